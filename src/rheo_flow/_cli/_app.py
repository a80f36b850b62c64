"""The ``rheo-flow`` command line: the app, the live demo, and every command registered.

The commands live in modules of their own: :mod:`._inspect` (read-only),
:mod:`._ops` (changes), :mod:`._pause` (pause, resume),
:mod:`rheo_flow._faults._cli` (torture),
:mod:`.worker._command` (worker), :mod:`.metrics._command` (the exporter),
:mod:`.top._command` (the live view). Each
module imports what only its commands need (the facade, a backend's driver, the
runtimes, the fault scenarios, the demo, Textual) when one of them runs, so that
a command starts without loading what the others use.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

import typer
import typer.main

from .. import __version__
from .._faults._cli import torture as _torture
from . import _create, _inspect, _ops, _pause, _retention
from ._command import Command, Group
from ._common import console as cli_console
from ._common import run, set_verbose
from .demo._state import DemoConfig
from .metrics._command import metrics as _metrics
from .top._command import top as _top
from .worker._command import worker as _worker

__all__ = ["app", "app_for", "main"]


def _new_app() -> typer.Typer:
    return typer.Typer(
        name="rheo-flow",
        cls=Group,
        help="Durable event streams with competing consumer groups: demo, inspection, "
             "operations.",
        no_args_is_help=True,
        # Plain help: typer's rich help labels every flag "<bool>".
        rich_markup_mode=None,
        add_completion=False,
        pretty_exceptions_enable=False,
    )


app = _new_app()

DEFAULTS = DemoConfig(url="sqlite:///demo.db")
URL_HELP = "Backend URL: sqlite:///path.db, postgresql://..., redis://..., mongodb://..."


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rheo-flow {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.",
    )] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", help="On an error, print the driver's full detail too (also accepted "
                          "after the command's name).",
    )] = False,
) -> None:
    """Durable event streams with competing consumer groups: demo, inspection, operations.

    Every command but demo and torture takes the backend URL as --url/-u, by
    default the environment variable RHEO_URL; --json prints one JSON object per line.
    """
    set_verbose(verbose)


@app.command(cls=Command)
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
    import tempfile

    from .demo._run import run_demo

    # Off a terminal its panels and tables are as wide as their content (see _plain).
    console = cli_console()
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
        result = run(console, lambda: run_demo(config, console, live=live, quiet=quiet),
                     url)
    if not result.ok:
        raise typer.Exit(1)


_inspect.register(app)
_ops.register(app)
_create.register(app)
_pause.register(app)
_retention.register(app)
# Kept in their own modules; registered here so that they are commands of this app.
app.command("torture", cls=Command)(_torture)
app.command("worker", cls=Command)(_worker)
app.command("metrics", cls=Command)(_metrics)
app.command("top", cls=Command)(_top)


def main() -> None:
    """Run the app for ``sys.argv`` (see :func:`app_for`); the script and ``python -m
    rheo_flow`` come here through :func:`rheo_flow.__main__.main`.

    What the start-up built (modules, classes, functions: they live until the process
    ends) is moved out of the cyclic collector's way first (``gc.freeze``): otherwise
    each full collection during the command walks all of it again, about 20 ms of a
    ``rheo-flow streams`` that loads a client library such as redis-py.
    """
    gc.freeze()
    args = _verbose_first(sys.argv[1:])
    app_for(args[:1])(args, prog_name="rheo-flow")


def _verbose_first(args: list[str]) -> list[str]:
    """``args`` with a ``--verbose`` given after the command's name (before any ``--``)
    moved in front of it, where the app's option is."""
    end = args.index("--") if "--" in args else len(args)
    if "--verbose" not in args[1:end]:
        return args
    return ["--verbose", *(a for i, a in enumerate(args) if a != "--verbose" or i >= end)]


def app_for(first: list[str]) -> typer.Typer:
    """The app to run for arguments starting with ``first``: :data:`app` itself, or
    when ``first`` names a command, an app of that command alone.

    typer builds every command's click command before running one (about 20 ms for
    all of them); the app of one command has the same callback and settings, so it
    parses, helps and fails as :data:`app` does for that command. No argument, an
    option or an unknown command runs :data:`app`.
    """
    for info in app.registered_commands:
        callback = info.callback
        name = info.name or (typer.main.get_command_name(callback.__name__) if callback
                             else None)
        if first == [name]:
            one = _new_app()
            one.registered_callback = app.registered_callback
            one.registered_commands.append(info)
            return one
    return app

