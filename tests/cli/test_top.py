"""``rheo-flow top``: the live view driven as a person would, with Textual's pilot."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rheo_flow import Rheo
from rheo_flow._cli._app import app as cli

pytest.importorskip("textual")

from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from rheo_flow._cli.top._letters import LetterTable
from rheo_flow._cli.top._view import TopApp

runner = CliRunner()
DEADLINE_S = 10.0


async def _store(url: str) -> None:
    """Stream ``orders`` (2 partitions, 6 events), group ``billing`` with 2 settled, 1 dead."""
    async with Rheo(url) as rheo:
        await rheo.create_stream("orders", partitions=2)
        await rheo.create_stream("audit")
        await rheo.create_group("orders", "billing")
        for i in range(6):
            await rheo.append("orders", {"type": "placed", "data": {"n": i}}, partition=i % 2)
        leases = await rheo.fetch("orders", "billing", limit=3, partitions=[0])
        await rheo.ack(leases[:2])
        await rheo.reject(leases[2], "boom", error="ValueError: bad input")


def _text(app: TopApp) -> str:
    """What the screen says: every Static's text and every cell of the dead-letter table."""
    parts = [str(w.content) for w in app.query(Static)]
    table: DataTable[str] = app.query_one("#dead", DataTable)
    for row in range(table.row_count):
        parts.append(" | ".join(str(c) for c in table.get_row_at(row)))
    return "\n".join(parts)


async def _until(pilot: Pilot[None], check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}; screen:\n{_text(pilot.app)}")  # type: ignore[arg-type]
        await pilot.pause(0.05)


@contextlib.asynccontextmanager
async def _top(tmp_path: Path, size: tuple[int, int]
               ) -> AsyncIterator[tuple[str, TopApp, Pilot[None]]]:
    """The store of :func:`_store` watched by a running app, once its dead letter shows."""
    url = f"sqlite:///{tmp_path / 'top.db'}"
    await _store(url)
    app = TopApp(url, "orders", interval=0.2)
    async with app.run_test(size=size) as pilot:
        await _until(pilot, lambda: "ValueError: bad input" in _text(app), "the dead letter")
        yield url, app, pilot


async def test_top_shows_lag_and_dead_letters_pauses_redrives_and_quits(tmp_path: Path) -> None:
    async with _top(tmp_path, (140, 40)) as (url, app, pilot):
        screen = _text(app)
        assert "billing" in screen
        assert "migrate=false" not in screen  # the URL as given, not as opened
        # Partition 0: 3 appended, 2 acked then 1 rejected (settled): frontier 3, lag 0.
        assert "p0  high water 3  frontier 3  lag 0" in screen
        assert "p1  high water 3  frontier 0  lag 3" in screen
        assert "billing   max attempts 5   dead letters 1" in screen
        assert "all  settled 3  lag 3  0.0 events/s" in screen
        assert "0:3 | 1 | boom | ValueError: bad input" in screen

        await pilot.press("p")
        assert app.paused
        await _until(pilot, lambda: "PAUSED" in _text(app), "the paused state")
        shown, ticks = app.readings, app.ticks
        async with Rheo(url) as rheo:
            await rheo.append("orders", {"type": "placed", "data": {"n": 7}}, partition=1)
        await _until(pilot, lambda: app.ticks >= ticks + 3, "three refresh intervals")
        assert app.readings == shown
        assert "p1  high water 3 " in _text(app)
        await pilot.press("p")
        await _until(pilot, lambda: "p1  high water 4  frontier 0  lag 4" in _text(app),
                     "the refresh after resuming")

        await pilot.press("down", "r")
        await _until(pilot, lambda: app.query_one("#dead", DataTable).row_count == 0,
                     "the dead letter to leave the table")
        async with Rheo(url) as rheo:
            assert await rheo.dead_letters("orders", "billing") == []

        await pilot.press("s")
        await _until(pilot, lambda: app.stream == "audit" and "audit has no groups" in _text(app),
                     "the switch to the next stream")

        async with Rheo(url) as rheo:  # a reading that fails shows, the app lives on
            await rheo.delete_stream("audit")
        await _until(pilot, lambda: "error: " in str(app.query_one("#status", Static).content)
                     and "audit" in str(app.query_one("#status", Static).content),
                     "the failed reading on the status line")
        assert app.is_running

        await pilot.press("q")
        await _until(pilot, lambda: not app.is_running, "the app to exit")


async def test_top_screenshot_is_text(tmp_path: Path) -> None:
    async with _top(tmp_path, (120, 30)) as (_, app, _pilot):
        svg = app.export_screenshot()
    assert svg.startswith("<svg")
    assert "billing" in svg


def test_top_help() -> None:
    result = runner.invoke(cli, ["top", "--help"])
    assert result.exit_code == 0, result.output
    assert "--interval" in result.output
    assert "STREAM" in result.output


def test_top_without_textual_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    monkeypatch.delitem(sys.modules, "rheo_flow._cli.top._view")
    monkeypatch.setitem(sys.modules, "textual.app", None)  # makes the import fail
    result = runner.invoke(cli, ["top", "s", "--url", f"sqlite:///{tmp_path / 'x.db'}"])
    assert result.exit_code == 2, result.output
    assert "pip install 'rheo-flow[tui]'" in result.output
    assert list(tmp_path.iterdir()) == []


async def test_top_survives_a_redrive_that_fails(tmp_path: Path) -> None:
    async with _top(tmp_path, (120, 30)) as (url, app, pilot):
        await pilot.press("p")
        async with Rheo(url) as rheo:
            await rheo.delete_stream("orders")
        await pilot.press("down", "r")
        await _until(pilot, lambda: any("UnknownStream" in n.message
                                        for n in app._notifications),
                     "the error notification")
        assert app.is_running
        assert app.query_one("#dead", DataTable).row_count == 1


async def test_top_shows_a_paused_group(tmp_path: Path) -> None:
    async with _top(tmp_path, (140, 40)) as (url, app, pilot):
        async with Rheo(url) as rheo:
            await rheo.pause_group("orders", "billing")
        await _until(pilot, lambda: "dead letters 1   paused until resumed" in _text(app),
                     "the paused group")
        async with Rheo(url) as rheo:
            await rheo.resume_group("orders", "billing")
        await _until(pilot, lambda: "paused until" not in _text(app), "the resumed group")
        assert "billing   max attempts 5   dead letters 1" in _text(app)


async def _two_dead_letters(url: str) -> None:
    """Stream ``orders``, group ``billing`` with two dead letters (0:1 and 0:2)."""
    async with Rheo(url) as rheo:
        await rheo.create_stream("orders")
        await rheo.create_group("orders", "billing")
        for i in range(3):
            await rheo.append("orders", {"type": "placed", "data": {"n": i}})
        leases = await rheo.fetch("orders", "billing", limit=2)
        for lease in leases:
            await rheo.reject(lease, "boom", error=f"ValueError: {lease.sequence}")


def _hints(app: TopApp) -> int:
    """How many times ``r`` said to select a dead letter first."""
    return sum("select a dead letter first" in n.message for n in app._notifications)


def _selected(app: TopApp) -> tuple[str, int] | None:
    """The selected row: its ``partition:sequence`` cell and its index; None if none."""
    table = app.query_one("#dead", LetterTable)
    if table.chosen is None:
        return None
    assert table.show_cursor
    row = table.cursor_coordinate.row
    return str(table.get_row_at(row)[1]), row


async def test_top_keys_work_at_once_and_r_redrives_only_the_chosen_row(tmp_path: Path
                                                                        ) -> None:
    url = f"sqlite:///{tmp_path / 'top.db'}"
    await _two_dead_letters(url)
    app = TopApp(url, "orders", interval=0.2)
    async with app.run_test(size=(140, 40)) as pilot:
        table = app.query_one("#dead", LetterTable)
        await _until(pilot, lambda: table.row_count == 2, "the two dead letters")
        assert app.focused is table  # no Tab needed
        assert _selected(app) is None
        assert not table.show_cursor

        await pilot.press("r")  # nothing selected: nothing redriven, the user is told
        await _until(pilot, lambda: _hints(app) == 1, "the hint")
        async with Rheo(url) as rheo:
            assert len(await rheo.dead_letters("orders", "billing")) == 2

        await pilot.press("down")  # the first key press selects
        first = _selected(app)
        assert first is not None
        assert first[1] == 0
        await pilot.press("down")  # the next one moves the selection
        second = _selected(app)
        assert second is not None
        assert second[1] == 1
        readings = app.readings  # refreshes meanwhile keep the selection on its row
        await _until(pilot, lambda: app.readings >= readings + 2, "two refreshes")
        assert _selected(app) == second

        await pilot.press("r")
        await _until(pilot, lambda: table.row_count == 1, "the redriven row to leave")
        async with Rheo(url) as rheo:
            left = await rheo.dead_letters("orders", "billing")
        assert [f"{d.partition}:{d.sequence}" for d in left] == [first[0]]
        # The chosen row is gone: nothing is selected, r does nothing again.
        await _until(pilot, lambda: _selected(app) is None, "the selection to drop")
        await pilot.press("r")
        await _until(pilot, lambda: _hints(app) == 2, "the hint again")
        async with Rheo(url) as rheo:
            assert len(await rheo.dead_letters("orders", "billing")) == 1

        await pilot.press("enter")  # Enter selects too; Escape unselects
        assert _selected(app) == (first[0], 0)
        await pilot.press("escape")
        assert _selected(app) is None


async def test_top_footer_says_what_the_keys_do(tmp_path: Path) -> None:
    async with _top(tmp_path, (160, 40)) as (_, app, _pilot):
        svg = app.export_screenshot()
    for words in ("Select", "Redrive", "Pause", "Next", "Quit", "Unselect"):
        assert words in svg, words


async def test_top_counts_settle_outcomes_since_it_started(tmp_path: Path) -> None:
    async with _top(tmp_path, (160, 40)) as (url, app, pilot):
        assert "since start: settled +0, dead-lettered +0" in _text(app)
        async with Rheo(url) as rheo:
            leases = await rheo.fetch("orders", "billing", limit=3, partitions=[1])
            await rheo.ack(leases[:2])
            await rheo.reject(leases[2], "boom")
        await _until(pilot, lambda: "since start: settled +3, dead-lettered +1" in _text(app),
                     "the outcomes since start")
        assert "dead letters 2" in _text(app)
