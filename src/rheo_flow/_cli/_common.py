"""What the ``rheo-flow`` commands share: the URL option, output, errors, confirmation."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Annotated, Any, TypeVar

import orjson
import typer
from rich.console import Console
from rich.markup import escape

from .._backends._urls import redact_url, scrub_secrets
from .._model._errors import RheoError, UnknownGroup, UnknownStream
from ._plain import PlainConsole
from ._table import print_lines, print_table

__all__ = [
    "NUMERIC",
    "URL_ENV",
    "GroupArg",
    "JsonOption",
    "StreamArg",
    "UrlOption",
    "YesOption",
    "confirm",
    "console",
    "done",
    "emit",
    "errors",
    "existing",
    "interactive",
    "run",
]

T = TypeVar("T")

URL_ENV = "RHEO_URL"
URL_HELP = (f"Backend URL (default: ${URL_ENV}): sqlite:///path.db, postgresql://..., "
            "redis://..., mongodb://...")

UrlOption = Annotated[str, typer.Option(
    "--url", "-u", envvar=URL_ENV, show_envvar=False, help=URL_HELP, show_default=False,
    metavar="URL")]
JsonOption = Annotated[bool, typer.Option(
    "--json", help="One JSON object per line instead of a table.")]
StreamArg = Annotated[str, typer.Argument(
    help="Stream name.", show_default=False, metavar="STREAM")]
GroupArg = Annotated[str, typer.Argument(help="Group name.", show_default=False, metavar="GROUP")]
YesOption = Annotated[bool, typer.Option(
    "--yes", "-y", help="Do it without asking (required when stdin is not a terminal).")]

_CREATING_SCHEMES = ("sqlite", "postgresql", "postgres")
"""Backends that create their schema on open unless the URL says ``migrate=false``."""


def errors() -> Console:
    """The console of error messages (stderr: ``--json`` output stays parseable)."""
    return Console(stderr=True, highlight=False, soft_wrap=True)


def console() -> Console:
    """The console of a command's output: off a terminal, plain text that is never
    wrapped, each table or panel as wide as its content (see :mod:`._plain`)."""
    out = Console(highlight=False)
    return out if out.is_terminal else PlainConsole()


def existing(url: str) -> str:
    """``url`` opening an existing store only: nothing is created, a typo is an error.

    SQLite and PostgreSQL create their schema (and SQLite its file) on open; with
    ``migrate=false`` a missing file or schema fails instead. Every command but
    ``migrate`` (and the demo) opens so.
    """
    if url.split("://", 1)[0].lower() not in _CREATING_SCHEMES:
        return url
    base, _, query = url.partition("?")
    # Split by hand, not re-encoded: every other option keeps its spelling (and a
    # secret in one stays recognisable to the error scrubber).
    kept = [o for o in query.split("&") if o and o.partition("=")[0] != "migrate"]
    return f"{base}?{'&'.join([*kept, 'migrate=false'])}"


def run(out: Console, make: Callable[[], Awaitable[T]], url: str | None = None, *,
        stream_fix: str | None = None) -> T:
    """Run a coroutine; an error becomes a one-line message and exit status 1.

    A driver's own error (a refused connection, bad credentials) is shown too,
    with the URL's password masked should the driver have quoted it. An unknown
    stream or group names the closest existing one and the command creating it
    (``stream_fix`` for a stream, when the command has its own way).
    """
    err = errors()
    try:
        return asyncio.run(make())  # type: ignore[arg-type]
    except (typer.Exit, typer.Abort, typer.BadParameter):
        raise
    except (UnknownStream, UnknownGroup) as exc:
        from ._unknown import unknown_message

        text = unknown_message(exc, existing(url) if url else None, stream_fix)
        err.print(f"[bold red]error:[/] {escape(scrub_secrets(text, url))}")
        raise typer.Exit(1) from None
    except RheoError as exc:
        err.print(f"[bold red]error:[/] {escape(scrub_secrets(str(exc), url))}")
        raise typer.Exit(1) from None
    except Exception as exc:
        where = f" ({redact_url(url)})" if url else ""
        message = scrub_secrets(f"{type(exc).__name__}: {exc}", url)
        err.print(f"[bold red]error{escape(where)}:[/] {escape(message)}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err.print("interrupted")
        raise typer.Exit(130) from None


def interactive() -> bool:
    """Whether a person can answer a question (stdin is a terminal)."""
    return sys.stdin.isatty()


def confirm(out: Console, question: str, yes: bool) -> None:
    """Ask before a destructive command; ``--yes`` skips it, no terminal refuses it."""
    if yes:
        return
    if not interactive():
        errors().print("[bold red]error:[/] refusing to "
                  f"{escape(question)} without --yes (stdin is not a terminal)")
        raise typer.Exit(2)
    if not typer.confirm(f"{question}?", default=False):
        out.print("aborted: nothing changed")
        raise typer.Exit(1)


def done(json: bool, row: dict[str, Any], message: str) -> None:
    """Report a change: a JSON line, or a check mark and ``message``."""
    out = console()
    if json:
        out.out(orjson.dumps(row).decode(), highlight=False)
    else:
        out.print(f"[green]✓[/] {escape(message)}")


def emit(out: Console, json: bool, title: str, columns: Iterable[str],
         rows: Iterable[Mapping[str, Any]], cells: Callable[[Mapping[str, Any]], list[str]]
         ) -> None:
    """Print ``rows`` as JSON lines (``--json``) or as one table of ``cells(row)``."""
    if json:
        print_lines(out, (orjson.dumps(row).decode() for row in rows))
        return
    print_table(out, title, tuple(columns), NUMERIC, [cells(row) for row in rows])


NUMERIC = frozenset({
    "partitions", "events", "retained", "partition", "sequence", "high water", "frontier",
    "lag", "attempts", "max attempts", "removed", "low water", "settled", "scheduled",
})
"""The columns tables right-justify."""
