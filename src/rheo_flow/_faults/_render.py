"""Showing reports: a rich table, and one JSON object per report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from rich.table import Table

from ._checker import Report

__all__ = ["report_dict", "report_table"]

EXAMPLES = 5
"""Ids listed per finding in JSON (the counts are always complete)."""


def report_table(reports: Sequence[Report], title: str = "torture") -> Table:
    """One row per report; violation cells in red, a verdict per row."""
    table = Table(title=title, title_justify="left")
    for column in ("scenario", "workload", "events", "delivered", "dup. deliveries",
                   "lost", "unexpected", "dup. appends", "stale accepted", "stale refused",
                   "ambiguous", "dead letters", "lag", "seconds", "verdict"):
        table.add_column(column, justify="left" if column in ("scenario", "workload",
                                                              "verdict") else "right")
    for r in reports:
        table.add_row(
            r.scenario, r.workload, f"{r.acknowledged:,}", f"{r.delivered:,}",
            f"{r.duplicated:,}", _bad(len(r.lost)), _bad(len(r.unexpected)),
            _bad(len(r.duplicate_appends)), _bad(len(r.stale_accepted)),
            f"{r.stale_rejected:,}", f"{r.ambiguous_appends}/{r.ambiguous_settles}",
            _letters(r), _warn(r.lag), f"{r.elapsed_s:.1f}", _verdict(r),
        )
    return table


def _bad(count: int) -> str:
    return f"[bold red]{count:,}[/]" if count else "0"


def _warn(count: int) -> str:
    return f"[yellow]{count:,}[/]" if count else "0"


def _letters(r: Report) -> str:
    extra = len(r.unexpected_dead_letters)
    return f"{r.dead_letters:,} ({extra} not poison)" if extra else f"{r.dead_letters:,}"


def _verdict(r: Report) -> str:
    if r.error is not None:
        return f"[bold red]error[/]: {r.error[:80]}"
    if not r.ok:
        effects = (len(r.duplicated_effects) + len(r.missing_effects)
                   + len(r.orphan_effects))
        return f"[bold red]VIOLATION[/] ({effects} effects)" if effects else (
            "[bold red]VIOLATION[/]")
    if not r.complete:
        return f"[yellow]incomplete[/] ({len(r.unfinished)} unfinished)"
    return "[green]ok[/]"


def report_dict(r: Report) -> dict[str, Any]:
    """A JSON-ready summary of a report: counts, a few ids per finding, the verdict."""
    out: dict[str, Any] = {}
    for name, value in asdict(r).items():
        if isinstance(value, list | tuple) and name != "notes":
            out[name] = len(value)
            if value:
                out[f"{name}_examples"] = list(value[:EXAMPLES])
        else:
            out[name] = value
    out.update(duplicated=r.duplicated, violations=r.violations, ok=r.ok, complete=r.complete)
    return out
