"""The README's first example is what a new user pastes first: it must run without printing
anything but its own output, on a machine without a GPU too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _first_python_block(text: str) -> str:
    lines = text.splitlines()
    start = lines.index("```python") + 1
    end = lines.index("```", start)
    return "\n".join(lines[start:end]) + "\n"


def test_first_readme_example_runs_without_warnings(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(_first_python_block(README.read_text(encoding="utf-8")))
    # As a user runs it: no interpreter flag (the CPU path), the norm warning not switched off.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TRITON_INTERPRET", "LIK_SUPPRESS_NORM_WARN", "PYTHONWARNINGS")
    }
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Warning" not in proc.stderr, proc.stderr[-3000:]
