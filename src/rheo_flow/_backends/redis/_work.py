"""A Redis Cluster's summaries of which partitions of a group have work (``work.lua``).

A script on a Cluster touches one slot, so the partition scripts cannot keep the
summaries that let a standalone fetch visit only the partitions with work. Here the
client keeps them, in a slot of their own per stream (``{P:s:work}``), as a hint:

* after an append, nack, redrive, replay, reset or trim that made work (or may have),
  the client *notes* the partitions (one ``work`` call, after the partition scripts
  answered): each note bumps the stream's version and marks the partitions;
* a fetch first *plans* (one ``work`` call, in its first round trip): the partitions
  the notes and earlier fetches say have new or due work; it visits only those, and
  then writes back what the visits found (``fetch.lua`` reports each partition's
  earliest due delivery and whether events are past the cursor) when that differs
  from the plan. Such a write lowers an entry always, and raises or clears it only
  when no note of that partition came after the plan, so a note a fetch did not see
  is never undone by it.

A stale "has work" costs one partition call, whose visit corrects it. A missed "has
work" (a note lost with its client, a release that writes no notes) is healed by the
resync: a backend's first fetch of a group, and one every ``_SWEEP_S`` seconds after,
visits every partition and writes them all; a group whose summary was never written
in full (new, deleted, or lost with a node) is resynced by every fetch until one is.
A note that fails is not reported (the operation it follows succeeded): this
backend's next fetch of the stream resyncs instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from ..._model._errors import BackendError
from ._codec import text
from ._core import RedisCore
from ._scripts import ScriptCall

__all__ = ["Planned", "WorkNotes", "WorkPlan", "plan_of"]


class WorkPlan(NamedTuple):
    """A ``work.lua`` plan: what the summary says of a group's partitions."""

    version: int
    written: bool
    """Whether a fetch wrote the summary from every partition since it was (re)created."""
    now: int
    """The summary's server time (ms)."""
    fresh: dict[int, int | None]
    """The partitions that may have new events, with their due score (None: none)."""
    due: dict[int, int]
    """The partitions with a due score at or before ``now``."""

    def with_work(self) -> set[int]:
        return {*self.fresh, *self.due}

    def needs_write(self, p: int, earliest: int, fresh: bool) -> bool:
        """Whether what a visit of ``p`` found (its earliest due delivery, 0: none, and
        whether events are past the cursor) should be written back: it is work the plan
        did not show (a lease's deadline, events left over), or the plan showed work now
        that is not there (the partition would be visited again for nothing)."""
        score = self.due.get(p, self.fresh.get(p))
        was_fresh = p in self.fresh
        if fresh != was_fresh:
            return True
        if earliest and (score is None or earliest < score):
            return True
        return score is not None and score <= self.now and (not earliest or earliest > self.now)


class Planned(NamedTuple):
    """A planned fetch: its plan, and whether it visited every partition (a resync)."""

    plan: WorkPlan
    full: bool


def plan_of(raw: Sequence[Any]) -> WorkPlan:
    """The plan in a ``work.lua`` ``p`` reply."""
    version, written, now, fresh_text, due_text = raw
    fresh: dict[int, int | None] = {}
    for pair in filter(None, text(fresh_text).split(",")):
        p, _, score = pair.partition(":")
        fresh[int(p)] = int(float(score)) if score else None
    due: dict[int, int] = {}
    for pair in filter(None, text(due_text).split(",")):
        p, _, score = pair.partition(":")
        due[int(p)] = int(float(score))
    return WorkPlan(int(version), bool(int(written)), int(now), fresh, due)


class WorkNotes(RedisCore):
    """Noting work in a Cluster's summaries, and the calls a planned fetch makes."""

    def _planned_streams(self, stream: str) -> bool:
        """Whether fetches of the stream may plan with the summaries: a Cluster, and not
        a stream known to have one partition (a settle may come from a backend that
        never read the stream's record: it notes all the same)."""
        return self._cluster and self._partitions.get(stream) != 1

    def _plan_call(self, stream: str, group: str) -> ScriptCall:
        return ("work", self._keys.work_keys(stream, group), ["p"])

    def _found_call(self, stream: str, group: str, planned: Planned,
                    found: dict[int, tuple[int, bool]], count: int) -> ScriptCall | None:
        """The write of what a planned fetch's visits found (None: nothing to write).
        A resync writes every partition, and marks the summary written when it has
        them all."""
        plan = planned.plan
        args: list[Any] = []
        for p, (earliest, fresh) in found.items():
            if planned.full or plan.needs_write(p, earliest, fresh):
                args += [p, earliest, "1" if fresh else "0"]
        complete = planned.full and len(found) == count
        if not args and not complete:
            return None
        return ("work", self._keys.work_keys(stream, group),
                ["x", plan.version, "1" if complete else "0", *args])

    async def _write_work(self, stream: str, call: ScriptCall) -> None:
        """Run a summary write (best effort: see the module docstring)."""
        await self._note_calls(stream, [call])

    async def _note_appended(self, stream: str, partitions: Iterable[int]) -> None:
        """Events were appended to the partitions (after their scripts answered)."""
        if self._planned_streams(stream):
            await self._note_calls(stream, [
                ("work", self._keys.work_keys(stream), ["a", *sorted(set(partitions))])])

    async def _note_work(self, stream: str, groups: Iterable[str], partitions: Iterable[int],
                         *, fresh: bool) -> None:
        """The groups may have work in the partitions: events past their cursor
        (``fresh``: a replay or reset) or deliveries due now."""
        ps = sorted(set(partitions))
        if not ps or not self._planned_streams(stream):
            return
        await self._note_calls(stream, [
            ("work", self._keys.work_keys(stream, group), ["n", "1" if fresh else "0", *ps])
            for group in sorted(set(groups))])

    async def _note_due(self, stream: str, group: str, partitions: Iterable[int],
                        at_ms: int) -> None:
        """A renew moved the group's leases in the partitions to expire at ``at_ms``: the
        summary's entry may name a later time (the lease ms was longer), so it is lowered."""
        ps = sorted(set(partitions))
        if not ps or not self._planned_streams(stream):
            return
        await self._note_calls(stream, [
            ("work", self._keys.work_keys(stream, group), ["d", at_ms, *ps])])

    async def _note_calls(self, stream: str, calls: list[ScriptCall]) -> None:
        """Run the calls; when they fail, this backend's next fetches of the stream
        resync (the summary may miss what they would have noted)."""
        try:
            await self._eval(calls)
        except BackendError:
            for key in [key for key in self._swept if key[0] == stream]:
                del self._swept[key]
