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
    "BRIEF_CHARS",
    "NUMERIC",
    "URL_ENV",
    "GroupArg",
    "JsonOption",
    "StreamArg",
    "UrlOption",
    "YesOption",
    "brief",
    "confirm",
    "console",
    "detail",
    "done",
    "emit",
    "errors",
    "existing",
    "interactive",
    "print_error",
    "run",
    "set_verbose",
    "shown",
    "verbose",
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

BRIEF_CHARS = 200
"""The longest error line a command prints without ``--verbose``."""
_VERBOSE = {"on": False}

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


def set_verbose(on: bool) -> None:
    """Set by ``--verbose``: an error prints the driver's full detail too."""
    _VERBOSE["on"] = on


def verbose() -> bool:
    """Whether ``--verbose`` was given."""
    return _VERBOSE["on"]


def shown(text: str, url: str | None) -> str:
    """``text`` as its reader should see it: the URL as typed (without the
    ``migrate=false`` :func:`existing` added) and its secrets masked."""
    if url:
        opened = existing(url)
        if opened != url:
            text = text.replace(opened, url).replace(redact_url(opened), redact_url(url))
    return scrub_secrets(text, url)


def brief(exc: BaseException, url: str | None) -> str:
    """The one line an error is reported in: its message's first line, cut at
    :data:`BRIEF_CHARS` unless ``--verbose`` (which prints :func:`detail` too)."""
    text = shown(str(exc), url)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    if verbose() or (len(first) <= BRIEF_CHARS and first == text.strip()):
        return first
    return first[:BRIEF_CHARS - 30].rstrip() + " … (--verbose for the detail)"


def detail(exc: BaseException, url: str | None) -> list[str]:
    """The error and its causes, one entry each (the driver's own words), masked."""
    lines: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(lines) < 10:
        lines.append(shown(f"{type(seen).__name__}: {seen}", url))
        seen = seen.__cause__ or seen.__context__
    return lines


def print_error(exc: BaseException, url: str | None, text: str | None = None,
                where: str = "") -> None:
    """Print ``error: ...`` for ``exc`` (``text`` instead of its message) on stderr, and
    with ``--verbose`` the error's chain of causes."""
    err = errors()
    line = shown(text, url) if text is not None else brief(exc, url)
    err.print(f"[bold red]error{escape(where)}:[/] {escape(line)}")
    if verbose():
        for entry in detail(exc, url):
            err.print(f"  {escape(entry)}")


def run(out: Console, make: Callable[[], Awaitable[T]], url: str | None = None, *,
        stream_fix: str | None = None) -> T:
    """Run a coroutine; an error becomes a one-line message and exit status 1.

    A driver's own error (a refused connection, bad credentials) is shown too,
    with the URL's password masked should the driver have quoted it. An unknown
    stream or group names the closest existing one and the command creating it
    (``stream_fix`` for a stream, when the command has its own way).
    """
    try:
        return asyncio.run(make())  # type: ignore[arg-type]
    except (typer.Exit, typer.Abort, typer.BadParameter):
        raise
    except (UnknownStream, UnknownGroup) as exc:
        from ._unknown import unknown_message

        print_error(exc, url, unknown_message(exc, existing(url) if url else None, stream_fix))
        raise typer.Exit(1) from None
    except RheoError as exc:
        print_error(exc, url)
        raise typer.Exit(1) from None
    except Exception as exc:
        where = f" ({redact_url(url)})" if url else ""
        print_error(exc, url, f"{type(exc).__name__}: {brief(exc, url)}", where)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        errors().print("interrupted")
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
