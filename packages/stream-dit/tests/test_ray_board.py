"""The health board's link: a slow board keeps its handle (dropping the creator's handle would
end the board, and a new one, still starting, would be slow again); a board that is gone is
found or created anew; rows go stale after STALE_S."""

import asyncio

import pytest

ray = pytest.importorskip("ray")

from ray.exceptions import RayActorError  # noqa: E402

from stream_dit.ray import board as board_module  # noqa: E402
from stream_dit.ray.board import STALE_S, BoardLink, board_rows  # noqa: E402


class _Method:
    def __init__(self, answer):
        self.answer = answer

    def remote(self, *args):
        return self.answer(*args)


class _FakeBoard:
    """A board handle whose calls hang (``slow``), fail as a dead actor (``dead``) or answer."""

    def __init__(self, mode: str):
        self.mode = mode
        self.calls = 0
        self.report = _Method(self._answer)
        self.rows = _Method(self._answer)

    async def _answer(self, *args):
        self.calls += 1
        if self.mode == "slow":
            await asyncio.sleep(3600)
        if self.mode == "dead":
            raise RayActorError()
        return ["row"]


@pytest.fixture
def handles(monkeypatch):
    made: list[_FakeBoard] = []
    modes = iter(["slow", "ok"])

    def fake_handle(app_name):
        assert app_name == "app"
        made.append(_FakeBoard(next(modes)))
        return made[-1]

    monkeypatch.setattr(board_module, "board_handle", fake_handle)
    monkeypatch.setattr(board_module, "CALL_TIMEOUT_S", 0.05)
    return made


def test_a_slow_board_keeps_its_handle_and_a_gone_one_is_replaced(handles):
    async def run():
        link = BoardLink("app")
        for _ in range(3):  # slow three times over: still the one handle
            with pytest.raises(TimeoutError):
                await link.call("report", "r", {})
        assert len(handles) == 1 and handles[0].calls == 3
        handles[0].mode = "dead"
        with pytest.raises(RayActorError):
            await link.call("rows")
        assert await link.call("rows") == ["row"]  # from a new handle
        assert len(handles) == 2 and handles[1].calls == 1

    asyncio.run(run())


def test_rows_go_stale_and_unready_after_stale_s():
    ready = {"state": "ready", "ready": True}
    reports = {"a": (ready, 100.0 - STALE_S + 0.1), "b": (ready, 100.0 - STALE_S - 0.1)}
    rows = {r["replica"]: r for r in board_rows(reports, now=100.0)}
    assert rows["a"]["fresh"] and rows["a"]["ready"] and rows["a"]["state"] == "ready"
    assert not rows["b"]["fresh"] and not rows["b"]["ready"]
    assert rows["b"]["state"] == "unresponsive" and rows["b"]["last_state"] == "ready"
