"""The ``rheo-flow pause`` and ``resume`` commands: a group's consumers, in every process,
stop taking new work until it is resumed (or until a time), and take it up again."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Final

import orjson
import typer
from rich.markup import escape

from ._command import Command
from ._common import GroupArg, JsonOption, StreamArg, UrlOption, console, existing, run

if TYPE_CHECKING:
    from .._model._stream import GroupInfo

__all__ = ["parse_duration", "register"]

_UNITS: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_PART: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``1h30m``, ``2d`` (units ms, s, m, h, d; a bare number is
    seconds) as a positive :class:`~datetime.timedelta`."""
    spec = text.strip().lower()
    seconds = 0.0
    if re.fullmatch(r"\d+(?:\.\d+)?", spec):
        seconds = float(spec)
    elif spec and re.fullmatch(f"(?:{_PART.pattern})+", spec):
        seconds = sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(spec))
    else:
        raise typer.BadParameter(f"expected a duration such as 30s, 15m, 1h30m or 2d, "
                                 f"got {text!r}", param_hint="--for")
    if seconds <= 0:
        raise typer.BadParameter(f"the duration must be positive, got {text!r}",
                                 param_hint="--for")
    return timedelta(seconds=seconds)


def _until(until: str | None, for_: str | None) -> datetime | None:
    """When the pause ends: ``--until`` (ISO 8601; UTC without an offset), now plus
    ``--for``, or ``None`` (until resumed)."""
    if until is not None and for_ is not None:
        raise typer.BadParameter("give --until or --for, not both", param_hint="--until")
    if for_ is not None:
        return datetime.now(UTC) + parse_duration(for_)
    if until is None:
        return None
    try:
        moment = datetime.fromisoformat(until.strip())
    except ValueError:
        raise typer.BadParameter(f"expected an ISO 8601 time such as 2030-01-31T18:00:00Z, "
                                 f"got {until!r}", param_hint="--until") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _report(json: bool, info: GroupInfo) -> None:
    out = console()
    row: dict[str, Any] = {"stream": info.stream, "group": info.group, "paused": info.paused,
                           "paused_until_ms": info.paused_until_ms}
    if json:
        out.out(orjson.dumps(row).decode(), highlight=False)
        return
    state = pause_text(info) if info.paused else "resumed: its consumers fetch again"
    out.print(f"[green]✓[/] {escape(f'{info.stream}/{info.group}')} {escape(state)}")


def pause_text(info: GroupInfo) -> str:
    """``paused until resumed`` or ``paused until <time>`` (UTC); ``-`` when not paused."""
    if not info.paused:
        return "-"
    if info.paused_until_ms is None:
        return "paused until resumed"
    moment = datetime.fromtimestamp(info.paused_until_ms / 1000, UTC)
    return "paused until " + moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def pause(
    url: UrlOption,
    stream: StreamArg,
    group: GroupArg,
    until: Annotated[str | None, typer.Option(
        "--until", help="End the pause at this ISO 8601 time (UTC without an offset).",
        show_default=False)] = None,
    for_: Annotated[str | None, typer.Option(
        "--for", help="End the pause after this long: 30s, 15m, 1h30m, 2d.",
        show_default=False)] = None,
    json: JsonOption = False,
) -> None:
    """Pause a group: its consumers, in every process, fetch nothing new until it is
    resumed (or until --until / --for). Leases already out are still settled; the
    workers stay up and ready."""
    out = console()
    ends = _until(until, for_)

    async def go() -> GroupInfo:
        from .._rheo import Rheo

        async with Rheo(existing(url)) as rheo:
            return await rheo.pause_group(stream, group, until=ends)

    _report(json, run(out, go, url))


def resume(url: UrlOption, stream: StreamArg, group: GroupArg, json: JsonOption = False) -> None:
    """Resume a paused group: its consumers fetch again at once where the backend has
    wake-ups, else within their poll interval."""
    out = console()

    async def go() -> GroupInfo:
        from .._rheo import Rheo

        async with Rheo(existing(url)) as rheo:
            return await rheo.resume_group(stream, group)

    _report(json, run(out, go, url))


def register(app: typer.Typer) -> None:
    """Add ``pause`` and ``resume`` to ``app``."""
    app.command(cls=Command)(pause)
    app.command(cls=Command)(resume)
