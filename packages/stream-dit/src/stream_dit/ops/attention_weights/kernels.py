"""The launch of the attention weights: the few-keys attention kernel writing its softmax
probabilities instead of their product with the values (one tile holds a head's keys)."""

from __future__ import annotations

from types import SimpleNamespace

from triton_dispatch.declaration import Call

from ..attention.kernels import few_keys_launch


def attention_weights_plan(call: Call) -> SimpleNamespace:
    """The launch of a validated call, bound once per kind of call."""
    launch = few_keys_launch(call, weights=True)
    b, n, heads, _ = call["q"].shape
    n_k = call["k"].shape[1]

    def forward(q, k, key_mask, q_weight, k_weight):
        out = q.new_empty((b, n, heads, n_k))
        # absent operands are never read (their constexpr flags are off): q and k stand in
        launch(q, k, k, out, q if key_mask is None else key_mask,
               q if q_weight is None else q_weight, q if k_weight is None else k_weight)  # fmt: skip
        return out

    return SimpleNamespace(forward=forward)
