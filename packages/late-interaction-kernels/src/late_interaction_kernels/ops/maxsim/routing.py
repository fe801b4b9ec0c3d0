"""How a MaxSim call is routed, from its metadata alone: its sizes and layout, and which backward
method it will use. The declaration (:mod:`.op`) and the plans (:mod:`.plan`) both read these."""

from __future__ import annotations

from ..common.layout import ALL_PAIRS, GROUPED, PAIRS, VARLEN

BACKWARD_METHODS = ("auto", "unified", "lowmem")

#: All-pairs batches with at least this many (query, document) pairs go to ``lowmem`` under
#: ``auto``; ``None``: never. Measured on an H100 (BENCHMARKS.md), ``unified`` beat ``lowmem``'s
#: CSR kernel on every in-batch square (128×128 and 256×256 pairs, Ld 300 and 1030) in time and in
#: memory: the documents of an in-batch step are few, so its fp32 gradient buffer is small, while
#: the CSR kernel's sort of the argmax rows grows with the number of pairs.
AUTO_LOWMEM_MIN_PAIRS: int | None = None


def resolve_backward(
    backward: str | None, layout: int, n_query: int, n_doc: int, lq: int | None = None
) -> str:
    """The backward method a call will use: ``"unified"`` (fp32 atomics) or ``"lowmem"`` (no
    atomics, no fp32 gradient buffer).

    ``None``/``"auto"`` picks ``lowmem`` wherever it runs its dense kernel, which writes
    ``grad_D`` once with neither a sort nor an fp32 buffer: the 4-D (query × its own K documents)
    layout, pairs, and all-pairs calls whose queries hold few tokens in all (a rerank with
    gradients; ``lq`` is the query length, ``None`` if unknown). In-batch all-pairs calls and
    varlen get ``unified`` (see :data:`AUTO_LOWMEM_MIN_PAIRS`).
    """
    from .backward_plan import uses_dense_kernel

    method = "auto" if backward is None else backward
    if not isinstance(method, str) or method not in BACKWARD_METHODS:
        raise ValueError(
            f"backward={backward!r} is not a backward method; expected None or one of "
            + ", ".join(map(repr, BACKWARD_METHODS))
        )
    if method != "auto":
        return method
    if layout in (GROUPED, PAIRS) or (lq is not None and uses_dense_kernel(layout, n_query, lq)):
        return "lowmem"
    many = AUTO_LOWMEM_MIN_PAIRS is not None and n_query * n_doc >= AUTO_LOWMEM_MIN_PAIRS
    return "lowmem" if layout == ALL_PAIRS and many else "unified"


def sizes(named) -> tuple[int, int, int, int, int, tuple[int, ...]]:
    """``(layout, n_query, n_doc, lq, ld, scores' shape)`` of a checked call (``named``: its
    tensors and settings by name); the ``ALL_PAIRS`` setting with a 4-D ``D`` is ``GROUPED``."""
    layout, Q, D = named["layout"], named["Q"], named["D"]
    if layout >= VARLEN:
        nq = named["cu_seqlens_q"].shape[0] - 1
        if layout == VARLEN:
            return layout, nq, 1, named["lq"], named["ld"], (nq,)
        nd = named["cu_seqlens_d"].shape[0] - 1
        return layout, nq, nd, named["lq"], named["ld"], (nq, nd)
    nq, lq, ld = Q.shape[0], Q.shape[1], D.shape[-2]
    if layout == PAIRS:
        return PAIRS, nq, 1, lq, ld, (nq,)
    nd = D.shape[-3]
    return (GROUPED if D.dim() == 4 else ALL_PAIRS), nq, nd, lq, ld, (nq, nd)
