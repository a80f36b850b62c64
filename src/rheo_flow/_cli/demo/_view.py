"""How the demo shows itself: the live view, the status line and the closing summary."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ..._backends._urls import redact_url
from ._state import GROUPS, MAX_ATTEMPTS, STREAM, DemoState

__all__ = ["render_line", "render_live", "render_summary"]

_KIND_STYLE = {"ok": "green", "repeated": "green", "stale_lease": "yellow",
               "receipt_mismatch": "yellow", "backend_unavailable": "red",
               "ambiguous": "red", "failed": "red", "invalid": "red"}


def _header(state: DemoState) -> Panel:
    c = state.config
    text = Text.assemble(
        ("backend   ", "bold"), f"{redact_url(c.url)}  ({state.description})\n",
        ("stream    ", "bold"), f"{STREAM} · {c.partitions} partitions · key = customer id\n",
        ("groups    ", "bold"), f"{', '.join(GROUPS)} · {c.workers} workers each\n",
        ("settings  ", "bold"),
        f"max_attempts={MAX_ATTEMPTS} · lease_ms={c.lease_ms} · batch={c.batch}\n",
        ("faults    ", "bold"),
        f"{len(state.faults.flaky)} transient · 1 poison · 1 undeliverable · 1 stalled worker",
    )
    return Panel(text, title="[bold]rheo-flow demo[/]", title_align="left", border_style="cyan")


def _groups_table(state: DemoState, *, final: bool = False) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("group")
    for column in ("handled", "acked", "retried", "dead letters",
                   "avg events/s" if final else "events/s", "lag"):
        table.add_column(column, justify="right")
    for g in state.groups.values():
        rate = g.settled / state.elapsed if final and state.elapsed > 0 else g.rate()
        lag = sum(g.lag.values())
        table.add_row(g.name, f"{g.handled:,}", f"{g.acked:,}", f"{g.retried:,}",
                      f"{len(g.dead_letters):,}", f"{rate:,.0f}",
                      Text(f"{lag:,}", style="green" if lag == 0 else "yellow"))
    return table


def _lag_table(state: DemoState) -> Table:
    table = Table(title="lag per partition", title_justify="left", box=None, pad_edge=False,
                  header_style="bold", title_style="bold")
    table.add_column("")
    for p in range(state.config.partitions):
        table.add_column(f"p{p}", justify="right")
    table.add_row("high water", *(f"{state.high_water.get(p, 0):,}"
                                  for p in range(state.config.partitions)), style="dim")
    for g in state.groups.values():
        table.add_row(g.name, *(_lag_cell(g.lag.get(p, 0)) for p in range(state.config.partitions)))
    return table


def _lag_cell(lag: int) -> Text:
    style = "green" if lag == 0 else "yellow" if lag < 100 else "red"
    return Text(f"{lag:,}", style=style)


def _outcomes_table(state: DemoState) -> Table:
    kinds = ["ok", *sorted({k for g in state.groups.values() for k in g.outcomes} - {"ok"})]
    table = Table(title="settle outcomes", title_justify="left", box=None, pad_edge=False,
                  header_style="bold", title_style="bold")
    table.add_column("")
    for kind in kinds:
        table.add_column(kind, justify="right", style=_KIND_STYLE.get(kind, ""))
    for g in state.groups.values():
        table.add_row(g.name, *(f"{g.outcomes.get(k, 0):,}" for k in kinds))
    return table


def render_live(state: DemoState) -> RenderableType:
    """The refreshing view: header, append progress, groups, lag and settle outcomes."""
    progress = Table.grid(padding=(0, 1))
    progress.add_row(
        Text("appended", style="bold"),
        ProgressBar(total=state.total, completed=state.appended, width=40),
        f"{state.appended:,}/{state.total:,}",
        Text(f"{state.elapsed:5.1f} s", style="dim"),
    )
    return Group(_header(state), progress, Text(), _groups_table(state), Text(),
                 _lag_table(state), Text(), _outcomes_table(state))


def render_line(state: DemoState) -> str:
    """One plain status line (for logs and non-terminal output)."""
    parts = [f"[{state.elapsed:5.1f}s] appended {state.appended}/{state.total}"]
    for g in state.groups.values():
        parts.append(f"{g.name}: {g.settled} settled, lag {sum(g.lag.values())},"
                     f" {g.rate():.0f}/s")
    return " · ".join(parts)


def render_summary(state: DemoState, missing: dict[str, int]) -> RenderableType:
    """The closing summary: per-group totals, dead letters and the verdict."""
    title = Text.assemble(
        ("Summary  ", "bold"),
        f"{state.total:,} events · {state.config.partitions} partitions · "
        f"{state.elapsed:.1f} s",
    )
    parts: list[RenderableType] = [_header(state), title, Text(), _groups_table(state, final=True),
                                   Text(), _lag_table(state), Text(), _outcomes_table(state)]
    letters = Table(title="dead letters", title_justify="left", box=None, pad_edge=False,
                    header_style="bold", title_style="bold")
    for column in ("group", "partition", "sequence", "event", "attempts", "reason"):
        letters.add_column(column)
    for g in state.groups.values():
        for d in g.dead_letters:
            letters.add_row(g.name, str(d.partition), str(d.sequence),
                            d.event_id.removeprefix(f"{state.run_id}-"), str(d.attempts),
                            d.reason)
    if letters.row_count:
        parts += [Text(), letters]
    parts.append(Text())
    for name, count in missing.items():
        g = state.groups[name]
        if count == 0 and sum(g.lag.values()) == 0:
            parts.append(Text.assemble(
                ("✓ ", "bold green"),
                f"{name}: all {state.total:,} events settled ({g.acked:,} acked,"
                f" {len(g.dead_letters)} dead-lettered), no lag"))
        else:
            parts.append(Text.assemble(
                ("✗ ", "bold red"),
                f"{name}: {count:,} events not settled, lag {sum(g.lag.values()):,}"))
    if not state.done:
        parts.append(Text(f"stopped after the {state.config.timeout_s:.0f} s timeout",
                          style="bold red"))
    return Group(*parts)
