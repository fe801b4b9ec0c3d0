"""The registry of known cards: names as the driver reports them, their facts, and nearness."""

import pytest

from triton_dispatch.cards import (
    KNOWN_CARDS,
    as_card,
    card_by_slug,
    card_from_description,
    card_of,
    cards_by_nearness,
    describe_card,
    family_card,
    known_card,
    slug_of,
)
from triton_dispatch.device import DeviceFacts
from triton_dispatch.gpu_targets import TARGETS, target_of


@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA GH200 144G HBM3e", "gh200-hbm3e"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA GeForce RTX 5090", "rtx5090"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("nvidia h200", "h200"),  # case does not matter
    ],
)
def test_reported_names_find_their_card(name, slug):
    assert known_card(name).slug == slug and slug_of(name) == slug


def test_unknown_names_are_no_known_card_and_get_a_slug_of_their_own():
    assert known_card("NVIDIA H800") is None and slug_of("NVIDIA H800") == "h800"
    ada = "NVIDIA RTX 6000 Ada Generation"  # not the RTX PRO 6000 (Blackwell)
    assert known_card(ada) is None and slug_of(ada) == "rtx-6000-ada-generation"
    with pytest.raises(TypeError, match="name"):
        known_card(None)


def test_the_registry_agrees_with_itself_and_with_the_targets():
    slugs = [c.slug for c in KNOWN_CARDS]
    assert len(set(slugs)) == len(slugs)
    for card in KNOWN_CARDS:
        assert known_card(card.name) is card and card_by_slug(card.slug) is card
        assert card.shared_memory_per_block == target_of(card.capability).shared_memory_per_block
        assert card.memory_bandwidth_gbs > 0 and card.sm_count > 0
    # a simulated target's name (what the target checks run as) is its family's card
    for target in TARGETS:
        assert known_card(target.facts().name) is family_card(target.compute_capability)
    assert family_card((9, 0)).slug == "h100" and family_card((12, 0)).slug == "rtx5090"
    assert family_card((7, 5)).slug == "sm75"  # no known card: the capability alone


def test_a_device_the_registry_does_not_know_is_described_by_its_facts():
    h800 = DeviceFacts("NVIDIA H800", (9, 0), 132, 232_448, 0, memory_bandwidth_gbs=3352.3)
    card = card_of(h800)
    assert (card.slug, card.family, card.memory_bandwidth_gbs) == ("h800", "sm90", 3352.3)
    assert card_of(known_card("NVIDIA H200").facts()).slug == "h200"
    # what a table made there records brings the same card back
    assert card_from_description(card.name, describe_card(card), capability=None) == card
    with pytest.raises(ValueError, match="card_facts"):
        card_from_description("NVIDIA H800", {"capability": "nine"}, capability=None)
    with pytest.raises(TypeError, match="facts"):
        card_of("NVIDIA H100")
    with pytest.raises(TypeError, match="card"):
        as_card("sm90")


def hopper(name, gbs):
    """A Hopper card the registry does not know, as its device facts describe it."""
    return card_of(DeviceFacts(name, (9, 0), 132, 232_448, 0, memory_bandwidth_gbs=gbs))


def _order(card, *names):
    return [c.slug for c in cards_by_nearness(card, [known_card(n) for n in names])]


def test_nearest_card_order():
    tables = ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA B200")
    # an H200 reads its own table, then the H100's (same capability), then by bandwidth
    assert _order(known_card("NVIDIA H200"), *tables) == ["h200", "h100", "b200", "a100"]
    assert _order(known_card("NVIDIA H100 80GB HBM3"), *tables) == ["h100", "h200", "a100", "b200"]
    assert _order(known_card("NVIDIA H200"), *tables[:1], *tables[2:])[0] == "h100"
    # the H100 PCIe (2 TB/s) is nearer the H100 SXM than the H200
    assert _order(known_card("NVIDIA H100 PCIe"), *tables[:2]) == ["h100", "h200"]
    # an unknown Hopper: the Hopper tables first, the closest bandwidth first (4.0 TB/s is
    # nearer the H100's 3.35 than the H200's 4.8 on a log scale)
    assert _order(hopper("NVIDIA H20", 4000), *tables) == ["h100", "h200", "a100", "b200"]
    assert _order(hopper("NVIDIA H20 141GB", 4600), *tables)[:2] == ["h200", "h100"]
    blind = card_of(DeviceFacts("NVIDIA H800", (9, 0), 132, 232_448, 0))  # no bandwidth known
    assert set(_order(blind, *tables)[:2]) == {"h100", "h200"}
    # an RTX 5090 (99 KB per block): a card tuned within its shared memory first, then the
    # nearest bandwidth (1792 GB/s: the A100's 2039, the H100's 3350, the H200's 4800)
    rtx5090 = known_card("NVIDIA GeForce RTX 5090")
    assert _order(rtx5090, *tables, "NVIDIA GeForce RTX 4090") == [
        "rtx4090", "a100", "h100", "h200", "b200"
    ]  # fmt: skip
    assert _order(rtx5090, "NVIDIA H200", "NVIDIA H100 80GB HBM3") == ["h100", "h200"]
