"""PNG charts of a suite's results: ``python benchmarks/run.py SUITE --plot DIR``.

Results are grouped into charts by their name with its numbers taken out
(``"consume+ack, 4 worker processes"`` -> ``"consume+ack, N worker processes"``):
the numbers become the x axis (batch size, partitions, workers, percentile).
Results whose name stands alone are gathered into one chart per unit. Each bar
of ours stands next to its baseline when it has one. matplotlib is imported
only here, and only when a chart is drawn.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks._common import Result

__all__ = ["charts", "from_json_lines", "write_charts"]

_NUMBER = re.compile(r"\d+(?:[,_.]\d+)*")


def _template(name: str) -> tuple[str, float | None]:
    """The name with its numbers replaced by ``N``, and its first number."""
    match = _NUMBER.search(name)
    x = float(match.group().replace(",", "").replace("_", "")) if match else None
    return _NUMBER.sub("N", name), x


def charts(results: Iterable[Result]) -> dict[str, list[Result]]:
    """Results grouped into charts: chart title -> its results, in their order."""
    by_template: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        by_template.setdefault((r.unit, _template(r.name)[0]), []).append(r)
    grouped: dict[str, list[Result]] = {}
    for (unit, template), members in by_template.items():
        if len({_template(r.name)[1] for r in members}) > 1:
            grouped[f"{template} ({unit})"] = members
        else:
            grouped.setdefault(unit, []).extend(members)
    return grouped


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower().replace("µ", "u")).strip("-")[:60] \
        or "chart"


def _shown(members: list[Result]) -> list[Result]:
    """Members minus those already drawn as another member's baseline bar."""
    baselines = {r.baseline for r in members if r.baseline is not None}
    return [r for r in members if r.baseline is not None or r.value not in baselines] \
        or members


SPREAD = 30.0
"""Values further apart than this (largest / smallest) do not share a linear axis: a
sweep gets one panel per backend, other charts a logarithmic axis."""
WIDTH_IN = 11.0
"""The widest figure (inches at 100 dpi): the docs show it at about this size, so its
text stays legible (a wider image would be scaled down, text with it)."""
_UNITS = {"us": "µs"}
"""Units as shown (results of older runs say ``us``)."""


class _Chart:
    """What one chart shows: its members, their x labels, colours and legends."""

    def __init__(self, members: list[Result]) -> None:
        shown = _shown(members)
        # A baseline without a name is named after the result it repeats.
        self.repeated = {r.value: r.name for r in members if r not in shown}
        self.members = shown
        self.numbered = len({_template(r.name)[0] for r in shown}) == 1 and \
            all(_template(r.name)[1] is not None for r in shown)
        self.labels = list(dict.fromkeys(self.label_of(r) for r in shown))
        self.backends = list(dict.fromkeys(r.backend for r in shown))
        self.colours = {b: f"C{i}" for i, b in enumerate(self.backends)}
        self.has_baseline = any(r.baseline is not None for r in shown)
        self.unit = _UNITS.get(shown[0].unit, shown[0].unit)
        values = [v for r in shown for v in (r.value, r.baseline) if v is not None and v > 0]
        self.spread = max(values) / min(values) if values else 1.0

    def label_of(self, r: Result) -> str:
        """The x label of ``r``: its number in a sweep, else its name."""
        return f"{_template(r.name)[1]:g}" if self.numbered else r.name


def _draw(path: Path, title: str, members: list[Result], caption: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chart = _Chart(members)
    heading = "\n".join([title.replace("(us)", "(µs)").replace(": us", ": µs"),
                         *textwrap.wrap(caption, 110)])
    if chart.numbered and len(chart.backends) > 1 and chart.spread > SPREAD:
        columns = min(3, len(chart.backends))
        rows = -(-len(chart.backends) // columns)
        fig, grid = plt.subplots(rows, columns, figsize=(WIDTH_IN, 2.9 * rows + 1.3),
                                 squeeze=False)
        for ax, backend in zip(grid.flat, chart.backends, strict=False):
            _bars(ax, chart, [r for r in chart.members if r.backend == backend], backend)
        for ax in list(grid.flat)[len(chart.backends):]:
            ax.set_visible(False)
        names = {r.baseline_name for r in chart.members if r.baseline is not None}
        if names:
            heading += f"\ndashed line: each backend's baseline ({', '.join(map(str, names))})"
        fig.suptitle(heading, fontsize=10)
    else:
        bars = len(chart.members) + sum(r.baseline is not None for r in chart.members)
        fig, ax = plt.subplots(figsize=(min(WIDTH_IN, max(8.0, 0.45 * bars + 4)), 5.2))
        if chart.spread > SPREAD:
            ax.set_yscale("log")
        _bars(ax, chart, chart.members, None)
        ax.set_title(heading, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


def _bars(ax: Any, chart: _Chart, members: list[Result], backend: str | None) -> None:
    """Draw ``members`` on ``ax``: per x label, ours then its baseline for each backend.
    In a backend's own panel (``backend``) a baseline common to all its bars is a line."""
    common = {r.baseline for r in members}
    as_line = backend is not None and len(common) == 1 and None not in common
    bars: dict[str, list[tuple[Result, bool, float]]] = {x: [] for x in chart.labels}
    for r in members:
        bars[chart.label_of(r)].append((r, False, r.value))
        if r.baseline is not None and not as_line:
            bars[chart.label_of(r)].append((r, True, r.baseline))
    width = 0.8 / max(1, *(len(v) for v in bars.values()))
    legends: set[str] = set()
    for x, label in enumerate(chart.labels):
        row = bars[label]
        for i, (r, baseline, height) in enumerate(row):
            legend = _legend(chart, r, baseline)
            drawn = ax.bar(x + (i - (len(row) - 1) / 2) * width, height, width,
                           label=None if legend in legends or backend else legend,
                           color=chart.colours[r.backend], hatch="//" if baseline else None,
                           alpha=0.45 if baseline else 1.0)
            ax.bar_label(drawn, labels=[_compact(height)], fontsize=9, padding=2)
            legends.add(legend)
    if as_line:
        ax.axhline(members[0].baseline, color="0.35", linestyle="--", linewidth=1)
    elif backend is None:
        # A strip of its own above the tallest bar: the legend never hides a bar's value.
        if ax.get_yscale() == "linear":
            tallest = max(height for row in bars.values() for _, _, height in row)
            ax.set_ylim(0, tallest * 1.35)
        ax.legend(fontsize=9, loc="upper center", ncol=min(3, len(legends)), frameon=False)
    ax.set_xticks(range(len(chart.labels)))
    # Narrower lines the more labels share the width, so neighbours never overlap.
    width_chars = max(12, min(22, 80 // max(1, len(chart.labels))))
    ax.set_xticklabels(chart.labels if chart.numbered
                       else [_wrap(x, width_chars) for x in chart.labels], fontsize=9)
    ax.set_xlabel(_template(chart.members[0].name)[0] if chart.numbered else "", fontsize=10)
    ax.set_ylabel(chart.unit, fontsize=10)
    ax.tick_params(axis="y", labelsize=9)
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:,g}")  # 400,000 rather than 400000
    if backend is not None or ax.get_yscale() != "linear":
        ax.margins(y=0.15)
    if backend is not None:
        ax.set_title(backend, fontsize=11)


def _legend(chart: _Chart, r: Result, baseline: bool) -> str:
    if baseline:
        name = r.baseline_name or chart.repeated.get(r.baseline or 0.0) or "baseline"
        return f"{r.backend}: baseline ({name})"
    return f"{r.backend} (ours)" if chart.has_baseline else r.backend


def _compact(value: float) -> str:
    """A bar's value, short: 47.7k, 1,234, 56, 0.3."""
    if value >= 10_000:
        return f"{value / 1000:,.0f}k" if value >= 100_000 else f"{value / 1000:.1f}k"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def _wrap(text: str, width: int = 22) -> str:
    words, lines, line = text.split(), [], ""
    for word in words:
        if line and len(line) + len(word) + 1 > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "\n".join([*lines, line])


def write_charts(suite: str, results: list[Result], directory: Path | str,
                 command: str | None = None) -> list[Path]:
    """Write one PNG per chart of :func:`charts` into ``directory`` (created if missing);
    the written paths. Titles name the suite, the unit, the cores, the date and the
    command line."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    command = command or " ".join(["python", *sys.argv])
    caption = (f"{os.cpu_count()} cores, {datetime.date.today().isoformat()}, "
               f"$ {command}").replace("$", r"\$")
    written: list[Path] = []
    for title, members in charts(results).items():
        path = directory / f"{_slug(suite)}-{_slug(title)}.png"
        _draw(path, f"{suite}: {title}".replace("$", r"\$"), members, caption)
        written.append(path)
    return written


def from_json_lines(path: Path | str) -> list[Result]:
    """The results of a saved ``--json`` run (one JSON object per line)."""
    results: list[Result] = []
    for line in Path(path).read_text().splitlines():
        if line.strip().startswith("{"):
            data: dict[str, Any] = json.loads(line)
            results.append(Result(**{k: data[k] for k in Result.__slots__ if k in data}))
    return results
