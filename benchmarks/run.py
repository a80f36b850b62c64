"""Run a benchmark suite: ``python benchmarks/run.py SUITE [--quick] [--json]``.

A suite is a module ``benchmarks/<suite>.py`` exposing
``async def run(quick: bool) -> list[Result]`` (:class:`benchmarks._common.Result`);
:data:`SUITES` maps a suite name to its module when they differ. ``--json`` prints
one JSON object per result line (``name``, ``backend``, ``value``, ``unit``,
``baseline``, ``ratio``, and ``baseline_name`` and ``note`` when set); otherwise a table.
``--plot DIR`` also writes PNG charts of the results into DIR (``benchmarks/_plot.py``,
needs matplotlib: the ``bench`` extra); ``--plot-from FILE --plot DIR`` charts the
results saved by an earlier ``--json`` run instead of running the suite.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# `python benchmarks/run.py` puts benchmarks/ first on sys.path, where a suite named
# after a driver (redis.py) would shadow the driver itself: import suites as a package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import Result  # noqa: E402

Suite = Callable[[bool], Coroutine[Any, Any, list[Result]]]
"""A suite's ``run(quick)`` coroutine function."""

SUITES: dict[str, str] = {
    "pipeline": "pipeline",
    "memory": "memory_bound",
    "typed": "typed",
}
"""Suite name -> module in ``benchmarks/`` (any other ``benchmarks/<name>.py`` also works)."""

NOT_SUITES = frozenset({"run", "profile_group"})
"""Modules of ``benchmarks/`` that are tools, not suites."""


def available() -> list[str]:
    """Every suite name: the registry plus modules found next to this file."""
    names = set(SUITES)
    for path in Path(__file__).parent.glob("*.py"):
        if not path.stem.startswith("_") and path.stem not in {*NOT_SUITES, *SUITES.values()}:
            names.add(path.stem)
    return sorted(names)


def load(suite: str) -> Suite:
    """The ``run`` coroutine function of a suite."""
    module_name = SUITES.get(suite, suite)
    if module_name in NOT_SUITES or not (Path(__file__).parent / f"{module_name}.py").exists():
        raise SystemExit(f"unknown suite {suite!r}; available: {', '.join(available())}")
    module = importlib.import_module(f"benchmarks.{module_name}")
    run: Suite | None = getattr(module, "run", None)
    if run is None:
        raise SystemExit(f"benchmarks/{module_name}.py has no run(quick) coroutine")
    return run


def print_table(suite: str, results: list[Result]) -> None:
    """Print results as a rich table (off a terminal, at its natural width, as the CLI's
    commands do: nothing cut to 80 columns)."""
    from rich.console import Console
    from rich.table import Table

    from rheo_flow._cli._plain import PlainConsole

    table = Table(title=f"benchmark suite: {suite}")
    for column in ("name", "backend", "value", "unit", "baseline", "vs", "ratio", "note"):
        table.add_column(column, justify="right" if column in ("value", "baseline", "ratio")
                         else "left")
    notes: list[str] = []
    for r in results:
        if r.note and r.note not in notes:
            notes.append(r.note)
        table.add_row(
            r.name, r.backend, f"{r.value:,.1f}", r.unit,
            "" if r.baseline is None else f"{r.baseline:,.1f}",
            r.baseline_name or "",
            "" if r.ratio is None else f"{r.ratio:.2f}",
            f"[{notes.index(r.note) + 1}]" if r.note else "",
        )
    table.caption = "  ".join(f"[{i}] {note}" for i, note in enumerate(notes, start=1))
    (Console() if sys.stdout.isatty() else PlainConsole()).print(table)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the suite, print its results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", nargs="?", help=f"one of: {', '.join(available())}")
    parser.add_argument("--quick", action="store_true", help="a short run (under a minute)")
    parser.add_argument("--json", action="store_true", help="one JSON object per result line")
    parser.add_argument("--plot", metavar="DIR", type=Path,
                        help="also write PNG charts of the results into DIR")
    parser.add_argument("--plot-from", metavar="FILE", type=Path,
                        help="with --plot: chart the JSON lines of an earlier --json run")
    args = parser.parse_args(argv)
    if args.plot_from is not None:
        if args.plot is None:
            parser.error("--plot-from needs --plot DIR")
        plot(args.suite or args.plot_from.stem, _plot_module().from_json_lines(args.plot_from),
             args.plot)
        return 0
    if args.suite is None:
        parser.error("a suite is required")
    run = load(args.suite)
    results = asyncio.run(run(args.quick))
    if args.json:
        for r in results:
            print(json.dumps(r.as_json()))
    else:
        print_table(args.suite, results)
    if args.plot is not None:
        plot(args.suite, results, args.plot)
    return 0


def _plot_module() -> Any:
    # Lazily: matplotlib is an optional dependency, needed only for --plot.
    from benchmarks import _plot

    return _plot


def plot(suite: str, results: list[Result], directory: Path) -> None:
    """Write the charts of ``results`` into ``directory``; name them on stderr."""
    for path in _plot_module().write_charts(suite, results, directory):
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
