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

        await pilot.press("r")
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
        await pilot.press("r")
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
