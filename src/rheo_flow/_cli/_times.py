"""Times on the command line: an ISO 8601 time with its timezone, or a duration before
now (``-15m``), as the commands that take a time as a position read them."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

import typer

if TYPE_CHECKING:
    from .._model._stream import StartPosition

__all__ = ["DURATION_HELP", "TIME_HELP", "format_duration", "format_time", "looks_like_time",
           "parse_duration", "parse_position", "parse_time"]

TIME_HELP: Final = ("an ISO 8601 time with its timezone (2026-12-07T09:30:00Z, "
                    "2026-12-07T10:30+01:00) or a duration before now (-90s, -15m, -2h, -7d)")

DURATION_HELP: Final = "a duration: a whole number and a unit, ms, s, m, h or d (90s, 12h, 7d)"

_AGO: Final = re.compile(r"-(\d+)([smhd])")
_UNITS: Final = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
_DURATION: Final = re.compile(r"(\d+)(ms|[smhd])")
_UNIT_MS: Final = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1))


def parse_duration(text: str) -> timedelta:
    """The positive duration ``text`` names (``90s``, ``12h``, ``7d``); a bad one is a
    ``typer.BadParameter`` saying why."""
    found = _DURATION.fullmatch(text.strip())
    if found is None or int(found.group(1)) == 0:
        raise typer.BadParameter(f"expected {DURATION_HELP}, above 0, got {text!r}")
    unit_ms = dict(_UNIT_MS)[found.group(2)]
    try:
        return timedelta(milliseconds=int(found.group(1)) * unit_ms)
    except OverflowError:
        raise typer.BadParameter(f"{text!r} is too long a duration") from None


def format_duration(ms: int) -> str:
    """``ms`` in the largest unit that states it exactly (``7d``, ``90s``, ``1500ms``)."""
    for unit, size in _UNIT_MS:
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"  # pragma: no cover - the last unit divides every ms


def looks_like_time(text: str) -> bool:
    """Whether ``text`` is meant as a time (a date, or a duration before now)."""
    return bool(_AGO.fullmatch(text)) or bool(re.match(r"\d{4}-\d{2}-\d{2}", text))


def parse_time(text: str, *, now: datetime | None = None) -> datetime:
    """The aware time ``text`` names; a bad one is a ``typer.BadParameter`` saying why."""
    ago = _AGO.fullmatch(text)
    if ago:
        count, unit = int(ago.group(1)), _UNITS[ago.group(2)]
        return (now or datetime.now(UTC)) - timedelta(**{unit: count})
    try:
        value = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise typer.BadParameter(f"expected {TIME_HELP}, got {text!r}") from None
    if value.tzinfo is None:
        raise typer.BadParameter(
            f"{text!r} has no timezone: add one (Z for UTC, or +01:00), so that it names "
            "one moment wherever it is run")
    return value


def parse_position(text: str) -> StartPosition | datetime:
    """Where ``reset --to`` and ``create-group --start`` put a group: ``earliest``,
    ``latest``, after a sequence, or at a time (:func:`parse_time`)."""
    if text in ("earliest", "latest"):
        return text  # type: ignore[return-value]
    if text.isdigit():
        return int(text)
    if looks_like_time(text):
        return parse_time(text)
    raise typer.BadParameter(
        f"expected earliest, latest, a sequence or a time ({TIME_HELP}), got {text!r}")


def format_time(value: datetime) -> str:
    """``value`` as the commands print it: UTC, to the millisecond (``...T09:30:00.000Z``)."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
