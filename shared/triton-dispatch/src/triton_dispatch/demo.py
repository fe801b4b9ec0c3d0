"""The contract between a package's demo and the workspace's ``demo`` command.

A package registers ``run_demo(output_dir: pathlib.Path) -> DemoResult`` under the entry-point
group :data:`DEMO_ENTRY_POINT_GROUP`; the runner calls each one and prints one line per package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DEMO_ENTRY_POINT_GROUP = "triton_dispatch.demos"


@dataclass
class DemoResult:
    """What a demo reports.

    Attributes:
        summary: what ran, in a few words.
        backend: the backend that ran it (``"triton"``, ``"interpret"`` or ``"torch"``).
        key_figure: the one number a user should look at, with its unit.
        outputs: files the demo wrote.
    """

    summary: str
    backend: str
    key_figure: str
    outputs: list[Path] = field(default_factory=list)
