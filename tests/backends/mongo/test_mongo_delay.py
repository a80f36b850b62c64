"""Delayed delivery on MongoDB (``_delay``): what a stream without scheduled events does
not pay, the mark a group created later takes, and windows split under small batches."""

from __future__ import annotations

from typing import Any

from _mongo_backends import Backends
from rheo_flow import NewEvent, Rheo
from test_mongo_fetch_cost import counted, fetch_counted

HOUR_MS = 3_600_000


def _mentions_da(value: Any) -> bool:
    """Whether a command (any depth) names the field ``da``."""
    if isinstance(value, dict):
        return "da" in value or any(_mentions_da(v) for v in value.values())
    if isinstance(value, list):
        return any(_mentions_da(v) for v in value)
    return False


async def test_a_stream_without_scheduled_events_looks_for_none(backends: Backends) -> None:
    async with counted(backends) as (rheo, commands):
        for stream in ("plain", "timed"):
            await rheo.create_stream(stream, partitions=2)
            await rheo.create_group(stream, "g")
        await rheo.append("plain", [NewEvent("t", i) for i in range(6)])
        got, sent = await fetch_counted(rheo, commands, "plain")
        assert got == 6
        assert not any(_mentions_da(s.command) for s in sent), [s.command for s in sent]
        commands.on = True
        assert await rheo.scheduled("plain", "g") == {0: 0, 1: 0}
        commands.on = False
        assert not any(s.name in ("count", "aggregate") for s in commands.clear())
        at = backends.clock() + HOUR_MS
        await rheo.append("timed", [NewEvent("t", 0, deliver_at=at), NewEvent("t", 1)],
                          partition=0)
        got, sent = await fetch_counted(rheo, commands, "timed")
        assert got == 1  # the event after the scheduled one
        assert any(_mentions_da(s.command) for s in sent)
        assert await rheo.scheduled("timed", "g") == {0: 1, 1: 0}


async def test_a_group_created_after_a_scheduled_append_waits_too(backends: Backends) -> None:
    async with Rheo(backends.make()) as rheo:
        await rheo.create_stream("s")
        at = backends.clock() + HOUR_MS
        await rheo.append("s", [NewEvent("t", 0, deliver_at=at), NewEvent("t", 1)])
        await rheo.create_group("s", "late", start="earliest")
        leases = await rheo.fetch("s", "late", consumer_id="c", limit=10, lease_ms=60_000)
        assert [lease.sequence for lease in leases] == [2]
        await rheo.ack(leases)
        backends.clock.advance(HOUR_MS)
        leases = await rheo.fetch("s", "late", consumer_id="c", limit=10, lease_ms=60_000)
        assert [(lease.sequence, lease.attempt) for lease in leases] == [(1, 1)]
        await rheo.ack(leases)
        assert await rheo.frontier("s", "late") == {0: 2}


async def test_small_batches_pass_every_scheduled_event(backends: Backends) -> None:
    """Windows split a few events at a time: every due event once, in order, and each
    scheduled one at its time, with the frontier behind the first."""
    async with Rheo(backends.make()) as rheo:
        await rheo.create_stream("s")
        await rheo.create_group("s", "g")
        now = backends.clock()
        events = [NewEvent("t", i, deliver_at=now + HOUR_MS * (1 + i % 2) if i % 3 == 0
                           else None) for i in range(20)]
        await rheo.append("s", events)
        scheduled = {i + 1 for i in range(20) if i % 3 == 0}
        seen: list[int] = []
        while leases := await rheo.fetch("s", "g", consumer_id="c", limit=3, lease_ms=60_000):
            assert len(leases) <= 3
            seen += [lease.sequence for lease in leases]
            await rheo.ack(leases)
        assert seen == [s for s in range(1, 21) if s not in scheduled]
        assert await rheo.frontier("s", "g") == {0: 0}
        assert await rheo.scheduled("s", "g") == {0: len(scheduled)}
        for hours, wanted in ((1, {s for s in scheduled if (s - 1) % 2 == 0}),
                              (2, {s for s in scheduled if (s - 1) % 2 == 1})):
            backends.clock.advance(now + HOUR_MS * hours - backends.clock())
            due: list[int] = []
            while leases := await rheo.fetch("s", "g", consumer_id="c", limit=3,
                                             lease_ms=60_000):
                due += [lease.sequence for lease in leases]
                await rheo.ack(leases)
            assert sorted(due) == sorted(wanted)
        assert await rheo.frontier("s", "g") == {0: 20}
        assert await rheo.scheduled("s", "g") == {0: 0}
