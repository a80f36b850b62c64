"""Stateful rules that re-drive dead letters and delete the group or the stream.

``redrive_all`` re-drives every dead letter at once; ``expire_at_max_then_redrive``
takes one delivery (of a key, when there is one) to its last attempt, lets the
lease run out there, fetches (which dead-letters it and, in a key-ordered group,
may lease the next delivery of its key), re-drives it and fetches again, so
that expiry, max attempts, key ordering and redrive meet by design rather than
by chance. The deletions check that the group (or stream) is gone, create it
again under the same name and start the model afresh.
"""

from __future__ import annotations

from typing import Literal

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from .._model._errors import UnknownGroup, UnknownStream
from .._model._lease import Lease
from .._model._stream import DeadLetter, StartPosition
from ._case import LONG_MS, check, check_equal, expect_error
from ._model import Op, outcome_of
from ._stateful_base import (
    CONSUMERS,
    ERRORS,
    KEYS,
    MAX_ATTEMPTS,
    PARTITIONS,
    START_CHOICES,
    MachineBase,
)

__all__ = ["RedriveAndDeletionRules"]

DRIVE_LIMIT = 8
"""How many leases a fetch of the drive takes from the partition."""
End = Literal["expire", "nack", "reject"]
ENDS: list[End] = ["expire", "expire", "nack", "reject"]
"""How the drive dead-letters a delivery at its last attempt (an expiry half the time)."""
PAUSED_SETTLES: list[Op] = ["renew", "ack", "nack"]
"""What the pause rule does with a held lease while the group is paused."""


class RedriveAndDeletionRules(MachineBase):
    """Rules re-driving dead letters and deleting the group or the stream."""

    @rule()
    def redrive_all(self) -> None:
        self.run(self._redrive_all())

    async def _redrive_all(self, dead: list[DeadLetter] | None = None) -> None:
        """``redrive`` naming no dead letter re-drives every one of the group
        (``redrive.dead_letters_only``) and counts them. ``dead``: the model was just
        told every dead letter (:meth:`_settle_doomed`), here they are."""
        if dead is None:
            dead = await self._settle_doomed()
        count = await self.rheo.redrive(self.stream, self.group)
        check_equal(count, len(dead), "redrive of every dead letter: the count")
        self.model.redriven([(d.partition, d.sequence) for d in dead])
        event(f"redrive_all: {'some' if dead else 'no'} dead letters")

    @rule(index=st.integers(0, 99), end=st.sampled_from(ENDS), everything=st.booleans())
    def expire_at_max_then_redrive(self, index: int, end: End, everything: bool) -> None:
        # Two events of one key: the second waits for the first when key-ordered.
        # On a real clock they are appended every time: whether leases are still held
        # depends on it (a short lease may run out between steps), and a precondition
        # reads the event count, which must not, or Hypothesis finds its data
        # generation flaky. On a harness's own clock, only when none is held.
        if not (self.harness.exact_time and self.current()):
            self.append_events([(KEYS[index % len(KEYS)], None)] * 2, duplicate=1)
        self.run(self._expire_at_max_then_redrive(index, end, everything=everything))

    async def _expire_at_max_then_redrive(self, index: int, end: End, *,
                                          everything: bool) -> None:
        """Nack one held lease (of a key, when there is one; or one fetched now) with an
        error up to its last attempt; there let it expire (``end="expire"``), or nack
        or reject it without an error; fetch, re-drive it (or every dead letter) and
        fetch again. The dead letter keeps the error (``settle.last_error``); the
        fetches check that it is dead-lettered, that its key moves on
        (``ordering.released``) and that the redriven delivery comes back with
        attempt 1, beside a later lease of its key that the redrive does not revoke
        (``ordering.key_blocked``)."""
        current = self.current() or await self._fetch(DRIVE_LIMIT, None, CONSUMERS[1], LONG_MS)
        keyed = [x for x in current if x.event.key is not None] or current
        if not keyed:
            return
        lease: Lease | None = keyed[index % len(keyed)]
        while lease is not None and lease.attempt < MAX_ATTEMPTS:
            await self._settle("nack", [lease], error=ERRORS[index % 2])
            lease = await self._fetch_again(lease)
        if lease is None:
            return
        if end == "expire":
            await self._expire([lease])
        else:
            await self._settle(end, [lease])
        await self._fetch(DRIVE_LIMIT, [lease.partition], CONSUMERS[1], LONG_MS)
        dead = await self._settle_doomed()
        chosen = [d for d in dead if (d.partition, d.sequence) == (lease.partition, lease.sequence)]
        if not chosen:
            return
        if everything:
            await self._redrive_all(dead)
        else:
            check_equal(await self.rheo.redrive(self.stream, self.group, chosen), 1,
                        f"redrive of dead letter {(lease.partition, lease.sequence)}: the count")
            self.model.redriven([(lease.partition, lease.sequence)])
        await self._fetch(DRIVE_LIMIT, [lease.partition], CONSUMERS[1], LONG_MS)
        key = "keyed" if lease.event.key is not None else "keyless"
        order = "key-ordered" if self.model.ordered else "unordered"
        event(f"expire_at_max_then_redrive: {key} delivery of a {order} group, {end}")

    async def _fetch_again(self, lease: Lease) -> Lease | None:
        """Fetch from the lease's partition; the new lease of its delivery, if leased."""
        leases = await self._fetch(DRIVE_LIMIT, [lease.partition], CONSUMERS[1], LONG_MS)
        return next((x for x in leases if x.sequence == lease.sequence), None)

    @precondition(lambda self: self.backend.capabilities.pause)
    @rule(op=st.sampled_from(PAUSED_SETTLES))
    def pause_settle_resume(self, op: Op) -> None:
        self.run(self._pause_settle_resume(op))

    async def _pause_settle_resume(self, op: Op) -> None:
        """``pause_group``: the group's fetches return nothing (``pause.fetch``, checked
        by the model) while a held lease settles or renews as it would; ``resume_group``
        ends it (``pause.resume``). The pause lasts this rule only, so that the other
        rules keep finding work."""
        info = await self.rheo.pause_group(self.stream, self.group)
        check_equal((info.paused, info.paused_until_ms), (True, None), "pause_group's info")
        self.model.paused = True
        try:
            await self._fetch(DRIVE_LIMIT, None, CONSUMERS[1], LONG_MS)
            await self._settle(op, self.current()[:1])
        finally:
            self.model.paused = False
            await self._resume()
        event(f"pause_settle_resume: {op}")

    async def _resume(self) -> None:
        """``resume_group``: the group's fetches lease again (``pause.resume``)."""
        info = await self.rheo.resume_group(self.stream, self.group)
        check_equal((info.paused, info.paused_until_ms), (False, None), "resume_group's info")
        check_equal((await self.rheo.group_info(self.stream, self.group)).paused, False,
                    "group_info after resume_group")
        self.model.paused = False

    @rule(start=START_CHOICES, flip=st.integers(0, 3))
    def delete_and_recreate_group(self, start: StartPosition, flip: int) -> None:
        """Created again with the same ordering, or (one time in four) the other one."""
        self.run(self._recreate_group(start, self.model.ordered != (flip == 0)))

    async def _recreate_group(self, start: StartPosition, ordered: bool) -> None:
        """``delete_group`` removes the group (``delete.group``): it is no longer listed,
        calls naming it raise ``UnknownGroup`` naming it, its leases settle nothing
        (``settle.unknown_lease``); created again, it starts fresh at ``start``
        (``group.start``), without the dead letters of the old group: the rule
        rejects a held lease first when the group has none."""
        held = self.current()
        if held and not self.model.rejected():
            await self._settle("reject", held[-1:], error=ERRORS[0])
        await self.rheo.delete_group(self.stream, self.group)
        groups = [g.group for g in await self.rheo.groups(self.stream)]
        check(self.group not in groups, f"groups() lists the deleted group: {groups}")
        exc = await expect_error(UnknownGroup, self.rheo.group_info(self.stream, self.group),
                                 "group_info of the deleted group")
        check_equal((getattr(exc, "stream", None), getattr(exc, "group", None)),
                    (self.stream, self.group), "the stream and group UnknownGroup names")
        held = [x for x in self.current()[:2] if x.lease_id not in self.orphans]
        if held:
            results = await self.rheo.ack(held)
            check_equal([outcome_of(r) for r in results], ["invalid"] * len(held),
                        "ack with leases of the deleted group")
        await self._create_group(start, ordered)
        event(f"delete_and_recreate_group: start={'sequence' if isinstance(start, int) else start}")

    @precondition(lambda self: self.counter >= 12)
    @rule(ordered=st.booleans())
    def delete_and_recreate_stream(self, ordered: bool) -> None:
        self.run(self._recreate_stream(ordered))

    async def _recreate_stream(self, ordered: bool) -> None:
        """``delete_stream`` removes the stream with its groups (``delete.stream``); the
        name created again is a new stream: sequences from 1, old ids new again, old
        leases settle nothing."""
        await self.rheo.delete_stream(self.stream)
        streams = await self.rheo.streams()
        check(self.stream not in streams, "streams() lists the deleted stream")
        exc = await expect_error(UnknownStream, self.rheo.stream_info(self.stream),
                                 "stream_info of the deleted stream")
        check_equal(getattr(exc, "stream", None), self.stream, "the stream UnknownStream names")
        self.orphans.update(self.leases)
        self.model = self.new_model()
        await self.rheo.create_stream(self.stream, partitions=PARTITIONS)
        await self._create_group("earliest", ordered)
        event("delete_and_recreate_stream")
