"""Every public op of late-interaction-kernels through the shared bad-input kit (tiny shapes)."""

import pytest
import torch

from late_interaction_kernels import maxsim, maxsim_pairs, maxsim_varlen_pairs, retrieve
from late_interaction_kernels.ops.maxsim.reference import (
    maxsim_pairs_reference,
    maxsim_reference,
    maxsim_varlen_reference,
)
from late_interaction_kernels.ops.maxsim_from_hidden import maxsim_from_hidden
from late_interaction_kernels.ops.maxsim_from_hidden.reference import maxsim_from_hidden_reference
from late_interaction_kernels.ops.maxsim_residual import maxsim_residual
from late_interaction_kernels.ops.maxsim_residual.reference import (
    maxsim_residual_reference,
    pack_buckets,
)
from late_interaction_kernels.ops.retrieve.reference import retrieve_reference
from triton_dispatch.testing import (
    OpSpec,
    TensorArg,
    bad_input_params,
    check_bad_input,
    rand_mask,
    randint,
    randn,
)

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
NQ, LQ, ND, LD, DIM = 2, 3, 3, 5, 4


def _maxsim_inputs(g):
    return {
        "Q": randn((NQ, LQ, DIM), generator=g),
        "D": randn((ND, LD, DIM), generator=g),
        "q_mask": rand_mask((NQ, LQ), generator=g),
        "d_mask": rand_mask((ND, LD), generator=g),
    }


MAXSIM = OpSpec(
    "maxsim",
    maxsim,
    maxsim_reference,
    _maxsim_inputs,
    [
        TensorArg("Q", dtypes=FLOATS, related=("q_mask",)),
        TensorArg("D", ranks=(3, 4), dtypes=FLOATS, related=("d_mask",)),
        TensorArg("q_mask", dtypes=(torch.bool,)),
        TensorArg("d_mask", dtypes=(torch.bool,)),
    ],
)

MAXSIM_PAIRS = OpSpec(
    "maxsim_pairs",
    maxsim_pairs,
    maxsim_pairs_reference,
    lambda g: {"Q": randn((NQ, LQ, DIM), generator=g), "D": randn((NQ, LD, DIM), generator=g)},
    [TensorArg("Q", dtypes=FLOATS), TensorArg("D", dtypes=FLOATS)],
)


def _varlen_inputs(g):
    return {
        "Q_packed": randn((5, DIM), generator=g),
        "D_packed": randn((7, DIM), generator=g),
        "cu_seqlens_q": torch.tensor([0, 2, 5]),
        "cu_seqlens_d": torch.tensor([0, 4, 7]),
    }


MAXSIM_VARLEN = OpSpec(
    "maxsim_varlen_pairs",
    maxsim_varlen_pairs,
    maxsim_varlen_reference,
    _varlen_inputs,
    [
        TensorArg("Q_packed", dtypes=FLOATS, related=("cu_seqlens_q",)),
        TensorArg("D_packed", dtypes=FLOATS, related=("cu_seqlens_d",)),
        TensorArg("cu_seqlens_q", dtypes=(torch.int32, torch.int64), index_range=(0, 6)),
        TensorArg("cu_seqlens_d", dtypes=(torch.int32, torch.int64), index_range=(0, 8)),
    ],
)


def _retrieved(inputs, returned):
    """Scores and the float64 score of each returned index: ties may order documents either way."""
    scores, indices = returned
    full = maxsim_reference(inputs["Q"].detach().double(), inputs["D"].detach().double())
    return scores, full.gather(1, indices.long())


def _retrieve(Q, D, k):
    """The published signature (``top_k``, cosine by default) on the reference's terms."""
    return retrieve(Q, D, top_k=k, normalize=False)


RETRIEVE = OpSpec(
    "retrieve",
    _retrieve,
    retrieve_reference,
    lambda g: {
        "Q": randn((NQ, LQ, DIM), generator=g),
        "D": randn((ND, LD, DIM), generator=g),
        "k": 2,
    },
    # retrieve hands D to MaxSimScorer(documents=...), whose errors call it documents
    # The published retrieve answers an empty collection with empty results and ranks non-finite
    # scores as torch.topk does, where this reference refuses them: those cases are its own tests'.
    [
        TensorArg("Q", dtypes=FLOATS, skip=("nonfinite",)),
        TensorArg("D", dtypes=FLOATS, related=("documents",), skip=("empty", "nonfinite")),
    ],
    result=_retrieved,
)

MAXSIM_FROM_HIDDEN = OpSpec(
    "maxsim_from_hidden",
    maxsim_from_hidden,
    maxsim_from_hidden_reference,
    lambda g: {
        "Q": randn((NQ, LQ, DIM), generator=g),
        "H_d": randn((ND, LD, 6), generator=g),
        "W": randn((6, DIM), generator=g),
        "b": randn((DIM,), generator=g),
    },
    [
        TensorArg("Q", dtypes=FLOATS),
        TensorArg("H_d", dtypes=FLOATS),
        TensorArg("W", dtypes=FLOATS),
        TensorArg("b", dtypes=FLOATS),
    ],
)

NBITS, CENTROIDS, DOCLENS = 2, 3, (2, 0, 3)


def _residual_inputs(g):
    n_tok = sum(DOCLENS)
    return {
        "Q": randn((NQ, LQ, DIM), generator=g),
        "centroids": randn((CENTROIDS, DIM), generator=g),
        "codes": randint(0, CENTROIDS, (n_tok,), generator=g),
        "packed_residuals": pack_buckets(randint(0, 1 << NBITS, (n_tok, DIM), generator=g), NBITS),
        "bucket_weights": randn((1 << NBITS,), generator=g, scale=0.1),
        "doclens": torch.tensor(DOCLENS),
    }


MAXSIM_RESIDUAL = OpSpec(
    "maxsim_residual",
    maxsim_residual,
    maxsim_residual_reference,
    _residual_inputs,
    [
        TensorArg("Q", dtypes=FLOATS),
        TensorArg("centroids", dtypes=FLOATS),
        TensorArg("codes", dtypes=(torch.int32, torch.int64), index_range=(0, CENTROIDS)),
        TensorArg("packed_residuals", dtypes=(torch.uint8,)),
        TensorArg("bucket_weights", dtypes=FLOATS),
        TensorArg("doclens", dtypes=(torch.int32, torch.int64)),
    ],
    kwargs={"nbits": NBITS},
)

SPECS = [MAXSIM, MAXSIM_PAIRS, MAXSIM_VARLEN, RETRIEVE, MAXSIM_FROM_HIDDEN, MAXSIM_RESIDUAL]


@pytest.mark.parametrize("case", [p for spec in SPECS for p in bad_input_params(spec)])
def test_bad_inputs(case, seed, device):
    check_bad_input(case, seed=seed, device=device)
