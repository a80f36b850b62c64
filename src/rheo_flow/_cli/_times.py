"""Times on the command line: an ISO 8601 time with its timezone, or a duration before
now (``-15m``), as the commands that take a time as a position read them."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Final

import typer

__all__ = ["TIME_HELP", "format_time", "looks_like_time", "parse_time"]

TIME_HELP: Final = ("an ISO 8601 time with its timezone (2026-12-07T09:30:00Z, "
                    "2026-12-07T10:30+01:00) or a duration before now (-90s, -15m, -2h, -7d)")

_AGO: Final = re.compile(r"-(\d+)([smhd])")
_UNITS: Final = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


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


def format_time(value: datetime) -> str:
    """``value`` as the commands print it: UTC, to the millisecond (``...T09:30:00.000Z``)."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
