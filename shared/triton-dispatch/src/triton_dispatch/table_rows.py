"""Which launch-config table rows a running card reads for a regime, and in what order.

Every table of a package is read (:func:`~triton_dispatch.launch_configs.package_tables`), and
each row counts as made on its own card (:meth:`LaunchTable.row_card`). Rows of cards of the
running card's compute capability come first, ordered by how far their key is from the regime's
(:func:`~triton_dispatch.launch_configs.key_distance`) and, at one distance, the running card's
own row first, then the nearest card's: an H200 without a row of its own for a regime takes the
H100's exact row before its own row for a neighbouring regime, since the two cards run the same
code and the regime decides the tile. Rows of other compute capabilities follow, nearest card
first (:func:`~triton_dispatch.cards.nearness`), nearest key first within a card: there the card
decides more than the regime does.

Rows of an older family table (``sm90.json``, no card) are the own rows of every card of that
family, and stand for the family's first known card (:func:`~triton_dispatch.cards.family_card`)
on other cards.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .cards import Card, cards_by_nearness, family_card, nearness
from .launch_configs import LaunchTable, family_capability, key_distance

__all__ = ["RankedRow", "rows_by_nearness", "tables_by_nearness"]


@dataclass(frozen=True)
class RankedRow:
    """One table row as a running card reads it.

    Attributes:
        row: the row (``key``, ``config``, ``ms``, ``card``).
        card: the card that measured it (an older family table's: its family's first card).
        own: made on the running card (or in an older table of its family).
        distance: how far its key is from the regime's (0: the same regime).
        table: the table it is in.
    """

    row: Mapping[str, Any]
    card: Card
    own: bool
    distance: float
    table: LaunchTable


def _row_card(table: LaunchTable, row: Mapping[str, Any], running: Card) -> tuple[Card, bool]:
    card = table.row_card(row)
    if card is None:  # an older family table: every card of the family's own
        own = table.family == running.family
        return (running if own else family_card(family_capability(table.family) or (0, 0))), own
    return card, card.slug == running.slug


def rows_by_nearness(
    tables: Sequence[LaunchTable], kernel: str, key: Mapping[str, Any], card: Card
) -> list[RankedRow]:
    """The rows of ``kernel`` in ``tables`` whose key has the regime's fields, in the order a
    device that is ``card`` reads them (see the module); ``key`` as tables store it
    (:func:`~triton_dispatch.launch_configs.jsonable` values)."""
    found: list[tuple[tuple, RankedRow]] = []
    for t, table in enumerate(tables):
        for i, row in enumerate(table.kernels.get(kernel, [])):
            distance = key_distance(key, row.get("key", {}))
            if distance == math.inf:
                continue
            made_on, own = _row_card(table, row, card)
            near = (False,) if own else nearness(card, made_on)
            if own or made_on.capability == card.capability:
                order = (0, distance, near, t, i)
            else:
                order = (1, near, distance, t, i)
            found.append((order, RankedRow(row, made_on, own, distance, table)))
    return [ranked for _, ranked in sorted(found, key=lambda item: item[0])]


def tables_by_nearness(tables: Sequence[LaunchTable], card: Card) -> list[LaunchTable]:
    """``tables`` ordered by how near the card that made each is to ``card`` (its own first; an
    older family table of its family next; others by :func:`~triton_dispatch.cards.nearness`)."""
    makers = {t.name: _row_card(t, {}, card) for t in tables}
    order = cards_by_nearness(card, [made_on for made_on, _ in makers.values()])
    rank = {c.slug: i for i, c in enumerate(order)}

    def position(table: LaunchTable) -> tuple:
        made_on, own = makers[table.name]
        return (rank[made_on.slug], table.card is None and own, table.name)

    return sorted(tables, key=position)
