"""Retention on the command line: the options that give a policy (``--max-age``,
``--max-events``), how the commands show one, and ``rheo-flow retention``, which shows,
sets or clears a stream's stored policy (docs/cli.md, "Retention")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from ._command import Command
from ._common import JsonOption, StreamArg, UrlOption, console, done, existing, run
from ._times import DURATION_HELP, format_duration, parse_duration

if TYPE_CHECKING:
    from .._model._stream import Retention

__all__ = ["MaxAgeOption", "MaxEventsOption", "policy_of", "policy_row", "policy_text",
           "register"]

MaxAgeOption = Annotated[str | None, typer.Option(
    "--max-age", help=f"Retention: events older than this go once settled ({DURATION_HELP}).",
    show_default=False)]
MaxEventsOption = Annotated[int | None, typer.Option(
    "--max-events", min=1, help="Retention: each partition keeps its last N events (the "
    "older ones go once settled).", show_default=False)]


def policy_of(max_age: str | None, max_events: int | None, *, age_option: str = "--max-age"
              ) -> Retention | None:
    """The policy the options give (``None`` when neither is given); ``age_option``
    names the option ``max_age`` came from in an error."""
    from .._model._stream import Retention

    if max_age is None and max_events is None:
        return None
    try:
        age = None if max_age is None else parse_duration(max_age)
    except typer.BadParameter as exc:
        raise typer.BadParameter(exc.message, param_hint=age_option) from None
    return Retention(max_age=age, max_events=max_events)


def policy_row(retention: Retention | None) -> dict[str, Any] | None:
    """A policy as JSON output carries it (``None``: no policy)."""
    if retention is None:
        return None
    return {"max_age_ms": retention.max_age_ms, "max_events": retention.max_events}


def policy_text(retention: Retention | None) -> str:
    """A policy as the tables show it: ``7d``, ``1,000 events``, ``7d or 1,000 events``."""
    if retention is None:
        return "-"
    parts = []
    if retention.max_age_ms is not None:
        parts.append(format_duration(retention.max_age_ms))
    if retention.max_events is not None:
        parts.append(f"{retention.max_events:,} events")
    return " or ".join(parts)


def retention(
    url: UrlOption,
    stream: StreamArg,
    max_age: MaxAgeOption = None,
    max_events: MaxEventsOption = None,
    none: Annotated[bool, typer.Option(
        "--none", help="Clear the stream's policy (its events then stay until trimmed).")
    ] = False,
    json: JsonOption = False,
) -> None:
    """Show a stream's retention policy, or set it (--max-age, --max-events) or clear it
    (--none). The worker applies it; so does trim --retention."""
    out = console()
    policy = policy_of(max_age, max_events)
    if none and policy is not None:
        raise typer.BadParameter("--none clears the policy: give it alone",
                                 param_hint="--none")

    async def go() -> Retention | None:
        from .._rheo import Rheo

        async with Rheo(existing(url)) as rheo:
            if none or policy is not None:
                return (await rheo.set_retention(stream, policy)).retention
            return (await rheo.stream_info(stream)).retention

    stored = run(out, go, url)
    verb = "cleared" if none else "set to" if policy is not None else "is"
    done(json, {"stream": stream, "retention": policy_row(stored)},
          f"{stream}: retention {verb}{'' if none else ' ' + policy_text(stored)}"
          if stored is not None or none else f"{stream}: no retention policy")


def register(app: typer.Typer) -> None:
    """Add ``retention`` to ``app``."""
    app.command(cls=Command)(retention)
