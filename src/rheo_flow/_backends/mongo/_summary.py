"""A group's work summary: which partitions may have events past its cursor.

Each group document keeps ``w``, a small map from partition (as text) to the
sequence that partition was *appended up to* when it was noted, holding only the
partitions that may have events past the group's cursor, and ``ws`` (1) once the
summary is complete. A fetch reads the group without its per-partition entries
(``parts``), then visits only the partitions named in ``w`` or holding due
deliveries (the index by ready time tells those): an empty fetch reads the
group's few fields and one empty index range, whatever the partition count
(``_claim``). The summary lives in the group document so that the rules that
move a group's cursor (claims, replay, reset, trim) and the epoch that fences
them stay in one place.

Who writes it:

* an append *notes* the partitions it appended to, in every group of the stream
  (one ``update_many`` raising ``w.<p>`` with ``$max`` to the last sequence it
  appended there), twice: once before its sequences become visible (before the
  counters are raised; with transactions, before the commit) and once after. The
  first note means a process that dies mid-append leaves no visible event
  unnoted; the second covers a group created while the append was in flight
  (after the first note, which could not reach it, and before the counters moved,
  which its creation could not see);
* a replay or a reset notes the partitions it moves back, in the update that
  moves the cursors (the same document, so atomically) and bumps their epochs;
* a fetch that moved a partition's cursor to at least the value it read *clears*
  the entry, with ``{parts.<p>.e: epoch read, w.<p>: {$lte: cursor}}`` as the
  filter, after the cursor's ``$max`` in the same ordered bulk write;
* a group with no ``ws`` (created before summaries, or by a process that died
  before finishing it) is *built* by the next fetch, which reads the group whole
  and every high water as fetches did before, and adds an entry (``$max``) for
  every partition whose high water is past the cursor; its creation does the
  same right after inserting the group.

Why no event is hidden. ``w.<p>`` only grows, except through a clear, and a clear
only removes an entry that is at most the cursor at that moment: the value
compared is the cursor the fetch read or the one its ``$max`` (run first) raised it
to, and the epoch in the filter is unchanged, so no replay or reset (the only
writes that lower a cursor, each bumping the epoch) moved it back since. Every
append notes its last sequence before that sequence is visible:
if the note landed before the clear, the clear's ``$lte`` fails unless the cursor
has passed that sequence already (the events are materialised); if it lands
after, it writes the entry again. A race between an append and a fetch clearing
the flag therefore ends with either the events claimed or the entry present, and
no ordering of the two writes loses one. A group whose document appeared between
an append's first note and its counters is reached by the second note, which
follows the counters: the creation (or the build) reads the high waters after the
insert, so it sees the counters or the second note finds the document. Only a
process dying between those two points while a group is being created leaves
that group's entry missing, until the next append to the partition.

The summary over-approximates: an entry may stay after its events were claimed
(a fetch filled its batch first, a trim raised the cursor, a first note outran a
failed append), which costs the next fetch a visit of that partition; the visit
reads the high water and clears what the cursor has passed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pymongo import ReturnDocument, UpdateOne

from ._documents import Group

__all__ = ["built", "clears", "initial", "note"]


async def note(groups: Any, stream: str, tops: Mapping[int, int]) -> None:
    """Note in every group of ``stream`` that partition ``p`` was appended up to ``tops[p]``."""
    if tops:
        await groups.update_many(
            {"s": stream}, {"$max": {f"w.{p}": top for p, top in sorted(tops.items())}})


def initial(cursors: Mapping[int, int], highs: Mapping[int, int]) -> dict[int, int]:
    """The entries of a summary built from the cursors and the high waters: the partitions
    with events past the cursor, each at its high water."""
    return {p: highs[p] for p, cursor in cursors.items() if highs.get(p, 0) > cursor}


async def built(groups: Any, g: Group, highs: Mapping[int, int]) -> Group:
    """Complete ``g``'s summary from its cursors (``g`` read whole) and ``highs`` (read after
    the group document existed); ``g`` with its summary.

    Entries are only added (``$max``): a note landing meanwhile is kept.
    """
    entries = initial({p: part["c"] for p, part in g.parts.items()}, highs)
    update: dict[str, Any] = {"$set": {"ws": 1, "np": g.count}}
    if entries:
        update["$max"] = {f"w.{p}": top for p, top in sorted(entries.items())}
    doc = await groups.find_one_and_update({"_id": g.id}, update, {"w": 1},
                                           return_document=ReturnDocument.AFTER)
    if doc is None:  # deleted meanwhile: nothing to fetch from
        g.work = {}
    else:
        g.work = {int(p): top for p, top in (doc.get("w") or {}).items()}
    return g


def clears(g: Group, cursors: Mapping[int, int], visited: list[int]) -> list[UpdateOne]:
    """The writes clearing the entries of ``visited`` that ``cursors`` (the cursor raised
    per partition, where it was) have passed, each fenced by the epoch read and by the
    entry still being at most the cursor (a later note keeps it). To follow the
    cursors' ``$max`` in an ordered bulk write."""
    out: list[UpdateOne] = []
    work = g.work or {}
    for p in visited:
        if p not in work:
            continue
        cursor = max(g.parts[p]["c"], cursors.get(p, 0))
        if cursor >= work[p]:
            out.append(UpdateOne(
                {"_id": g.id, f"parts.{p}.e": g.parts[p]["e"], f"w.{p}": {"$lte": cursor}},
                {"$unset": {f"w.{p}": ""}}))
    return out
