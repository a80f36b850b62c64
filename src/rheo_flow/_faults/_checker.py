"""The checker: a pure function from recorded histories and the final state to a report.

Definitions (docs/reliability.md explains them at length):

* **acknowledged** — an id carried by an append call that returned ``ok``;
  **maybe appended** — by one that ended ``ambiguous`` (or had no recorded end).
* **settled** — the group acked the event (an ``ok`` ack result was recorded),
  dead-lettered it (it is among the final dead letters), or an ack of it has no
  recorded answer (the worker died waiting) or an ``ambiguous`` one (the
  connection was lost mid-call) and the group's final frontier covers it.
* **lost** — acknowledged (or maybe appended and found stored), not settled, and
  the group will never deliver it again: its position is covered by the final
  frontier, or it is missing from the stream.
* **unfinished** — acknowledged, not settled, not lost: still pending when the
  run ended (part of the final lag).
* **unexpected** — delivered or stored, but never appended (or appended only by
  calls that failed definitely).
* **duplicate appends** — an id stored at two positions, or two ``ok`` appends
  of one id that returned different positions (idempotent append broken).
* **stale settle accepted** — an ``ok`` settle (ack, nack or reject) of a lease of
  attempt *a* although a delivery of the same event with a higher attempt had
  started (its handler began) before the settle was issued (its handler ended):
  the newer lease was granted before the old one's settle reached the backend,
  which must have fenced it off with ``stale_lease``. Both times are recorded
  on one host's clock and bound the unknown instants conservatively (grant
  before handler start; settle call after handler end), so a reported stale
  settle is certain, never a timing artefact.
* **duplicated deliveries** — deliveries of an event beyond its first: expected
  after kills, lease expiry and nacks (at-least-once), reported, not a violation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ._history import DeliveryRecord, History, SettleRecord

__all__ = ["FinalState", "Report", "StaleSettle", "check"]


@dataclass(frozen=True, slots=True)
class FinalState:
    """What the backend shows once the run is over (read through the checker's URL)."""

    high_water: Mapping[int, int]
    """Highest sequence per partition."""
    frontier: Mapping[int, int]
    """The group's contiguous frontier per partition."""
    dead_letters: Mapping[str, int] = field(default_factory=dict)
    """Dead-lettered event ids with their attempts."""
    stored: Mapping[str, tuple[tuple[int, int], ...]] | None = None
    """Every stored event id with its positions (``None``: not read)."""
    effects: Mapping[str, int] | None = None
    """The ``outbox`` scenario: the application's rows per source event id."""
    derived: Mapping[str, int] | None = None
    """The ``outbox`` scenario: derived events per source event id."""


@dataclass(frozen=True, slots=True)
class StaleSettle:
    """A settle the backend accepted although a newer lease of the event existed."""

    event_id: str
    op: str
    worker: str
    attempt: int
    newer_attempt: int
    newer_worker: str
    lead_us: int
    """How long before the stale settle was issued the newer delivery had started."""


@dataclass(frozen=True, slots=True)
class Report:
    """The checker's verdict on one run (one scenario over one workload and backend)."""

    scenario: str
    workload: str
    backend: str
    attempted: int
    """Distinct ids the producers tried to append."""
    acknowledged: int
    """Distinct ids with an ``ok`` append."""
    ambiguous_appends: int
    """Append calls that ended ambiguous (retried with the same ids)."""
    failed_appends: int
    """Append calls that failed definitely (retried with the same ids)."""
    delivered: int
    """Distinct ids delivered to a handler."""
    deliveries: int
    """Deliveries in all."""
    acked: int
    """Distinct ids with an ``ok`` ack."""
    lost: tuple[str, ...]
    unexpected: tuple[str, ...]
    duplicate_appends: tuple[str, ...]
    stale_accepted: tuple[StaleSettle, ...]
    stale_rejected: int
    """Settles refused as ``stale_lease``/``receipt_mismatch``: fencing at work."""
    ambiguous_settles: int
    """Settles without a recorded answer (the worker died or was stopped)."""
    unfinished: tuple[str, ...]
    lag: int
    """Final ``high water - frontier``, summed over partitions."""
    dead_letters: int
    unexpected_dead_letters: tuple[str, ...]
    """Dead letters of events that were not poison (e.g. past max_attempts by kills)."""
    poison_not_dead_lettered: tuple[str, ...]
    """Poison events (their handler always fails) not among the dead letters."""
    truncated_files: int = 0
    elapsed_s: float = 0.0
    error: str | None = None
    """Why the run itself failed (then the counts may be partial)."""
    notes: tuple[str, ...] = ()
    """What the scenario did, with times, and processes that crashed."""
    stream: str = ""
    """The run's stream (left in place for inspection)."""
    duplicated_effects: tuple[str, ...] = ()
    """``outbox``: source events whose row or derived event was committed more than once."""
    missing_effects: tuple[str, ...] = ()
    """``outbox``: events acked (covered by the frontier, not dead letters) without both
    their row and their derived event, or with one of the two only."""
    orphan_effects: tuple[str, ...] = ()
    """``outbox``: a row or derived event of an event that was not acked (a dead letter,
    beyond the frontier, or never stored): committed without its ack."""

    @property
    def duplicated(self) -> int:
        """Deliveries beyond the first of each event (at-least-once redeliveries)."""
        return self.deliveries - self.delivered

    @property
    def violations(self) -> int:
        """Lost, unexpected, duplicate-append and stale-accepted findings together."""
        return (len(self.lost) + len(self.unexpected) + len(self.duplicate_appends)
                + len(self.stale_accepted) + len(self.duplicated_effects)
                + len(self.missing_effects) + len(self.orphan_effects))

    @property
    def ok(self) -> bool:
        """No violation and no run error."""
        return self.violations == 0 and self.error is None

    @property
    def complete(self) -> bool:
        """Every acknowledged event was settled (nothing unfinished, poison dead-lettered)."""
        return not self.unfinished and not self.poison_not_dead_lettered


def check(
    history: History,
    final: FinalState,
    *,
    scenario: str = "",
    workload: str = "",
    backend: str = "",
    poison: Iterable[str] = (),
    elapsed_s: float = 0.0,
    error: str | None = None,
) -> Report:
    """Check a run's ``history`` against the ``final`` state of the backend. Pure: reads
    nothing else. ``poison`` names the events whose handler always fails (dead letters)."""
    poison_ids = frozenset(poison)
    appends = _Appends.of(history, final.stored)
    by_event: dict[str, list[DeliveryRecord]] = defaultdict(list)
    for d in history.deliveries:
        by_event[d.event_id].append(d)
    unexpected = {i for i in by_event if i not in appends.appended}
    if final.stored is not None:
        unexpected |= {i for i in final.stored if i not in appends.appended}
    settles = _Settles.of(history, by_event)
    must_settle = set(appends.acknowledged)
    if final.stored is not None:
        must_settle |= {i for i in appends.maybe if final.stored.get(i)}
    lost, unfinished = _unsettled(must_settle, appends, settles, by_event, final)
    lag = sum(max(0, high - final.frontier.get(p, 0)) for p, high in final.high_water.items())
    duplicated_effects, missing_effects, orphan_effects = _effect_findings(final)
    return Report(
        scenario=scenario,
        workload=workload,
        backend=backend,
        attempted=len(appends.attempted),
        acknowledged=len(appends.acknowledged),
        ambiguous_appends=appends.ambiguous_calls,
        failed_appends=appends.failed_calls,
        delivered=len(by_event),
        deliveries=len(history.deliveries),
        acked=len(settles.acked),
        lost=tuple(sorted(lost)),
        unexpected=tuple(sorted(unexpected)),
        duplicate_appends=tuple(sorted(appends.duplicates)),
        stale_accepted=tuple(sorted(settles.stale_accepted,
                                    key=lambda x: (x.event_id, x.attempt))),
        stale_rejected=settles.stale_rejected,
        ambiguous_settles=settles.ambiguous,
        unfinished=tuple(sorted(unfinished)),
        lag=lag,
        dead_letters=len(final.dead_letters),
        unexpected_dead_letters=tuple(sorted(set(final.dead_letters) - poison_ids)),
        poison_not_dead_lettered=tuple(sorted(
            i for i in poison_ids & must_settle if i not in final.dead_letters)),
        truncated_files=history.truncated,
        elapsed_s=elapsed_s,
        error=error,
        duplicated_effects=duplicated_effects,
        missing_effects=missing_effects,
        orphan_effects=orphan_effects,
    )


def _effect_findings(final: FinalState
                     ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The ``outbox`` scenario's exactly-once effect: every acked event has one row and
    one derived event, every other event none (empty when not read)."""
    rows, derived = final.effects, final.derived
    if rows is None or derived is None:
        return (), (), ()
    stored = final.stored or {}
    duplicated = {i for i in rows.keys() | derived.keys()
                  if rows.get(i, 0) > 1 or derived.get(i, 0) > 1}
    missing: set[str] = set()
    orphan = {i for i in rows.keys() | derived.keys() if i not in stored}
    for event_id, positions in stored.items():
        partition, sequence = min(positions)
        acked = (final.frontier.get(partition, 0) >= sequence
                 and event_id not in final.dead_letters)
        has_row, has_derived = rows.get(event_id, 0) > 0, derived.get(event_id, 0) > 0
        if (acked and not (has_row and has_derived)) or has_row != has_derived:
            missing.add(event_id)
        elif not acked and (has_row or has_derived):
            orphan.add(event_id)
    return tuple(sorted(duplicated)), tuple(sorted(missing)), tuple(sorted(orphan))


@dataclass(slots=True)
class _Appends:
    """What the recorded appends say: which ids were tried, acknowledged or maybe
    appended, where the acknowledged ones went, and which were appended twice."""

    attempted: set[str] = field(default_factory=set)
    acknowledged: set[str] = field(default_factory=set)
    maybe: set[str] = field(default_factory=set)
    positions: dict[str, set[tuple[int, int]]] = field(
        default_factory=lambda: defaultdict(set))
    """The positions ``ok`` appends returned, by id."""
    ambiguous_calls: int = 0
    failed_calls: int = 0
    duplicates: set[str] = field(default_factory=set)

    @property
    def appended(self) -> set[str]:
        """Acknowledged or maybe appended."""
        return self.acknowledged | self.maybe

    @classmethod
    def of(cls, history: History,
           stored: Mapping[str, tuple[tuple[int, int], ...]] | None) -> _Appends:
        """The appends of ``history``, their duplicates checked against ``stored``."""
        found = cls()
        for a in history.appends:
            found.attempted.update(a.ids)
            if a.outcome == "ok":
                found.acknowledged.update(a.ids)
                for event_id, position in zip(a.ids, a.positions, strict=False):
                    found.positions[event_id].add(position)
            elif a.outcome == "ambiguous":
                found.ambiguous_calls += 1
                found.maybe.update(a.ids)
            else:
                found.failed_calls += 1
        found.duplicates = {i for i, p in found.positions.items() if len(p) > 1}
        if stored is not None:
            found.duplicates |= {i for i, p in stored.items() if len(p) > 1}
            for event_id, stored_at in stored.items():
                if event_id in found.acknowledged and found.positions[event_id] - set(stored_at):
                    found.duplicates.add(event_id)  # acknowledged at a position it is not at
        return found


@dataclass(slots=True)
class _Settles:
    """What the recorded settles say: acks that took effect, acks that may have, and
    stale settles refused and accepted."""

    acked: set[str] = field(default_factory=set)
    ambiguous_acks: set[str] = field(default_factory=set)
    ambiguous: int = 0
    stale_rejected: int = 0
    stale_accepted: list[StaleSettle] = field(default_factory=list)

    @classmethod
    def of(cls, history: History, by_event: Mapping[str, list[DeliveryRecord]]) -> _Settles:
        """The settles of ``history``, each ``ok`` one checked against ``by_event``."""
        found = cls()
        for s in history.settles:
            if s.result is None or s.result == "ambiguous":  # it may have committed
                found.ambiguous += 1
                if s.op == "ack":
                    found.ambiguous_acks.add(s.event_id)
                continue
            if s.result in ("stale_lease", "receipt_mismatch"):
                found.stale_rejected += 1
            if s.result != "ok":
                continue
            if s.op == "ack":
                found.acked.add(s.event_id)
            stale = _stale(s, by_event.get(s.event_id, ()))
            if stale is not None:
                found.stale_accepted.append(stale)
        return found


def _unsettled(must_settle: set[str], appends: _Appends, settles: _Settles,
               by_event: Mapping[str, list[DeliveryRecord]], final: FinalState
               ) -> tuple[set[str], set[str]]:
    """The events of ``must_settle`` not settled: those lost, and those unfinished."""
    stored = final.stored

    def covered(event_id: str) -> bool:
        where = _position_of(event_id, appends.positions, stored, by_event)
        return where is not None and final.frontier.get(where[0], 0) >= where[1]

    lost: set[str] = set()
    unfinished: set[str] = set()
    for event_id in must_settle:
        if event_id in settles.acked or event_id in final.dead_letters:
            continue
        if event_id in settles.ambiguous_acks and covered(event_id):
            continue
        missing = stored is not None and not stored.get(event_id)
        if missing or covered(event_id):
            lost.add(event_id)
        else:
            unfinished.add(event_id)
    return lost, unfinished


def _position_of(event_id: str, positions: Mapping[str, set[tuple[int, int]]],
                 stored: Mapping[str, tuple[tuple[int, int], ...]] | None,
                 by_event: Mapping[str, list[DeliveryRecord]]) -> tuple[int, int] | None:
    """Where ``event_id`` is: as appended, else as stored, else as first delivered."""
    known = positions.get(event_id)
    if known:
        return min(known)
    if stored is not None and stored.get(event_id):
        return stored[event_id][0]
    seen = by_event.get(event_id)
    return (seen[0].partition, seen[0].sequence) if seen else None


def _stale(settle: SettleRecord, deliveries: Iterable[DeliveryRecord]) -> StaleSettle | None:
    """The newer delivery proving ``settle`` stale, if there is one (the earliest)."""
    if settle.started_us is None:
        return None
    newer = [d for d in deliveries
             if d.attempt > settle.attempt and d.lease_id != settle.lease_id
             and d.at_us < settle.started_us]
    if not newer:
        return None
    first = min(newer, key=lambda d: d.at_us)
    return StaleSettle(settle.event_id, settle.op, settle.worker, settle.attempt, first.attempt,
                       first.worker, settle.started_us - first.at_us)
