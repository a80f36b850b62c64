"""docs/outbox.md stays true to the code: its SQLite example runs (in a fresh process,
in a temporary directory) and prints what its comments say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from _doc_blocks import expected_output, python_blocks
from test_docs import ROOT


def test_the_sqlite_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    [code] = [block for block in python_blocks(ROOT / "docs/outbox.md")
              if "import sqlite3" in block]
    expected = expected_output(code)
    assert expected
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == expected
