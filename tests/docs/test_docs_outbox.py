"""docs/outbox.md stays true to the code: its SQLite examples, and those of its "Read,
process, write exactly once" section (a Group, a Pipeline batcher, FastAPI with
SQLAlchemy on PostgreSQL), run in a fresh process in a temporary directory and print
what their comments say."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _doc_blocks import expected_output
from test_docs import ROOT

PAGE = ROOT / "docs/outbox.md"


def _section_blocks(heading: str) -> list[str]:
    """The ```python blocks of the section under ``heading`` (up to the next ``## ``)."""
    section = PAGE.read_text().split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def _run(code: str, cwd: Path, env: dict[str, str] | None = None) -> None:
    expected = expected_output(code)
    assert expected
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                         text=True, timeout=120,
                         env={**os.environ, **(env or {}), "PYTHONPATH": str(ROOT / "src")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == expected


def _runnable(heading: str, marker: str) -> str:
    [code] = [block for block in _section_blocks(heading)
              if "asyncio.run(main())" in block and marker in block]
    return code


def test_the_sqlite_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    _run(_runnable("## SQLite", "import sqlite3"), tmp_path)


def test_the_read_process_write_group_example_runs(tmp_path: Path) -> None:
    _run(_runnable("## Read, process, write exactly once", "class Billing(Consumer)"),
         tmp_path)


def test_the_read_process_write_pipeline_example_runs(tmp_path: Path) -> None:
    _run(_runnable("## Read, process, write exactly once", "confirm_settled(messages)"),
         tmp_path)


@pytest.mark.skipif(importlib.util.find_spec("fastapi") is None
                    or importlib.util.find_spec("httpx") is None,
                    reason="the FastAPI example needs fastapi and httpx")
def test_the_fastapi_example_runs(tmp_path: Path, postgres_url: str,
                                  postgres_schema: str) -> None:
    _run(_runnable("## Read, process, write exactly once", "from fastapi import"), tmp_path,
         {"DATABASE_URL": postgres_url, "OUTBOX_SCHEMA": postgres_schema})


def test_the_sync_sqlite_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    [code] = [block for block in _section_blocks("## Synchronous code")
              if "import sqlite3" in block]
    _run(code, tmp_path)


def test_the_django_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    [code] = [block for block in _section_blocks("## Synchronous code")
              if "import django" in block]
    _run(code, tmp_path)
