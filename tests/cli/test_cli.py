"""The ``rheo-flow`` command line: help, the demo, and the inspection commands."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import rheo_flow
from rheo_flow._cli._app import app

runner = CliRunner()

DEMO_ARGS = ["demo", "--events", "150", "--partitions", "3", "--workers", "2", "--rate", "0"]


def _plain(text: str) -> str:
    """The output without colour codes and table rules."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text).replace("│", " ").replace("┃", " ")


def test_help_lists_every_command() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    for command in ("demo", "streams", "groups", "lag", "dead-letters", "tail", "append",
                    "redrive", "replay", "reset", "trim", "delete-stream", "delete-group",
                    "migrate", "torture"):
        assert re.search(rf"^  {command} ", result.output, re.M), command


@pytest.mark.parametrize("command", ["demo", "streams", "lag", "tail", "append", "trim",
                                     "delete-stream", "migrate"])
def test_help_shows_no_bool_metavar(command: str) -> None:
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output
    assert "--help" in result.output


def test_no_arguments_shows_help() -> None:
    result = runner.invoke(app, [])
    assert "Usage" in _plain(result.output)
    assert "demo" in result.output


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"rheo-flow {rheo_flow.__version__}"


def test_python_dash_m_runs_the_cli() -> None:
    out = subprocess.run([sys.executable, "-m", "rheo_flow", "--version"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"rheo-flow {rheo_flow.__version__}"


def test_demo_on_default_sqlite_finishes_and_summarises() -> None:
    result = runner.invoke(app, DEMO_ARGS)
    output = _plain(result.output)
    assert result.exit_code == 0, output
    assert "Summary" in output
    assert "sqlite" in output
    assert "✓ billing: all 150 events settled" in output
    assert "✓ shipping: all 150 events settled" in output
    # The poison event is dead-lettered by billing at max_attempts (3).
    assert re.search(r"billing\s+\d+\s+\d+\s+\S+-placed\s+3\s+max_attempts", output), output
    # Piped to a file, its panels and tables stay a terminal's width.
    assert max(len(line) for line in output.splitlines()) <= 120, output[:500]


def test_demo_in_memory_non_tty_prints_progress_lines() -> None:
    result = runner.invoke(app, ["demo", "--url", "memory://", "--events", "120",
                                 "--partitions", "2", "--rate", "25"])
    output = _plain(result.output)
    assert result.exit_code == 0, output
    assert re.search(r"\[\s*\d+\.\ds\] appended \d+/120", output), output
    assert "memory" in output


def test_demo_quiet_prints_only_the_summary() -> None:
    result = runner.invoke(app, ["demo", "--url", "memory://", "--events", "60", "--quiet",
                                 "--rate", "30"])
    output = _plain(result.output)
    assert result.exit_code == 0, output
    assert "appended" not in output
    assert "Summary" in output


def test_demo_refuses_db_and_url_together(tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--db", str(tmp_path / "x.db"), "--url", "memory://"])
    assert result.exit_code == 2
    assert "not both" in result.output


def test_demo_refuses_bad_options() -> None:
    result = runner.invoke(app, ["demo", "--events", "0"])
    assert result.exit_code == 2


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite file left behind by a small demo run; returns its URL."""
    path = tmp_path_factory.mktemp("cli") / "demo.db"
    result = runner.invoke(app, [*DEMO_ARGS, "--quiet", "--db", str(path)])
    assert result.exit_code == 0, result.output
    assert path.exists()
    return f"sqlite:///{path}"


def test_streams_lists_the_demo_stream(demo_db: str) -> None:
    result = runner.invoke(app, ["streams", "--url", demo_db])
    output = _plain(result.output)
    assert result.exit_code == 0, output
    assert re.search(r"orders\s+3\s+150\s+150\s+-\s+billing, shipping", output), output


def test_lag_shows_every_partition_caught_up(demo_db: str) -> None:
    result = runner.invoke(app, ["lag", "-u", demo_db, "orders"])
    output = _plain(result.output)
    assert result.exit_code == 0, output
    rows = re.findall(r"(billing|shipping)\s+(\d)\s+([\d,]+)\s+([\d,]+)\s+(\d+)", output)
    assert len(rows) == 6, output
    assert all(high == frontier and lag == "0" for _, _, high, frontier, lag in rows)


def test_dead_letters_of_a_group(demo_db: str) -> None:
    result = runner.invoke(app, ["dead-letters", "orders", "billing"],
                           env={"RHEO_URL": demo_db})
    output = _plain(result.output)
    assert result.exit_code == 0, output
    assert "max_attempts" in output
    assert "last error" in output
    # The demo's poison event raises on every attempt: its dead letter says what.
    assert "ValueError" in output, output


def test_demo_on_an_existing_db_with_other_partitions_fails_clearly(demo_db: str) -> None:
    path = demo_db.removeprefix("sqlite:///")
    result = runner.invoke(app, ["demo", "--db", path, "--partitions", "5", "--quiet"])
    assert result.exit_code == 1
    assert "error:" in result.output
    assert "partitions" in result.output


def test_unknown_stream_is_an_error_not_a_traceback(demo_db: str) -> None:
    result = runner.invoke(app, ["lag", "--url", demo_db, "nope"])
    assert result.exit_code == 1
    assert "unknown stream 'nope'" in _plain(result.output)


def test_passwords_never_printed() -> None:
    result = runner.invoke(app, ["streams", "--url", "ftp://admin:hunter2@127.0.0.1/x"])
    assert result.exit_code == 1
    assert "hunter2" not in result.output
    assert "***" in result.output


def test_migrate_postgres_applies_the_schema_once(
        postgres_url: str, postgres_schema: str, postgres_schema_url: str) -> None:
    import asyncio

    import asyncpg

    from rheo_flow._backends.postgres._migrations import SCHEMA_VERSION

    schema, url = postgres_schema, postgres_schema_url
    for _ in range(2):  # idempotent: the second run finds the version in place
        result = runner.invoke(app, ["migrate", "--url", url])
        assert result.exit_code == 0, result.output
        assert (f"schema {schema}: version {SCHEMA_VERSION} is in place"
                in " ".join(_plain(result.output).split()))

    async def tables() -> set[str]:
        conn = await asyncpg.connect(postgres_url)
        try:
            rows = await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1",
                schema)
            return {r["table_name"] for r in rows}
        finally:
            await conn.close()

    assert {"streams", "events", "deliveries"} <= asyncio.run(tables())


def test_migrate_sqlite_creates_the_file(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    result = runner.invoke(app, ["migrate", "--url", f"sqlite:///{db}"])
    assert result.exit_code == 0, result.output
    assert db.exists()


def test_migrate_schema_option_is_postgres_only(tmp_path: Path) -> None:
    result = runner.invoke(app, ["migrate", "--url", f"sqlite:///{tmp_path / 'm.db'}",
                                 "--schema", "x"])
    assert result.exit_code == 2
    assert "PostgreSQL only" in result.output
    assert not (tmp_path / "m.db").exists()


def test_lag_counts_scheduled_events_apart(tmp_path: Path) -> None:
    import asyncio
    import json
    import time

    from rheo_flow import NewEvent, Rheo

    url = f"sqlite:///{tmp_path / 'events.db'}"

    async def fill() -> None:
        async with Rheo(url) as rheo:
            await rheo.create_stream("reminders")
            await rheo.create_group("reminders", "mail")
            later = int(time.time() * 1000) + 3_600_000
            await rheo.append("reminders", [NewEvent("t", 1, deliver_at=later),
                                            NewEvent("t", 2, deliver_at=later),
                                            NewEvent("t", 3)])

    asyncio.run(fill())
    result = runner.invoke(app, ["lag", "-u", url, "reminders", "--json"])
    assert result.exit_code == 0, result.output
    [row] = [json.loads(line) for line in result.output.splitlines()]
    assert (row["lag"], row["scheduled"]) == (3, 2)
    table = _plain(runner.invoke(app, ["lag", "-u", url, "reminders"]).output)
    assert "scheduled" in table
    assert re.search(r"mail\s+0\s+3\s+0\s+3\s+2", table), table
