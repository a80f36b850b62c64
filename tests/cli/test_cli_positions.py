"""``rheo-flow create-stream``, ``create-group``, and times as positions of ``replay`` and
``reset`` (``--from-time``, ``--to TIME``), on SQLite, as an operator types them."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rheo_flow import NewEvent, Rheo
from rheo_flow._cli._app import app
from rheo_flow._cli._times import parse_time
from rheo_flow._support._clock import ManualClock
from rheo_flow.backends import SQLiteBackend

runner = CliRunner()


def _cli(url: str, *args: str) -> Any:
    return runner.invoke(app, list(args), env={"RHEO_URL": url})


def _json(result: Any) -> dict[str, Any]:
    assert result.exit_code == 0, result.output
    [line] = [line for line in result.stdout.splitlines() if line.strip()]
    row: dict[str, Any] = json.loads(line)
    return row


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A migrated, empty SQLite store."""
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    assert _cli(url, "migrate").exit_code == 0
    return url


def test_create_stream_and_group(url: str) -> None:
    assert _json(_cli(url, "create-stream", "orders", "-p", "3", "--json")) == {
        "stream": "orders", "partitions": 3, "created": True, "retention": None}
    again = _cli(url, "create-stream", "orders", "-p", "3")
    assert again.exit_code == 0, again.output
    assert "stream orders exists with 3 partition(s)" in again.stdout
    other = _cli(url, "create-stream", "orders", "-p", "4")
    assert other.exit_code != 0
    assert "3" in other.output
    assert _json(_cli(url, "create-group", "orders", "billing", "--ordering", "key",
                      "--max-attempts", "4", "--json")) == {
        "stream": "orders", "group": "billing", "ordering": "key", "max_attempts": 4,
        "created": True}
    rows = [json.loads(line) for line in _cli(url, "groups", "orders", "--json").stdout
            .splitlines() if line.strip()]
    assert [(r["group"], r["ordering"], r["max_attempts"]) for r in rows] == [
        ("billing", "key", 4)]
    table = _cli(url, "groups", "orders")
    assert table.exit_code == 0, table.output
    assert "ordering" in table.stdout
    assert "key" in table.stdout
    assert _cli(url, "create-group", "orders", "billing", "--ordering", "sideways").exit_code == 2
    refused = _cli(url, "create-group", "orders", "billing")  # ordering none: not billing's
    assert refused.exit_code != 0
    assert "ordering" in refused.output


def test_create_group_starting_at_a_position(url: str) -> None:
    stamps = asyncio.run(_two_moments(url))
    later = _json(_cli(url, "create-group", "orders", "late", "--start", "latest", "--json"))
    assert later["created"] is True
    _json(_cli(url, "create-group", "orders", "timed", "--start", _iso(stamps[1]), "--json"))
    _json(_cli(url, "create-group", "orders", "after", "--start", "1", "--json"))
    assert asyncio.run(_frontiers(url, "late", "timed", "after")) == [{0: 2}, {0: 1}, {0: 1}]


async def _two_moments(url: str) -> list[int]:
    """Stream ``orders`` with two events stamped a minute apart (a manual clock), their
    stamps."""
    clock = ManualClock()
    async with Rheo(SQLiteBackend(url.removeprefix("sqlite:///"), clock=clock)) as rheo:
        await rheo.create_stream("orders")
        [first] = await rheo.append("orders", NewEvent("t", {"n": 1}))
        clock.advance(60_000)
        [second] = await rheo.append("orders", NewEvent("t", {"n": 2}))
        return [first.appended_at_ms, second.appended_at_ms]


async def _frontiers(url: str, *groups: str) -> list[dict[int, int]]:
    async with Rheo(url) as rheo:
        return [await rheo.frontier("orders", group) for group in groups]


def test_replay_and_reset_to_a_time(url: str) -> None:
    first, second = asyncio.run(_two_moments(url))
    _json(_cli(url, "create-group", "orders", "g", "--start", "latest", "--json"))
    row = _json(_cli(url, "replay", "orders", "g", "--from-time", _iso(second), "--yes",
                     "--json"))
    assert row["from_time"] == _iso(second)
    assert asyncio.run(_frontiers(url, "g")) == [{0: 1}]
    row = _json(_cli(url, "reset", "orders", "g", "--to", _iso(first), "--yes", "--json"))
    assert row["to"] == _iso(first)
    assert asyncio.run(_frontiers(url, "g")) == [{0: 0}]
    shown = _cli(url, "reset", "orders", "g", "--to", "-1d", "--yes")
    assert shown.exit_code == 0, shown.output
    assert "reset to 20" in shown.stdout  # the time it resolved to, not "-1d"
    assert asyncio.run(_frontiers(url, "g")) == [{0: 2}]  # both stamped in 2023
    both = _cli(url, "replay", "orders", "g", "--from", "2", "--from-time", "-1h", "--yes")
    assert both.exit_code == 2
    assert "not both" in both.output
    naive = _cli(url, "reset", "orders", "g", "--to", "2026-12-07T09:30:00", "--yes")
    assert naive.exit_code == 2
    assert "has no timezone" in naive.output


def test_parse_time() -> None:
    now = datetime(2026, 12, 7, 9, 30, tzinfo=UTC)
    assert parse_time("-15m", now=now) == now - timedelta(minutes=15)
    assert parse_time("-2d", now=now) == now - timedelta(days=2)
    assert parse_time("2026-12-07T09:30:00Z") == now
    assert parse_time("2026-12-07T10:30+01:00") == now
    with pytest.raises(Exception, match="expected an ISO 8601 time"):
        parse_time("yesterday")
