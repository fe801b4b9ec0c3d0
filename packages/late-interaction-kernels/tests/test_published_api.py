"""Every public name of late-interaction-kernels 0.4.5 imports from its published module path,
and every public function keeps the published parameter names, kinds, order and defaults.

The table below is written from the published 0.4.5 signatures. Our additions must be
keyword-only with a default, so no published call can bind differently.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect

import pytest
import torch

P = "late_interaction_kernels"
MAXSIM = "Q, D, q_mask=None, d_mask=None, *, normalize=False, backward=None"
PYLATE = "queries_embeddings, documents_embeddings, queries_mask=None, documents_mask=None, *, mask=None"
LOSS = "self, query_embeddings, doc_embeddings, offset=0"
NEG_LOSS = "self, query_embeddings, doc_embeddings, neg_doc_embeddings, offset=0"
RESIDUAL = "Q, codes, residuals, doc_lengths, centroids, bucket_weights, nbits, *, normalize=True"
PADDED = "queries, documents, query_lengths, doc_lengths, *, validate=False"
VARLEN = "Q_packed, D_packed, cu_seqlens_q, cu_seqlens_d, max_seqlen_q=None, max_seqlen_d=None"
RETRIEVE = (
    "Q, D, top_k, q_mask=None, d_mask=None, *, normalize=True, chunk=None, largest=True, "
    "sorted=True"
)
SCORER = {
    "__init__": "self, *, normalize=True, backward='auto', mask_pad_token=None",
    "forward": "self, Q, D, q_mask=None, d_mask=None",
    "score": "self, Q, D, q_mask=None, d_mask=None",
    "retrieve": "self, Q, D, top_k, q_mask=None, d_mask=None, *, chunk=None",
    "forward_with_ids": "self, Q, D, q_ids, d_ids",
}
PATCHER = ""

PUBLISHED: dict[str, dict[str, str | dict[str, str] | None]] = {
    P: {
        "maxsim": MAXSIM, "maxsim_pairs": MAXSIM, "maxsim_varlen": VARLEN,
        "maxsim_padded": PADDED, "retrieve": RETRIEVE, "MaxSimScorer": SCORER,
        "patch_pylate": PATCHER, "unpatch_pylate": PATCHER,
        "patch_colpali_engine": PATCHER, "unpatch_colpali_engine": PATCHER,
        "reference": None, "__version__": None,
    },
    f"{P}.autograd": {"maxsim": MAXSIM, "maxsim_pairs": MAXSIM},
    f"{P}.retrieve": {"MaxSimScorer": SCORER, "retrieve": RETRIEVE},
    f"{P}.varlen": {"maxsim_varlen": VARLEN},
    f"{P}.score_pairs": {
        "score_pairs_packed": "Q_packed, D_packed, cu_seqlens_q, cu_seqlens_d, pair_q_idx, "
        "pair_d_idx, *, max_seqlen_q=None, max_seqlen_d=None",
    },
    f"{P}.padded": {"PackedBatch": None, "pack_padded": PADDED, "maxsim_padded": PADDED},
    f"{P}.fused_head": {
        "maxsim_from_hidden": "Q, H_d, W, b=None, d_mask=None, normalize=True",
    },
    f"{P}.plaid": {
        "plaid_approx_score": "query_centroid_scores, codes, doc_lengths",
        "plaid_approx_score_reference": "query_centroid_scores, codes, doc_lengths",
        "maxsim_residual": RESIDUAL,
        "maxsim_residual_reference": RESIDUAL,
        "maxsim_residual_varlen": "Q, codes_flat, residuals_flat, cu_seqlens_d, centroids, "
        "bucket_weights, nbits, *, max_seqlen_d=None, normalize=True",
    },
    f"{P}.topk": {
        "maxsim_topk": "Q, D, k, q_mask=None, d_mask=None, *, normalize=False, chunk_size=None, "
        "largest=True, sorted=True",
    },
    f"{P}.fp8": {
        "quantize_fp8_per_tensor": "X, dtype=torch.float8_e4m3fn",
        "quantize_fp8_per_token": "X, dtype=torch.float8_e4m3fn",
        "dequantize_fp8_per_tensor": "X_fp8, scale",
        "dequantize_fp8_per_token": "X_fp8, scale",
        "maxsim_inference_fp8": "Q, D, *, scale_Q, scale_D, q_mask=None, d_mask=None",
    },
    f"{P}.reference": {
        "maxsim_reference": "Q, D, q_mask=None, d_mask=None, *, normalize=False",
        "plaid_approx_score_reference": "query_centroid_scores, codes, doc_lengths",
        "unpack_residuals_reference": "residuals, nbits, d",
        "maxsim_residual_reference": RESIDUAL,
        "maxsim_from_hidden_reference": "Q, H_d, W, b=None, d_mask=None, *, normalize=True",
        "maxsim_reference_varlen": "Q, D, cu_seqlens_q, cu_seqlens_d",
        "maxsim_reference_scatter": "Q_packed, D_packed, cu_seqlens_q, cu_seqlens_d, "
        "pair_q_idx, pair_d_idx",
        "maxsim_padded_reference": "queries, documents, query_lengths, doc_lengths",
    },
    f"{P}.pylate_compat": {
        "patched_colbert_scores": PYLATE, "patched_colbert_kd_scores": PYLATE,
        "patched_colbert_scores_pairwise": PYLATE,
        "patch_pylate": PATCHER, "unpatch_pylate": PATCHER,
    },
    f"{P}.colpali_compat": {
        "patched_score_multi_vector": "qs, ps, batch_size=128, device=None",
        "patched_colbert_loss_forward": LOSS,
        "patched_colbert_pairwise_ce_forward": LOSS,
        "patched_colbert_sigmoid_forward": LOSS,
        "patched_colbert_negative_ce_forward": NEG_LOSS,
        "patched_colbert_pairwise_negative_ce_forward": NEG_LOSS,
        "patch_colpali_engine": PATCHER, "unpatch_colpali_engine": PATCHER,
    },
    f"{P}.mps": {
        "maxsim_mps": "Q, D, q_mask=None, d_mask=None, *, normalize=True",
        "maxsim_inference_mps": "Q, D, q_mask=None, d_mask=None, *, normalize=True",
    },
}  # fmt: skip

PACKED_BATCH_FIELDS = [
    "Q_packed", "cu_seqlens_q", "D_packed", "cu_seqlens_d",
    "pair_q_idx", "pair_d_idx", "max_seqlen_q", "max_seqlen_d",
]  # fmt: skip
_MISSING = inspect.Parameter.empty


def _published(sig: str) -> list[tuple[str, inspect._ParameterKind, object]]:
    """``(name, kind, default)`` of each parameter of a signature written as Python source."""
    args = ast.parse(f"def f({sig}): pass").body[0].args
    out = []
    positional = args.args
    defaults = [_MISSING] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for arg, default in zip(positional, defaults):
        value = _MISSING if default is _MISSING else eval(ast.unparse(default), {"torch": torch})
        out.append((arg.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, value))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        value = _MISSING if default is None else eval(ast.unparse(default), {"torch": torch})
        out.append((arg.arg, inspect.Parameter.KEYWORD_ONLY, value))
    return out


def _check_signature(fn, sig: str, where: str) -> None:
    ours = inspect.signature(fn).parameters
    published = _published(sig)
    names = list(ours)
    for position, (name, kind, default) in enumerate(published):
        assert name in ours, f"{where}: parameter {name!r} is missing"
        p = ours[name]
        assert p.kind == kind, f"{where}: {name!r} is {p.kind.description}, published {kind.description}"
        if kind == inspect.Parameter.POSITIONAL_OR_KEYWORD:
            assert names[position] == name, f"{where}: {name!r} moved from position {position}"
        assert p.default == default or p.default is default, (
            f"{where}: default of {name!r} is {p.default!r}, published {default!r}"
        )
    for name, p in ours.items():
        if name not in {n for n, _, _ in published}:
            assert p.kind == inspect.Parameter.KEYWORD_ONLY and p.default is not _MISSING, (
                f"{where}: addition {name!r} must be keyword-only with a default"
            )


CASES = [(mod, name) for mod, names in PUBLISHED.items() for name in names]


@pytest.mark.parametrize(("module", "name"), CASES, ids=[f"{m}:{n}" for m, n in CASES])
def test_published_name_and_signature(module: str, name: str) -> None:
    obj = getattr(importlib.import_module(module), name)
    spec = PUBLISHED[module][name]
    if isinstance(spec, str):
        _check_signature(obj, spec, f"{module}.{name}")
    elif isinstance(spec, dict):
        assert issubclass(obj, torch.nn.Module)
        for method, sig in spec.items():
            _check_signature(getattr(obj, method), sig, f"{module}.{name}.{method}")


def test_packed_batch_fields_and_unpacking() -> None:
    from late_interaction_kernels.padded import PackedBatch

    assert [f.name for f in dataclasses.fields(PackedBatch)] == PACKED_BATCH_FIELDS
    assert dataclasses.is_dataclass(PackedBatch) and PackedBatch.__dataclass_params__.frozen


def test_top_level_names_are_the_submodule_objects() -> None:
    import late_interaction_kernels as lik
    from late_interaction_kernels import padded, reference, retrieve, varlen  # noqa: F401

    assert lik.MaxSimScorer is importlib.import_module(f"{P}.retrieve").MaxSimScorer
    assert lik.maxsim_varlen is varlen.maxsim_varlen
    assert lik.maxsim_padded is padded.maxsim_padded
    assert inspect.ismodule(lik.reference)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda m: m.retrieve(torch.zeros(1, 2, 4), torch.zeros(3, 2, 4), 0), ValueError),
        (lambda m: m.topk.maxsim_topk(torch.zeros(1, 2, 4), torch.zeros(3, 2, 4), 0), ValueError),
        (lambda m: m.MaxSimScorer(backward="fast"), ValueError),
        (
            lambda m: m.MaxSimScorer().forward_with_ids(
                torch.zeros(1, 2, 4), torch.zeros(1, 2, 4), torch.zeros(1, 2), torch.zeros(1, 2)
            ),
            ValueError,
        ),
        (lambda m: m.plaid.maxsim_residual(*[torch.zeros(1)] * 6, 3), ValueError),
        (
            lambda m: m.padded.pack_padded(
                torch.zeros(2, 3), torch.zeros(2, 1, 3, 4), torch.ones(2), torch.ones(2, 1)
            ),
            ValueError,
        ),
    ],
)
def test_published_error_types(call, error) -> None:
    import late_interaction_kernels as lik
    from late_interaction_kernels import padded, plaid, topk  # noqa: F401

    with pytest.raises(error):
        call(lik)


def test_retrieve_takes_2d_inputs_and_clamps_k(rng) -> None:
    from late_interaction_kernels import reference, retrieve

    Q = torch.randn(3, 8, generator=rng)
    D = torch.randn(4, 5, 8, generator=rng)
    scores, idx = retrieve(Q, D, top_k=10)
    want = reference.maxsim_reference(Q.double(), D.double(), normalize=True)
    assert scores.shape == (4,) and idx.shape == (4,)
    assert torch.allclose(scores.double(), want.sort(descending=True).values, atol=1e-5)
