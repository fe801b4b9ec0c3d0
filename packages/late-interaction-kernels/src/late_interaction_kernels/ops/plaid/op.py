"""``plaid_approx_score``'s declaration (checks refusing every unusable argument with
``ValueError``, as the published PLAID API does; backend choice, plan cache, the custom op
``late_interaction_kernels::plaid_approx_score`` with its fake, and the reference route: chunks of
gathered centroid scores in PyTorch). The plan binds the launch of :mod:`.kernels` once."""

from __future__ import annotations

import torch

from triton_dispatch import next_power_of_2
from triton_dispatch.declaration import OpDeclaration, TensorSpec
from triton_dispatch.launch import KernelLaunch

from ..common.buffers import output_buffer
from ..common.validation import FLOAT_DTYPES
from .reference import plaid_approx_score_chunked

_INTEGERS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
             torch.uint32, torch.uint64)  # fmt: skip
_REAL = (*FLOAT_DTYPES, *_INTEGERS)


class ApproxScorePlan:
    """The kernel's launch for one kind of call, bound once: scores ``(B,)`` float32."""

    def __init__(self, call) -> None:
        from .kernels import plaid_approx_score_kernel

        n_centroids, lq = call["query_centroid_scores"].shape
        self.batch, max_ld = call["codes"].shape
        block_q = min(next_power_of_2(max(lq, 1)), 128)
        bound = dict(n_centroids=n_centroids, lq=lq, max_ld=max_ld, stride_c=lq, stride_b=max_ld,
                     BLOCK_L=max(16, min(64, 4096 // block_q)), BLOCK_Q=block_q)  # fmt: skip
        self.device = device = call.device
        self.launch = KernelLaunch(plaid_approx_score_kernel, (self.batch,), bound, device=device)
        self.copy = not all(t.is_contiguous() for t in call.tensors.values())

    def forward(self, query_centroid_scores, codes, doc_lengths):
        if self.copy:  # the kernel reads rows of contiguous tensors
            query_centroid_scores, codes, doc_lengths = (
                t.contiguous() for t in (query_centroid_scores, codes, doc_lengths)
            )
        out = output_buffer((self.batch,), dtype=torch.float32, device=self.device)
        self.launch(query_centroid_scores, codes, doc_lengths, out)
        return out


def _plan(call):
    # float64 (and integer) tables are scored exactly by the reference; so is an empty batch
    if call["query_centroid_scores"].dtype not in FLOAT_DTYPES[:3] or call["codes"].shape[0] == 0:
        return None
    return ApproxScorePlan(call)


def _check(call) -> None:
    qcs, codes, lengths = call.tensors.values()
    if lengths.shape[0] != codes.shape[0]:
        raise ValueError(
            f"doc_lengths must have shape (B,) with B = codes.shape[0] = {codes.shape[0]}, got "
            f"{tuple(lengths.shape)}"
        )
    if qcs.shape[0] == 0 and codes.numel():
        raise ValueError(
            "query_centroid_scores must hold at least one centroid row (out-of-range codes read "
            "centroid 0), got shape (0, Lq)"
        )


def _spec(name: str, dtypes, shape: str, rank: int, kind: str) -> TensorSpec:
    return TensorSpec(name, dtypes, shape, fits=lambda s: len(s) == rank, binds_strides=False,
                      dtype_message=f"{{name}} must be {kind}, got {{dtype}} tensor",
                      type_error=ValueError)  # fmt: skip


APPROX_SCORE = OpDeclaration(
    "late_interaction_kernels::plaid_approx_score",
    inputs=[
        _spec("query_centroid_scores", _REAL, "(n_centroids, Lq)", 2, "a float or integer tensor"),
        _spec("codes", _INTEGERS, "(B, max_Ld)", 2, "an integer tensor of centroid ids"),
        _spec("doc_lengths", _INTEGERS, "(B,)", 1, "an integer tensor"),
    ],
    check=_check,
    outputs=("scores",),
    returns=("scores",),
    reference=plaid_approx_score_chunked,
    plan=_plan,
    fake=lambda qcs, codes, lengths: codes.new_empty((codes.shape[0],), dtype=torch.float32),
)
