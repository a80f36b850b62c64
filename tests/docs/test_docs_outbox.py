"""docs/outbox.md stays true to the code: its SQLite examples run (in a fresh process,
in a temporary directory) and print what their comments say. The PostgreSQL ones run
in tests/backends/postgres/ (they need the server)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from _doc_blocks import expected_output
from test_docs import ROOT


def _section_blocks(heading: str) -> list[str]:
    """The ```python blocks of the page's section ``## heading``."""
    page = (ROOT / "docs/outbox.md").read_text()
    section = page.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def _runs_and_prints_what_it_says(code: str, cwd: Path) -> None:
    expected = expected_output(code)
    assert expected
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == expected


def test_the_sqlite_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    [code] = [block for block in _section_blocks("SQLite") if "import sqlite3" in block]
    _runs_and_prints_what_it_says(code, tmp_path)


def test_the_sync_sqlite_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    [code] = [block for block in _section_blocks("Synchronous code")
              if "import sqlite3" in block]
    _runs_and_prints_what_it_says(code, tmp_path)


def test_the_django_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    [code] = [block for block in _section_blocks("Synchronous code")
              if "import django" in block]
    _runs_and_prints_what_it_says(code, tmp_path)
