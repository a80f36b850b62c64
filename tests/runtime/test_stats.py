"""The runtimes' counters: one name means one thing, with one type, in a producer's
stats and a group's; the settle accounting and grouping both runtimes share."""

from __future__ import annotations

from collections import Counter
from typing import get_type_hints

from rheo_flow import GroupStats, ProducerStats, Rheo, SettleKind, SettleResult
from rheo_flow._runtime._settle_calls import by_settle_call, count_settled


def test_counters_a_producer_and_a_group_both_keep_have_the_same_types() -> None:
    producer = get_type_hints(ProducerStats)
    group = get_type_hints(GroupStats)
    shared = producer.keys() & group.keys()
    assert shared == {"fetched", "acked", "nacked", "rejected", "dead_lettered", "skipped",
                      "settle_failures", "fetch_failures_by_kind", "renew_failures"}
    assert {name: producer[name] for name in shared} == {name: group[name] for name in shared}
    for failures in ("settle_failures", "fetch_failures_by_kind", "renew_failures"):
        assert producer[failures] == Counter[str]


def test_fetch_failures_is_the_count_of_failed_fetches_in_both() -> None:
    for stats in (ProducerStats(), GroupStats()):
        assert stats.fetch_failures == 0
        stats.fetch_failures_by_kind.update({"backend_unavailable": 2, "ambiguous": 1})
        assert stats.fetch_failures == 3


def test_a_producer_snapshot_is_detached_from_the_live_counters() -> None:
    live = ProducerStats(acked=2)
    live.settle_failures["stale_lease"] += 1
    live.fetch_failures_by_kind["ambiguous"] += 1
    snapshot = live.copy()
    live.acked += 1
    live.settle_failures["stale_lease"] += 1
    live.fetch_failures_by_kind["ambiguous"] += 1
    live.renew_failures["stale_lease"] += 1
    assert snapshot == ProducerStats(acked=2, settle_failures=Counter(stale_lease=1),
                                     fetch_failures_by_kind=Counter(ambiguous=1))
    assert (snapshot.fetch_failures, live.fetch_failures) == (1, 2)


def _results(*kinds: SettleKind | None) -> list[SettleResult]:
    return [SettleResult.success(f"l{i}") if kind is None else
            SettleResult.failure(f"l{i}", kind) for i, kind in enumerate(kinds)]


async def test_count_settled_counts_failures_by_kind_and_what_took_effect(rheo: Rheo) -> None:
    for stats in (ProducerStats(), GroupStats()):
        acks = _results(None, SettleKind.STALE_LEASE, None)
        assert count_settled(stats, rheo, "ack", [], acks) == 2
        rejects = _results(SettleKind.STALE_LEASE, None)
        assert count_settled(stats, rheo, "reject", [], rejects) == 1
        assert (stats.acked, stats.rejected, stats.dead_lettered, stats.nacked) == (2, 1, 1, 0)
        assert stats.settle_failures == {"stale_lease": 2}


def test_by_settle_call_groups_in_the_order_calls_first_appear() -> None:
    failures = [("nack", "a", 5), ("reject", "b", 0), ("nack", "a", 5), ("nack", "a", 7)]
    calls = by_settle_call(failures, lambda failure: failure[:2])
    assert list(calls.items()) == [
        (("nack", "a"), [("nack", "a", 5), ("nack", "a", 5), ("nack", "a", 7)]),
        (("reject", "b"), [("reject", "b", 0)]),
    ]
