"""The store gauges in the Prometheus text format, written directly.

One scrape of a store of 100 streams x 4 groups x 8 partitions is about 17,000 lines.
Through OpenTelemetry's SDK and its Prometheus exporter they took 0.5-0.9 s to render
(per point: an observation, an aggregation, an exemplar reservoir, a label check); as
lines written here they take a few milliseconds. The names, label names and units are
those the exporter gives the runtime's instruments on the same page.
"""

from __future__ import annotations

from collections.abc import Callable

from ..._model._lag import GroupLag, LagReport, PartitionLag, age_seconds
from ..._telemetry import _names as n

__all__ = ["store_text"]


def _prom(name: str) -> str:
    return name.replace(".", "_")


_SYSTEM = f'{_prom(n.MESSAGING_SYSTEM)}="{n.SYSTEM}"'
_PartitionPick = Callable[[PartitionLag, int], "float | None"]

_PARTITION_GAUGES: tuple[tuple[str, str, _PartitionPick], ...] = (
    (_prom(n.STORE_LAG), "Events appended but not settled by the group (high water minus "
     "frontier), read from the store.", lambda p, _: p.lag),
    (_prom(n.STORE_SCHEDULED), "Of the lag, events whose delivery time is ahead.",
     lambda p, _: p.scheduled),
    (_prom(n.STORE_FRONTIER), "The group's contiguous frontier (settled up to it).",
     lambda p, _: p.frontier),
    (_prom(n.STORE_HIGH_WATER), "Highest appended sequence of the partition.",
     lambda p, _: p.high_water),
    (_prom(n.STORE_OLDEST_UNSETTLED_AGE) + "_seconds", "Age of the first event past the "
     "frontier at the read (0 when none).",
     lambda p, at: age_seconds(p.oldest_unsettled_ms, at) or 0.0),
)
_GROUP_GAUGES: tuple[tuple[str, str, Callable[[GroupLag], float]], ...] = (
    (_prom(n.STORE_DEAD_LETTERS), "Dead-lettered deliveries of the group.",
     lambda g: g.dead_letters),
    (_prom(n.STORE_PAUSED), "1 while the group is paused, else 0.", lambda g: int(g.paused)),
)


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


def store_text(report: LagReport | None, *, up: bool, read_seconds: float,
               read_at: float | None) -> str:
    """The store gauges of ``report`` (none before a first read) and the read's own."""
    lines: list[str] = []
    if report is not None:
        groups = [(g, f'{_prom(n.CONSUMER_GROUP)}="{_escape(g.group)}",'
                      f'{_prom(n.DESTINATION)}="{_escape(g.stream)}"') for g in report.groups]
        at = report.read_at_ms
        partition = _prom(n.PARTITION)
        for name, help_text, pick in _PARTITION_GAUGES:
            lines.append(f"# HELP {name} {help_text}\n# TYPE {name} gauge")
            lines.extend(f'{name}{{{labels},{partition}="{p.partition}",{_SYSTEM}}} '
                         f"{_number(value)}"
                         for g, labels in groups for p in g.partitions
                         if (value := pick(p, at)) is not None)
        for name, help_text, group_pick in _GROUP_GAUGES:
            lines.append(f"# HELP {name} {help_text}\n# TYPE {name} gauge")
            lines.extend(f"{name}{{{labels},{_SYSTEM}}} {_number(group_pick(g))}"
                         for g, labels in groups)
    for name, help_text, value in (
            (_prom(n.STORE_UP), "1 when the last read of the store succeeded, else 0.",
             int(up)),
            (_prom(n.STORE_READ_DURATION) + "_seconds",
             "How long the last read of the lag report took.", read_seconds),
            (_prom(n.STORE_READ_TIMESTAMP) + "_seconds",
             "When the last successful read finished (Unix time).", read_at)):
        if value is not None:
            lines.append(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n"
                         f"{name}{{{_SYSTEM}}} {_number(value)}")
    return "\n".join(lines) + "\n" if lines else ""
