"""Every Python code block of the READMEs runs as written, each in a fresh interpreter, as a user
who pasted it would run it (on a machine without CUDA: the PyTorch reference path, no interpreter
flag), so the examples cannot rot.

Markers, an HTML comment on the line before a block (invisible on the rendered page):

* ``<!-- snippet: cuda -->`` — needs a GPU: skipped without one (the GPU runner runs it);
* ``<!-- snippet: continue -->`` — runs after the file's previous block, in the same interpreter;
* ``<!-- snippet: slow -->`` — runs for minutes on a CPU (marked ``slow``; still part of the suite);
* ``<!-- snippet: skip REASON -->`` — not run by this suite; REASON says where it is tested.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
READMES = [
    ROOT / "README.md",
    ROOT / "shared" / "triton-dispatch" / "README.md",
    *sorted((ROOT / "packages").glob("*/README.md")),
]
_MARKER = re.compile(r"^<!--\s*snippet:\s*(cuda|continue|skip|slow)\b\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int
    code: str
    marker: str | None
    reason: str

    @property
    def id(self) -> str:
        return f"{self.path.parent.name or 'root'}:{self.line}"


def snippets(path: Path) -> list[Snippet]:
    """The ``python`` blocks of one Markdown file, with their markers."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i + 1
            end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
            before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            match = _MARKER.match(before)
            found.append(
                Snippet(
                    path,
                    start + 1,
                    textwrap.dedent("\n".join(lines[start:end])),
                    match.group(1) if match else None,
                    match.group(2) if match else "",
                )
            )
            i = end
        i += 1
    return found


ALL = [s for readme in READMES for s in snippets(readme)]


def test_every_readme_has_its_blocks_found():
    assert len(ALL) >= 8
    for snippet in ALL:
        assert snippet.code.strip(), snippet.id


PARAMS = [
    pytest.param(
        s,
        id=s.id,
        marks=[pytest.mark.slow, pytest.mark.timeout(1000)] if s.marker == "slow" else [],
    )
    for s in ALL
]


@pytest.mark.parametrize("snippet", PARAMS)
def test_readme_snippet_runs(snippet: Snippet, tmp_path):
    if snippet.marker == "skip":
        pytest.skip(snippet.reason or "marked skip")
    blocks = snippets(snippet.path)
    chain = [snippet]
    index = blocks.index(snippet)
    while chain[0].marker == "continue" and index > 0:
        index -= 1
        chain.insert(0, blocks[index])
    if any(s.marker == "cuda" for s in chain) and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if any(s.marker == "skip" for s in chain):
        pytest.skip("continues a block marked skip")
    code = "\n\n".join(s.code for s in chain)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = tmp_path / "snippet.py"  # as a user saves it (Triton reads a kernel's source file)
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900 if snippet.marker == "slow" else 300,
    )
    assert proc.returncode == 0, f"{snippet.id}:\n{proc.stderr[-3000:]}"
