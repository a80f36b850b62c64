"""Cases about the times a backend records: when streams and groups were created.

On a harness with a manual clock time moves only when the case says so, so the
stamps are checked to the millisecond; on a real clock, within the call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from .._model._event import NewEvent
from ._case import CaseEnv, case, check, check_equal


async def _stamped(env: CaseEnv, call: Callable[[], Awaitable[int]], what: str) -> int:
    """Run ``call`` (returning a ``created_at_ms``) and check it is the time of the call."""
    await env.advance(env.short_ms)
    before = await env.now()
    stamp = await call()
    after = await env.now()
    check(before - env.margin_ms <= stamp <= after + env.margin_ms,
          f"{what}: created_at_ms is {stamp}, the call ran from {before} to {after}")
    return stamp


@case(rules=["stream.lifecycle", "delete.stream"])
async def case_stream_created_at_is_kept(env: CaseEnv) -> None:
    """A stream's created_at_ms is its creation time; creating it again keeps it."""
    name = env.name("s")

    async def create() -> int:
        return (await env.rheo.create_stream(name, partitions=2)).created_at_ms

    created = await _stamped(env, create, "a new stream")
    await env.advance(env.short_ms)
    check_equal((await env.rheo.create_stream(name, partitions=2)).created_at_ms, created,
                "create_stream of an existing stream, later")
    check_equal((await env.rheo.stream_info(name)).created_at_ms, created, "stream_info")
    await env.rheo.delete_stream(name)
    again = await _stamped(env, create, "the stream created again after its deletion")
    check(again > created, "a stream created again after a deletion is a new stream")


@case(rules=["group.lifecycle", "delete.group"])
async def case_group_created_at_is_kept(env: CaseEnv) -> None:
    """A group's created_at_ms is its creation time (explicit or by fetch); it never moves."""
    stream = await env.stream()
    await env.append(stream, 1)

    async def create() -> int:
        return (await env.rheo.create_group(stream, "g")).created_at_ms

    async def fetch() -> int:
        await env.fetch(stream, "f")
        return (await env.rheo.group_info(stream, "f")).created_at_ms

    created = await _stamped(env, create, "create_group")
    by_fetch = await _stamped(env, fetch, "a group created by fetch")
    await env.advance(env.short_ms)
    check_equal((await env.rheo.create_group(stream, "g", max_attempts=9)).created_at_ms,
                created, "create_group of an existing group, later, with max_attempts")
    check_equal((await env.rheo.create_group(stream, "f", start="latest")).created_at_ms,
                by_fetch, "create_group of a group fetch created, later")
    check_equal({g.group: g.created_at_ms for g in await env.rheo.groups(stream)},
                {"f": by_fetch, "g": created}, "groups")
    await env.rheo.delete_group(stream, "g")
    again = await _stamped(env, create, "the group created again after its deletion")
    check(again > created, "a group created again after a deletion is a new group")


@case(rules=["stream.lifecycle", "group.lifecycle"])
async def case_describe_streams_matches_each_stream(env: CaseEnv) -> None:
    """describe_streams lists each stream as stream_info and groups() describe it."""
    first, second = env.name("a"), env.name("b")
    await env.rheo.create_stream(first, partitions=3)
    await env.rheo.create_stream(second)
    await env.rheo.create_group(first, "g2")
    await env.rheo.create_group(first, "g1", max_attempts=3)
    await env.rheo.append(first, [NewEvent("t", {"n": n}) for n in range(5)])
    described = {info.name: (info, groups) for info, groups in
                 await env.rheo.describe_streams()}
    names = [info.name for info, _ in await env.rheo.describe_streams()]
    check(names == sorted(names), f"describe_streams is sorted by name: {names}")
    for name in (first, second):
        check(name in described, f"describe_streams lists {name}")
        info, groups = described[name]
        check_equal(info, await env.rheo.stream_info(name), f"the info of {name}")
        check_equal(groups, await env.rheo.groups(name), f"the groups of {name}")


@case(rules=["frontier.contiguous", "group.lifecycle"])
async def case_frontiers_match_each_group(env: CaseEnv) -> None:
    """frontiers names every group of the stream with the frontier frontier() gives it."""
    stream = await env.stream(partitions=2)
    other = env.name("other")
    await env.rheo.create_stream(other)
    await env.rheo.create_group(other, "elsewhere")
    check_equal(await env.rheo.frontiers(stream), {}, "frontiers of a stream without groups")
    await env.rheo.append(stream, [NewEvent("t", {"n": n}, partition=n % 2) for n in range(6)])
    await env.rheo.create_group(stream, "idle")
    leases = await env.fetch(stream, "busy", limit=3)
    await env.rheo.ack(leases)
    frontiers = await env.rheo.frontiers(stream)
    check_equal(sorted(frontiers), ["busy", "idle"], "the groups frontiers names")
    for group in ("busy", "idle"):
        check_equal(frontiers[group], await env.rheo.frontier(stream, group),
                    f"the frontier of {group}")
    check(sum(frontiers["busy"].values()) == 3, f"three acked events: {frontiers['busy']}")
