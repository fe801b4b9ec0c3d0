"""``maxsim_topk``'s declaration (checks, backend choice, plan cache, the custom op
``late_interaction_kernels::maxsim_topk`` with its fake, and the reference route: chunks of
documents scored in PyTorch and merged into a running top-k). On the Triton backends the plan
picks by size the fused kernel (:mod:`.kernels`, its launch bound once) or the same chunks scored
by :func:`maxsim`'s kernels."""

from __future__ import annotations

import functools

import torch

from triton_dispatch import interpreter_enabled, next_power_of_2, padded_dim
from triton_dispatch.declaration import OpDeclaration, SettingSpec, TensorSpec
from triton_dispatch.launch import KernelLaunch

from ..common.buffers import output_buffer
from ..common.precision import NORM_EPS, dot_settings
from ..common.validation import FLOAT_DTYPES, check_mask, check_pair
from ..maxsim.reference import compute_dtype
from .running_topk import RING, STATE_WORDS

#: Queries up to which the fused kernel serves a call. It scores one (document, query) pair per
#: program, and a document's queries read it from L2; from 4 queries on, ``maxsim``'s kernel for
#: query batches (each document tile read once for a group of queries) is faster, so batches take
#: the chunked path (H100, 20,000 documents of 300 tokens, k = 100: fused 0.52 / 0.73 / 1.31 ms
#: at 1 / 2 / 4 queries; ``maxsim`` + ``torch.topk`` 0.58 / 1.06 / 0.64 ms).
FUSED_MAX_QUERIES = 2
#: Documents per chunk on the chunked path when ``chunk_size`` is not given: at least this many...
MIN_CHUNK_SIZE = 8192
#: ...and up to this many scores per chunk over all queries (1 MiB of float32), so memory stays
#: independent of Nd while small batches score the collection in few chunks.
CHUNK_SCORES = 2**18
#: Largest ``k`` the running top-k keeps (beyond it: the chunked path).
MAX_K = 1024
#: Longest query held in registers whole (longer queries take the chunked path).
MAX_QUERY_TOKENS = 128
#: Widest embedding the kernel takes.
MAX_DIM = 256
#: Programs of one launch (one per document and query); candidates keep the document index in
#: 32 bits.
MAX_PROGRAMS = 2**31 - 1
#: Smallest sort of a merge (kept list and one window of offers); a window is the rest of it.
MIN_SORT = 512


def fused_covers(Q: torch.Tensor, D: torch.Tensor, k: int) -> bool:
    """Whether the fused kernel takes a checked call for ``k`` results (``k <= Nd``)."""
    nq, lq, dim = Q.shape
    nd, ld, _ = D.shape
    return (
        Q.dtype in (torch.float16, torch.bfloat16, torch.float32)
        and 0 < lq <= MAX_QUERY_TOKENS
        and 0 < dim <= MAX_DIM
        and ld > 0
        and 0 < nd * nq <= MAX_PROGRAMS
        and 0 < k <= MAX_K
    )


class FusedTopk:
    """The fused kernel's launch for one kind of call, bound once: ``(scores, indices)``, each
    ``(Nq, k)``, best first, from one launch over a zeroed per-query state."""

    def __init__(self, call, k: int) -> None:
        from .kernels import topk_kernel

        Q, D = call["Q"], call["D"]
        (nq, lq, dim), (nd, ld, _) = Q.shape, D.shape
        k_pad = max(next_power_of_2(k), 16)
        sort = max(2 * k_pad, MIN_SORT)
        self.list_words = k_pad + RING * (sort - k_pad)
        upcast, ieee = dot_settings(Q.dtype)
        block_k = max(padded_dim(dim), 16)
        bound = dict(
            nq=nq, lq=lq, ld=ld, dim=dim, nd=nd, k=k,
            HAS_QM=call["q_mask"] is not None, HAS_DM=call["d_mask"] is not None,
            NORMALIZE=call["normalize"], LARGEST=call["largest"], UPCAST=upcast, IEEE=ieee,
            NORM_EPS=NORM_EPS, EVEN_K=block_k == dim, DYNAMIC_BOUNDS=not interpreter_enabled(),
            BLOCK_Q=max(padded_dim(lq), 16), BLOCK_K=block_k, K_PAD=k_pad, WINDOW=sort - k_pad,
            SORT=sort, STATE_WORDS=STATE_WORDS, LIST_WORDS=self.list_words,
        )  # fmt: skip
        self.launch = KernelLaunch(topk_kernel, (nq * nd,), bound, device=Q.device)
        self.nq, self.k, self.device = nq, k, Q.device
        self.copy = not all(t is None or t.is_contiguous() for t in call.tensors.values())

    def forward(self, Q, D, q_mask, d_mask):
        if self.copy:
            Q, D, q_mask, d_mask = (None if t is None else t.contiguous()
                                    for t in (Q, D, q_mask, d_mask))  # fmt: skip
        nq, device = self.nq, self.device
        # the state starts at zero on every call; the lists need no clearing
        state = torch.zeros(nq, STATE_WORDS, dtype=torch.int64, device=device)
        lists = torch.empty(nq, self.list_words, dtype=torch.int64, device=device)
        scores = output_buffer((nq, self.k), dtype=torch.float32, device=device)
        index = output_buffer((nq, self.k), dtype=torch.int64, device=device)
        qm = Q if q_mask is None else q_mask.view(torch.uint8)
        dm = D if d_mask is None else d_mask.view(torch.uint8)
        self.launch(Q, D, qm, dm, state, lists, scores, index)
        return scores, index


class ChunkedTopk:
    """``chunk`` documents at a time scored by :func:`maxsim` on ``backend``, merged into a
    running top-k (batches of queries, and calls the fused kernel does not take)."""

    def __init__(self, call, backend: str) -> None:
        chunk = _chunk(call["chunk_size"], call["Q"].shape[0])
        self.forward = functools.partial(chunked_topk, chunk=chunk, k=call["k"],
                                         normalize=call["normalize"], largest=call["largest"],
                                         backend=backend)  # fmt: skip


def _chunk(chunk_size: int | None, nq: int) -> int:
    return chunk_size or max(MIN_CHUNK_SIZE, CHUNK_SCORES // max(nq, 1))


@torch.no_grad()
def chunked_topk(Q, D, q_mask, d_mask, chunk, k, normalize, largest, backend):
    """``(scores, indices int64)``, each ``(Nq, min(k, Nd))``, best first; scores in
    :func:`maxsim`'s dtype (float32, float64 for float64 inputs)."""
    from ..maxsim import maxsim_unchecked

    k = min(k, D.shape[0])
    if k == 0 or Q.shape[0] == 0:
        empty = torch.zeros(Q.shape[0], k, device=Q.device)
        return empty, empty.long()
    best_s = best_i = None
    for start in range(0, D.shape[0], chunk):
        stop = min(start + chunk, D.shape[0])
        dm = None if d_mask is None else d_mask[start:stop]
        s = maxsim_unchecked(Q, D[start:stop], q_mask, dm, normalize=normalize, backend=backend)
        i = torch.arange(start, stop, device=s.device).expand_as(s)
        if best_s is not None:
            s, i = torch.cat([best_s, s], dim=1), torch.cat([best_i, i], dim=1)
        if backend == "torch":
            # the spec: between equal scores the earlier document wins, as in the fused kernel
            # (torch.topk leaves the order of ties unspecified)
            where = s.sort(dim=1, descending=largest, stable=True).indices[:, : min(k, s.shape[1])]
            best_s = s.gather(1, where)
        else:
            best_s, where = s.topk(min(k, s.shape[1]), dim=1, largest=largest, sorted=True)
        best_i = i.gather(1, where)
    return best_s, best_i


def _plan(call):
    Q, D = call["Q"], call["D"]
    k = min(call["k"], D.shape[0])
    if Q.shape[0] <= FUSED_MAX_QUERIES and fused_covers(Q, D, k):
        return FusedTopk(call, k)
    return ChunkedTopk(call, call.backend)


def _reference(Q, D, q_mask, d_mask, *, k, normalize, chunk_size, largest):
    chunk = _chunk(chunk_size, Q.shape[0])
    return chunked_topk(Q, D, q_mask, d_mask, chunk, k, normalize, largest, "torch")


def _fake(Q, D, q_mask, d_mask, *, k, **_):
    shape = (Q.shape[0], min(k, D.shape[0]))
    return Q.new_empty(shape, dtype=compute_dtype(Q.dtype)), Q.new_empty(shape, dtype=torch.int64)


def _check(call) -> None:
    Q, D = call["Q"], call["D"]
    check_pair(Q, D)
    check_mask("q_mask", call["q_mask"], Q.shape[:2])
    check_mask("d_mask", call["d_mask"], D.shape[:2])


def _spec(name: str, dtypes, shape: str, rank: int, expected: str, **flags) -> TensorSpec:
    # 2-D tokens (1-D masks) arrive as batches of one; strided tensors are copied per call
    return TensorSpec(name, dtypes, shape, fits=lambda s: len(s) == rank, binds_strides=False,
                      dtypes_expected=expected, **flags)  # fmt: skip


_FLOATS = "float16, bfloat16, float32 or float64"
_BOOL = "a bool tensor (True = valid token)"
_CHUNK_SIZE = SettingSpec("chunk_size", int, None, nullable=True, valid=lambda n: n > 0,
                          expected="a positive int or None", type_error=ValueError)  # fmt: skip

TOPK = OpDeclaration(
    "late_interaction_kernels::maxsim_topk",
    inputs=[
        _spec("Q", FLOAT_DTYPES, "(Nq, Lq, d) or (Lq, d)", 3, _FLOATS),
        _spec("D", FLOAT_DTYPES, "(Nd, Ld, d) or (Ld, d)", 3, _FLOATS),
        _spec("q_mask", (torch.bool,), "(Nq, Lq) or (Lq,)", 2, _BOOL, optional=True),
        _spec("d_mask", (torch.bool,), "(Nd, Ld) or (Ld,)", 2, _BOOL, optional=True),
    ],
    settings=[
        SettingSpec("k", int, 1, valid=lambda k: k > 0, expected="a positive int"),
        SettingSpec("normalize", bool, False),
        _CHUNK_SIZE,
        SettingSpec("largest", bool, True),
    ],
    check=_check,
    outputs=("scores", "indices"),
    returns=("scores", "indices"),
    reference=_reference,
    plan=_plan,
    fake=_fake,
)
