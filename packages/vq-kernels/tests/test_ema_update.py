"""ema_update_: kernels (interpreter on CPU) against the float64 reference, semantics, restarts,
randomness, determinism and bad input."""

from __future__ import annotations

import pytest
import torch
from vq_test_helpers import assert_state_matches, make_state, reference_step

from triton_dispatch.testing import randint, randn
from vq_kernels import DEFAULT_THRESHOLDS, ema_statistics, ema_update_
from vq_kernels.ops.ema_update.reference import ema_statistics_reference

# (B, K, D, L): non-powers of two, a single sample, K > B (many inactive codes), stacked levels,
# a D wider than the interpreter's tiles, and a D that takes the scatter's two-pass path.
SHAPES = [
    (37, 13, 20, 1),
    (1, 5, 7, 1),
    (24, 70, 8, 1),
    (24, 6, 33, 2),
    (5, 3, 1100, 1),
]


def _codes_leaving_gaps(batch, num_codes, levels, rng):
    """Random codes that never use code 1, so at least one code is inactive."""
    codes = randint(0, num_codes, (levels, batch), generator=rng)
    if num_codes > 2:
        codes[codes == 1] = 2
    return codes


def _run(x, codes, state, candidates, **kw):
    stacked = x.dim() == 3
    st = [t.clone() for t in state]
    args = st if stacked else [t[0] for t in st]
    cand = candidates if stacked else candidates[0]
    replaced = ema_update_(x, codes, *args, candidates=cand, **kw)
    return st, replaced if stacked else replaced[None]


@pytest.mark.parametrize("semantics", ["active_only", "decay_all"])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}K{}D{}L{}".format(*s))
def test_matches_float64_reference(shape, semantics, deterministic, rng):
    batch, num_codes, dim, levels = shape
    x = randn((levels, batch, dim), generator=rng)
    codes = _codes_leaving_gaps(batch, num_codes, levels, rng)
    state = make_state(levels, num_codes, dim, rng=rng, semantics=semantics)
    candidates = randint(0, batch, (levels, num_codes), generator=rng)
    threshold = DEFAULT_THRESHOLDS[semantics]
    if levels == 1:
        x, codes = x[0], codes[0]
    st, replaced = _run(
        x, codes, state, candidates, decay=0.9, semantics=semantics, deterministic=deterministic
    )
    x3 = x if levels > 1 else x[None]
    c3 = codes if levels > 1 else codes[None]
    ref, ref_replaced = reference_step(
        x3, c3, state, candidates, decay=0.9, semantics=semantics, threshold=threshold
    )
    assert_state_matches(st, ref, replaced, ref_replaced)


@pytest.mark.parametrize("threshold", [DEFAULT_THRESHOLDS["active_only"], None])
@pytest.mark.parametrize("shape", [(37, 13, 20, 1), (24, 6, 33, 2), (5, 3, 1100, 1)])
def test_single_launch_update_matches_reference(shape, threshold, rng, device):
    """The fused statistics + epilogue kernel (what ema_update_ runs on CUDA for active-only
    updates). Under the interpreter its programs run one after another, so one program does all
    the work there; on a GPU the grid is the launcher's own."""
    from vq_kernels.ops.ema_update.kernels import fused_update

    batch, num_codes, dim, levels = shape
    x = randn((levels, batch, dim), generator=rng)
    x[0, 3, 2] = float("nan")  # a skipped row
    codes = _codes_leaving_gaps(batch, num_codes, levels, rng)
    state = make_state(levels, num_codes, dim, rng=rng)
    candidates = randint(0, batch, (levels, num_codes), generator=rng)
    st = [t.clone().to(device) for t in state]
    replaced = fused_update(
        x.to(device),
        codes.to(device),
        *st,
        candidates.to(device),
        decay=0.9,
        eps=1e-5,
        threshold=threshold,
        programs=1 if device == "cpu" else None,
    )
    ref, ref_replaced = reference_step(
        x, codes, state, candidates, decay=0.9, semantics="active_only", threshold=threshold
    )
    assert_state_matches([t.cpu() for t in st], ref, replaced.cpu(), ref_replaced)


@pytest.mark.parametrize("levels", [1, 2])
def test_small_batch_kernel_over_many_spans(levels, rng):
    """The small-batch kernel reads the codes a span at a time and revisits only the chunks that
    hold its code: a batch of several spans (the interpreter's span is 64 rows), one code in every
    chunk, one in a single late chunk, rows of the same code in neighbouring chunks, NaN rows and
    out-of-range codes."""
    batch, num_codes, dim = 203, 6, 5
    x = randn((levels, batch, dim), generator=rng)
    codes = randint(2, num_codes, (levels, batch), generator=rng)
    codes[:, ::16] = 0  # a row in every chunk
    codes[:, 190] = 1  # the last span only
    codes[:, 31:34] = 5  # across a chunk boundary
    codes[:, 7] = num_codes  # ignored
    codes[:, 8] = -1
    x[:, 9, 1] = float("nan")  # skipped
    state = make_state(levels, num_codes, dim, rng=rng)
    candidates = randint(0, batch, (levels, num_codes), generator=rng)
    if levels == 1:
        x, codes = x[0], codes[0]
    st, replaced = _run(x, codes, state, candidates, decay=0.8, check_codes=False)
    x3 = x if levels > 1 else x[None]
    c3 = codes if levels > 1 else codes[None]
    ref, ref_replaced = reference_step(
        x3, c3, state, candidates, decay=0.8, semantics="active_only",
        threshold=DEFAULT_THRESHOLDS["active_only"],
    )  # fmt: skip
    assert_state_matches(st, ref, replaced, ref_replaced)


@pytest.mark.parametrize("semantics", ["active_only", "decay_all"])
def test_torch_backend_matches_reference(semantics, rng):
    batch, num_codes, dim, levels = 19, 7, 6, 2
    x = randn((levels, batch, dim), generator=rng)
    codes = _codes_leaving_gaps(batch, num_codes, levels, rng)
    state = make_state(levels, num_codes, dim, rng=rng, semantics=semantics)
    candidates = randint(0, batch, (levels, num_codes), generator=rng)
    st, replaced = _run(
        x, codes, state, candidates, decay=0.7, semantics=semantics, backend="torch"
    )
    ref, ref_replaced = reference_step(
        x,
        codes,
        state,
        candidates,
        decay=0.7,
        semantics=semantics,
        threshold=DEFAULT_THRESHOLDS[semantics],
    )
    assert_state_matches(st, ref, replaced, ref_replaced)


@pytest.mark.parametrize("code_dtype", [torch.int32, torch.int64])
def test_statistics_match_reference_without_one_hot(code_dtype, rng):
    x = randn((53, 9), generator=rng)
    codes = randint(0, 11, (53,), generator=rng, dtype=code_dtype)
    counts, sums = ema_statistics(x, codes, 11)
    ref_counts, ref_sums = ema_statistics_reference(
        x[None].double(), codes[None], 11, dtype=torch.float64
    )
    assert torch.equal(counts.double(), ref_counts[0])
    torch.testing.assert_close(sums.double(), ref_sums[0], rtol=1e-5, atol=1e-5)


def test_all_codes_active(rng):
    num_codes, dim = 8, 12
    x = randn((40, dim), generator=rng)
    codes = torch.arange(40) % num_codes
    cb, size, es, ctr = (t[0] for t in make_state(1, num_codes, dim, rng=rng))
    ctr.fill_(19)  # one step from the threshold: an assignment must reset it
    replaced = ema_update_(x, codes, cb, size, es, ctr, decay=0.8)
    assert not replaced.any()
    assert (ctr == 0).all()


def test_dead_code_restart_takes_the_candidate_row(rng):
    num_codes, dim, batch = 6, 10, 15
    x = randn((batch, dim), generator=rng)
    codes = randint(0, num_codes, (batch,), generator=rng)
    codes[codes == 4] = 0  # code 4 stays inactive
    cb, size, es, ctr = (t[0] for t in make_state(1, num_codes, dim, rng=rng))
    ctr.zero_()
    ctr[4] = 19  # reaches 20 this step
    candidates = randint(0, batch, (num_codes,), generator=rng)
    replaced = ema_update_(x, codes, cb, size, es, ctr, candidates=candidates, dead_threshold=20)
    assert replaced.tolist() == [k == 4 for k in range(num_codes)]
    assert torch.equal(cb[4], x[candidates[4]])
    assert torch.equal(es[4], x[candidates[4]])
    assert size[4].item() == 1.0 and ctr[4].item() == 0


def test_counters_increment_and_reset(rng):
    num_codes, dim = 5, 4
    x = randn((6, dim), generator=rng)
    codes = torch.tensor([0, 0, 2, 2, 2, 4])
    cb, size, es, ctr = (t[0] for t in make_state(1, num_codes, dim, rng=rng))
    ctr.copy_(torch.tensor([3, 7, 1, 0, 11], dtype=torch.int32))
    ema_update_(x, codes, cb, size, es, ctr, dead_threshold=None)
    assert ctr.tolist() == [0, 8, 0, 1, 0]


@pytest.mark.parametrize("semantics", ["active_only", "decay_all"])
def test_decay_one_keeps_state_decay_zero_takes_the_batch(semantics, rng):
    num_codes, dim = 4, 6
    x = randn((12, dim), generator=rng)
    codes = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2])
    state = [t[0] for t in make_state(1, num_codes, dim, rng=rng)]
    state[1].fill_(3.0)  # above the decay-all threshold
    kept = [t.clone() for t in state]
    ema_update_(x, codes, *kept, decay=1.0, semantics=semantics, dead_threshold=None)
    assert torch.equal(kept[1], state[1]) and torch.equal(kept[2], state[2])
    if semantics == "active_only":  # assigned codes re-read the (unchanged) EMA state
        torch.testing.assert_close(kept[0][:3], state[2][:3] / state[1][:3, None])
        assert torch.equal(kept[0][3], state[0][3])
    fresh = [t.clone() for t in state]
    ema_update_(x, codes, *fresh, decay=0.0, semantics=semantics, dead_threshold=None)
    for k in range(3):
        mean = x[codes == k].mean(0)
        torch.testing.assert_close(fresh[2][k], x[codes == k].sum(0))
        if semantics == "active_only":
            torch.testing.assert_close(fresh[0][k], mean)
    assert fresh[1][3].item() == (state[1][3].item() if semantics == "active_only" else 0.0)


def test_threshold_none_disables_restarts_and_nonpositive_is_rejected(rng):
    cb, size, es, ctr = (t[0] for t in make_state(1, 4, 3, rng=rng))
    ctr.fill_(1000)
    x = randn((5, 3), generator=rng)
    codes = torch.zeros(5, dtype=torch.long)
    before = cb.clone()
    assert not ema_update_(x, codes, cb, size, es, ctr, dead_threshold=None).any()
    assert torch.equal(cb[1:], before[1:])
    for bad in (0, -1, 0.0):
        with pytest.raises(ValueError, match="dead_threshold must be > 0"):
            ema_update_(x, codes, cb, size, es, ctr, dead_threshold=bad)


def test_generator_draws_match_reference(rng, seed):
    """Default candidates come from one torch.randint over every code: the same generator state
    gives the reference the same rows, so the codebooks themselves agree."""
    levels, batch, num_codes, dim = 2, 9, 7, 5
    x = randn((levels, batch, dim), generator=rng)
    codes = _codes_leaving_gaps(batch, num_codes, levels, rng)
    state = make_state(levels, num_codes, dim, rng=rng)
    state[3].fill_(30)
    st = [t.clone() for t in state]
    replaced = ema_update_(x, codes, *st, generator=torch.Generator().manual_seed(seed))
    candidates = torch.randint(
        0, batch, (levels, num_codes), generator=torch.Generator().manual_seed(seed)
    )
    ref, ref_replaced = reference_step(
        x, codes, state, candidates, decay=0.99, semantics="active_only", threshold=20
    )
    assert replaced.any()
    assert_state_matches(st, ref, replaced, ref_replaced)


def test_deterministic_mode_is_bitwise_reproducible(rng):
    x = randn((64, 24), generator=rng)
    codes = randint(0, 5, (64,), generator=rng)
    state = [t[0] for t in make_state(1, 5, 24, rng=rng)]
    runs = []
    for _ in range(2):
        st = [t.clone() for t in state]
        ema_update_(x, codes, *st, candidates=torch.zeros(5, dtype=torch.long), deterministic=True)
        runs.append(st)
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_bf16_x_matches_upcast_reference(rng):
    batch, num_codes, dim = 21, 6, 18
    x = randn((1, batch, dim), generator=rng).to(torch.bfloat16)
    codes = _codes_leaving_gaps(batch, num_codes, 1, rng)
    state = make_state(1, num_codes, dim, rng=rng)
    candidates = randint(0, batch, (1, num_codes), generator=rng)
    st, replaced = _run(x, codes, state, candidates, decay=0.9)
    ref, ref_replaced = reference_step(
        x.float(), codes, state, candidates, decay=0.9, semantics="active_only", threshold=20
    )
    assert_state_matches(st, ref, replaced, ref_replaced)


def test_float64_state_runs_the_reference(rng):
    x = randn((10, 4), generator=rng, dtype=torch.float64)
    codes = randint(0, 3, (10,), generator=rng)
    cb, size, es, ctr = (t[0] for t in make_state(1, 3, 4, rng=rng))
    cb, size, es = cb.double(), size.double(), es.double()
    ema_update_(x, codes, cb, size, es, ctr, dead_threshold=None)
    assert cb.dtype == torch.float64 and torch.isfinite(cb).all()


def test_nan_rows_are_ignored_and_never_reach_the_codebook(rng):
    num_codes, dim, batch = 4, 5, 12
    x = randn((batch, dim), generator=rng)
    codes = randint(0, num_codes, (batch,), generator=rng)
    bad = x.clone()
    bad[3, 2] = float("nan")
    bad[7, 0] = float("inf")
    state = [t[0] for t in make_state(1, num_codes, dim, rng=rng)]
    state[3].fill_(19)
    keep = torch.ones(batch, dtype=torch.bool)
    keep[[3, 7]] = False
    # Code 2 restarts from the NaN row 3: refused, it stays dead and is retried next step.
    candidates = torch.tensor([0, 1, 3, 5])
    codes[codes == 2] = 1
    st = [t.clone() for t in state]
    replaced = ema_update_(bad, codes, *st, candidates=candidates)
    want = [t.clone() for t in state]
    remap = torch.cumsum(keep.long(), 0) - 1  # candidate indices into the kept rows
    ema_update_(x[keep], codes[keep], *want, candidates=remap[torch.tensor([0, 1, 0, 5])])
    assert not replaced[2]
    for a in st[:3]:
        assert torch.isfinite(a).all()
    torch.testing.assert_close(st[0][[0, 1, 3]], want[0][[0, 1, 3]])
    torch.testing.assert_close(st[1][[0, 1, 3]], want[1][[0, 1, 3]])
    assert st[3][2].item() == 20  # still dead, counted


def test_empty_batch_is_a_no_op(rng):
    state = [t[0] for t in make_state(1, 4, 3, rng=rng)]
    st = [t.clone() for t in state]
    replaced = ema_update_(torch.empty(0, 3), torch.empty(0, dtype=torch.long), *st)
    assert not replaced.any() and replaced.shape == (4,)
    for a, b in zip(st, state):
        assert torch.equal(a, b)


def _args(rng, batch=6, num_codes=4, dim=3):
    x = randn((batch, dim), generator=rng)
    codes = randint(0, num_codes, (batch,), generator=rng)
    state = [t[0].clone() for t in make_state(1, num_codes, dim, rng=rng)]
    return x, codes, state


def test_bad_codes_are_rejected(rng):
    x, codes, state = _args(rng)
    with pytest.raises(TypeError, match="codes must be an integer"):
        ema_update_(x, codes.float(), *state)
    before = [t.clone() for t in state]
    for value in (4, -1):
        bad = codes.clone()
        bad[0] = value
        with pytest.raises(ValueError, match=r"codes must lie in \[0, K\)"):
            ema_update_(x, bad, *state)
    for a, b in zip(state, before):
        assert torch.equal(a, b)


def test_out_of_range_codes_without_check_are_ignored(rng, device):
    """With the check off — and on CUDA by default, where it would sync — out-of-range codes take
    no part in the update."""
    x, codes, state = _args(rng)
    x, codes, state = x.to(device), codes.to(device), [t.to(device) for t in state]
    bad = codes.clone()
    bad[0] = 99
    bad[1] = -3
    st = [t.clone() for t in state]
    check = None if device == "cuda" else False
    ema_update_(x, bad, *st, check_codes=check, dead_threshold=None)
    want = [t.clone() for t in state]
    ema_update_(x[2:], codes[2:], *want, dead_threshold=None)
    for a, b in zip(st, want):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "mutate, error, match",
    [
        (lambda a: a.update(x=a["x"][:, :2]), ValueError, "codebook must have shape"),
        (lambda a: a.update(codes=a["codes"][:-1]), ValueError, "codes must have shape"),
        (lambda a: a.update(cluster_size=a["cluster_size"][:-1]), ValueError, "cluster_size"),
        (lambda a: a.update(embed_sum=a["embed_sum"][:, :2]), ValueError, "embed_sum"),
        (lambda a: a.update(steps_since_active=a["steps_since_active"][:2]), ValueError, "steps"),
        (lambda a: a.update(steps_since_active=None), ValueError, "steps_since_active is required"),
        (
            lambda a: a.update(steps_since_active=a["steps_since_active"].float()),
            TypeError,
            "steps",
        ),
        (lambda a: a.update(cluster_size=a["cluster_size"].half()), TypeError, "cluster_size"),
        (lambda a: a.update(x=a["x"].long()), TypeError, "x must have dtype"),
        (lambda a: a.update(x=a["x"][None, None]), ValueError, "x must be"),
        (lambda a: a.update(decay=1.5), ValueError, "decay"),
        (lambda a: a.update(eps=0.0), ValueError, "eps"),
        (lambda a: a.update(semantics="all"), ValueError, "semantics"),
        (lambda a: a.update(codebook=a["codebook"].to("meta")), ValueError, "same device"),
        (lambda a: a.update(embed_sum=a["embed_sum"].T.contiguous().T), ValueError, "contiguous"),
        (lambda a: a.update(candidates=torch.zeros(3, dtype=torch.long)), ValueError, "candidates"),
    ],
)
def test_bad_input_gets_a_clear_error(mutate, error, match, rng):
    x, codes, (cb, size, es, ctr) = _args(rng)
    args = dict(
        x=x, codes=codes, codebook=cb, cluster_size=size, embed_sum=es, steps_since_active=ctr
    )
    mutate(args)
    with pytest.raises(error, match=match):
        ema_update_(**args)
