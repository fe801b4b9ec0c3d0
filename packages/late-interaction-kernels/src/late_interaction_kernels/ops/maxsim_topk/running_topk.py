"""The running top-k that the programs of :mod:`.kernels` share, one per query, in global memory.

Each candidate is one int64, ``(ordered key bits) << 32 | (2**32 - 1 - document)``: comparing two
of them compares the keys, and between equal keys prefers the earlier document, so candidates
have a strict total order and the state never needs a (key, index) pair kept in step.

Per query the state holds:

* ``THRESHOLD``: the ``k``-th best candidate merged so far (stored XOR ``SIGN``, so the zeroed
  state reads as "none yet"). Only ever raised; a program that reads an older value offers a few
  more candidates than it needs to, never fewer.
* ``COUNT``: candidates offered so far; offer ``n`` goes to window ``n // WINDOW`` of a ring of
  ``RING`` windows.
* per ring slot, ``WRITTEN`` (offers stored in its current window) and ``GENERATION`` (windows
  merged through it): window ``w`` may be written once slot ``w % RING`` has merged ``w // RING``
  windows, so a slot is never overwritten before its merge has read it.
* ``LOCK`` and ``KEPT``: the list of the ``K_PAD`` best candidates (sorted, best first) is changed
  under the lock by the program that completes a window.

Cross-program words are read and written with scalar atomics: one thread of the program performs
them and the result is broadcast, so every thread of a program takes the same branch.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: int64 words of state per query (the layout above, padded).
STATE_WORDS = 16
#: Windows in the ring of offered candidates.
RING = 4

_THRESHOLD = tl.constexpr(0)
_COUNT = tl.constexpr(1)
_LOCK = tl.constexpr(2)
_KEPT = tl.constexpr(3)
_WRITTEN = tl.constexpr(4)
_GENERATION = tl.constexpr(4 + RING)
_RING = tl.constexpr(RING)
#: The word counting a query's finished programs (the kernel's last program writes the results).
DONE = tl.constexpr(4 + 2 * RING)
_SIGN = tl.constexpr(-9223372036854775808)
_LOW = tl.constexpr(4294967295)


@triton.jit
def pack(score, doc, LARGEST: tl.constexpr):
    """The candidate of ``doc`` with ``score``; NaN ranks first for ``LARGEST`` and last
    otherwise, as in :func:`torch.topk`."""
    key = score if LARGEST else -score
    bits = (key + 0.0).to(tl.int32, bitcast=True)  # + 0.0: -0.0 and 0.0 are one key
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    nan_key = 2147483647 if LARGEST else -2147483648
    ordered = tl.where(score != score, nan_key, ordered)
    return (ordered.to(tl.int64) << 32) | (_LOW - doc.to(tl.int64))


@triton.jit
def unpack(packed, LARGEST: tl.constexpr):
    """``(score, document)`` of candidates made by :func:`pack`."""
    ordered = (packed >> 32).to(tl.int32)
    key = (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    doc = _LOW - (packed & _LOW)
    score = key if LARGEST else -key
    return score, doc


@triton.jit
def _atomic_read(ptr):
    return tl.atomic_add(ptr, 0)


@triton.jit
def _merge(STATE, KEPT_LIST, ENTRIES, n, k, K_PAD: tl.constexpr, SORT: tl.constexpr):
    """Merge ``n`` candidates at ``ENTRIES`` into the kept list and raise the threshold once the
    list holds ``k`` candidates."""
    free = tl.cast(0, tl.int64)
    while tl.atomic_cas(STATE + _LOCK, free, free + 1) != free:
        pass
    tl.debug_barrier()
    kept = _atomic_read(STATE + _KEPT)
    i = tl.arange(0, SORT)
    old = tl.load(KEPT_LIST + i, mask=i < kept, other=_SIGN, volatile=True)
    j = i - K_PAD
    new = tl.load(ENTRIES + j, mask=(j >= 0) & (j < n), other=_SIGN, volatile=True)
    best = tl.sort(tl.where(i < K_PAD, old, new), descending=True)
    tl.store(KEPT_LIST + i, best, mask=i < K_PAD)
    kept = tl.minimum(kept + n, K_PAD)
    tl.atomic_xchg(STATE + _KEPT, kept)
    if kept >= k:
        kth = tl.sum(tl.where(i == k - 1, best, 0))
        tl.atomic_xchg(STATE + _THRESHOLD, kth ^ _SIGN)
    tl.debug_barrier()  # every thread's share of the list is stored before the lock opens
    tl.atomic_xchg(STATE + _LOCK, 0)


@triton.jit
def offer(STATE, LIST, candidate, k, K_PAD: tl.constexpr, WINDOW: tl.constexpr, SORT: tl.constexpr):
    """Offer one candidate to a query's running top-k (``STATE``/``LIST`` are that query's)."""
    threshold = _atomic_read(STATE + _THRESHOLD) ^ _SIGN
    if candidate > threshold:
        at = tl.atomic_add(STATE + _COUNT, 1)
        window = at // WINDOW
        slot = window % _RING
        while _atomic_read(STATE + _GENERATION + slot) != window // _RING:
            pass  # the slot's previous window is still being merged
        ring = LIST + K_PAD + slot * WINDOW
        tl.atomic_xchg(ring + at % WINDOW, candidate)
        if tl.atomic_add(STATE + _WRITTEN + slot, 1) == WINDOW - 1:
            tl.atomic_xchg(STATE + _WRITTEN + slot, 0)
            _merge(STATE, LIST, ring, WINDOW, k, K_PAD, SORT)
            tl.atomic_add(STATE + _GENERATION + slot, 1)


@triton.jit
def finish(STATE, LIST, OUT_SCORE, OUT_INDEX, k, LARGEST: tl.constexpr, K_PAD: tl.constexpr,
           WINDOW: tl.constexpr, SORT: tl.constexpr):  # fmt: skip
    """After every program has offered: merge the last, partial window and write the ``k`` best,
    best first."""
    count = _atomic_read(STATE + _COUNT)
    left = count % WINDOW
    if left > 0:
        slot = (count // WINDOW) % _RING
        _merge(STATE, LIST, LIST + K_PAD + slot * WINDOW, left, k, K_PAD, SORT)
    tl.debug_barrier()
    i = tl.arange(0, K_PAD)
    score, doc = unpack(tl.load(LIST + i, mask=i < k, other=0, volatile=True), LARGEST)
    tl.store(OUT_SCORE + i, score, mask=i < k)
    tl.store(OUT_INDEX + i, doc, mask=i < k)
