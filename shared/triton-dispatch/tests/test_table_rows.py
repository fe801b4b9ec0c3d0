"""Per-card launch-config tables: their format, and the rows a running card reads in order."""

import pytest

from triton_dispatch import launch_configs as lc
from triton_dispatch.cards import describe_card, known_card
from triton_dispatch.table_rows import rows_by_nearness, tables_by_nearness

H100, H200 = known_card("NVIDIA H100 80GB HBM3"), known_card("NVIDIA H200")
A100, RTX_5090 = known_card("NVIDIA A100-SXM4-80GB"), known_card("NVIDIA GeForce RTX 5090")


def _row(n, block, card, warps=4):
    return {
        "key": {"N": n, "X": "torch.float32"},
        "config": {"kwargs": {"BLOCK": block}, "num_warps": warps, "num_stages": 2},
        "ms": 0.01,
        "card": card,
    }


def _table(card, *rows, kernel="k"):
    return {"card": card.name, "family": card.family, "card_facts": describe_card(card),
            "date": "2026-11-28", "kernels": {kernel: list(rows)}}  # fmt: skip


def test_a_table_in_the_format_has_no_problems():
    assert lc.table_problems(_table(H100, _row(64, 32, H100.name)), "h100") == []
    # a card the registry does not know records its facts
    h800 = {**_table(H100, _row(64, 32, "NVIDIA H800")), "card": "NVIDIA H800"}
    assert lc.table_problems(h800, "h800") == []
    del h800["card_facts"]
    (problem,) = lc.table_problems(h800, "h800")
    assert "not a known card" in problem and "card_facts" in problem


@pytest.mark.parametrize(
    ("change", "name", "wanted"),
    [
        (lambda t: t["kernels"]["k"][0].pop("card"), "h100", "no 'card' naming the GPU"),
        (lambda t: t.pop("card"), "h100", "names the card that made it"),
        (lambda t: None, "sm90", "names the card that made it"),  # an older family table
        (lambda t: None, "h200", "its name is h100.json"),
        (lambda t: t.update(family="sm80"), "h100", "'family' is 'sm80'"),
        (lambda t: t["kernels"]["k"][0].update(config={"num_warps": 4}), "h100", "not a stored"),
        (lambda t: t["kernels"]["k"][0].update(ms="fast"), "h100", "not a number"),
        (lambda t: t["kernels"]["k"][0].pop("key"), "h100", "no 'key' mapping"),
        (lambda t: t.update(kernels=[]), "h100", "no 'kernels' mapping"),
    ],
)
def test_table_problems_name_what_is_wrong(change, name, wanted):
    table = _table(H100, _row(64, 32, H100.name))
    change(table)
    problems = lc.table_problems(table, name)
    assert any(wanted in p for p in problems), problems


def test_reading_is_lenient_where_the_meaning_is_clear():
    bare = {"kernels": {"k": [_row(64, 32, H100.name)]}}
    assert lc.parse_table(bare, "h100").card is H100  # the stem names a known card
    older = lc.parse_table(bare, "sm90")
    assert older.card is None and older.family == "sm90"
    with pytest.warns(RuntimeWarning, match="names no card"):
        assert lc.parse_table(bare, "mystery") is None
    with pytest.warns(RuntimeWarning, match="card_facts"):
        assert lc.parse_table({**bare, "card": "X", "card_facts": {}}, "x") is None


def _read(tables, card, n, kernel="k"):
    rows = rows_by_nearness(tables, kernel, {"N": n, "X": "torch.float32"}, card)
    return [(r.card.slug, r.row["key"]["N"], r.own, r.distance) for r in rows]


def test_a_card_reads_its_own_rows_then_its_siblings_then_other_cards():
    h100 = lc.parse_table(_table(H100, _row(64, 32, H100.name), _row(1024, 128, H100.name)), "h100")
    h200 = lc.parse_table(_table(H200, _row(64, 64, H200.name)), "h200")
    a100 = lc.parse_table(_table(A100, _row(1024, 32, A100.name)), "a100")
    tables = [a100, h100, h200]
    # its own exact row first
    assert _read(tables, H200, 64)[0] == ("h200", 64, True, 0)
    # no own row for the regime: the H100's exact row comes before its own neighbour's
    assert _read(tables, H200, 1024) == [
        ("h100", 1024, False, 0), ("h200", 64, True, 4), ("h100", 64, False, 4),
        ("a100", 1024, False, 0),
    ]  # fmt: skip
    assert _read(tables, H100, 1024)[:3] == [
        ("h100", 1024, True, 0), ("h100", 64, True, 4), ("h200", 64, False, 4)
    ]  # fmt: skip
    # another compute capability: card by card, the nearest card first
    assert [s for s, *_ in _read(tables, RTX_5090, 64)] == ["a100", "h100", "h100", "h200"]
    assert [t.name for t in tables_by_nearness(tables, H200)] == ["h200", "h100", "a100"]


def test_a_row_counts_as_made_on_its_own_card():
    """A row copied into another card's file keeps its card: on the file's card it is
    borrowed, and the card that made it reads it as its own."""
    mixed = lc.parse_table(_table(H200, _row(64, 64, H100.name), _row(128, 64, H200.name)), "h200")
    assert _read([mixed], H200, 64)[0] == ("h100", 64, False, 0)
    assert _read([mixed], H100, 64)[0] == ("h100", 64, True, 0)


def test_rows_of_an_older_family_table_are_every_family_cards_own():
    older = lc.parse_table({"kernels": {"k": [_row(64, 32, "")]}}, "sm90")
    assert _read([older], H100, 64) == [("h100", 64, True, 0)]
    assert _read([older], H200, 64) == [("h200", 64, True, 0)]
    assert _read([older], A100, 64) == [("h100", 64, False, 0)]  # borrowed from its stand-in


@pytest.mark.parametrize("package", ["vq_kernels", "tomo_kplanes", "late_interaction_kernels"])
def test_shipped_tables_serve_both_cards(package):
    """The H100 and the H200 each read their own row for every regime their own tuning reached,
    and the other card's row, at the same key, for a regime only the other card's tuning reached
    (each package's test_launch_tables holds its files to the format through
    ``check_package_tables``)."""
    pytest.importorskip(package)
    shipped = lc.package_tables(package)
    assert {t.name for t in shipped} == {"h100", "h200"}
    for reader in (H100, H200):
        for table in shipped:
            for kernel, rows in table.kernels.items():
                for row in rows:
                    own = [
                        r for t in shipped for r in t.kernels.get(kernel, [])
                        if r["key"] == row["key"] and r["card"] == reader.name
                    ]  # fmt: skip
                    (first, *_) = rows_by_nearness(shipped, kernel, row["key"], reader)
                    assert first.distance == 0 and first.row["key"] == row["key"]
                    assert first.own == bool(own)
                    if own:
                        assert first.row["config"] == own[0]["config"]
