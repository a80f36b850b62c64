"""The sink-side frontier: which (stream, group, partition, sequence) a sink already wrote.

When the sink's database is not the stream backend's, a crash between the
sink's commit and the group's ack makes the backend deliver the batch again.
The sink records, in the same transaction as its rows, the sequences it
wrote, per (sink table, stream, group, partition), as closed spans
``lo..hi``; a replayed message whose sequence lies in a span is skipped (and
acked) instead of written again.

A single "last sequence" per partition is not enough: batches of one partition
can commit out of order (several batch processors, a retried message, a
competing consumer), so "every sequence up to S" is never known to the sink.
Spans record exactly what was written; adjacent spans are merged, so the table
holds one row per partition plus one per gap (a dead-lettered or retried
sequence, or sequences the pipeline sent elsewhere).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from ..pipeline import Message

__all__ = [
    "DEFAULT_PROGRESS_TABLE",
    "GroupRows",
    "Span",
    "SpanPlan",
    "by_group",
    "covered",
    "create_table_sql",
    "is_covered",
    "plan_spans",
    "progress_table_for",
    "runs",
    "split_replayed",
    "union",
]

DEFAULT_PROGRESS_TABLE: Final = "rheo_sink_progress"


@dataclass(frozen=True, slots=True, order=True)
class Span:
    """Sequences ``lo..hi`` (inclusive) of one partition, all written."""

    part: int
    lo: int
    hi: int


@dataclass(slots=True)
class SpanPlan:
    """How to update the stored spans of one (stream, group) after a write."""

    delete: list[Span] = field(default_factory=list)
    insert: list[Span] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.delete or self.insert)


def covered(spans: Sequence[Span]) -> dict[int, list[tuple[int, int]]]:
    """The spans per partition, sorted, for :func:`is_covered` lookups."""
    out: dict[int, list[tuple[int, int]]] = {}
    for s in spans:
        out.setdefault(s.part, []).append((s.lo, s.hi))
    for ranges in out.values():
        ranges.sort()
    return out


def is_covered(index: Mapping[int, list[tuple[int, int]]], part: int, seq: int) -> bool:
    """Whether ``seq`` of ``part`` lies in a stored span."""
    ranges = index.get(part)
    if not ranges:
        return False
    # Few spans per partition: a linear scan beats bisect's overhead.
    return any(lo <= seq <= hi for lo, hi in ranges)


def runs(sequences: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted, distinct sequences as maximal runs of consecutive numbers."""
    ordered = sorted(set(sequences))
    if ordered and ordered[-1] - ordered[0] + 1 == len(ordered):
        return [(ordered[0], ordered[-1])]  # the common case: one contiguous run
    out: list[tuple[int, int]] = []
    for seq in ordered:
        if out and out[-1][1] + 1 == seq:
            out[-1] = (out[-1][0], seq)
        else:
            out.append((seq, seq))
    return out


def union(spans: Iterable[Span]) -> list[Span]:
    """The same sequences as ``spans``, as the fewest spans (overlapping and adjacent
    ones merged), sorted."""
    out: list[Span] = []
    for s in sorted(spans):
        last = out[-1] if out else None
        if last is not None and last.part == s.part and s.lo <= last.hi + 1:
            if s.hi > last.hi:
                out[-1] = Span(s.part, last.lo, s.hi)
        else:
            out.append(s)
    return out


def plan_spans(existing: Sequence[Span], written: Mapping[int, Sequence[tuple[int, int]]]
               ) -> SpanPlan:
    """Merge newly written runs of sequences (per partition, as :func:`runs` gives them)
    into the stored spans.

    Stored spans that overlap or touch a new run are deleted and replaced by
    their union with it; the other stored spans are left alone.
    """
    plan = SpanPlan()
    by_part: dict[int, list[Span]] = {}
    for s in existing:
        by_part.setdefault(s.part, []).append(s)
    for part, new in written.items():
        if not new:
            continue
        items = sorted([(s.lo, s.hi, s) for s in by_part.get(part, ())]
                       + [(lo, hi, None) for lo, hi in new], key=lambda e: (e[0], e[1]))
        groups: list[_Union] = []
        for lo, hi, span in items:
            if groups and lo <= groups[-1].hi + 1:
                group = groups[-1]
                group.hi = max(group.hi, hi)
            else:
                group = _Union(lo, hi)
                groups.append(group)
            if span is None:
                group.has_new = True
            else:
                group.stored.append(span)
        for g in groups:
            if not g.has_new:
                continue
            if len(g.stored) == 1 and (g.stored[0].lo, g.stored[0].hi) == (g.lo, g.hi):
                continue  # everything new was already inside one stored span
            plan.delete.extend(g.stored)
            plan.insert.append(Span(part, g.lo, g.hi))
    return plan


@dataclass(slots=True)
class _Union:
    lo: int
    hi: int
    stored: list[Span] = field(default_factory=list)
    has_new: bool = False


def progress_table_for(table: str) -> str:
    """The default progress table of a sink table: ``rheo_sink_progress`` in its schema."""
    schema, dot, _ = table.rpartition(".")
    return f"{schema}{dot}{DEFAULT_PROGRESS_TABLE}"


def create_table_sql(table_sql: str, *, primary_key: bool) -> str:
    """The progress table's DDL (``table_sql`` is already quoted)."""
    key = ", PRIMARY KEY (sink, stream, grp, part, lo)" if primary_key else ""
    return (
        f"CREATE TABLE IF NOT EXISTS {table_sql} ("
        "sink VARCHAR NOT NULL, stream VARCHAR NOT NULL, grp VARCHAR NOT NULL, "
        f"part INTEGER NOT NULL, lo BIGINT NOT NULL, hi BIGINT NOT NULL{key})"
    )




@dataclass(slots=True)
class GroupRows:
    """The rows of one (stream, group) in a batch: their indexes, partitions and sequences."""

    stream: str
    group: str
    indexes: Sequence[int]
    parts: list[int]
    seqs: list[int]

    @property
    def bounds(self) -> tuple[int, int]:
        """The lowest sequence minus one and the highest plus one (spans that touch)."""
        return min(self.seqs) - 1, max(self.seqs) + 1


def by_group(messages: Sequence[Message]) -> list[GroupRows]:
    """The batch's rows per (stream, group); usually all of them share one."""
    leases = [m.lease for m in messages]
    events = [lease.event for lease in leases]
    first = leases[0]
    stream, group = first.event.stream, first.group
    if all(lease.group == group for lease in leases) and all(
            e.stream == stream for e in events):
        return [GroupRows(stream, group, range(len(events)), [e.partition for e in events],
                          [e.sequence for e in events])]
    out: dict[tuple[str, str], tuple[list[int], list[int], list[int]]] = {}
    for i, (lease, e) in enumerate(zip(leases, events, strict=True)):
        indexes, parts, seqs = out.setdefault((e.stream, lease.group), ([], [], []))
        indexes.append(i)
        parts.append(e.partition)
        seqs.append(e.sequence)
    return [GroupRows(stream, group, *lists) for (stream, group), lists in out.items()]


def split_replayed(spans: Sequence[Span], rows: GroupRows
                   ) -> tuple[list[int], dict[int, list[tuple[int, int]]]]:
    """The indexes of rows already covered by ``spans``, and the runs of sequences of
    the others per partition (as :func:`runs` gives them)."""
    by_part: dict[int, list[int]] = {}
    for part, seq in zip(rows.parts, rows.seqs, strict=True):
        seqs = by_part.get(part)
        if seqs is None:
            by_part[part] = [seq]
        else:
            seqs.append(seq)
    index = covered(spans)
    hits: set[tuple[int, int]] = set()
    fresh: dict[int, list[tuple[int, int]]] = {}
    for part, seqs in by_part.items():
        ranges = index.get(part)
        if ranges:
            low, high = min(seqs), max(seqs)
            # Usually every stored span lies below the batch: nothing to look up.
            if any(lo <= high and low <= hi for lo, hi in ranges):
                done = {seq for seq in seqs if is_covered(index, part, seq)}
                hits.update((part, seq) for seq in done)
                seqs = [seq for seq in seqs if seq not in done]
        part_runs = runs(seqs)
        if part_runs:
            fresh[part] = part_runs
    if not hits:
        return [], fresh
    replayed = [i for i, part, seq in zip(rows.indexes, rows.parts, rows.seqs, strict=True)
                if (part, seq) in hits]
    return replayed, fresh
