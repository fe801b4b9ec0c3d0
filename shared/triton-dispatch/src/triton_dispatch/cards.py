"""The GPUs launch-config tables are made on, and which of them is nearest a given card.

Tables are per card, not per compute capability: an H100 and an H200 are both sm_90 but read
memory at 3.35 and 4.8 TB/s, and a read-bound kernel's best tile differs between them. A
:class:`Card` says how ``torch.cuda.get_device_name`` names it (a pattern), its slug (the stem of
its table file: ``h100`` → ``<package>/launch_configs/h100.json``), its compute capability,
memory bandwidth, SM count and shared memory per block (its supported target's,
:data:`~triton_dispatch.gpu_targets.TARGETS`).

A card the registry does not know (an H800, next year's RTX) is described from its device facts
(:func:`card_of`; the bandwidth from the memory clock and bus width the driver reports), and a
table made on it records those facts (:func:`describe_card`), so it still finds the tables
nearest it and they find it. :func:`nearness` orders cards: the same compute capability first,
then the same major version, then cards with no more shared memory per block than it has (their
rows were tuned within its limit), then the closest memory bandwidth, then the closest SM count.
Whether a borrowed row fits is decided on the compiled kernel by the runtime guard
(:mod:`triton_dispatch.shared_memory`), not here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .device import DeviceFacts
from .gpu_targets import target_of

__all__ = [
    "KNOWN_CARDS",
    "Card",
    "as_card",
    "card_by_slug",
    "card_from_description",
    "card_of",
    "cards_by_nearness",
    "describe_card",
    "family_card",
    "known_card",
    "nearness",
    "slug_of",
]


@dataclass(frozen=True)
class Card:
    """One GPU model as tables know it.

    Attributes:
        slug: the stem of its table files (``"h100"``).
        name: a name the driver reports for it (``"NVIDIA H100 80GB HBM3"``).
        capability: its compute capability, ``(9, 0)``.
        memory_bandwidth_gbs: peak device-memory bandwidth in GB/s (0 when unknown).
        sm_count: streaming multiprocessors (0 when unknown).
        shared_memory_per_block: the most shared memory one program may use, in bytes.
        pattern: the regular expression that recognises its reported names (``None`` for a card
            described from its facts).
    """

    slug: str
    name: str
    capability: tuple[int, int]
    memory_bandwidth_gbs: float
    sm_count: int
    shared_memory_per_block: int
    pattern: str | None = None

    @property
    def family(self) -> str:
        """Its compute-capability family, ``"sm90"``."""
        return f"sm{self.capability[0]}{self.capability[1]}"

    def facts(self) -> DeviceFacts:
        """What this card reports, for :func:`~triton_dispatch.device.simulated_device`."""
        return DeviceFacts(
            name=self.name,
            capability=self.capability,
            sm_count=self.sm_count,
            shared_memory_per_block=self.shared_memory_per_block,
            total_memory=0,
            memory_bandwidth_gbs=self.memory_bandwidth_gbs,
        )


def _known(
    slug: str, name: str, pattern: str, capability: tuple[int, int], gbs: float, sms: int
) -> Card:
    target = target_of(capability)
    assert target is not None, f"{slug}: no supported target for sm_{capability}"
    return Card(slug, name, capability, gbs, sms, target.shared_memory_per_block, pattern)


#: The cards the registry knows, in matching order (a more specific pattern before a general
#: one: ``H100 NVL`` and ``H100 ... PCIe`` before ``H100``, which stands for the SXM card).
#: Bandwidths and SM counts are NVIDIA's published figures for each card.
KNOWN_CARDS: tuple[Card, ...] = (
    _known("a100", "NVIDIA A100-SXM4-80GB", r"\bA100\b", (8, 0), 2039, 108),
    _known("a10", "NVIDIA A10", r"\bA10\b", (8, 6), 600, 72),
    _known("rtx3090", "NVIDIA GeForce RTX 3090", r"\bRTX 3090\b", (8, 6), 936, 82),
    _known("rtx-a6000", "NVIDIA RTX A6000", r"\bRTX A6000\b", (8, 6), 768, 84),
    _known("rtx4090", "NVIDIA GeForce RTX 4090", r"\bRTX 4090\b", (8, 9), 1008, 128),
    _known("l4", "NVIDIA L4", r"\bL4\b", (8, 9), 300, 58),
    _known("l40s", "NVIDIA L40S", r"\bL40S\b", (8, 9), 864, 142),
    _known("h100-nvl", "NVIDIA H100 NVL", r"\bH100 NVL\b", (9, 0), 3900, 132),
    _known("h100-pcie", "NVIDIA H100 PCIe", r"\bH100\b.*\bPCIe\b", (9, 0), 2000, 114),
    _known("h100", "NVIDIA H100 80GB HBM3", r"\bH100\b", (9, 0), 3350, 132),
    _known("h200-nvl", "NVIDIA H200 NVL", r"\bH200 NVL\b", (9, 0), 4800, 132),
    _known("h200", "NVIDIA H200", r"\bH200\b", (9, 0), 4800, 132),
    _known("gh200-hbm3e", "NVIDIA GH200 144G HBM3e", r"\bGH200\b.*\bHBM3e\b", (9, 0), 4900, 132),
    _known("gh200", "NVIDIA GH200 480GB", r"\bGH200\b", (9, 0), 4000, 132),
    _known("b200", "NVIDIA B200", r"\bB200\b", (10, 0), 8000, 148),
    _known("rtx5090", "NVIDIA GeForce RTX 5090", r"\bRTX 5090\b", (12, 0), 1792, 170),
    _known(
        "rtx-pro-6000",
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        r"\bRTX PRO 6000\b",
        (12, 0),
        1792,
        188,
    ),
)


def _require_name(name: Any, argument: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"{argument} must be a card name (str), got {type(name).__name__}")
    return name


def known_card(name: str) -> Card | None:
    """The registry's card for a reported device name (``"NVIDIA H200"`` → ``h200``), or
    ``None``. Matching ignores case."""
    _require_name(name, "name")
    return next((c for c in KNOWN_CARDS if re.search(c.pattern, name, re.IGNORECASE)), None)


def card_by_slug(slug: str) -> Card | None:
    """The registry's card of a table stem (``"h100"``), or ``None``."""
    _require_name(slug, "slug")
    return next((c for c in KNOWN_CARDS if c.slug == slug), None)


def slug_of(name: str) -> str:
    """The table stem of a card's name: the registry's slug, else the name in lower case with
    the vendor words and any parenthesis dropped and other characters folded to ``-``
    (``"NVIDIA H800"`` → ``"h800"``)."""
    known = known_card(name)
    if known is not None:
        return known.slug
    words = re.sub(r"\(.*?\)", " ", name.lower())
    words = re.sub(r"\b(nvidia|geforce)\b", " ", words)
    return re.sub(r"[^a-z0-9]+", "-", words).strip("-") or "unknown"


def card_of(facts: DeviceFacts) -> Card:
    """The card a device is: the registry's when it knows the name, else one described by the
    device's own facts (compute capability, bandwidth, SM count, shared memory)."""
    if not isinstance(facts, DeviceFacts):
        raise TypeError(f"facts must be DeviceFacts, got {type(facts).__name__}")
    known = known_card(facts.name)
    if known is not None:
        return known
    return Card(
        slug_of(facts.name),
        facts.name,
        tuple(facts.capability),
        float(facts.memory_bandwidth_gbs),
        int(facts.sm_count),
        int(facts.shared_memory_per_block),
    )


def family_card(capability: tuple[int, int]) -> Card:
    """The card a bare compute capability stands for: its supported target's first card (an
    H100 for ``(9, 0)``, what family tables were made on), else the registry's first card of
    it, else a card with only that capability."""
    capability = tuple(capability)
    target = target_of(capability)
    stand_in = known_card(target.cards.split(",")[0]) if target is not None else None
    if stand_in is not None and stand_in.capability == capability:
        return stand_in
    known = next((c for c in KNOWN_CARDS if c.capability == capability), None)
    if known is not None:
        return known
    smem = target.shared_memory_per_block if target is not None else 0
    family = f"sm{capability[0]}{capability[1]}"
    return Card(family, family, capability, 0.0, 0, smem)


def as_card(card: Card | tuple[int, int]) -> Card:
    """``card`` itself, or the card a compute capability stands for (:func:`family_card`)."""
    if isinstance(card, Card):
        return card
    if (
        isinstance(card, tuple)
        and len(card) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in card)
    ):
        return family_card(card)
    raise TypeError(f"card must be a Card or a compute capability (major, minor), got {card!r}")


def describe_card(card: Card) -> dict[str, Any]:
    """What a table records of the card that made it (``card_facts``), so that a card the
    registry does not know can be ranked by those who read its table."""
    return {
        "capability": list(card.capability),
        "memory_bandwidth_gbs": card.memory_bandwidth_gbs,
        "sm_count": card.sm_count,
        "shared_memory_per_block": card.shared_memory_per_block,
    }


def card_from_description(
    name: str, described: Mapping[str, Any] | None = None, *, capability: tuple[int, int] | None
) -> Card:
    """The card a table names: the registry's for a known name, else one built from the table's
    ``card_facts`` (``described``), else one with only ``capability`` (its family's).
    ``ValueError`` when ``card_facts`` is malformed."""
    _require_name(name, "name")
    known = known_card(name)
    if known is not None:
        return known
    if described is None:
        base = family_card(capability or (0, 0))
        return Card(slug_of(name), name, base.capability, 0.0, 0, base.shared_memory_per_block)
    try:
        major, minor = (int(v) for v in described["capability"])
        return Card(
            slug_of(name),
            name,
            (major, minor),
            float(described.get("memory_bandwidth_gbs", 0.0)),
            int(described.get("sm_count", 0)),
            int(described["shared_memory_per_block"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"card_facts of {name!r} are malformed: {exc!r}") from None


def _log_gap(a: float, b: float) -> float:
    """Octaves between two positive figures; unknown (0) is infinitely far."""
    return abs(math.log2(a / b)) if a > 0 and b > 0 else math.inf


def nearness(card: Card, other: Card) -> tuple:
    """How near ``other``'s launch configs are to what suits ``card``, as a sort key (smaller is
    nearer; ``card`` itself is nearest): the same compute capability, the same major version,
    no more shared memory per block than ``card``, the closest memory bandwidth and SM count (on
    a log scale), the closest compute capability, the older card, the slug."""
    number = card.capability[0] * 10 + card.capability[1]
    other_number = other.capability[0] * 10 + other.capability[1]
    if other.capability == card.capability:
        tier = 0
    elif other.capability[0] == card.capability[0]:
        tier = 1
    else:
        tier = 2
    return (
        other.slug != card.slug,
        tier,
        other.shared_memory_per_block > card.shared_memory_per_block,
        _log_gap(other.memory_bandwidth_gbs, card.memory_bandwidth_gbs),
        _log_gap(other.sm_count, card.sm_count),
        abs(other_number - number),
        other_number,
        other.slug,
    )


def cards_by_nearness(card: Card, others: Iterable[Card]) -> list[Card]:
    """``others`` (each slug once), nearest ``card`` first (:func:`nearness`)."""
    unique = {c.slug: c for c in others}
    return sorted(unique.values(), key=lambda other: nearness(card, other))
