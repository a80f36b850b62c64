"""The ``rheo-flow`` command line: a live demo and a few inspection commands."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, TypeVar
from urllib.parse import quote

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__
from ._demo import DemoConfig, run_demo
from ._errors import RheoError
from ._rheo import Rheo
from ._urls import redact_url, scrub_secrets

__all__ = ["app", "main"]

T = TypeVar("T")

app = typer.Typer(
    name="rheo-flow",
    help="Durable event streams with competing consumer groups: demo and inspection.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DEFAULTS = DemoConfig(url="sqlite:///demo.db")
URL_HELP = "Backend URL: sqlite:///path.db, postgresql://..., redis://..., mongodb://..."


def _console() -> Console:
    return Console(highlight=False)


def _run(console: Console, make: Callable[[], Awaitable[T]], url: str | None = None) -> T:
    """Run a coroutine; an error becomes a one-line message and exit status 1.

    A driver's own error (a refused connection, bad credentials) is shown too,
    with the URL's password masked should the driver have quoted it.
    """
    try:
        return asyncio.run(make())  # type: ignore[arg-type]
    except RheoError as exc:
        console.print(f"[bold red]error:[/] {escape(scrub_secrets(str(exc), url))}")
        raise typer.Exit(1) from None
    except Exception as exc:
        where = f" ({redact_url(url)})" if url else ""
        message = scrub_secrets(f"{type(exc).__name__}: {exc}", url)
        console.print(f"[bold red]error{escape(where)}:[/] {escape(message)}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        console.print("interrupted")
        raise typer.Exit(130) from None


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rheo-flow {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.",
    )] = False,
) -> None:
    """Durable event streams with competing consumer groups: demo and inspection."""


@app.command()
def demo(
    events: Annotated[int, typer.Option(
        min=10, max=1_000_000, help="Events to append.",
    )] = DEFAULTS.events,
    partitions: Annotated[int, typer.Option(
        min=1, max=64, help="Partitions of the stream.",
    )] = DEFAULTS.partitions,
    workers: Annotated[int, typer.Option(
        min=1, max=64, help="Workers per group.",
    )] = DEFAULTS.workers,
    rate: Annotated[float, typer.Option(
        min=0, help="Events/s appended after the initial backlog (0: as fast as possible).",
    )] = DEFAULTS.rate,
    db: Annotated[Path | None, typer.Option(
        help="SQLite file to use (kept afterwards); default: a temporary file.",
        dir_okay=False,
    )] = None,
    url: Annotated[str | None, typer.Option(
        help="Run against this backend URL instead of SQLite (e.g. postgresql://...).",
    )] = None,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="Print only the summary.",
    )] = False,
    timeout: Annotated[float, typer.Option(
        min=1, help="Give up after this many seconds.",
    )] = DEFAULTS.timeout_s,
) -> None:
    """Run an order pipeline live: billing and shipping groups over a partitioned stream.

    Appends orders (placed, paid, shipped; keyed by customer), consumes them with
    two groups of competing workers, retries transient failures, dead-letters a
    poison event at max_attempts=3 and shows throughput, lag per partition and
    settle outcomes. Uses an embedded SQLite file: no server needed.
    """
    console = _console()
    if db is not None and url is not None:
        console.print("[bold red]error:[/] give --db or --url, not both")
        raise typer.Exit(2)
    with tempfile.TemporaryDirectory(prefix="rheo-demo-") as tmp:
        if url is None:
            path = (db if db is not None else Path(tmp) / "demo.db").resolve()
            url = f"sqlite:///{quote(str(path), safe='/')}"
        config = DemoConfig(url=url, events=events, partitions=partitions, workers=workers,
                            rate=rate, timeout_s=timeout)
        live = console.is_terminal and not quiet
        result = _run(console, lambda: run_demo(config, console, live=live, quiet=quiet),
                      url)
    if not result.ok:
        raise typer.Exit(1)


@app.command()
def streams(url: Annotated[str, typer.Argument(help=URL_HELP)]) -> None:
    """List the streams of a backend with their partitions, events and groups."""
    console = _console()

    async def go() -> Table:
        table = Table(title=redact_url(url), title_justify="left")
        for column in ("stream", "partitions", "events", "retained", "groups"):
            table.add_column(column, justify="left" if column in ("stream", "groups") else "right")
        async with Rheo(url) as rheo:
            for name in await rheo.streams():
                info = await rheo.stream_info(name)
                groups = await rheo.groups(name)
                appended = sum(info.high_water.values())
                retained = sum(info.high_water[p] - info.low_water[p] + 1
                               for p in info.high_water)
                table.add_row(name, str(info.partitions), f"{appended:,}", f"{retained:,}",
                              ", ".join(g.group for g in groups) or "-")
        return table

    console.print(_run(console, go, url))


@app.command()
def lag(
    url: Annotated[str, typer.Argument(help=URL_HELP)],
    stream: Annotated[str, typer.Argument(help="Stream name.")],
    group: Annotated[str | None, typer.Argument(help="Group name (default: every group).")] = None,
) -> None:
    """Show high water, frontier and lag per partition for one group or all of them."""
    console = _console()

    async def go() -> Table:
        async with Rheo(url) as rheo:
            info = await rheo.stream_info(stream)
            names = [group] if group is not None else [g.group for g in await rheo.groups(stream)]
            table = Table(title=f"{stream} on {redact_url(url)}", title_justify="left")
            table.add_column("group")
            table.add_column("partition", justify="right")
            table.add_column("high water", justify="right")
            table.add_column("frontier", justify="right")
            table.add_column("lag", justify="right")
            for name in names:
                await rheo.group_info(stream, name)
                frontier = await rheo.frontier(stream, name)
                for p in range(info.partitions):
                    high = info.high_water[p]
                    done = frontier.get(p, 0)
                    table.add_row(name, str(p), f"{high:,}", f"{done:,}",
                                  f"{max(0, high - done):,}")
        return table

    console.print(_run(console, go, url))


@app.command("dead-letters")
def dead_letters(
    url: Annotated[str, typer.Argument(help=URL_HELP)],
    stream: Annotated[str, typer.Argument(help="Stream name.")],
    group: Annotated[str, typer.Argument(help="Group name.")],
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many.")] = 50,
) -> None:
    """List the dead letters (rejected deliveries) of a group."""
    console = _console()

    async def go() -> Table:
        async with Rheo(url) as rheo:
            await rheo.group_info(stream, group)
            letters = await rheo.dead_letters(stream, group, limit=limit)
        table = Table(title=f"dead letters of {stream}/{group}", title_justify="left")
        for column in ("partition", "sequence", "event id", "attempts", "reason"):
            table.add_column(column)
        table.add_column("last error", overflow="fold")
        for d in letters:
            # Stored text, not markup: "[...]" in a reason or error must print as is.
            table.add_row(str(d.partition), str(d.sequence), escape(d.event_id),
                          str(d.attempts), escape(d.reason), escape(d.last_error or "-"))
        return table

    console.print(_run(console, go, url))


@app.command()
def migrate(
    url: Annotated[str, typer.Argument(help=URL_HELP)],
    schema: Annotated[str | None, typer.Option(
        help="PostgreSQL schema (default: the URL's ?schema= or rheo_flow).")] = None,
) -> None:
    """Create or upgrade a backend's schema explicitly (safe to run concurrently).

    PostgreSQL applies its versioned migrations under an advisory lock; the other
    backends create their tables, indexes or keys when they open.
    """
    console = _console()

    async def go() -> str:
        if url.split("://", 1)[0].lower() in ("postgresql", "postgres"):
            from ._urls import require_driver

            require_driver("PostgreSQL", "postgres", "asyncpg")
            from ._backends.postgres import DEFAULT_SCHEMA
            from ._backends.postgres import migrate as pg_migrate

            version = await pg_migrate(url, schema or DEFAULT_SCHEMA)
            return f"schema version {version} is in place"
        if schema is not None:
            raise typer.BadParameter("--schema applies to PostgreSQL only")
        async with Rheo(url):
            pass
        return "schema is in place"

    message = _run(console, go, url)
    console.print(f"[green]✓[/] {escape(redact_url(url))}: {message}")


def main() -> None:
    """Entry point of the ``rheo-flow`` script."""
    app(prog_name="rheo-flow")



# Kept in its own module; registered here so that it is one of the commands.
from ._faults._cli import torture as _torture  # noqa: E402

app.command("torture")(_torture)

# Kept in its own module; registered here so that it is one of the commands.
from ._worker_cli import worker as _worker  # noqa: E402

app.command("worker")(_worker)
