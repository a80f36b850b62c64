"""The read-only ``rheo-flow`` commands: streams, groups, lag, dead-letters, tail.

They open the store with ``migrate=false`` (see :func:`existing`): a mistyped
SQLite file or PostgreSQL schema is an error, never a new empty store.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from rich.markup import escape

from .._backends._urls import redact_url
from .._model._lag import age_seconds
from ._command import Command
from ._common import (
    NUMERIC,
    GroupArg,
    JsonOption,
    StreamArg,
    UrlOption,
    console,
    emit,
    errors,
    existing,
    run,
)
from ._retention import policy_row, policy_text
from ._table import print_lines, print_table, rich_table

if TYPE_CHECKING:  # the facade and rich's live display load when a command runs
    from rich.console import Console
    from rich.live import Live

    from .._model._event import Event
    from .._rheo import Rheo

__all__ = ["register"]


Row = dict[str, Any]


def streams(url: UrlOption, json: JsonOption = False) -> None:
    """List the streams with their partitions, events appended and retained, and groups."""
    out = console()

    async def go() -> list[Row]:
        from .._rheo import Rheo

        rows = []
        async with Rheo(existing(url)) as rheo:
            for info, groups in await rheo.describe_streams():
                rows.append({
                    "stream": info.name, "partitions": info.partitions,
                    "events": sum(info.high_water.values()),
                    "retained": sum(info.high_water[p] - info.low_water[p] + 1
                                    for p in info.high_water),
                    "groups": [g.group for g in groups],
                    "created_at_ms": info.created_at_ms,
                    "retention": policy_row(info.retention),
                    "policy": policy_text(info.retention),
                })
        return rows

    rows = run(out, go, url)
    emit(out, json, redact_url(url),
         ("stream", "partitions", "events", "retained", "retention", "groups"),
         rows if not json else [{k: v for k, v in r.items() if k != "policy"} for r in rows],
         lambda r: [r["stream"], str(r["partitions"]), f"{r['events']:,}",
                    f"{r['retained']:,}", r["policy"], ", ".join(r["groups"]) or "-"])


def groups(url: UrlOption, stream: StreamArg, json: JsonOption = False) -> None:
    """List a stream's groups with ordering, max_attempts, creation time, frontier total
    and lag."""
    out = console()

    async def go() -> list[Row]:
        from .._rheo import Rheo

        async with Rheo(existing(url)) as rheo:
            high = await rheo.high_water(stream)
            frontiers = await rheo.frontiers(stream)
            rows = []
            for g in await rheo.groups(stream):
                frontier = frontiers.get(g.group)
                if frontier is None:  # created since frontiers was read
                    continue
                rows.append({
                    "stream": stream, "group": g.group, "ordering": g.ordering,
                    "max_attempts": g.max_attempts, "created_at_ms": g.created_at_ms,
                    "settled": sum(frontier.values()),
                    "lag": sum(max(0, h - frontier.get(p, 0)) for p, h in high.items()),
                    "paused": g.paused, "paused_until_ms": g.paused_until_ms,
                })
        return rows

    emit(out, json, f"groups of {stream} on {redact_url(url)}",
         ("group", "ordering", "max attempts", "created", "settled", "lag", "paused"),
         run(out, go, url),
         lambda r: [r["group"], r["ordering"], str(r["max_attempts"]),
                    _time(r["created_at_ms"]), f"{r['settled']:,}", f"{r['lag']:,}",
                    _paused_cell(r)])


def _paused_cell(row: Mapping[str, Any]) -> str:
    """``-``, ``until resumed`` or ``until <time>`` (UTC)."""
    if not row["paused"]:
        return "-"
    until = row["paused_until_ms"]
    return "until resumed" if until is None else f"until {_time(until)}"


async def _lag_rows(rheo: Rheo, stream: str, group: str | None) -> list[Row]:
    """The rows of ``rheo-flow lag`` (docs/cli.md, "lag --json"): one
    :meth:`~rheo_flow.Rheo.lag_report` of the stream; an unknown stream or group is an
    error, as the reads it replaced raised."""
    report = await rheo.lag_report([stream])
    entries = [g for g in report.groups if group is None or g.group == group]
    if not entries:  # empty: a stream without groups, or a name the store lacks
        await (rheo.group_info(stream, group) if group is not None
               else rheo.stream_info(stream))
    return [{"stream": g.stream, "group": g.group, "partition": p.partition,
             "high_water": p.high_water, "frontier": p.frontier, "lag": p.lag,
             "scheduled": p.scheduled, "paused": g.paused, "paused_until_ms": g.paused_until_ms,
             "oldest_unsettled_ms": p.oldest_unsettled_ms, "dead_letters": g.dead_letters,
             "read_at_ms": report.read_at_ms}
            for g in entries for p in g.partitions]


_LAG_COLUMNS = ("group", "partition", "high water", "frontier", "lag", "scheduled", "oldest",
                "paused")


def _lag_cells(rows: list[Row]) -> list[list[str]]:
    return [[r["group"], str(r["partition"]), f"{r['high_water']:,}", f"{r['frontier']:,}",
             f"{r['lag']:,}", f"{r['scheduled']:,}",
             _age(r["oldest_unsettled_ms"], r["read_at_ms"]), _paused_cell(r)] for r in rows]


def _age(since_ms: int | None, now_ms: int) -> str:
    """How long ago ``since_ms`` was, in the largest unit that keeps it short (``-``: never)."""
    seconds = age_seconds(since_ms, now_ms)
    if seconds is None:
        return "-"
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


def lag(
    url: UrlOption,
    stream: StreamArg,
    group: Annotated[str | None, typer.Argument(
        help="Group name (default: every group).", show_default=False)] = None,
    json: JsonOption = False,
    watch: Annotated[bool, typer.Option(
        "--watch", "-w", help="Refresh until interrupted (Ctrl-C).")] = False,
    interval: Annotated[float, typer.Option(
        min=0.1, max=3600, help="Seconds between refreshes with --watch.")] = 2.0,
    count: Annotated[int | None, typer.Option(
        min=1, help="With --watch: stop after this many refreshes.", show_default=False,
    )] = None,
) -> None:
    """Show high water, frontier and lag per partition for one group or all of them; of
    the lag, "scheduled" counts the events whose delivery time is still ahead, and
    "oldest" is how long ago the first unsettled event was appended.

    With --watch the table refreshes in place on a terminal; elsewhere (and with
    --json, whose lines then carry the time of the reading in "at_ms") each
    reading is printed after the last.
    """
    out = console()
    title = f"{stream} on {redact_url(url)}"
    readings = 1 if not watch else count

    async def go() -> None:
        from .._rheo import Rheo

        async with Rheo(existing(url)) as rheo:
            live: Live | None = None
            done = 0
            try:
                while readings is None or done < readings:
                    if done:
                        await asyncio.sleep(interval)
                    rows = await _lag_rows(rheo, stream, group)
                    done += 1
                    if json:
                        at = {"at_ms": int(time.time() * 1000)} if watch else {}
                        print_lines(out, (orjson.dumps({**row, **at}).decode()
                                          for row in rows))
                    elif watch and out.is_terminal:
                        if live is None:
                            from rich.live import Live

                            live = Live(console=out, auto_refresh=False)
                            live.start()
                        live.update(rich_table(f"{title}  ({_time(None)})", _LAG_COLUMNS,
                                               NUMERIC, ([escape(c) for c in cells]
                                                         for cells in _lag_cells(rows))),
                                    refresh=True)
                    else:
                        print_table(out, title, _LAG_COLUMNS, NUMERIC, _lag_cells(rows))
            finally:
                if live is not None:
                    live.stop()

    run(out, go, url)


def dead_letters(
    url: UrlOption,
    stream: StreamArg,
    group: GroupArg,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many.")] = 50,
    json: JsonOption = False,
) -> None:
    """List the dead letters (rejected deliveries) of a group."""
    out = console()

    async def go() -> list[Row]:
        from .._rheo import Rheo

        async with Rheo(existing(url)) as rheo:
            await rheo.group_info(stream, group)
            letters = await rheo.dead_letters(stream, group, limit=limit)
        return [{"stream": d.stream, "group": d.group, "partition": d.partition,
                 "sequence": d.sequence, "event_id": d.event_id, "attempts": d.attempts,
                 "reason": d.reason, "last_error": d.last_error,
                 "rejected_at_ms": d.rejected_at_ms} for d in letters]

    emit(out, json, f"dead letters of {stream}/{group}",
         ("partition", "sequence", "event id", "attempts", "reason", "last error", "rejected"),
         run(out, go, url),
         lambda r: [str(r["partition"]), str(r["sequence"]), r["event_id"], str(r["attempts"]),
                    r["reason"], r["last_error"] or "-", _time(r["rejected_at_ms"])])


def tail(
    url: UrlOption,
    stream: StreamArg,
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="Keep printing events as they are appended (Ctrl-C stops).",
    )] = False,
    group: Annotated[str | None, typer.Option(
        "--group", "-g", help="Only events this group has not settled yet (after its "
        "frontier), oldest first.", show_default=False)] = None,
    limit: Annotated[int, typer.Option(
        "--limit", "-n", min=1, max=10_000, help="How many events to print first.")] = 10,
    poll: Annotated[float, typer.Option(
        min=0.05, max=60, help="With --follow: longest wait between two looks (s).")] = 1.0,
    json: JsonOption = False,
) -> None:
    """Print a stream's latest events (or a group's pending ones) without consuming them.

    Reads with queries only: no group is created, no delivery is leased. Events
    are ordered by append time across partitions.
    """
    out = console()
    show = _event_printer(out, json)

    async def go() -> None:
        from .._rheo import Rheo

        async with Rheo(existing(url)) as rheo:
            info = await rheo.stream_info(stream)
            if group is not None:
                await rheo.group_info(stream, group)
                frontier = await rheo.frontier(stream, group)
                starts = {p: frontier.get(p, 0) + 1 for p in info.high_water}
                events = await _read(rheo, stream, starts, limit)
                events = sorted(events, key=_order)[:limit]
            else:
                starts = {p: max(1, h - limit + 1) for p, h in info.high_water.items()}
                events = sorted(await _read(rheo, stream, starts, limit), key=_order)[-limit:]
            for event in events:
                show(event)
            if not events and not json:
                errors().print(_nothing_text(stream, group, follow))
            if not follow:
                return
            after = dict(info.high_water)
            if group is not None:  # continue after what was shown, or the group's frontier
                after = {p: s - 1 for p, s in starts.items()}
                for event in events:
                    after[event.partition] = max(after[event.partition], event.sequence)
            while True:
                await rheo.wait_for_append(stream, poll)
                fresh = await _read(rheo, stream, {p: s + 1 for p, s in after.items()}, None)
                for event in sorted(fresh, key=_order):
                    after[event.partition] = max(after[event.partition], event.sequence)
                    show(event)

    run(out, go, url)


def _nothing_text(stream: str, group: str | None, follow: bool) -> str:
    """What ``tail`` says on stderr when it has no event to print."""
    text = (f"nothing pending: {group} has settled every event of {stream}"
            if group is not None else f"{stream} has no events")
    return escape(text + ("; waiting for new ones (Ctrl-C stops)" if follow else ""))


async def _read(rheo: Rheo, stream: str, starts: dict[int, int], limit: int | None
                ) -> list[Event]:
    """Up to ``limit`` events per partition from its start sequence (``None``: all)."""
    from .._model._query import Query

    events: list[Event] = []
    for p, start in starts.items():
        query = Query(stream=stream, partitions=[p], from_sequence=start)
        if limit is None:
            events.extend([e async for e in rheo.stream_query(query)])
        else:
            events.extend((await rheo.query_page(query, limit=limit)).events)
    return events


def _order(event: Event) -> tuple[int, int, int]:
    return event.appended_at_ms, event.partition, event.sequence


def _event_printer(out: Console, json: bool) -> Callable[[Event], None]:
    def show(event: Event) -> None:
        if json:
            out.out(orjson.dumps({
                "stream": event.stream, "partition": event.partition,
                "sequence": event.sequence, "id": event.id, "type": event.type,
                "key": event.key, "data": event.data, "headers": dict(event.headers),
                "appended_at_ms": event.appended_at_ms,
            }).decode(), highlight=False)
        else:
            key = f" key={event.key}" if event.key is not None else ""
            out.print(f"[dim]{_time(event.appended_at_ms)}[/] {event.partition}:{event.sequence} "
                      f"[bold]{escape(event.type)}[/] id={escape(event.id)}{escape(key)} "
                      f"{escape(orjson.dumps(event.data).decode())}")
    return show


def _time(ms: int | None) -> str:
    """An epoch-millisecond time as UTC ISO 8601 (now when ``None``)."""
    moment = datetime.now(UTC) if ms is None else datetime.fromtimestamp(ms / 1000, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def register(app: typer.Typer) -> None:
    """Add the read-only commands to ``app``."""
    app.command(cls=Command)(streams)
    app.command(cls=Command)(groups)
    app.command(cls=Command)(lag)
    app.command("dead-letters", cls=Command)(dead_letters)
    app.command(cls=Command)(tail)
