"""``rheo-flow pause`` / ``resume`` on SQLite, and how ``groups``, ``lag`` and ``top`` show
a paused group."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from rheo_flow import Rheo
from rheo_flow._cli._app import app
from rheo_flow._cli._pause import parse_duration

runner = CliRunner()


def _cli(url: str, *args: str) -> Any:
    return runner.invoke(app, list(args), env={"RHEO_URL": url, "COLUMNS": "160"})


def _lines(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.strip()]


@pytest.fixture
def store(tmp_path: Path) -> str:
    """Stream "orders" (2 partitions, 4 events) with groups "billing" and "audit"."""
    url = f"sqlite:///{tmp_path / 'pause.db'}"

    async def fill() -> None:
        async with Rheo(url) as rheo:
            await rheo.create_stream("orders", partitions=2)
            await rheo.append("orders", [{"type": "t", "data": {"n": i}} for i in range(4)])
            await rheo.create_group("orders", "billing")
            await rheo.create_group("orders", "audit")

    asyncio.run(fill())
    return url


def _fetch(url: str, group: str) -> int:
    async def go() -> int:
        async with Rheo(url) as rheo:
            return len(await rheo.fetch("orders", group, limit=10))
    return asyncio.run(go())


def test_pause_and_resume_a_group(store: str) -> None:
    paused = _cli(store, "pause", "orders", "billing")
    assert paused.exit_code == 0, paused.output
    assert "orders/billing paused until resumed" in paused.output
    assert _fetch(store, "billing") == 0
    assert _fetch(store, "audit") == 4

    groups = _cli(store, "groups", "orders")
    assert groups.exit_code == 0, groups.output
    assert "until resumed" in groups.output
    rows = {r["group"]: r for r in _lines(_cli(store, "groups", "orders", "--json").output)}
    assert (rows["billing"]["paused"], rows["billing"]["paused_until_ms"]) == (True, None)
    assert (rows["audit"]["paused"], rows["audit"]["paused_until_ms"]) == (False, None)
    lag = _lines(_cli(store, "lag", "orders", "--json").output)
    assert {(r["group"], r["paused"]) for r in lag} == {("billing", True), ("audit", False)}
    assert "until resumed" in _cli(store, "lag", "orders", "billing").output

    resumed = _cli(store, "resume", "orders", "billing", "--json")
    assert resumed.exit_code == 0, resumed.output
    assert _lines(resumed.output) == [{"stream": "orders", "group": "billing", "paused": False,
                                       "paused_until_ms": None}]
    assert _fetch(store, "billing") == 4


def test_pause_until_a_time_or_for_a_while(store: str) -> None:
    until = _cli(store, "pause", "orders", "billing", "--until", "2099-01-31T18:00:00Z",
                 "--json")
    assert until.exit_code == 0, until.output
    end = int(datetime(2099, 1, 31, 18, tzinfo=UTC).timestamp() * 1000)
    assert _lines(until.output)[0]["paused_until_ms"] == end
    naive = _cli(store, "pause", "orders", "billing", "--until", "2099-01-31T18:00:00",
                 "--json")
    assert _lines(naive.output)[0]["paused_until_ms"] == end  # no offset: UTC
    before = int(time.time() * 1000)
    for_ = _cli(store, "pause", "orders", "billing", "--for", "1h30m", "--json")
    assert for_.exit_code == 0, for_.output
    ends = _lines(for_.output)[0]["paused_until_ms"]
    assert before + 5_400_000 <= ends <= int(time.time() * 1000) + 5_400_000
    assert "until 20" in _cli(store, "groups", "orders").output


@pytest.mark.parametrize(("args", "message"), [
    (["--until", "2099-01-01T00:00:00Z", "--for", "1h"], "not both"),
    (["--for", "soon"], "expected a duration"),
    (["--for", "0s"], "must be positive"),
    (["--until", "tomorrow"], "expected an ISO 8601 time"),
])
def test_bad_pause_options_are_usage_errors(store: str, args: list[str], message: str) -> None:
    result = _cli(store, "pause", "orders", "billing", *args)
    assert result.exit_code == 2
    assert message in result.output
    assert _fetch(store, "billing") == 4  # nothing was paused


def test_a_past_time_and_a_missing_group_are_errors(store: str) -> None:
    past = _cli(store, "pause", "orders", "billing", "--until", "2001-01-01T00:00:00Z")
    assert past.exit_code == 1
    assert "until must be in the future" in past.output
    for command in ("pause", "resume"):
        missing = _cli(store, command, "orders", "nope")
        assert missing.exit_code == 1
        assert "unknown group 'nope'" in missing.output
    assert _fetch(store, "billing") == 4


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("90s", 90), ("15m", 900), ("1h30m", 5400), ("2d", 172800), ("250ms", 0.25),
    ("1.5h", 5400),
])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "h", "1x", "-5m", "1h 30m", "0"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(typer.BadParameter):
        parse_duration(text)
