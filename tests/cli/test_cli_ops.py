"""The operator commands of ``rheo-flow`` on SQLite: reads, appends, and the destructive ones."""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rheo_flow import Group, NewEvent, Query, Rheo, consumer
from rheo_flow._cli._app import app

runner = CliRunner()


def _lines(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.strip()]


def _cli(url: str, *args: str, input: str | None = None) -> Any:
    return runner.invoke(app, list(args), input=input, env={"RHEO_URL": url})


def _state(url: str, stream: str, group: str) -> tuple[dict[int, int], int]:
    """A group's frontier and how many dead letters it has."""
    async def read() -> tuple[dict[int, int], int]:
        async with Rheo(url) as rheo:
            return (await rheo.frontier(stream, group),
                    len(await rheo.dead_letters(stream, group)))
    return asyncio.run(read())


@pytest.fixture
def store(tmp_path: Path) -> str:
    """An SQLite store with stream "orders" (2 partitions, 3 events each) and groups
    "billing" (4 acked, (0, 3) dead-lettered, (1, 3) leased) and "audit" (nothing fetched)."""
    url = f"sqlite:///{tmp_path / 'ops.db'}"

    async def fill() -> None:
        async with Rheo(url) as rheo:
            await rheo.create_stream("orders", partitions=2)
            await rheo.append("orders", [NewEvent("order.placed", {"n": i}, id=f"o-{i}",
                                                  partition=i % 2) for i in range(6)])
            await rheo.create_group("orders", "audit")
            leases = await rheo.fetch("orders", "billing", limit=6)
            leases.sort(key=lambda lease: (lease.partition, lease.sequence))
            await rheo.ack([lease for lease in leases if lease.sequence <= 2])
            await rheo.reject([lease for lease in leases if lease.sequence == 3][:1], "poison")
            # Left: (1, 3) leased. Frontiers: 3 in partition 0 (the dead letter is settled), 2.

    asyncio.run(fill())
    return url


def test_streams_and_groups_json(store: str) -> None:
    result = _cli(store, "streams", "--json")
    assert result.exit_code == 0, result.output
    [row] = _lines(result.stdout)
    assert {k: row[k] for k in ("stream", "partitions", "events", "retained", "groups")} == {
        "stream": "orders", "partitions": 2, "events": 6, "retained": 6,
        "groups": ["audit", "billing"]}
    result = _cli(store, "groups", "orders", "--json")
    assert result.exit_code == 0, result.output
    rows = {r["group"]: r for r in _lines(result.stdout)}
    assert rows["audit"]["lag"] == 6
    assert rows["audit"]["settled"] == 0
    assert rows["billing"]["settled"] == 5
    assert rows["billing"]["lag"] == 1
    assert "billing" in _cli(store, "groups", "orders").stdout


def test_lag_json_and_watch(store: str) -> None:
    result = _cli(store, "lag", "orders", "billing", "--json")
    assert result.exit_code == 0, result.output
    assert [(r["partition"], r["high_water"], r["frontier"], r["lag"])
            for r in _lines(result.stdout)] == [(0, 3, 3, 0), (1, 3, 2, 1)]
    result = _cli(store, "lag", "orders", "--watch", "--count", "2", "--interval", "0.1",
                  "--json")
    assert result.exit_code == 0, result.output
    rows = _lines(result.stdout)
    assert len(rows) == 8  # 2 readings x 2 groups x 2 partitions
    assert len({r["at_ms"] for r in rows[:4]}) == 1
    assert rows[4]["at_ms"] >= rows[0]["at_ms"]
    result = _cli(store, "lag", "orders", "--watch", "--count", "2", "--interval", "0.1")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("high water") == 2


LAG_KEYS = ["stream", "group", "partition", "high_water", "frontier", "lag", "scheduled",
            "paused", "paused_until_ms", "oldest_unsettled_ms", "dead_letters", "read_at_ms"]
"""The documented, stable keys of ``rheo-flow lag --json`` (docs/cli.md), in order."""


def test_lag_json_rows_follow_the_documented_schema(store: str) -> None:
    async def appended() -> dict[tuple[int, int], int]:
        async with Rheo(store) as rheo:
            return {(e.partition, e.sequence): e.appended_at_ms
                    for e in (await rheo.query_page(Query(stream="orders"))).events}

    times = asyncio.run(appended())
    result = _cli(store, "lag", "orders", "--json")
    assert result.exit_code == 0, result.output
    rows = _lines(result.stdout)
    assert all(list(r) == LAG_KEYS for r in rows)
    assert len({r["read_at_ms"] for r in rows}) == 1
    assert [(r["group"], r["partition"], r["lag"], r["oldest_unsettled_ms"], r["dead_letters"])
            for r in rows] == [("audit", 0, 3, times[(0, 1)], 0), ("audit", 1, 3, times[(1, 1)], 0),
                               ("billing", 0, 0, None, 1), ("billing", 1, 1, times[(1, 3)], 1)]
    assert rows[0]["read_at_ms"] >= max(times.values())
    table = _cli(store, "lag", "orders").stdout
    assert "oldest" in table
    assert _cli(store, "lag", "nope").exit_code == 1
    assert _cli(store, "lag", "orders", "nope").exit_code == 1


def test_dead_letters_json(store: str) -> None:
    result = _cli(store, "dead-letters", "orders", "billing", "--json")
    assert result.exit_code == 0, result.output
    rows = _lines(result.stdout)
    assert [(r["sequence"], r["reason"], r["attempts"]) for r in rows] == [(3, "poison", 1)]


def test_tail_reads_without_consuming(store: str) -> None:
    result = _cli(store, "tail", "orders", "--limit", "4", "--json")
    assert result.exit_code == 0, result.output
    rows = _lines(result.stdout)
    assert len(rows) == 4
    assert {r["type"] for r in rows} == {"order.placed"}
    pending = _lines(_cli(store, "tail", "orders", "--group", "billing", "--json").stdout)
    assert [(r["partition"], r["sequence"]) for r in sorted(
        pending, key=lambda r: (r["partition"], r["sequence"]))] == [(1, 3)]
    text = _cli(store, "tail", "orders", "-n", "1").stdout
    assert "order.placed" in text
    assert "id=o-" in text
    # Nothing was consumed or created.
    assert _state(store, "orders", "billing") == ({0: 3, 1: 2}, 1)
    streams = _lines(_cli(store, "streams", "--json").stdout)
    assert streams[0]["groups"] == ["audit", "billing"]
    assert _cli(store, "tail", "orders", "--group", "nope").exit_code == 1


def _readline(proc: subprocess.Popen[str], timeout: float = 30) -> str:
    """The process's next output line; fails after ``timeout`` seconds without one."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output within {timeout} s"
    return proc.stdout.readline()


def test_tail_follow_prints_new_events(store: str) -> None:
    env = {**os.environ, "RHEO_URL": store}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rheo_flow", "tail", "orders", "-f", "-n", "1", "--json",
         "--poll", "0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        first = json.loads(_readline(proc))
        assert first["type"] == "order.placed"

        async def add() -> None:
            async with Rheo(store) as rheo:
                await rheo.append("orders", NewEvent("order.late", {"late": True}, id="late"))

        asyncio.run(add())
        event = json.loads(_readline(proc))
        assert (event["type"], event["id"], event["data"]) == ("order.late", "late",
                                                               {"late": True})
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_append_from_stdin(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    assert _cli(url, "migrate").exit_code == 0
    lines = ('{"type": "t", "data": {"a": 1}, "id": "e-1", "key": "k"}\n\n'
             '{"type": "t", "data": [2]}\n')
    result = _cli(url, "append", "s", "--json", input=lines)
    assert result.exit_code == 1
    assert "unknown stream 's'" in result.output
    result = _cli(url, "append", "s", "--create", "--partitions", "2", "--json", input=lines)
    assert result.exit_code == 0, result.output
    rows = _lines(result.stdout)
    assert len({(r["partition"], r["sequence"]) for r in rows}) == 2
    assert rows[0]["id"] == "e-1"
    again = _lines(_cli(url, "append", "s", "--json", input=lines.split("\n")[0]).stdout)
    assert again == rows[:1]  # idempotent on the id
    table = _cli(url, "append", "s", input='{"type": "t", "id": "e-9"}\n')
    assert table.exit_code == 0
    assert "e-9" in table.stdout
    for bad, message in (('{"type": "t"}\nnot json\n', "line 2: not JSON"),
                         ("[1]\n", "line 1: not a JSON object"),
                         ('{"data": 1}\n', "line 1: an event needs a 'type'")):
        result = _cli(url, "append", "s", input=bad)
        assert result.exit_code == 1, result.output
        assert message in result.output
    events = _lines(_cli(url, "tail", "s", "-n", "100", "--json").stdout)
    assert len(events) == 3  # nothing of the failed inputs was appended


def test_destructive_commands_refuse_without_yes_off_terminal(store: str) -> None:
    for args in (["redrive", "orders", "billing"], ["replay", "orders", "billing"],
                 ["reset", "orders", "billing", "--to", "latest"], ["trim", "orders"],
                 ["delete-group", "orders", "billing"], ["delete-stream", "orders"]):
        result = _cli(store, *args)
        assert result.exit_code == 2, (args, result.output)
        assert "without --yes" in result.output
    assert _state(store, "orders", "billing") == ({0: 3, 1: 2}, 1)


def test_confirmation_on_a_terminal(store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rheo_flow._cli._common.interactive", lambda: True)
    result = _cli(store, "delete-group", "orders", "audit", input="n\n")
    assert result.exit_code == 1
    assert "nothing changed" in result.output
    result = _cli(store, "delete-group", "orders", "audit", input="y\n")
    assert result.exit_code == 0, result.output
    assert _lines(_cli(store, "streams", "--json").stdout)[0]["groups"] == ["billing"]


def test_redrive(store: str) -> None:
    result = _cli(store, "redrive", "orders", "billing", "--position", "0:9", "--yes")
    assert result.exit_code == 1
    assert "no dead letter at 0:9" in result.output
    assert _cli(store, "redrive", "orders", "billing", "--position", "x").exit_code == 2
    letter = _lines(_cli(store, "dead-letters", "orders", "billing", "--json").stdout)[0]
    result = _cli(store, "redrive", "orders", "billing", "--position",
                  f"{letter['partition']}:{letter['sequence']}", "--yes", "--json")
    assert result.exit_code == 0, result.output
    assert _lines(result.stdout) == [{"stream": "orders", "group": "billing", "redriven": 1}]
    assert _state(store, "orders", "billing")[1] == 0
    result = _cli(store, "redrive", "orders", "billing", "-y")
    assert result.exit_code == 0
    assert "0 dead letter(s) redriven" in result.stdout


def test_replay_and_reset(store: str) -> None:
    result = _cli(store, "replay", "orders", "billing", "--from", "2", "-p", "1", "--yes")
    assert result.exit_code == 0, result.output
    assert "partition 1" in result.stdout
    assert _state(store, "orders", "billing")[0] == {0: 3, 1: 1}
    result = _cli(store, "reset", "orders", "billing", "--to", "latest", "--yes", "--json")
    assert result.exit_code == 0, result.output
    assert _lines(result.stdout)[0]["to"] == "latest"
    assert _state(store, "orders", "billing") == ({0: 3, 1: 3}, 0)
    result = _cli(store, "reset", "orders", "billing", "--to", "1", "--yes")
    assert result.exit_code == 0, result.output
    assert _state(store, "orders", "billing")[0] == {0: 1, 1: 1}
    assert _cli(store, "reset", "orders", "billing", "--to", "soon", "--yes").exit_code == 2
    assert _cli(store, "replay", "orders", "nope", "--yes").exit_code == 1


def test_trim(store: str) -> None:
    # Capped at the lowest frontier: audit has settled nothing.
    result = _cli(store, "trim", "orders", "--up-to", "2", "--yes", "--json")
    assert result.exit_code == 0, result.output
    assert [r["removed"] for r in _lines(result.stdout)] == [0, 0]
    result = _cli(store, "trim", "orders", "--up-to", "2", "--force", "--yes")
    assert result.exit_code == 0, result.output
    rows = _lines(_cli(store, "streams", "--json").stdout)
    assert (rows[0]["events"], rows[0]["retained"]) == (6, 2)


def test_delete_group_and_stream(store: str) -> None:
    result = _cli(store, "delete-group", "orders", "billing", "--yes", "--json")
    assert result.exit_code == 0, result.output
    assert _lines(result.stdout) == [{"stream": "orders", "group": "billing", "deleted": True}]
    result = _cli(store, "delete-group", "orders", "billing", "--yes")
    assert result.exit_code == 1
    assert "unknown group 'billing'" in result.output
    result = _cli(store, "delete-stream", "orders", "--yes")
    assert result.exit_code == 0
    assert "stream orders deleted" in result.stdout
    assert _cli(store, "streams", "--json").stdout == ""
    result = _cli(store, "delete-stream", "orders", "--yes")
    assert result.exit_code == 1
    assert "unknown stream 'orders'" in result.output


def test_long_lines_do_not_wrap_off_terminal(store: str) -> None:
    async def add() -> None:
        async with Rheo(store) as rheo:
            await rheo.append("orders", NewEvent("wide", {"text": "x" * 400}, id="wide"))

    asyncio.run(add())
    result = _cli(store, "tail", "orders", "-n", "1")
    assert result.exit_code == 0, result.output
    [line] = result.stdout.splitlines()
    assert "x" * 400 in line
    result = _cli(store, "dead-letters", "orders", "billing")
    assert all(len(line) < 200 for line in result.stdout.splitlines())


def test_url_is_required() -> None:
    result = runner.invoke(app, ["streams"], env={"RHEO_URL": ""})
    assert result.exit_code == 2
    assert "--url" in result.output


def test_dead_letter_of_a_raising_handler_shows_its_error(tmp_path: Path) -> None:
    """What a handler raised reaches the dead letter and the command's table and JSON."""
    url = f"sqlite:///{tmp_path / 'raising.db'}"

    async def run_failing_group() -> None:
        async with Rheo(url) as rheo:
            await rheo.create_stream("orders", partitions=1)
            await rheo.create_group("orders", "billing", max_attempts=1)
            await rheo.append("orders", [NewEvent("order.placed", {"total": "12,50 EUR"})])

            @consumer(stream="orders", group="billing", poll_ms=20)
            async def handle(event: Any, context: Any) -> Any:
                return int(event.data["total"])  # raises ValueError

            async with Group(rheo, handle):
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 10
                while not await rheo.dead_letters("orders", "billing"):
                    assert loop.time() < deadline, "no dead letter within 10 s"
                    await asyncio.sleep(0.02)  # polling the store against a deadline

    asyncio.run(run_failing_group())
    result = _cli(url, "dead-letters", "orders", "billing", "--json")
    assert result.exit_code == 0, result.output
    [row] = _lines(result.stdout)
    assert row["last_error"] == "ValueError: invalid literal for int() with base 10: '12,50 EUR'"
    table = runner.invoke(app, ["dead-letters", "orders", "billing"], env={
        "RHEO_URL": url, "COLUMNS": "250"})
    assert "ValueError: invalid literal for int()" in table.stdout
