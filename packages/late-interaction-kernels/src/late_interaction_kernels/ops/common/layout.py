"""The one problem form every backend solves.

Each public layout is flattened to token matrices ``Q2 (query rows, d)`` and ``D2 (document rows,
d)`` plus a list of *pairs* (query, document) to score:

* ``ALL_PAIRS`` — pair ``p`` = query ``p // n_doc`` × document ``p % n_doc`` (3-D ``maxsim``);
* ``GROUPED``   — pair ``p`` = query ``p // n_doc`` × document ``p`` (4-D ``maxsim``, ``n_doc = K``);
* ``PAIRS``     — pair ``p`` = query ``p`` × document ``p`` (``maxsim_pairs``, ``n_doc = 1``);
* ``VARLEN``    — as ``PAIRS``, with token rows found through ``cu_seqlens`` (``maxsim_varlen``);
* ``VARLEN_ALL_PAIRS`` — as ``ALL_PAIRS``, with token rows found through ``cu_seqlens``
  (the packed all-pairs ``maxsim_varlen``: no padded copy of either side).

Padded layouts store query ``i`` at rows ``[i·lq, (i+1)·lq)`` and document ``j`` at
``[j·ld, (j+1)·ld)``. Argmax indices are stored as *global* rows of ``D2`` (``-1``: no winner), so
the backward kernels need no layout knowledge to find a winning document token.
"""

from __future__ import annotations

ALL_PAIRS = 0
GROUPED = 1
PAIRS = 2
VARLEN = 3
VARLEN_ALL_PAIRS = 4


def num_pairs(layout: int, n_query: int, n_doc: int) -> int:
    return n_query * n_doc if layout in (ALL_PAIRS, GROUPED, VARLEN_ALL_PAIRS) else n_query
