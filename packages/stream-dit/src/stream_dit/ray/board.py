"""Where replicas say how they are: a small Ray actor the ingress reads for ``GET /health``.

Ray Serve's router picks a replica for each call, so the ingress cannot ask one replica in
particular; instead every replica reports a snapshot of itself (state, occupancy, queue, pid)
to the board of its application twice a second, and ``/health`` lists the board's rows. A row
that has not been refreshed for :data:`STALE_S` belongs to a replica that stopped answering (it
died, or its process is stuck); it is dropped after :data:`FORGET_S`.

The board is a named actor that whoever needs it first creates (``get_if_exists``); it holds
no resources and dies with its creator, after which the next caller creates it again and the
replicas' next reports fill it. Each process reaches it through one :class:`BoardLink`, which
keeps its handle for as long as the board lives: the creator's handle going out of scope would
end the board, so a slow call (a loaded machine, the board's process still starting) is waited
out again, never answered by dropping the handle and creating a board anew.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

__all__ = [
    "CALL_TIMEOUT_S",
    "FORGET_S",
    "REPORT_EVERY_S",
    "STALE_S",
    "BoardLink",
    "ReplicaBoard",
    "board_handle",
    "board_name",
    "board_rows",
]

REPORT_EVERY_S = 0.5
#: Ten reports missed: a replica is silent, not merely slowed by a busy machine.
STALE_S = 5.0
FORGET_S = 60.0
#: How long one call to the board is awaited before the caller goes on (keeping its handle).
CALL_TIMEOUT_S = 5.0


@ray.remote(num_cpus=0, max_concurrency=64)
class ReplicaBoard:
    """The last snapshot of each replica, with its age."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[dict[str, Any], float]] = {}

    def report(self, replica: str, snapshot: dict[str, Any]) -> None:
        self._rows[replica] = (snapshot, time.monotonic())

    def forget(self, replica: str) -> None:
        self._rows.pop(replica, None)

    def rows(self) -> list[dict[str, Any]]:
        """Every replica heard from in the last :data:`FORGET_S` (see :func:`board_rows`)."""
        now = time.monotonic()
        self._rows = {k: v for k, v in self._rows.items() if now - v[1] < FORGET_S}
        return board_rows(self._rows, now)


def board_rows(
    reports: dict[str, tuple[dict[str, Any], float]], now: float
) -> list[dict[str, Any]]:
    """The rows ``/health`` lists: each replica's last snapshot with ``age_s`` and ``fresh``. A
    replica silent for :data:`STALE_S` (killed, or stuck) is listed as ``"unresponsive"`` and not
    ready, whatever it last said, its last state kept as ``last_state``."""
    rows = []
    for replica, (snapshot, at) in sorted(reports.items()):
        row = {**snapshot, "replica": replica, "age_s": round(now - at, 2)}
        row["fresh"] = now - at < STALE_S
        if not row["fresh"]:
            row.update(last_state=snapshot.get("state"), state="unresponsive", ready=False)
        rows.append(row)
    return rows


def board_name(app_name: str) -> str:
    return f"stream-dit-board:{app_name}"


def board_handle(app_name: str) -> ray.actor.ActorHandle:
    """The board of ``app_name``, created if nobody has yet."""
    return ReplicaBoard.options(name=board_name(app_name), get_if_exists=True).remote()


class BoardLink:
    """One process's way to its application's board: the handle is kept while the board lives
    and replaced only when the board is gone (its creator died), so that this process, when it
    created the board, keeps it alive."""

    def __init__(self, app_name: str) -> None:
        self.app_name = app_name
        self._board: ray.actor.ActorHandle | None = None

    async def call(self, method: str, *args: Any) -> Any:
        """``method(*args)`` on the board; raises ``TimeoutError`` after :data:`CALL_TIMEOUT_S`
        (the handle is kept: the board may only be slow) and what Ray raised when the board is
        gone (the next call finds or creates a new one)."""
        if self._board is None:
            self._board = await asyncio.to_thread(board_handle, self.app_name)
        try:
            return await asyncio.wait_for(
                getattr(self._board, method).remote(*args), CALL_TIMEOUT_S
            )
        except (RayActorError, ActorUnavailableError):
            self._board = None
            raise

    def forget(self, replica: str) -> None:
        """Drop ``replica``'s row, without waiting (a board this process never reached is left
        alone rather than created)."""
        if self._board is not None:
            self._board.forget.remote(replica)
