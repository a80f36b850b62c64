"""The stateful conformance test: random operation sequences against the reference model.

Hypothesis drives appends (with duplicate ids, also of trimmed events), fetches
(alone and concurrent), acks, nacks (with delays, with and without an error),
rejects (with and without an error), renews (short and long), expiries, clock
advances, replays, redrives (chosen dead letters, and all of them), resets,
trims (forced and capped at the frontier, when the backend declares ``trim``),
retention policies applied (stored with the stream when the backend declares
``retention``; by count, and by age on an exact clock),
paged dead-letter listings, group and stream deletions (created again under
the same name) and, on a harness with independent stores, appends, fetches and
settles on a second store with the same names (:mod:`._stateful_other`)
against a fresh backend from a harness, checking every answer against
:class:`~rheo_flow.testing._model.GroupModel` and, after each step, the high
and low water, the frontier and each dead letter exactly: its event id,
attempts, reason, last error and ``rejected_at_ms``. One rule takes a delivery
to its last attempt, dead-letters it there and re-drives it
(:mod:`._stateful_rules`), so key order, expiry at max attempts and redrive meet
by design. Each example ends by draining the group and comparing what is left
with the model: nothing lost, nothing unexpected.

Hypothesis calls the machine synchronously, so the machine owns an event loop
and runs each step to completion on it.

Two profiles set how hard it searches (:func:`stateful_settings`): ``fast``
(the default) stops at the first failure and reports it unshrunk, with its
step sequence, so a broken backend is reported within seconds; ``full`` runs
more and longer examples and shrinks a failure to a minimal step sequence,
which may take minutes. ``RHEO_STATEFUL_PROFILE`` picks one;
``RHEO_STATEFUL_EXAMPLES`` and ``RHEO_STATEFUL_STEPS`` override its counts.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Final

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from .._model._lease import Lease
from .._model._stream import DeadLetter, Retention, StartPosition
from ._case import LONG_MS, ConformanceFailure, check, check_equal
from ._harness import BackendHarness
from ._stateful_base import (
    CONSUMERS,
    ERRORS,
    KEYS,
    PARTITION_CHOICES,
    PARTITIONS,
    PICKS,
    STALE_PICKS,
)
from ._stateful_other import OtherStoreRules
from ._stateful_rules import RedriveAndDeletionRules

__all__ = [
    "PROFILES",
    "StatefulProfile",
    "conformance_state_machine",
    "run_stateful",
    "stateful_settings",
]


class ConformanceMachine(RedriveAndDeletionRules, OtherStoreRules):
    """Random operations on one group of one stream, checked against the model.

    The machine of one harness is the subclass :func:`conformance_state_machine`
    builds, which sets :attr:`harness` and makes :meth:`fetch`, :meth:`renew` and
    :meth:`advance` rules with strategies fitting the harness's clock.
    """

    @initialize(keys=st.lists(st.sampled_from(KEYS), min_size=2, max_size=10),
                ordered=st.booleans())
    def open(self, keys: list[str], ordered: bool) -> None:
        self.run(self._open(ordered))
        # Start with work to do, so that early steps have leases to fight over.
        self.append([(key, None) for key in keys], duplicate=1)

    async def _open(self, ordered: bool) -> None:
        backend, self._rheo = await self.open_store()
        self._backend = backend
        self.error_aware = backend.capabilities.last_error
        await self.rheo.create_stream(self.stream, partitions=PARTITIONS)
        # Half the examples are key-ordered, on a backend declaring it.
        await self._create_group("earliest", ordered)
        if backend.capabilities.delayed_nack:
            self.nack_delays = [0, 0, 1, 1_000, LONG_MS] if self.harness.exact_time else [0, 0, 20]
        self.can_trim = backend.capabilities.trim
        if backend.capabilities.delayed_delivery:
            self.schedule_delays = ([0, 1, 1_000, LONG_MS] if self.harness.exact_time
                                    else [0, 20])

    def teardown(self) -> None:
        try:
            if self._backend is not None and not self.in_step:
                self.run(self._drain_and_compare())
        finally:
            try:
                self.loop.run_until_complete(self.stack.aclose())
            finally:
                self.loop.close()

    # Steps -------------------------------------------------------------

    # Every event has a key or a partition: keyless events route at random, and
    # Hypothesis needs a step sequence to replay identically.
    @rule(specs=st.lists(st.tuples(st.sampled_from([*KEYS, None]),
                                   st.sampled_from([None, None, 0, 1])),
                         min_size=1, max_size=6),
          duplicate=st.integers(0, 99))
    def append(self, specs: list[tuple[str | None, int | None]], duplicate: int) -> None:
        # One append in four of a backend with delayed delivery schedules its events
        # (by ``duplicate``: a rule of its own would change the search of every backend).
        delays = self.schedule_delays
        self.append_events(specs, duplicate, delays[duplicate // 4 % len(delays)]
                           if delays and duplicate % 4 == 1 else None)

    # fetch, renew and advance are made rules per harness (conformance_state_machine):
    # their strategies depend on its clock.

    def fetch(self, limit: int, partitions: list[int] | None, consumer: str,
              lease_ms: int) -> None:
        self.run(self._fetch(limit, partitions, consumer, lease_ms))

    @rule(limits=st.lists(st.integers(1, 4), min_size=2, max_size=4))
    def fetch_concurrently(self, limits: list[int]) -> None:
        async def fetch_all() -> list[list[Lease]]:
            return list(await asyncio.gather(*(
                self.rheo.fetch(self.stream, self.group, consumer_id=CONSUMERS[0],
                                limit=limit, lease_ms=LONG_MS)
                for limit in limits
            )))

        batches, t0, t1 = self.run(self.timed(fetch_all()))
        leases = [lease for batch in batches for lease in batch]
        for batch, limit in zip(batches, limits, strict=True):
            check(len(batch) <= limit, f"fetch(limit={limit}) returned {len(batch)}")
        check_equal(len({(x.partition, x.sequence) for x in leases}), len(leases),
                    "concurrent fetches never lease an event twice")
        # As one fetch of their total limit: partition order holds per call only.
        self.model.check_fetch(sorted(leases, key=lambda x: (x.partition, x.sequence)),
                               limit=sum(limits), partitions=None, consumer_id=CONSUMERS[0],
                               lease_ms=LONG_MS, t0=t0, t1=t1)
        self.leases.update((lease.lease_id, lease) for lease in leases)

    @rule(indexes=PICKS, stale_indexes=STALE_PICKS)
    def ack(self, indexes: list[int], stale_indexes: list[int]) -> None:
        self.run(self._settle("ack", self.choose(indexes, stale_indexes)))

    @rule(indexes=PICKS, stale_indexes=STALE_PICKS, delay=st.integers(0, 99),
          error=st.integers(0, 99))
    def nack(self, indexes: list[int], stale_indexes: list[int], delay: int, error: int) -> None:
        delay_ms = self.nack_delays[delay % len(self.nack_delays)]
        self.run(self._settle("nack", self.choose(indexes, stale_indexes), delay_ms=delay_ms,
                              error=ERRORS[error % len(ERRORS)]))

    @rule(indexes=PICKS, stale_indexes=STALE_PICKS, error=st.integers(0, 99))
    def reject(self, indexes: list[int], stale_indexes: list[int], error: int) -> None:
        self.run(self._settle("reject", self.choose(indexes, stale_indexes),
                              error=ERRORS[error % len(ERRORS)]))

    def renew(self, indexes: list[int], stale_indexes: list[int], lease_ms: int) -> None:
        self.run(self._settle("renew", self.choose(indexes, stale_indexes), lease_ms=lease_ms))

    @rule(indexes=st.lists(st.integers(0, 99), min_size=1, max_size=3))
    def expire(self, indexes: list[int]) -> None:
        """Shorten some leases to the minimum, then let them run out."""
        self.run(self._expire(self.choose(indexes, [])))

    def advance(self, ms: int) -> None:
        self.run(self.harness.advance_time(self.backend, ms))

    @precondition(lambda self: any(self.model.high_water))
    @rule(partition=st.integers(0, PARTITIONS - 1),
          back=st.sampled_from([0, 1, 2, 3, 4, 10_000]))
    def replay(self, partition: int, back: int) -> None:
        from_sequence = max(1, self.model.high_water[partition] - back)
        self.run(self.rheo.replay(self.stream, self.group, from_sequence=from_sequence,
                                  partitions=[partition]))
        self.model.replayed(partition, from_sequence)

    @precondition(lambda self: any(self.model.high_water))
    @rule(pick=st.integers(0, 99), shift=st.sampled_from([-1, 0, 1]), replay=st.booleans())
    def move_to_a_time(self, pick: int, shift: int, replay: bool) -> None:
        """Replay from, or reset to, a time around a retained event's stamp."""
        stamps = sorted(d.event.appended_at_ms for (p, s), d in self.model.deliveries.items()
                        if s >= self.model.low_water[p])
        if not stamps:
            return
        at_ms = stamps[pick % len(stamps)] + shift
        at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=at_ms)
        firsts = [self.model.position_at(p, at_ms) for p in range(PARTITIONS)]
        if replay:
            self.run(self.rheo.replay(self.stream, self.group, from_time=at))
            for p, first in enumerate(firsts):
                self.model.replayed(p, first)
        else:
            self.run(self.rheo.reset(self.stream, self.group, to=at))
            for p, first in enumerate(firsts):
                self.model.reset(p, first - 1)

    @rule(every=st.integers(1, 3))
    def redrive(self, every: int) -> None:
        self.run(self._redrive(every))

    async def _redrive(self, every: int) -> None:
        await self._check_dead_letters()
        dead = await self.rheo.dead_letters(self.stream, self.group, limit=10_000)
        chosen = dead[::every]
        count = await self.rheo.redrive(self.stream, self.group, chosen)
        check_equal(count, len(chosen), "redrive count")
        self.model.redriven([(d.partition, d.sequence) for d in chosen])

    @rule(partitions=st.sampled_from(PARTITION_CHOICES),
          to=st.one_of(st.sampled_from(["earliest", "latest"]), st.integers(-2, 6)))
    def reset(self, partitions: list[int] | None, to: str | int) -> None:
        """Reset to earliest, latest, or a sequence ``to`` below the highest high water."""
        selected = list(range(PARTITIONS)) if partitions is None else partitions
        position: StartPosition
        if to == "earliest":
            position = "earliest"
        elif to == "latest":
            position = "latest"
        else:
            position = max(0, max(self.model.high_water[p] for p in selected) - int(to))
        self.run(self.rheo.reset(self.stream, self.group, to=position,
                                 partitions="all" if partitions is None else partitions))
        for p in selected:
            self.model.reset(p, position)

    @precondition(lambda self: self.can_trim)
    @rule(partitions=st.sampled_from(PARTITION_CHOICES),
          step=st.sampled_from([0, 1, 2, 3, 5, 10_000, None]), force=st.booleans())
    def trim(self, partitions: list[int] | None, step: int | None, force: bool) -> None:
        """Trim ``step`` events past the lowest low water, or as far as possible (``None``)."""
        selected = list(range(PARTITIONS)) if partitions is None else partitions
        if step is None:
            bound = 2**62  # what the facade asks for with up_to=None
        else:
            bound = min(self.model.low_water[p] - 1 for p in selected) + step
        up_to: int | dict[int, int] | None
        if step is None and partitions is None:
            up_to = None
        elif partitions is None:
            up_to = bound
        else:
            up_to = dict.fromkeys(selected, bound)
        self.run(self._trim(dict.fromkeys(selected, bound), up_to, force))

    # Preconditions may only depend on what was drawn, never on the backend's
    # answers (on a real clock, or with concurrent fetches, those vary between
    # runs of one example, which Hypothesis reports as flaky).
    @precondition(lambda self: self.can_trim)
    @rule(partitions=st.sampled_from(PARTITION_CHOICES))
    def trim_past_hole(self, partitions: list[int] | None) -> None:
        """Force a trim over an unsettled delivery to just below a settled one, where
        the frontier must walk on over the settled events past the bound (one event
        past the low water in a partition without such a delivery)."""
        selected = list(range(PARTITIONS)) if partitions is None else partitions
        bounds = {p: self.model.low_water[p] if (b := self.model.bound_below_settled(p))
                  is None else b for p in selected}
        self.run(self._trim(bounds, bounds, True))

    @precondition(lambda self: self.can_trim)
    @rule(keep=st.sampled_from([None, 0, 1, 2, 5]), pick=st.integers(0, 99),
          shift=st.sampled_from([None, 0, 1]), force=st.booleans(), stored=st.booleans())
    def apply_retention(self, keep: int | None, pick: int, shift: int | None, force: bool,
                        stored: bool) -> None:
        """Apply a retention policy (stored with the stream when the backend declares
        ``retention``, else given to ``apply_retention``): ``max_events`` ``keep + 1``
        and, on an exact clock, a ``max_age`` putting the cut at a retained event's stamp
        (``shift`` 0) or a millisecond after it (1); on a real clock an age that removes
        nothing (the cut's moment is not known to the millisecond)."""
        self.run(self._apply_retention(keep, pick, shift, force, stored))

    async def _apply_retention(self, keep: int | None, pick: int, shift: int | None,
                               force: bool, stored: bool) -> None:
        model = self.model
        bounds = {p: 0 if keep is None else max(0, model.high_water[p] - keep - 1)
                  for p in range(PARTITIONS)}
        age: timedelta | None = None
        stamps = sorted(d.event.appended_at_ms for (p, s), d in model.deliveries.items()
                        if s >= model.low_water[p])
        if shift is not None and self.harness.exact_time and stamps:
            now = await self.now()
            cut = stamps[pick % len(stamps)] + shift
            age = timedelta(milliseconds=max(1, now - cut))
            bounds = {p: max(b, model.position_at(p, now - age // timedelta(milliseconds=1))
                             - 1) for p, b in bounds.items()}
        elif shift is not None or keep is None:
            age = timedelta(days=365)
        policy = Retention(max_age=age, max_events=None if keep is None else keep + 1)
        if stored and self.backend.capabilities.retention:
            info = await self.rheo.set_retention(self.stream, policy)
            check_equal(info.retention, policy, "set_retention returns the policy")
            removed = await self.rheo.apply_retention(self.stream, force=force)
        else:
            removed = await self.rheo.apply_retention(self.stream, policy, force=force)
        self.model.check_trim(bounds, removed, force=force, t1=await self.now())

    async def _trim(self, requested: dict[int, int], up_to: int | dict[int, int] | None,
                    force: bool) -> None:
        removed = await self.rheo.trim(self.stream, up_to=up_to, force=force)
        self.model.check_trim(requested, removed, force=force, t1=await self.now())

    @rule(limit=st.integers(1, 3))
    def page_dead_letters(self, limit: int) -> None:
        self.run(self._page_dead_letters(limit))

    async def _page_dead_letters(self, limit: int) -> None:
        """Paging with ``after=`` the last one listed gives the whole list, once each.

        With fewer dead letters than two pages need, held leases are rejected first
        (redrives of every dead letter would otherwise leave few to page through).
        """
        missing = limit + 1 - len(self.model.rejected())
        if missing > 0:
            await self._settle("reject", self.current()[:missing])
        paged: list[DeadLetter] = []
        after: DeadLetter | None = None
        for _ in range(len(self.model.deliveries) + 2):
            page = await self.rheo.dead_letters(self.stream, self.group, limit=limit,
                                                after=after)
            check(len(page) <= limit, f"dead_letters(limit={limit}) returned {len(page)}")
            paged += page
            if len(page) < limit:
                break
            after = page[-1]
        else:
            raise ConformanceFailure(
                f"paging dead_letters(limit={limit}) did not end: {len(paged)} listed")
        t1 = await self.now()
        positions = [(d.partition, d.sequence) for d in paged]
        check_equal(len(set(positions)), len(positions),
                    f"paging dead_letters(limit={limit}) lists each once")
        check_equal(positions, sorted(positions),
                    f"paging dead_letters(limit={limit}) in (partition, sequence) order")
        self.model.check_dead_letters(paged, t1)
        whole = await self.rheo.dead_letters(self.stream, self.group, limit=10_000)
        if self.harness.exact_time:
            check_equal(paged, whole, f"paging dead_letters(limit={limit}) gives the full list")
        else:
            # On a real clock a doomed delivery may be dead-lettered in between:
            # the full list may add such ones (checked next), never drop one.
            by_position = {(d.partition, d.sequence): d for d in whole}
            check_equal([by_position.get(p) for p in positions], paged,
                        f"paging dead_letters(limit={limit}) gives the full list")
        await self._check_dead_letters()

    # Checks ------------------------------------------------------------

    @invariant()
    def progress_matches_model(self) -> None:
        if self._backend is not None:
            self.run(self._check_progress())

    async def _drain_and_compare(self) -> None:
        """Settle what is held, let delays pass, drain the group, compare with the model."""
        await self._settle("ack", self.current())
        await self._advance_past(self.model.latest_ready())
        expected = set(self.model.unsettled())
        drained: list[tuple[int, int]] = []
        for _ in range(len(self.model.deliveries) + 5):
            leases, t0, t1 = await self.timed(self.rheo.fetch(
                self.stream, self.group, consumer_id="drain", limit=20, lease_ms=LONG_MS))
            self.model.check_fetch(leases, limit=20, partitions=None, consumer_id="drain",
                                   lease_ms=LONG_MS, t0=t0, t1=t1)
            if not leases:
                break
            self.leases.update((lease.lease_id, lease) for lease in leases)
            drained += [(x.partition, x.sequence) for x in leases]
            await self._settle("ack", leases)
        check_equal(sorted(drained), sorted(expected),
                    "draining delivers exactly the unsettled events")
        check_equal(self.model.unsettled(), [], "everything settled after the drain")
        frontier = await self.rheo.frontier(self.stream, self.group)
        check_equal([frontier[p] for p in range(PARTITIONS)], self.model.high_water,
                    "frontier equals the high water after the drain")
        lag = await self.rheo.lag(self.stream, self.group)
        check_equal(sum(lag.values()), 0, "lag after the drain")
        dead = await self.rheo.dead_letters(self.stream, self.group, limit=10_000)
        check_equal({(d.partition, d.sequence): (d.event_id, d.attempts, d.reason, d.last_error)
                     for d in dead}, self.model.rejected(), "dead letters after the drain")
        self.model.check_dead_letters(dead, await self.now())


def conformance_state_machine(harness: BackendHarness) -> type[RuleBasedStateMachine]:
    """A Hypothesis state machine checking the backend of ``harness`` against the model."""
    lease_times = st.sampled_from([LONG_MS, harness.short_ms])
    if harness.exact_time:
        advances = st.one_of(st.integers(1, 2_000),
                             st.sampled_from([LONG_MS - 1, LONG_MS, LONG_MS + 1, 2 * LONG_MS]))
    else:
        advances = st.integers(1, 30)

    class Machine(ConformanceMachine):
        fetch = rule(limit=st.integers(1, 8),
                     partitions=st.sampled_from([None, [0], [1], [0, 1]]),
                     consumer=st.sampled_from(CONSUMERS),
                     lease_ms=lease_times)(ConformanceMachine.fetch)
        renew = rule(indexes=PICKS, stale_indexes=STALE_PICKS,
                     lease_ms=lease_times)(ConformanceMachine.renew)
        advance = rule(ms=advances)(ConformanceMachine.advance)

    Machine.harness = harness
    Machine.__name__ = Machine.__qualname__ = (
        f"ConformanceMachine_{''.join(c if c.isalnum() else '_' for c in harness.name)}"
    )
    return Machine


@dataclass(frozen=True, slots=True)
class StatefulProfile:
    """How hard :func:`run_stateful` searches."""

    max_examples: int
    stateful_step_count: int
    shrink: bool
    """Shrink a failure to a minimal step sequence before reporting it (slow)."""


PROFILES: Final[Mapping[str, StatefulProfile]] = MappingProxyType({
    # Stop at the first failure and report it as found: seconds.
    # 25 examples: fewer (17 kept the run as short as before the rules of redrive-all,
    # deletion and a second store) let older kinds of bug slip through more often.
    "fast": StatefulProfile(max_examples=25, stateful_step_count=50, shrink=False),
    # A wider search, and a failure shrunk to a minimal step sequence: minutes.
    "full": StatefulProfile(max_examples=200, stateful_step_count=100, shrink=True),
})
"""The search profiles of :func:`stateful_settings`, by name."""

DEFAULT_PROFILE = "fast"
_NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)


def stateful_settings(profile: str | None = None) -> settings:
    """Hypothesis settings of the stateful test for ``profile`` (``"fast"`` or ``"full"``).

    ``profile=None`` reads ``RHEO_STATEFUL_PROFILE`` (default ``fast``).
    ``RHEO_STATEFUL_EXAMPLES`` and ``RHEO_STATEFUL_STEPS`` override the example and
    step counts of either profile. Both stop at the first failure
    (``report_multiple_bugs=False``) and report it with its step sequence;
    ``fast`` reports it as found, ``full`` shrinks it first.
    """
    name = (profile if profile is not None
            else os.environ.get("RHEO_STATEFUL_PROFILE", "") or DEFAULT_PROFILE)
    chosen = PROFILES.get(name.strip().lower())
    if chosen is None:
        raise ValueError(f"unknown stateful profile {name!r}; known: {', '.join(PROFILES)}")
    return settings(
        max_examples=_count("RHEO_STATEFUL_EXAMPLES", chosen.max_examples),
        stateful_step_count=_count("RHEO_STATEFUL_STEPS", chosen.stateful_step_count),
        phases=tuple(Phase) if chosen.shrink else _NO_SHRINK,
        report_multiple_bugs=False,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


def _count(variable: str, default: int) -> int:
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{variable} must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{variable} must be a positive integer, got {raw!r}")
    return value


def run_stateful(harness: BackendHarness, *, config: settings | None = None,
                 profile: str | None = None) -> None:
    """Run the stateful test against ``harness``; raises on the first failure.

    ``profile`` picks the search (:func:`stateful_settings`; default
    ``RHEO_STATEFUL_PROFILE`` or ``fast``). ``config`` replaces the settings
    altogether (e.g. ``settings(max_examples=200)``).
    """
    run_state_machine_as_test(conformance_state_machine(harness),
                              settings=config or stateful_settings(profile))
