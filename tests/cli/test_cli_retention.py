"""Retention on the command line, on SQLite as an operator types it: ``create-stream
--max-age/--max-events``, ``retention`` (show, set, clear), ``trim --older-than``,
``--keep`` and ``--retention``, and the policy in ``streams``."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rheo_flow import NewEvent, Retention, Rheo
from rheo_flow._cli._app import app
from rheo_flow._cli._times import format_duration, parse_duration
from rheo_flow._support._clock import ManualClock
from rheo_flow.backends import SQLiteBackend

runner = CliRunner()


def _cli(url: str, *args: str) -> Any:
    return runner.invoke(app, list(args), env={"RHEO_URL": url})


def _rows(result: Any) -> list[dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A migrated, empty SQLite store."""
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    assert _cli(url, "migrate").exit_code == 0
    return url


def test_create_stream_with_a_policy_and_streams_shows_it(url: str) -> None:
    [row] = _rows(_cli(url, "create-stream", "audit", "-p", "2", "--max-age", "7d",
                       "--max-events", "1000000", "--json"))
    assert row == {"stream": "audit", "partitions": 2, "created": True,
                   "retention": {"max_age_ms": 7 * 86_400_000, "max_events": 1_000_000}}
    again = _cli(url, "create-stream", "audit", "-p", "2", "--max-events", "500")
    assert again.exit_code == 0, again.output
    assert "stream audit exists with 2 partition(s), retention 500 events" in again.stdout
    assert _cli(url, "create-stream", "plain").exit_code == 0
    [audit, plain] = _rows(_cli(url, "streams", "--json"))
    assert audit["retention"] == {"max_age_ms": None, "max_events": 500}
    assert plain["retention"] is None
    table = _cli(url, "streams")
    assert table.exit_code == 0, table.output
    assert "retention" in table.stdout
    assert "500 events" in table.stdout


@pytest.mark.parametrize("args", [["--max-age", "0d"], ["--max-age", "7 days"],
                                  ["--max-age", "-1h"], ["--max-events", "0"]])
def test_a_bad_policy_is_a_usage_error(url: str, args: list[str]) -> None:
    result = _cli(url, "create-stream", "s", *args)
    assert result.exit_code == 2, result.output
    assert "--max-" in result.output
    assert _rows(_cli(url, "streams", "--json")) == []  # nothing was created


def test_retention_shows_sets_and_clears(url: str) -> None:
    assert _cli(url, "create-stream", "orders").exit_code == 0
    shown = _cli(url, "retention", "orders")
    assert "orders: no retention policy" in shown.stdout
    assert _rows(_cli(url, "retention", "orders", "--max-age", "36h", "--json")) == [
        {"stream": "orders", "retention": {"max_age_ms": 36 * 3_600_000, "max_events": None}}]
    assert "orders: retention is 36h" in _cli(url, "retention", "orders").stdout
    both = _cli(url, "retention", "orders", "--max-age", "90s", "--max-events", "3")
    assert "orders: retention set to 90s or 3 events" in both.stdout
    assert "retention cleared" in _cli(url, "retention", "orders", "--none").stdout
    assert _rows(_cli(url, "retention", "orders", "--json")) == [
        {"stream": "orders", "retention": None}]
    mixed = _cli(url, "retention", "orders", "--none", "--max-events", "3")
    assert mixed.exit_code == 2, mixed.output
    missing = _cli(url, "retention", "nope", "--max-events", "3")
    assert missing.exit_code != 0
    assert "nope" in missing.output


def _stamped(path: Path) -> None:
    """Stream ``orders``: 4 events appended 2 days ago and 3 now, in partition 0;
    group ``g`` settled all but the last."""
    clock = ManualClock()

    async def go() -> None:
        async with Rheo(SQLiteBackend(path, clock=clock)) as rheo:
            await rheo.create_stream("orders")
            await rheo.append("orders", [NewEvent("t", {"n": n}) for n in range(4)])
            clock.advance(2 * 86_400_000)
            await rheo.append("orders", [NewEvent("t", {"n": n}) for n in range(3)])
            leases = await rheo.fetch("orders", "g", limit=6)
            await rheo.ack(leases)

    asyncio.run(go())


def _removed(result: Any) -> int:
    return sum(row["removed"] for row in _rows(result))


def test_trim_older_than_and_keep(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    _stamped(path)
    url = f"sqlite:///{path}"
    # The clock of the events is 2023's: every one is older than a day by now; the
    # group has settled six, so no more than six go.
    assert _removed(_cli(url, "trim", "orders", "--keep", "5", "--yes", "--json")) == 2
    assert _removed(_cli(url, "trim", "orders", "--older-than", "1d", "--yes", "--json")) == 4
    assert _removed(_cli(url, "trim", "orders", "--keep", "1", "--force", "--yes",
                         "--json")) == 0
    mixed = _cli(url, "trim", "orders", "--keep", "1", "--up-to", "3", "--yes")
    assert mixed.exit_code == 2, mixed.output
    bad = _cli(url, "trim", "orders", "--older-than", "soon", "--yes")
    assert bad.exit_code == 2
    assert "--older-than" in bad.output


def test_trim_by_the_stored_policy(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    _stamped(path)
    url = f"sqlite:///{path}"
    none = _cli(url, "trim", "orders", "--retention", "--yes")
    assert none.exit_code != 0
    assert "no retention policy" in none.output
    assert _cli(url, "retention", "orders", "--max-events", "2").exit_code == 0
    assert _removed(_cli(url, "trim", "orders", "--retention", "--yes", "--json")) == 5

    async def left() -> tuple[int, Retention | None]:
        async with Rheo(url) as rheo:
            info = await rheo.stream_info("orders")
            return info.low_water[0], info.retention

    assert asyncio.run(left()) == (6, Retention(max_events=2))


def test_durations() -> None:
    assert parse_duration("7d") == timedelta(days=7)
    assert parse_duration("1500ms") == timedelta(milliseconds=1500)
    assert [format_duration(ms) for ms in (604_800_000, 90_000, 1500, 3_600_000)] == [
        "7d", "90s", "1500ms", "1h"]
