"""``rheo-flow top``: a live full-screen view of a stream's groups (Textual).

Per group it shows the settled throughput (from frontier deltas between two
readings), the settle outcomes seen since ``top`` started (see :class:`_GroupState`),
and per partition high water, frontier and lag with a lag history sparkline;
below, the group's dead letters with their last errors. It only reads, except for
the ``r`` key, which redrives the dead letter the user selected (:mod:`._letters`).

Textual is an optional dependency (``pip install 'rheo-flow[tui]'``): this module
is imported only by the ``top`` command.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from ..._model._errors import MissingExtra

try:
    from textual.app import App, ComposeResult
    from textual.containers import Horizontal, VerticalScroll
    from textual.css.query import NoMatches
    from textual.widget import Widget
    from textual.widgets import Footer, Sparkline, Static

    from ._letters import LetterTable
except ImportError:
    raise MissingExtra("top command", "tui", "textual") from None

from ..._backends._urls import redact_url, scrub_secrets
from ..._model._stream import DeadLetter
from ..._rheo import Rheo
from .._common import existing
from .._pause import pause_text

__all__ = ["DEAD_LETTER_LIMIT", "HISTORY", "TopApp"]

HISTORY = 60
"""Readings kept for the sparklines."""

DEAD_LETTER_LIMIT = 100
"""Dead letters read per group and refresh (the first ones by partition and sequence)."""


_Layout = tuple[tuple[str, tuple[int, ...]], ...]
"""The groups shown and their partitions: the widgets are rebuilt when it changes."""


@dataclass(slots=True)
class _GroupState:
    """What ``top`` remembers of a group between two readings."""

    settled: int | None = None
    at: float = 0.0
    advanced: int = 0
    """Events settled since ``top`` started: the frontier's advances (acked and
    dead-lettered alike; a reset or replay moving it back counts nothing)."""
    dead: int | None = None
    dead_added: int = 0
    """Dead letters added since ``top`` started: the count's increases between
    two readings (a redrive between them hides as many new ones)."""
    rate: float = 0.0
    rates: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    lags: dict[int, deque[float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Partition:
    partition: int
    high_water: int
    frontier: int
    scheduled: int = 0
    """Of the lag, the events whose delivery time is still ahead."""

    @property
    def lag(self) -> int:
        return max(0, self.high_water - self.frontier)


@dataclass(frozen=True, slots=True)
class _Reading:
    """One look at a stream: per group, its partitions and dead letters."""

    partitions: dict[str, list[_Partition]]
    max_attempts: dict[str, int]
    dead_letters: list[DeadLetter]
    dead_counts: dict[str, int]
    """Per group, its dead letters in all (not only the ones read)."""
    paused: dict[str, str]
    """Per paused group: ``paused until resumed`` or ``paused until <time>``."""


class TopApp(App[None]):
    """The live view of one stream of the store at ``url``, taking a reading every ``interval`` s.

    The store is opened with ``migrate=false`` (see ``existing``): a missing SQLite
    file or PostgreSQL schema is an error, never a new store.
    """

    TITLE = "rheo-flow top"
    ENABLE_COMMAND_PALETTE = False
    AUTO_FOCUS = "#dead"
    CSS = """
    #status { height: 1; background: $boost; padding: 0 1; }
    #groups { height: 1fr; }
    .group { height: 1; margin-top: 1; padding: 0 1; text-style: bold; }
    .row { height: 1; padding: 0 1; }
    .row Static { width: 52; }
    .row Sparkline { width: 1fr; }
    #dead-title { height: 1; padding: 0 1; text-style: bold; }
    #dead { height: 12; }
    """
    BINDINGS = [
        ("r", "redrive", "Redrive selected"),
        ("p", "pause", "Pause refresh"),
        ("s", "switch", "Next stream"),
        ("q", "quit", "Quit"),
    ]

    def __init__(self, url: str, stream: str, *, interval: float = 1.0) -> None:
        super().__init__()
        self.url = url
        self.stream = stream
        self.interval = interval
        self.paused = False
        self.error: str | None = None
        self.readings = 0
        """Readings taken so far."""
        self.ticks = 0
        """Refresh timer firings so far, paused or not."""
        self._rheo: Rheo | None = None
        self._states: dict[str, _GroupState] = {}
        self._letters: dict[str, DeadLetter] = {}
        self._layout: _Layout | None = None
        self._lock = asyncio.Lock()

    def compose(self) -> ComposeResult:
        """The status line, the groups, the dead letters and the key legend."""
        yield Static("", id="status", markup=False)
        yield VerticalScroll(id="groups")
        yield Static("dead letters (newest first): ↓/↑ select one, r redrives it, "
                     "Esc unselects", id="dead-title", markup=False)
        table = LetterTable(id="dead")
        table.add_columns("group", "partition:sequence", "attempts", "reason", "last error",
                          "rejected (UTC)")
        yield table
        yield Footer()

    async def on_mount(self) -> None:
        """Open the store, take the first reading and refresh every ``interval``."""
        self.query_one("#dead", LetterTable).focus()  # the arrows work from the first key
        self._rheo = await Rheo(existing(self.url)).open()
        await self.refresh_view()
        self.set_interval(self.interval, self._tick)

    async def on_unmount(self) -> None:
        """Close the store."""
        if self._rheo is not None:
            await self._rheo.close()
            self._rheo = None

    async def _tick(self) -> None:
        self.ticks += 1
        if not self.paused:
            await self.refresh_view()

    async def refresh_view(self) -> None:
        """Take a reading and show it; a failed one is shown on the status line."""
        if self._rheo is None or self._lock.locked():
            return
        async with self._lock:
            stream = self.stream
            try:
                reading = await self._read(self._rheo)
            except Exception as exc:  # shown, not fatal: the store may come back
                self.error = self._message(exc)
                reading = None
            else:
                self.error = None
            try:
                # A reading of another stream (`s` was pressed meanwhile) is stale.
                if reading is not None and stream == self.stream:
                    await self._show(reading)
                self.readings += 1
                self._status()
            except NoMatches:  # the view was taken down (quit) while it was reading
                return

    async def _read(self, rheo: Rheo) -> _Reading:
        from ..._facade._delay import scheduled_counts

        high = await rheo.high_water(self.stream)
        partitions: dict[str, list[_Partition]] = {}
        attempts: dict[str, int] = {}
        letters: list[DeadLetter] = []
        paused: dict[str, str] = {}
        report = await rheo.lag_report([self.stream])
        dead = {entry.group: entry.dead_letters for entry in report.groups
                if entry.stream == self.stream}
        for info in await rheo.groups(self.stream):
            if info.paused:
                paused[info.group] = pause_text(info)
            frontier = await rheo.frontier(self.stream, info.group)
            scheduled = await scheduled_counts(rheo.backend, self.stream, frontier, high)
            attempts[info.group] = info.max_attempts
            partitions[info.group] = [_Partition(p, h, frontier.get(p, 0), scheduled[p])
                                      for p, h in sorted(high.items())]
            letters.extend(await rheo.dead_letters(self.stream, info.group,
                                                   limit=DEAD_LETTER_LIMIT))
        letters.sort(key=lambda d: (-d.rejected_at_ms, d.group, d.partition, d.sequence))
        return _Reading(partitions, attempts, letters, dead, paused)

    async def _show(self, reading: _Reading) -> None:
        now = time.monotonic()
        layout = tuple((g, tuple(p.partition for p in ps))
                       for g, ps in sorted(reading.partitions.items()))
        if layout != self._layout:
            await self._rebuild(layout)
        for n, (group, parts) in enumerate(sorted(reading.partitions.items())):
            state = self._states.setdefault(group, _GroupState())
            settled = sum(p.frontier for p in parts)
            if state.settled is not None and now > state.at:
                state.advanced += max(0, settled - state.settled)
                state.rate = max(0, settled - state.settled) / (now - state.at)
                state.rates.append(state.rate)
            state.settled, state.at = settled, now
            dead = reading.dead_counts.get(group, sum(d.group == group
                                                      for d in reading.dead_letters))
            if state.dead is not None:
                state.dead_added += max(0, dead - state.dead)
            state.dead = dead
            lag = sum(p.lag for p in parts)
            waiting = sum(p.scheduled for p in parts)
            pause = reading.paused.get(group)
            self.query_one(f"#g-{n}", Static).update(
                f"{group}   max attempts {reading.max_attempts[group]}   dead letters "
                f"{dead:,}{f'   {pause}' if pause else ''}   since start: settled "
                f"+{state.advanced:,}, dead-lettered +{state.dead_added:,}")
            self.query_one(f"#t-{n}", Static).update(
                f"  all  settled {settled:,}  lag {lag:,}{_scheduled(waiting)}"
                f"  {state.rate:,.1f} events/s")
            self.query_one(f"#gs-{n}", Sparkline).data = list(state.rates) or [0]
            for p in parts:
                history = state.lags.setdefault(p.partition, deque(maxlen=HISTORY))
                history.append(p.lag)
                row = f"{n}-{p.partition}"
                self.query_one(f"#p-{row}", Static).update(
                    f"  p{p.partition}  high water {p.high_water:,}  frontier {p.frontier:,}"
                    f"  lag {p.lag:,}{_scheduled(p.scheduled)}")
                self.query_one(f"#ps-{row}", Sparkline).data = list(history)
        self._states = {g: s for g, s in self._states.items() if g in reading.partitions}
        self._show_letters(reading.dead_letters)

    async def _rebuild(self, layout: _Layout) -> None:
        box = self.query_one("#groups", VerticalScroll)
        await box.remove_children()
        widgets: list[Widget] = []
        for n, (_, partitions) in enumerate(layout):
            widgets.append(Static("", id=f"g-{n}", classes="group", markup=False))
            widgets.append(Horizontal(
                Static("", id=f"t-{n}", markup=False),
                Sparkline([0], id=f"gs-{n}"), classes="row"))
            for p in partitions:
                widgets.append(Horizontal(
                    Static("", id=f"p-{n}-{p}", markup=False),
                    Sparkline([0], id=f"ps-{n}-{p}"), classes="row"))
        if not layout:
            widgets.append(Static(f"{self.stream} has no groups", classes="row",
                                  markup=False))
        await box.mount_all(widgets)
        self._layout = layout

    def _show_letters(self, letters: list[DeadLetter]) -> None:
        self._letters = {f"{d.group}\0{d.partition}\0{d.sequence}": d for d in letters}
        self.query_one("#dead", LetterTable).show_rows([
            (key, (d.group, f"{d.partition}:{d.sequence}", str(d.attempts), d.reason,
                   d.last_error or "-", _clock(d.rejected_at_ms)))
            for key, d in self._letters.items()])

    def _message(self, exc: Exception) -> str:
        return scrub_secrets(f"{type(exc).__name__}: {exc}", self.url)

    def _status(self) -> None:
        state = "PAUSED (p resumes)" if self.paused else f"every {self.interval:g}s"
        text = (f"{self.stream} on {redact_url(self.url)}   {state}   "
                f"{time.strftime('%H:%M:%S')}")
        if self.error is not None:
            text += f"   error: {self.error}"
        self.query_one("#status", Static).update(text)

    def action_pause(self) -> None:
        """Stop or restart the refreshing."""
        self.paused = not self.paused
        self._status()

    async def action_switch(self) -> None:
        """Show the next stream of the store (in name order)."""
        if self._rheo is None:
            return
        try:
            names = sorted(await self._rheo.streams())
        except Exception as exc:  # a key press must not end the app
            self.notify(self._message(exc), severity="error")
            return
        if not names:
            return
        after = [n for n in names if n > self.stream]
        self.stream = after[0] if after else names[0]
        self._states = {}
        self._layout = None
        await self.refresh_view()

    async def action_redrive(self) -> None:
        """Make the dead letter the user selected deliverable again (none: say so)."""
        chosen = self.query_one("#dead", LetterTable).chosen
        letter = self._letters.get(chosen or "")
        if self._rheo is None or letter is None:
            self.notify("select a dead letter first: ↓/↑ move the selection, then r",
                        severity="warning")
            return
        try:
            count = await self._rheo.redrive(letter.stream, letter.group, [letter])
        except Exception as exc:  # a key press must not end the app
            self.notify(self._message(exc), severity="error")
            return
        self.notify(f"redrove {count} dead letter of {letter.group} "
                    f"({letter.partition}:{letter.sequence})")
        await self.refresh_view()


def _clock(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))


def _scheduled(count: int) -> str:
    """How many of a lag's events are scheduled for later, when any are."""
    return f" ({count:,} scheduled)" if count else ""
