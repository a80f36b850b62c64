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
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "chart"


def _shown(members: list[Result]) -> list[Result]:
    """Members minus those already drawn as another member's baseline bar."""
    baselines = {r.baseline for r in members if r.baseline is not None}
    return [r for r in members if r.baseline is not None or r.value not in baselines] \
        or members


def _draw(path: Path, title: str, members: list[Result], caption: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = _shown(members)
    # A baseline without a name is named after the result it repeats.
    repeated = {r.value: r.name for r in members if r not in shown}
    members = shown
    numbered = len({_template(r.name)[0] for r in members}) == 1 and \
        all(_template(r.name)[1] is not None for r in members)

    def label_of(r: Result) -> str:
        return f"{_template(r.name)[1]:g}" if numbered else r.name

    labels = list(dict.fromkeys(label_of(r) for r in members))
    backends = list(dict.fromkeys(r.backend for r in members))
    colours = {b: f"C{i}" for i, b in enumerate(backends)}
    has_baseline = any(r.baseline is not None for r in members)
    # Per x: ours then its baseline for each backend, centred on the tick.
    bars: dict[str, list[tuple[str, bool, float, str | None]]] = {label: [] for label in labels}
    for r in members:
        bars[label_of(r)].append((r.backend, False, r.value, None))
        if r.baseline is not None:
            bars[label_of(r)].append((r.backend, True, r.baseline,
                                      r.baseline_name or repeated.get(r.baseline)))
    width = 0.8 / max(len(v) for v in bars.values())
    fig, ax = plt.subplots(figsize=(max(8.0, 0.5 * sum(len(v) for v in bars.values()) + 3),
                                    4.8))
    legends: set[str] = set()
    for x, label in enumerate(labels):
        row = bars[label]
        for i, (backend, baseline, height, baseline_name) in enumerate(row):
            legend = f"{backend}: baseline ({baseline_name or 'baseline'})" if baseline \
                else f"{backend} (ours)" if has_baseline else backend
            ax.bar(x + (i - (len(row) - 1) / 2) * width, height, width,
                   label=None if legend in legends else legend, color=colours[backend],
                   hatch="//" if baseline else None, alpha=0.45 if baseline else 1.0)
            legends.add(legend)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels if numbered else [_wrap(x) for x in labels],
                       fontsize=10 if numbered else 8)
    ax.set_xlabel(_template(members[0].name)[0] if numbered else "")
    ax.set_ylabel(members[0].unit)
    ax.legend(fontsize=8)
    ax.set_title("\n".join([title, *textwrap.wrap(caption, 100)]), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


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
