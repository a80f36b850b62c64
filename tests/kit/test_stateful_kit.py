"""The stateful test's newer rules can fail, and its search profiles.

Each mutant is the in-memory backend with one rule of reset, trim, replay below
the low water, dead-letter paging, renew with a short lease, last errors,
dead-letter times and ids, redrive of every dead letter, group deletion or
store isolation broken; the stateful model must catch every one of them. The
runs are derandomized and use no example database, so they are deterministic.
The search profiles of :func:`stateful_settings` are checked without running a
search.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import HealthCheck, Phase, settings

from rheo_flow import Event, Lease, SettleResult
from rheo_flow._backend import AppendRecord
from rheo_flow._backends._shared import Waiters
from rheo_flow._backends.memory import MemoryBackend
from rheo_flow._model._stream import DeadLetter, GroupInfo, StartPosition, StreamInfo
from rheo_flow._support._clock import Clock
from rheo_flow.testing import BackendHarness, ConformanceFailure, memory_harness, run_stateful
from rheo_flow.testing._stateful import PROFILES, stateful_settings


class ResetKeepsDeadLetters(MemoryBackend):
    """reset forgets deliveries but keeps the partition's dead letters listed."""

    async def reset(self, stream: str, group: str, to: StartPosition,
                    partitions: Sequence[int]) -> None:
        g = self._group(stream, group)
        kept = {pid: {seq: d for seq, d in g.partitions[pid].done.items()
                      if d.state == "rejected"} for pid in partitions}
        await super().reset(stream, group, to, partitions)
        for pid, dead in kept.items():
            g.partitions[pid].done.update(dead)


class ResetKeepsLeases(MemoryBackend):
    """reset forgets deliveries but keeps the leased ones: their leases still settle."""

    async def reset(self, stream: str, group: str, to: StartPosition,
                    partitions: Sequence[int]) -> None:
        g = self._group(stream, group)
        kept = {pid: {seq: d for seq, d in g.partitions[pid].active.items()
                      if d.state == "leased"} for pid in partitions}
        await super().reset(stream, group, to, partitions)
        for pid, leased in kept.items():
            g.partitions[pid].active.update(leased)


class ResetBelowLowWater(MemoryBackend):
    """reset to "earliest" moves the frontier to 0 even when events were trimmed."""

    async def reset(self, stream: str, group: str, to: StartPosition,
                    partitions: Sequence[int]) -> None:
        await super().reset(stream, group, to, partitions)
        if to == "earliest":
            g = self._group(stream, group)
            for pid in partitions:
                g.partitions[pid].frontier = 0


class TrimFrontierOnlyToBound(MemoryBackend):
    """trim raises the frontier to the bound but does not walk on over settled events."""

    async def trim(self, stream: str, up_to: Mapping[int, int]) -> dict[int, int]:
        before = {key: [gp.frontier for gp in g.partitions]
                  for key, g in self._groups.items() if key[0] == stream}
        removed = await super().trim(stream, up_to)
        parts = self._stream(stream).partitions
        for key, frontiers in before.items():
            for pid, bound in up_to.items():
                gp = self._groups[key].partitions[pid]
                gp.frontier = max(frontiers[pid], min(bound, parts[pid].high_water))
        return removed


class TrimKeepsLowWater(MemoryBackend):
    """trim removes events but leaves the low water where it was."""

    async def trim(self, stream: str, up_to: Mapping[int, int]) -> dict[int, int]:
        parts = self._stream(stream).partitions
        lows = [part.low_water for part in parts]
        removed = await super().trim(stream, up_to)
        for part, low in zip(parts, lows, strict=True):
            part.low_water = low
        return removed


class TrimLowWaterPastHighWater(MemoryBackend):
    """trim past the high water sets the low water to the bound + 1, not high water + 1."""

    async def trim(self, stream: str, up_to: Mapping[int, int]) -> dict[int, int]:
        removed = await super().trim(stream, up_to)
        for pid, bound in up_to.items():
            part = self._stream(stream).partitions[pid]
            if bound > part.high_water and bound < 2**40:
                part.low_water = bound + 1
        return removed


class ReplayBelowLowWater(MemoryBackend):
    """replay from below the low water moves the frontier below the trimmed events."""

    async def replay(self, stream: str, group: str, from_sequence: int,
                     partitions: Sequence[int]) -> None:
        await super().replay(stream, group, from_sequence, partitions)
        g = self._group(stream, group)
        for pid in partitions:
            gp = g.partitions[pid]
            gp.frontier = min(gp.frontier, from_sequence - 1)


class DeadLetterPagesSkipOne(MemoryBackend):
    """dead_letters(after=...) skips the first dead letter after the position."""

    async def dead_letters(self, stream: str, group: str, limit: int,
                           after: tuple[int, int] | None) -> list[DeadLetter]:
        if after is None:
            return await super().dead_letters(stream, group, limit, after)
        return (await super().dead_letters(stream, group, limit + 1, after))[1:]


class RenewIgnoresLeaseTime(MemoryBackend):
    """renew extends a lease by at least a minute, whatever shorter ``lease_ms`` asks for
    (the shortest lease, the kit's way to let a lease expire, still works)."""

    async def renew(self, leases: Sequence[Lease], lease_ms: int) -> list[SettleResult]:
        return await super().renew(leases, lease_ms if lease_ms <= 10 else max(lease_ms, 60_000))


class NackWithoutErrorClearsLastError(MemoryBackend):
    """A nack without an error clears the delivery's last error (it must keep it)."""

    async def nack(self, leases: Sequence[Lease], reason: str, delay_ms: int,
                   error: str | None = None) -> list[SettleResult]:
        results = await super().nack(leases, reason, delay_ms, error)
        for lease, result in zip(leases, results, strict=True):
            found = self._find(lease)
            if error is None and result.ok and not isinstance(found, SettleResult):
                found[2].last_error = None
        return results


class RejectStampsNoTime(MemoryBackend):
    """An explicit reject leaves ``rejected_at_ms`` unset (0)."""

    async def reject(self, leases: Sequence[Lease], reason: str,
                     error: str | None = None) -> list[SettleResult]:
        results = await super().reject(leases, reason, error)
        for lease, result in zip(leases, results, strict=True):
            found = self._find(lease)
            if result.ok and not result.repeated and not isinstance(found, SettleResult):
                found[2].rejected_at_ms = 0
        return results


class RedriveAllMissesTheLast(MemoryBackend):
    """redrive with no dead letter named leaves the last one of the group out."""

    async def redrive(self, stream: str, group: str,
                      positions: Sequence[tuple[int, int]] | None) -> int:
        if positions is None:
            dead = await self.dead_letters(stream, group, 10_000, None)
            positions = [(d.partition, d.sequence) for d in dead[:-1]]
        return await super().redrive(stream, group, positions)


class DeletedGroupLeavesDeadLetters(MemoryBackend):
    """delete_group leaves the dead letters behind: a group created again under the
    name finds them."""

    async def delete_group(self, stream: str, group: str) -> None:
        g = self._group(stream, group)
        self._graves = {(stream, group): [
            {q: d for q, d in gp.done.items() if d.state == "rejected"} for gp in g.partitions]}
        await super().delete_group(stream, group)

    async def create_group(self, stream: str, group: str, start: StartPosition,
                           max_attempts: int | None, *, ordering: str = "none") -> GroupInfo:
        info = await super().create_group(stream, group, start, max_attempts, ordering=ordering)
        graves: dict[tuple[str, str], list[dict[int, object]]] = getattr(self, "_graves", {})
        for gp, dead in zip(self._group(stream, group).partitions,
                            graves.pop((stream, group), []), strict=False):
            gp.done.update(dead)  # type: ignore[arg-type]
        return info


class DeadLetterNamesTheNextEvent(MemoryBackend):
    """A dead letter names the id of the next event of its partition (when there is one)."""

    async def dead_letters(self, stream: str, group: str, limit: int,
                           after: tuple[int, int] | None) -> list[DeadLetter]:
        events = self._stream(stream).partitions
        return [dataclasses.replace(d, event_id=events[d.partition].events.get(
                    d.sequence + 1, events[d.partition].events[d.sequence]).id)
                for d in await super().dead_letters(stream, group, limit, after)]


_SHARED_WAITERS = Waiters()


class WaitersSharedAcrossStores(MemoryBackend):
    """Every instance shares one set of waiters: an append to a stream of one store
    wakes the waiters of a stream of that name in another."""

    def __init__(self, *, clock: Clock | None = None) -> None:
        super().__init__(clock=clock)
        self._waiters = _SHARED_WAITERS


def harness_for(backend: type[MemoryBackend]) -> BackendHarness:
    """The memory harness, building the mutant instead (one store per instance)."""
    harness = BackendHarness.with_manual_clock(
        backend.__name__, lambda clock: backend(clock=clock), peer=lambda b, clock: b)
    return dataclasses.replace(harness, apart=harness.factory)


MUTANT_EXAMPLES = 500
"""Examples of the search each mutant must fail (every rule the model gains makes each
rule rarer per example)."""


def deterministic(max_examples: int = 300) -> settings:
    """A derandomized search without an example database: the same run every time."""
    return settings(max_examples=max_examples, stateful_step_count=50, deadline=None,
                    database=None, derandomize=True, phases=[Phase.generate],
                    report_multiple_bugs=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


class ScheduledDeliveredAtOnce(MemoryBackend):
    """appends ignore deliver_at: a scheduled event is leased before its time."""

    async def append(self, stream: str, records: Sequence[AppendRecord]) -> list[Event]:
        return await super().append(stream, [dataclasses.replace(r, deliver_at_ms=None)
                                             for r in records])


class ReplayForgetsDeliverAt(MemoryBackend):
    """a replay or reset delivers a scheduled event again at once, before its time."""

    async def replay(self, stream: str, group: str, from_sequence: int,
                     partitions: Sequence[int]) -> None:
        for pid in partitions:
            self._stream(stream).partitions[pid].scheduled.clear()
        await super().replay(stream, group, from_sequence, partitions)

    async def reset(self, stream: str, group: str, to: StartPosition,
                    partitions: Sequence[int]) -> None:
        for pid in partitions:
            self._stream(stream).partitions[pid].scheduled.clear()
        await super().reset(stream, group, to, partitions)


MUTANTS = [ScheduledDeliveredAtOnce, ReplayForgetsDeliverAt,
           ResetKeepsDeadLetters, ResetKeepsLeases, ResetBelowLowWater, TrimFrontierOnlyToBound,
           TrimKeepsLowWater, TrimLowWaterPastHighWater, ReplayBelowLowWater,
           DeadLetterPagesSkipOne, RenewIgnoresLeaseTime, NackWithoutErrorClearsLastError,
           RejectStampsNoTime, RedriveAllMissesTheLast, DeletedGroupLeavesDeadLetters,
           DeadLetterNamesTheNextEvent, WaitersSharedAcrossStores]


def test_a_conformance_failure_is_an_assertion_error() -> None:
    assert issubclass(ConformanceFailure, AssertionError)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.__name__)
def test_stateful_model_catches_mutant(mutant: type[MemoryBackend]) -> None:
    with pytest.raises(ConformanceFailure):
        run_stateful(harness_for(mutant), config=deterministic(MUTANT_EXAMPLES))


def test_memory_backend_passes_the_deterministic_search() -> None:
    run_stateful(memory_harness(), config=deterministic(100))


# Profiles ------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("RHEO_STATEFUL_PROFILE", "RHEO_STATEFUL_EXAMPLES", "RHEO_STATEFUL_STEPS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_fast_profile_is_the_default_and_does_not_shrink(clean_env: pytest.MonkeyPatch) -> None:
    config = stateful_settings()
    assert config.max_examples == PROFILES["fast"].max_examples
    assert config.stateful_step_count == PROFILES["fast"].stateful_step_count
    assert Phase.generate in config.phases
    assert Phase.shrink not in config.phases
    assert config.report_multiple_bugs is False
    assert config.deadline is None


def test_full_profile_from_the_environment_shrinks(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RHEO_STATEFUL_PROFILE", "full")
    config = stateful_settings()
    assert config.max_examples == PROFILES["full"].max_examples
    assert config.max_examples > PROFILES["fast"].max_examples
    assert config.stateful_step_count > PROFILES["fast"].stateful_step_count
    assert Phase.shrink in config.phases
    assert config.report_multiple_bugs is False


def test_profile_argument_wins_over_the_environment(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RHEO_STATEFUL_PROFILE", "full")
    assert Phase.shrink not in stateful_settings("fast").phases
    clean_env.setenv("RHEO_STATEFUL_PROFILE", "fast")
    assert Phase.shrink in stateful_settings("full").phases


@pytest.mark.parametrize("profile", ["fast", "full"])
def test_counts_override_either_profile(clean_env: pytest.MonkeyPatch, profile: str) -> None:
    clean_env.setenv("RHEO_STATEFUL_PROFILE", profile)
    clean_env.setenv("RHEO_STATEFUL_EXAMPLES", "7")
    clean_env.setenv("RHEO_STATEFUL_STEPS", "11")
    config = stateful_settings()
    assert (config.max_examples, config.stateful_step_count) == (7, 11)
    assert (Phase.shrink in config.phases) == (profile == "full")


def test_unknown_profile_and_bad_counts_are_refused(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="known: fast, full"):
        stateful_settings("thorough")
    with pytest.raises(ValueError, match="'thorough'"):
        run_stateful(memory_harness(), profile="thorough")
    clean_env.setenv("RHEO_STATEFUL_PROFILE", "slow")
    with pytest.raises(ValueError, match="'slow'"):
        stateful_settings()
    with pytest.raises(ValueError, match="'slow'"):
        run_stateful(memory_harness())
    clean_env.setenv("RHEO_STATEFUL_PROFILE", "fast")
    clean_env.setenv("RHEO_STATEFUL_EXAMPLES", "0")
    with pytest.raises(ValueError, match="RHEO_STATEFUL_EXAMPLES"):
        stateful_settings()


class LowWaterAlwaysZero(MemoryBackend):
    """Reports a low water of 0: wrong from the first step on."""

    async def stream_info(self, name: str) -> StreamInfo:
        info = await super().stream_info(name)
        return StreamInfo(info.name, info.partitions, info.created_at_ms, info.high_water,
                          dict.fromkeys(info.low_water, 0))


def test_fast_profile_reports_one_failure_with_its_steps(clean_env: pytest.MonkeyPatch) -> None:
    # Fails in every example: the fast default reports it, as one AssertionError
    # (not a group of several bugs), with the steps that led to it.
    with pytest.raises(ConformanceFailure, match="low water") as failure:
        run_stateful(harness_for(LowWaterAlwaysZero), profile="fast")
    steps = "\n".join(getattr(failure.value, "__notes__", []))
    assert "state.open(" in steps
    assert "state.progress_matches_model()" in steps
