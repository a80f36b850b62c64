"""Cases about the lag report (``Rheo.lag_report``, docs/contract.md, "Lag report"):
one read answers what ``lag``, ``scheduled``, ``dead_letters``, ``group_info`` and
``stream_info`` answer for every group of the streams asked for."""

from __future__ import annotations

from .._model._event import NewEvent
from .._model._lag import GroupLag, LagReport, PartitionLag
from .._model._query import Query
from ._case import CaseEnv, case, check, check_equal


async def _expected(env: CaseEnv, stream: str, group: str) -> GroupLag:
    """What the other reads say of one group (no time passes that changes them)."""
    rheo = env.rheo
    high = (await rheo.stream_info(stream)).high_water
    frontier = await rheo.frontier(stream, group)
    scheduled = await rheo.scheduled(stream, group)
    info = await rheo.group_info(stream, group)
    letters = await rheo.dead_letters(stream, group, limit=1_000)
    partitions = []
    for p in sorted(high):
        after = Query(stream=stream, partitions=[p], from_sequence=frontier[p] + 1)
        page = await rheo.query_page(after, limit=1)
        oldest = page.events[0].appended_at_ms if page.events else None
        partitions.append((p, high[p], frontier[p], scheduled[p], oldest))
    return GroupLag(stream, group, tuple(PartitionLag(*row) for row in partitions),
                    len(letters), info.paused, info.paused_until_ms)


def _only(report: LagReport, streams: set[str]) -> list[GroupLag]:
    return [g for g in report.groups if g.stream in streams]


@case(rules=["lag.report"])
async def case_lag_report_matches_the_other_reads(env: CaseEnv) -> None:
    """lag_report answers what lag, scheduled, dead_letters and group_info answer.

    Per group and partition, with stream_info's high water, and when the first
    unsettled event was appended."""
    rheo, caps = env.rheo, env.backend.capabilities
    first = await env.stream_with(4, 3, 0)
    second = await env.stream_with(2, 2)
    bare = await env.stream_with(1)  # no group: absent from the report
    if caps.delayed_delivery:
        at = await env.now() + env.long_ms
        await rheo.append(first, [NewEvent("t", n, partition=0, deliver_at=at) for n in (1, 2)])
    for group in ("b", "a", "c"):
        await rheo.create_group(first, group)
    leases = await env.fetch(first, "a", 4)
    await env.ack_ok(leases[:2])
    await rheo.reject(leases[2:3], "bad")
    await rheo.create_group(second, "x")
    await env.ack_ok(await env.drain(second, "x"))
    if caps.pause:
        await rheo.pause_group(first, "c")
        await env.backend.pause_group(first, "b", await env.now() + env.long_ms)
    before = await env.now()
    report = await rheo.lag_report([second, first, bare])
    after = await env.now()
    check(before - env.margin_ms <= report.read_at_ms <= after + env.margin_ms,
          f"read_at_ms {report.read_at_ms} is not between {before} and {after}")
    check_equal([(g.stream, g.group) for g in report.groups],
                sorted([(first, "a"), (first, "b"), (first, "c"), (second, "x")]),
                "the report's groups, by stream and group")
    for entry in report.groups:
        check_equal(entry, await _expected(env, entry.stream, entry.group),
                    f"lag_report's {entry.group!r} of {entry.stream!r} against the other reads")
    a = report.group(first, "a")
    x = report.group(second, "x")
    check(a is not None and a.dead_letters == 1 and a.scheduled == 2 * caps.delayed_delivery,
          f"group a: one dead letter, the scheduled events: {a}")
    check(x is not None and x.lag == 0 and x.oldest_unsettled_ms is None,
          f"group x settled everything: lag 0, no unsettled event: {x}")
    if caps.pause:
        check_equal([(g.group, g.paused) for g in report.groups if g.stream == first],
                    [("a", False), ("b", True), ("c", True)], "paused groups")
    everything = await rheo.lag_report()
    check_equal(_only(everything, {first, second}), list(report.groups),
                "lag_report() of every stream, for these streams")


@case(rules=["lag.report"])
async def case_lag_report_filters_streams(env: CaseEnv) -> None:
    """lag_report(streams) reports those streams only; a missing one is absent.

    No streams at all is an empty report; a deleted group is absent."""
    rheo = env.rheo
    first = await env.stream_with(3)
    second = await env.stream_with(1)
    await rheo.create_group(first, "g")
    await rheo.create_group(second, "g")
    missing = env.name("missing")
    report = await rheo.lag_report([first, missing])
    check_equal([(g.stream, g.group, g.lag) for g in report.groups], [(first, "g", 3)],
                "lag_report of a stream and a name no stream has")
    check_equal((await rheo.lag_report([missing])).groups, (), "lag_report of a missing stream")
    check_equal((await rheo.lag_report([])).groups, (), "lag_report of no streams")
    await rheo.delete_group(first, "g")
    check_equal((await rheo.lag_report([first, second])).groups,
                (await rheo.lag_report([second])).groups, "a deleted group is absent")
