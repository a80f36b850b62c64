"""``rheo-flow torture URL``: run the fault scenarios against a deployment and check."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated
from urllib.parse import urlsplit

import orjson
import typer
from rich.markup import escape

from .._backends._urls import redact_url
from .._cli._common import console as cli_console
from .._model._errors import RheoError

if TYPE_CHECKING:  # the scenarios, runner and checker load when the command runs
    from rich.console import Console

    from ._checker import Report
    from ._scenario import RunSettings, Scenario, Workload

__all__ = ["torture"]

MIN_CELL_S = 5.0
"""The shortest bound one scenario run may get."""
PACE_S = 8.0
"""The longest a run is paced for (more time only leaves room for slow runs)."""

EXIT_VIOLATION = 1
EXIT_INCOMPLETE = 3


def _scenario_help() -> str:
    from ._catalog import scenarios

    return ", ".join(f"{s.name}{'' if s.default else ' (not by default)'}"
                     for s in scenarios().values())


def torture(
    url: Annotated[str, typer.Argument(
        help="Backend URL shared by worker processes: sqlite:///path.db, postgresql://..., "
             "redis://..., mongodb://...")],
    events: Annotated[int, typer.Option(min=20, max=1_000_000,
                                        help="Events appended per scenario run.")] = 400,
    workers: Annotated[int, typer.Option(min=1, max=16,
                                         help="Worker processes per scenario run.")] = 2,
    seconds: Annotated[float, typer.Option(
        min=5, max=86_400,
        help="Bound of the whole command (each run is paced for its share, at most 8 s, "
             "and a slow run may use the time quicker ones left).",
    )] = 60.0,
    scenario: Annotated[list[str] | None, typer.Option(
        "--scenario", "-s", help="Run only this scenario (repeat for several).",
        show_default=False)] = None,
    workload: Annotated[list[str] | None, typer.Option(
        "--workload", "-w", help="group or pipeline (default: both).", show_default=False,
    )] = None,
    partitions: Annotated[int, typer.Option(min=1, max=64, help="Partitions per stream.")] = 4,
    lease_ms: Annotated[int, typer.Option(min=200, max=600_000,
                                          help="Lease of the workers.")] = 1_000,
    keep_histories: Annotated[Path | None, typer.Option(
        help="Keep each process's recorded history (JSON lines) under this directory.",
        file_okay=False)] = None,
    json_output: Annotated[bool, typer.Option(
        "--json", help="Print one JSON object per scenario run instead of a table.")] = False,
) -> None:
    """Run fault scenarios against a backend with real worker processes, then check.

    For each scenario and workload (a consumer Group, a Pipeline), a producer
    process appends uniquely numbered events while worker processes consume them
    and a fault hits them (kill -9 and restart, SIGSTOP past the lease, poison
    events, lost append answers; --scenario picks). Every process records what it
    did; the checker then reports events lost, unexpected or appended twice,
    stale settles the backend accepted, redeliveries, the final lag and dead
    letters. Each run uses a fresh stream named torture-<run id>-<scenario>-<workload>
    and group "torture"; they are left in place afterwards (delete them as you
    delete any stream of that backend), nothing else is touched.

    Exit status: 0 when every run is clean, 1 on any violation (lost, unexpected,
    duplicate append, stale settle accepted) or failed run, 3 when clean but some
    events were not settled within the time bound.
    """
    from ._scenario import RunSettings

    console = cli_console()
    wanted = _workloads(workload)
    chosen, runs = _plan(console, url, scenario or (), wanted, seconds)
    settings = RunSettings(events=events, workers=workers, partitions=partitions,
                           seconds=min(seconds / runs, PACE_S), lease_ms=lease_ms)
    try:
        reports = asyncio.run(_run(console, url, chosen, settings, wanted, runs,
                                   keep_histories, seconds, json_output))
    except KeyboardInterrupt:
        console.print("interrupted")
        raise typer.Exit(130) from None
    except Exception as exc:
        raise _failed(console, url, exc) from None
    _conclude(console, url, reports, json_output)


def _workloads(workload: list[str] | None) -> list[Workload]:
    """The workloads asked for with --workload (default: both)."""
    if workload:
        bad = [w for w in workload if w not in ("group", "pipeline")]
        if bad:
            raise typer.BadParameter(f"unknown workload {bad[0]!r}: use group or pipeline",
                                     param_hint="--workload")
    return [w for w in ("group", "pipeline") if not workload or w in workload]


def _plan(console: Console, url: str, names: list[str] | tuple[()], wanted: list[Workload],
          seconds: float) -> tuple[list[Scenario], int]:
    """The scenarios to run and how many runs they make; exits with status 2 when
    nothing applies or ``seconds`` is too short for them."""
    from ._runner import selected_scenarios

    try:
        chosen = selected_scenarios(url, names)
    except RheoError as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None
    runs = sum(1 for s in chosen for w in s.workloads if w in wanted)
    if runs == 0:
        console.print("[bold red]error:[/] no scenario applies to this backend and workload")
        raise typer.Exit(2)
    if seconds / runs < MIN_CELL_S:
        console.print(f"[bold red]error:[/] {runs} runs need --seconds of at least "
                      f"{runs * MIN_CELL_S:.0f}")
        raise typer.Exit(2)
    return chosen, runs


async def _run(console: Console, url: str, chosen: list[Scenario], settings: RunSettings,
               wanted: list[Workload], runs: int, keep_histories: Path | None, seconds: float,
               json_output: bool) -> list[Report]:
    """Every run, one after the other, each reported as it ends (a line, or JSON)."""
    from ._render import report_dict
    from ._runner import STREAM_PREFIX, run_torture

    if not json_output:
        console.print(f"torture on {escape(redact_url(url))}: {runs} runs within "
                      f"{seconds:.0f} s, streams {STREAM_PREFIX}<run id>-<scenario>-<workload>")
    reports = []
    async for report in run_torture(url, chosen, settings, workloads=wanted,
                                    work_dir=keep_histories, total_s=seconds):
        reports.append(report)
        if json_output:
            sys.stdout.write(orjson.dumps(report_dict(report)).decode() + "\n")
            sys.stdout.flush()
        else:
            mark = "[green]✓[/]" if report.ok and report.complete else "[red]✗[/]"
            console.print(f"{mark} {report.scenario} / {report.workload}: "
                          f"{report.elapsed_s:.1f} s, stream {report.stream}")
            for note in report.notes:
                console.print(f"    {escape(note)}")
    return reports


def _conclude(console: Console, url: str, reports: list[Report], json_output: bool) -> None:
    """The summary table (unless JSON), then the exit status when not every run was
    clean: 1 on a violation, 3 when something was left unsettled."""
    from ._render import report_table

    if not json_output:
        console.print(report_table(reports, f"torture on {redact_url(url)}"))
    if not all(r.ok for r in reports):
        raise typer.Exit(EXIT_VIOLATION)
    if not all(r.complete for r in reports):
        raise typer.Exit(EXIT_INCOMPLETE)


def _failed(console: Console, url: str, exc: Exception) -> typer.Exit:
    """Print why the command failed (the URL's password masked); exit status 1."""
    if isinstance(exc, RheoError):
        console.print(f"[bold red]error:[/] {escape(_masked(str(exc), url))}")
    else:
        message = _masked(f"{type(exc).__name__}: {exc}", url)
        console.print(f"[bold red]error ({escape(redact_url(url))}):[/] {escape(message)}")
    return typer.Exit(EXIT_VIOLATION)


def _masked(text: str, url: str) -> str:
    """``text`` with the URL's password (should a driver quote it) masked."""
    try:
        password = urlsplit(url).password
    except ValueError:
        return text
    return text.replace(password, "***") if password else text
