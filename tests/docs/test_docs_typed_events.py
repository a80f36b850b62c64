"""docs/typed-events.md: every example runs and prints what its closing comment says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from _doc_blocks import python_blocks

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs/typed-events.md"


def _promised(code: str) -> list[str]:
    """The ``# `` comment lines that end a block: the output it promises."""
    lines = code.rstrip().splitlines()
    tail: list[str] = []
    while lines and lines[-1].startswith("# "):
        tail.insert(0, lines.pop()[2:])
    return tail


@pytest.mark.parametrize("number", range(len(python_blocks(PAGE))))
def test_typed_events_examples_print_what_they_say(number: int, tmp_path: Path) -> None:
    code = python_blocks(PAGE)[number]
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == _promised(code)


def test_the_page_is_in_the_nav() -> None:
    assert "typed-events.md" in (ROOT / "mkdocs.yml").read_text()
