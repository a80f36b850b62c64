"""The conformance kit can fail: deliberately broken backends must each fail some case.

Each mutant is the in-memory backend with one rule of the contract broken. The
unmodified memory backend passes every case and the stateful test; every
mutant fails at least the cases named for it, and the stateful model catches
the ones that break what it drives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import Phase, settings

from rheo_flow import GroupInfo, Lease, SettleKind, SettleResult
from rheo_flow._backend import AppendRecord
from rheo_flow._backends._transitions import Op, Settled
from rheo_flow._backends.memory import MemoryBackend
from rheo_flow._backends.memory._state import (
    Delivery,
    Group,
    GroupPartition,
    Partition,
    Stream,
)
from rheo_flow._model._event import Event
from rheo_flow._model._stream import DeadLetter, StartPosition
from rheo_flow.testing import (
    CASES,
    BackendHarness,
    memory_harness,
    run_cases,
    run_stateful,
)

Found = tuple[Group, GroupPartition, Delivery] | SettleResult


class NoFencing(MemoryBackend):
    """Settles and renews whatever delivery a lease names, ignoring lease id and receipt."""

    def _find(self, lease: Lease) -> Found:
        g = self._groups.get((lease.stream, lease.group))
        if g is not None and 0 <= lease.partition < len(g.partitions):
            gp = g.partitions[lease.partition]
            d = gp.active.get(lease.sequence) or gp.done.get(lease.sequence)
            if d is not None:
                return g, gp, d
        return super()._find(lease)


class ReceiptIgnored(MemoryBackend):
    """Checks the lease id but not the receipt."""

    def _find(self, lease: Lease) -> Found:
        g = self._groups.get((lease.stream, lease.group))
        if g is not None and 0 <= lease.partition < len(g.partitions):
            gp = g.partitions[lease.partition]
            d = gp.active.get(lease.sequence) or gp.done.get(lease.sequence)
            if d is not None and d.lease_id == lease.lease_id:
                return g, gp, d
        return super()._find(lease)


class FetchIgnoresLimit(MemoryBackend):
    """Leases everything that is eligible, whatever the limit."""

    async def fetch(self, stream: str, group: str, consumer_id: str, limit: int, lease_ms: int,
                    partitions: Sequence[int] | None) -> list[Lease]:
        return await super().fetch(stream, group, consumer_id, 10_000, lease_ms, partitions)


class FrontierSkipsHoles(MemoryBackend):
    """Reports the highest settled sequence instead of the contiguous frontier."""

    async def frontier(self, stream: str, group: str) -> dict[int, int]:
        g = self._group(stream, group)
        return {i: max([gp.frontier, *gp.done]) for i, gp in enumerate(g.partitions)}


class AppendNotIdempotent(MemoryBackend):
    """Stores an event again when its id is already in the stream."""

    async def append(self, stream: str, records: Sequence[AppendRecord]) -> list[Event]:
        s = self._stream(stream)
        for record in records:
            s.ids.pop(record.id, None)
        return await super().append(stream, records)


class RenewDoesNotExtend(MemoryBackend):
    """Answers renew with a new deadline but keeps the old one."""

    async def renew(self, leases: Sequence[Lease], lease_ms: int) -> list[SettleResult]:
        before: dict[str, tuple[Delivery, int]] = {}
        for lease in leases:
            found = self._find(lease)
            if not isinstance(found, SettleResult):
                before[lease.lease_id] = (found[2], found[2].deadline_ms)
        results = await super().renew(leases, lease_ms)
        for delivery, deadline in before.values():
            delivery.deadline_ms = deadline
        return results


class RepeatedSettleIsStale(MemoryBackend):
    """Answers a repeated settle with stale_lease instead of ok/repeated."""

    async def ack(self, leases: Sequence[Lease]) -> list[SettleResult]:
        return [
            SettleResult.failure(r.lease_id, SettleKind.STALE_LEASE) if r.repeated else r
            for r in await super().ack(leases)
        ]


class MaxAttemptsIgnored(MemoryBackend):
    """Redelivers forever: the group's max_attempts is never enforced."""

    async def create_group(self, stream: str, group: str, start: StartPosition,
                           max_attempts: int | None, *, ordering: str = "none") -> GroupInfo:
        info = await super().create_group(stream, group, start, max_attempts, ordering=ordering)
        g = self._groups[(stream, group)]
        g.info = dataclasses.replace(info, max_attempts=1_000_000)
        return info


class ReplayForgetsNothing(MemoryBackend):
    """replay does nothing."""

    async def replay(self, stream: str, group: str, from_sequence: int,
                     partitions: Sequence[int]) -> None:
        self._group(stream, group)


class TrimReusesSequences(MemoryBackend):
    """A partition trimmed empty starts numbering at 1 again."""

    async def trim(self, stream: str, up_to: Mapping[int, int]) -> dict[int, int]:
        removed = await super().trim(stream, up_to)
        for part in self._stream(stream).partitions:
            if part.low_water > part.high_water:
                part.high_water, part.low_water = 0, 1
        return removed


class RejectAcks(MemoryBackend):
    """reject acknowledges instead of dead-lettering."""

    async def reject(self, leases: Sequence[Lease], reason: str,
                     error: str | None = None) -> list[SettleResult]:
        return await self.ack(leases)


class NackIgnoresDelay(MemoryBackend):
    """nack makes deliveries available at once, whatever the delay."""

    async def nack(self, leases: Sequence[Lease], reason: str, delay_ms: int,
                   error: str | None = None) -> list[SettleResult]:
        return await super().nack(leases, reason, 0, error)


class ResetKeepsDeadLetters(MemoryBackend):
    """reset forgets deliveries but keeps the partition's dead letters."""

    def _move_to(self, gp: GroupPartition, part: Partition, start: StartPosition) -> None:
        kept = {seq: d for seq, d in gp.done.items() if d.state == "rejected"}
        super()._move_to(gp, part, start)
        gp.done.update(kept)


class ResetFrontierAtHighWater(MemoryBackend):
    """reset to a sequence leaves the frontier at the high water: trim-unsafe."""

    def _move_to(self, gp: GroupPartition, part: Partition, start: StartPosition) -> None:
        super()._move_to(gp, part, start)
        gp.frontier = part.high_water


class RedriveTouchesAcked(MemoryBackend):
    """redrive of named positions also re-drives acked deliveries."""

    async def redrive(self, stream: str, group: str,
                      positions: Sequence[tuple[int, int]] | None) -> int:
        count = await super().redrive(stream, group, positions)
        g = self._group(stream, group)
        for pid, seq in positions or ():
            d = g.partitions[pid].done.get(seq)
            if d is not None and d.state == "acked":
                self._make_available(g.partitions[pid], d, self._clock())
                g.partitions[pid].frontier = min(g.partitions[pid].frontier, seq - 1)
                count += 1
        return count


class RedriveRestartsLive(MemoryBackend):
    """redrive of a named position that is leased or available starts it over."""

    async def redrive(self, stream: str, group: str,
                      positions: Sequence[tuple[int, int]] | None) -> int:
        count = await super().redrive(stream, group, positions)
        g = self._group(stream, group)
        for pid, seq in positions or ():
            d = g.partitions[pid].active.get(seq)
            if d is not None and d.attempt > 0:
                self._make_available(g.partitions[pid], d, self._clock())
                count += 1
        return count


class WakeOnAnyAppend(MemoryBackend):
    """An append wakes the waiters of every stream."""

    async def append(self, stream: str, records: Sequence[AppendRecord]) -> list[Event]:
        events = await super().append(stream, records)
        for other in self._streams:
            self._waiters.wake(other)
        return events


class DeadLetterPagesCompareSequencesOnly(MemoryBackend):
    """dead_letters(after=...) skips by sequence alone, losing later partitions' entries."""

    async def dead_letters(self, stream: str, group: str, limit: int,
                           after: tuple[int, int] | None) -> list[DeadLetter]:
        everything = await super().dead_letters(stream, group, 1_000_000, None)
        if after is not None:
            everything = [d for d in everything
                          if (d.partition, d.sequence) > after and d.sequence > after[1]]
        return everything[:limit]


class TrimFrontierOnlyToBound(MemoryBackend):
    """A forced trim raises the frontier to the bound but does not walk on."""

    async def trim(self, stream: str, up_to: Mapping[int, int]) -> dict[int, int]:
        groups = [g for (s, _), g in self._groups.items() if s == stream]
        before = [[gp.frontier for gp in g.partitions] for g in groups]
        high = [part.high_water for part in self._stream(stream).partitions]
        removed = await super().trim(stream, up_to)
        for g, frontiers in zip(groups, before, strict=True):
            for pid, bound in up_to.items():
                g.partitions[pid].frontier = max(frontiers[pid], min(bound, high[pid]))
        return removed


class DeadLetterTimeIsTheDeadline(MemoryBackend):
    """A reject or a nack at max attempts stamps the lease's deadline as rejected_at_ms."""

    def _apply(self, gp: GroupPartition, d: Delivery, outcome: Settled) -> None:
        super()._apply(gp, d, outcome)
        if outcome.state == "rejected" and outcome.settled_by is not None:
            d.rejected_at_ms = d.deadline_ms


class ExpiredDeadLetterTimeIsZero(MemoryBackend):
    """A delivery dead-lettered on expiry gets rejected_at_ms 0."""

    def _apply(self, gp: GroupPartition, d: Delivery, outcome: Settled) -> None:
        super()._apply(gp, d, outcome)
        if outcome.state == "rejected" and outcome.settled_by is None:
            d.rejected_at_ms = 0


class NackedRedeliveryKeepsItsLease(MemoryBackend):
    """A nacked delivery is redelivered under its old lease id and receipt."""

    async def fetch(self, stream: str, group: str, consumer_id: str, limit: int, lease_ms: int,
                    partitions: Sequence[int] | None) -> list[Lease]:
        g = self._group(stream, group)
        old = {(pid, seq): (d.lease_id, d.receipt)
               for pid, gp in enumerate(g.partitions) for seq, d in gp.active.items()
               if d.state == "available" and d.settled_by == "nack"}
        leases = await super().fetch(stream, group, consumer_id, limit, lease_ms, partitions)
        out = []
        for lease in leases:
            ids = old.get((lease.partition, lease.sequence))
            if ids is not None and ids[0] is not None and ids[1] is not None:
                d = g.partitions[lease.partition].active[lease.sequence]
                d.lease_id, d.receipt = ids
                lease = dataclasses.replace(lease, lease_id=ids[0], receipt=ids[1])
            out.append(lease)
        return out


class RedeliveriesReversed(MemoryBackend):
    """Within one fetch, a partition's redeliveries come in reverse sequence order."""

    async def fetch(self, stream: str, group: str, consumer_id: str, limit: int, lease_ms: int,
                    partitions: Sequence[int] | None) -> list[Lease]:
        leases = await super().fetch(stream, group, consumer_id, limit, lease_ms, partitions)
        places: dict[int, list[int]] = {}  # per partition: where its redeliveries are
        for i, lease in enumerate(leases):
            if lease.attempt > 1:
                places.setdefault(lease.partition, []).append(i)
        out = list(leases)
        for where in places.values():
            for i, j in zip(where, reversed(where), strict=True):
                out[i] = leases[j]
        return out


class RedeliveryLeaseNotRecorded(MemoryBackend):
    """A re-leased delivery keeps its old, expired deadline: the next fetch leases it again."""

    async def fetch(self, stream: str, group: str, consumer_id: str, limit: int, lease_ms: int,
                    partitions: Sequence[int] | None) -> list[Lease]:
        leases = await super().fetch(stream, group, consumer_id, limit, lease_ms, partitions)
        g = self._group(stream, group)
        for lease in leases:
            if lease.attempt > 1:
                gp = g.partitions[lease.partition]
                gp.active[lease.sequence].deadline_ms = self._clock() - 1
                gp.may_be_due(0)
        return leases


class SecondOccurrenceInBatchIsStale(MemoryBackend):
    """A lease named twice in one settle batch gets stale_lease the second time."""

    def _settle(self, leases: Sequence[Lease], op: Op, reason: str, delay_ms: int,
                error: str | None = None) -> list[SettleResult]:
        results = super()._settle(leases, op, reason, delay_ms, error)
        seen: set[str] = set()
        out = []
        for lease, result in zip(leases, results, strict=True):
            if lease.lease_id in seen:
                result = SettleResult.failure(lease.lease_id, SettleKind.STALE_LEASE)
            seen.add(lease.lease_id)
            out.append(result)
        return out


class UnleasedSequenceIsInvalid(MemoryBackend):
    """A lease naming an appended sequence without a delivery gets invalid, not stale_lease."""

    def _find(self, lease: Lease) -> Found:
        found = super()._find(lease)
        if (isinstance(found, SettleResult) and found.kind == SettleKind.STALE_LEASE
                and found.error is not None and "replayed" in found.error.reason):
            return SettleResult.failure(lease.lease_id, SettleKind.INVALID)
        return found


class KeyOrderIgnored(MemoryBackend):
    """A key-ordered group is fetched like any other: later events of a leased key too."""

    def _eligible_by_key(self, g: Group, pid: int, s: Stream, now: int, limit: int
                         ) -> tuple[list[Delivery], int]:
        return self._eligible(g, pid, s, now, limit)


# mutant -> cases it must fail (it may fail more)
MUTANTS: dict[type[MemoryBackend], set[str]] = {
    NoFencing: {"fencing_after_expiry_and_release", "nack_redelivers_immediately"},
    ReceiptIgnored: {"receipt_mismatch"},
    FetchIgnoresLimit: {"fetch_respects_limit"},
    FrontierSkipsHoles: {"frontier_contiguous_with_holes", "lag_is_high_water_minus_frontier"},
    AppendNotIdempotent: {"append_idempotent_event_id"},
    RenewDoesNotExtend: {"renew_extends_deadline"},
    RepeatedSettleIsStale: {"repeated_settle_is_ok_repeated"},
    MaxAttemptsIgnored: {"max_attempts_via_nack", "max_attempts_via_expiry"},
    ReplayForgetsNothing: {"replay_from_sequence", "replay_selected_partitions"},
    TrimReusesSequences: {"trim_sequences_not_reused"},
    RejectAcks: {"reject_dead_letters"},
    NackIgnoresDelay: {"nack_with_delay"},
    ResetKeepsDeadLetters: {"reset_forgets_dead_letters"},
    ResetFrontierAtHighWater: {"reset_forgets_dead_letters", "reset_positions"},
    RedriveTouchesAcked: {"redrive_touches_only_dead_letters"},
    RedriveRestartsLive: {"redrive_touches_only_dead_letters"},
    WakeOnAnyAppend: {"wait_for_append_ignores_other_streams"},
    DeadLetterPagesCompareSequencesOnly: {"dead_letters_paging_every_size"},
    TrimFrontierOnlyToBound: {"trim_below_a_hole_walks_the_frontier"},
    DeadLetterTimeIsTheDeadline: {"dead_letter_times_by_path"},
    ExpiredDeadLetterTimeIsZero: {"dead_letter_times_by_path"},
    NackedRedeliveryKeepsItsLease: {"fencing_on_redeliveries"},
    RedeliveriesReversed: {"fetch_order_on_redeliveries"},
    RedeliveryLeaseNotRecorded: {"lease_exclusive_on_redeliveries"},
    SecondOccurrenceInBatchIsStale: {"same_lease_twice_in_a_batch"},
    UnleasedSequenceIsInvalid: {"lease_on_unleased_sequence_is_stale"},
    KeyOrderIgnored: {"key_blocked_while_leased", "nack_keeps_key_blocked",
                      "expired_lease_re_leases_earliest_first"},
}

# Mutants that break what the stateful machine drives: the model must catch them.
STATEFUL_MUTANTS = [NoFencing, FetchIgnoresLimit, FrontierSkipsHoles, AppendNotIdempotent,
                    RenewDoesNotExtend, RepeatedSettleIsStale, MaxAttemptsIgnored,
                    ReplayForgetsNothing, RejectAcks, NackIgnoresDelay, KeyOrderIgnored]


def harness_for(backend: type[MemoryBackend]) -> BackendHarness:
    """The memory harness, building the mutant instead."""
    return BackendHarness.with_manual_clock(
        backend.__name__, lambda clock: backend(clock=clock), peer=lambda b, clock: b
    )


def test_memory_backend_passes_every_case() -> None:
    results = run_cases(memory_harness())
    assert len(results) == len(CASES) >= 40
    # Only the cases of the one capability it does not declare skip (writing in the
    # application's transaction needs a database the application also writes to).
    in_transaction = {c.name for c in CASES if "in_transaction" in c.requires}
    assert in_transaction
    assert {r.case for r in results if r.status == "skip"} == in_transaction
    assert [(r.case, r.detail) for r in results if r.status not in ("pass", "skip")] == []


def test_memory_backend_passes_the_stateful_model() -> None:
    run_stateful(memory_harness())


@pytest.mark.parametrize("mutant", list(MUTANTS), ids=lambda m: m.__name__)
def test_mutant_fails_its_cases(mutant: type[MemoryBackend]) -> None:
    results = run_cases(harness_for(mutant))
    failed = {r.case for r in results if r.status == "fail"}
    assert failed, f"{mutant.__name__} passed every case: the kit cannot see its bug"
    assert MUTANTS[mutant] <= failed, f"{mutant.__name__} failed only {sorted(failed)}"


@pytest.mark.parametrize("mutant", STATEFUL_MUTANTS, ids=lambda m: m.__name__)
def test_stateful_model_catches_mutant(mutant: type[MemoryBackend]) -> None:
    config = settings(max_examples=200, stateful_step_count=30, deadline=None, database=None,
                      derandomize=True, phases=[Phase.generate], report_multiple_bugs=False)
    with pytest.raises(AssertionError):
        run_stateful(harness_for(mutant), config=config)
