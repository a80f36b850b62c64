"""A fetch on a Redis Cluster visits only the partitions with work (``_work``,
``work.lua``): a plan from the group's summary in a slot of its own, then one call per
partition with work, whatever the partition count; the limit goes where the work is;
every operation that makes work notes it; and a summary that is stale, wiped or missing
a note never loses work: the resync (the backend's clock past ``_SWEEP_S``) finds it.
No case waits on the wall clock: the resync's clock is replaced.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from rheo_flow import BackendUnavailable, NewEvent, Rheo
from rheo_flow._backends.redis import _fetch, _scripts
from rheo_flow._backends.redis._work import plan_of
from rheo_flow.backends import RedisBackend
from test_redis_backend import scratch_backend

HOUR_MS = 3_600_000


class Clock:
    """The clock of the backends' resync (``_fetch._clock``), moved by hand."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def sweep(self) -> None:
        """Move past ``_SWEEP_S``: each backend's next fetch of a group resyncs."""
        self.now += _fetch._SWEEP_S + 1


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    manual = Clock()
    monkeypatch.setattr(_fetch, "_clock", manual)
    return manual


@pytest.fixture
async def backend(redis_cluster_url: str, clock: Clock) -> AsyncIterator[RedisBackend]:
    async with scratch_backend(redis_cluster_url) as b:
        yield b


@pytest.fixture
async def rheo(backend: RedisBackend) -> AsyncIterator[Rheo]:
    async with Rheo(backend) as instance:
        yield instance


@pytest.fixture
async def other(rheo: Rheo, redis_cluster_url: str) -> AsyncIterator[Rheo]:
    """A second process's instance on the same prefix (no cache shared with ``rheo``)."""
    prefix = _backend(rheo).prefix
    async with Rheo(RedisBackend.from_url(redis_cluster_url, prefix=prefix)) as instance:
        yield instance


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The script names and reads of every cluster batch (one round trip), in order."""
    seen: list[list[str]] = []
    runner = _scripts.ScriptRunner
    pipeline, run_one, on_node = runner._cluster_pipeline, runner._run_one, runner._run_on_node

    async def spy(self: Any, calls: Sequence[Any], reads: Sequence[Any], **kwargs: Any) -> Any:
        seen.append([call[0] for call in calls] + [read[0] for read in reads])
        return await pipeline(self, calls, reads, **kwargs)

    async def spy_one(self: Any, name: str, *args: Any) -> Any:
        seen.append([name])
        return await run_one(self, name, *args)

    async def spy_on_node(self: Any, name: str, *args: Any) -> Any:
        seen.append([name])
        return await on_node(self, name, *args)

    monkeypatch.setattr(_scripts.ScriptRunner, "_cluster_pipeline", spy)
    monkeypatch.setattr(_scripts.ScriptRunner, "_run_one", spy_one)
    monkeypatch.setattr(_scripts.ScriptRunner, "_run_on_node", spy_on_node)
    return seen


def _backend(rheo: Rheo) -> RedisBackend:
    backend = rheo.backend
    assert isinstance(backend, RedisBackend)
    return backend


async def _fill(rheo: Rheo, stream: str, partition: int, count: int) -> None:
    await rheo.append(stream, [NewEvent("t", {"n": n}) for n in range(count)],
                      partition=partition)


async def _plan(rheo: Rheo, stream: str, group: str) -> Any:
    backend = _backend(rheo)
    [raw] = await backend._eval([backend._plan_call(stream, group)])
    return plan_of(raw)


async def test_one_busy_partition_of_256_costs_one_plan_and_one_visit(
    rheo: Rheo, trips: list[list[str]]
) -> None:
    await rheo.create_stream("s", partitions=256)
    await _fill(rheo, "s", 37, 500)
    await rheo.fetch("s", "g", consumer_id="a", limit=1)  # the first fetch resyncs
    for _ in range(3):
        trips.clear()
        leases = await rheo.fetch("s", "g", consumer_id="a", limit=100, lease_ms=HOUR_MS)
        assert len(leases) == 100
        assert {lease.event.partition for lease in leases} == {37}
        seqs = [lease.event.sequence for lease in leases]
        assert seqs == sorted(seqs)
        # The plan, then one fetch call and its read: no call to the 255 idle ones.
        assert trips == [["work"], ["fetch", "XRANGE"]]
        trips.clear()
        await rheo.ack(leases)
        assert trips == [["settle"]]


async def test_an_empty_fetch_of_256_partitions_is_one_call(
    rheo: Rheo, trips: list[list[str]]
) -> None:
    await rheo.create_stream("s", partitions=256)
    assert await rheo.fetch("s", "g", consumer_id="a", limit=100) == []
    # The first fetch resyncs: it visits every partition, then writes the summary.
    assert [Counter(trip)["fetch"] for trip in trips[-2:]] == [256, 0]
    assert trips[-1] == ["work"]
    trips.clear()
    assert await rheo.fetch("s", "g", consumer_id="a", limit=100) == []
    assert trips == [["work"]]


async def test_the_limit_is_shared_fairly_among_the_partitions_with_work(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=16)
    await rheo.fetch("s", "g", consumer_id="a", limit=1)
    for partition, count in ((2, 10), (9, 50), (13, 50)):
        await _fill(rheo, "s", partition, count)
    leases = await rheo.fetch("s", "g", consumer_id="a", limit=60, lease_ms=HOUR_MS)
    # Partition 2 gives all it has; the other two split the rest evenly.
    assert Counter(lease.event.partition for lease in leases) == {2: 10, 9: 25, 13: 25}
    assert [lease.event.partition for lease in leases[:3]] in (
        [2, 9, 13], [9, 13, 2], [13, 2, 9])
    # A limit below the partitions with work: fetches take turns (the rotation), so
    # within as many fetches as there are partitions each one with work is served.
    more = [await rheo.fetch("s", "g", consumer_id="a", limit=1) for _ in range(16)]
    assert {leases[0].event.partition for leases in more} == {9, 13}


async def test_work_made_by_every_operation_is_found_without_a_resync(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=32)
    await rheo.fetch("s", "g", consumer_id="a", limit=1)

    async def fetch() -> list[tuple[int, int, int]]:
        got = await rheo.fetch("s", "g", consumer_id="a", limit=50, lease_ms=HOUR_MS)
        return [(lease.event.partition, lease.event.sequence, lease.attempt) for lease in got]

    await _fill(rheo, "s", 5, 20)
    leases = await rheo.fetch("s", "g", consumer_id="a", limit=20, lease_ms=HOUR_MS)
    assert len(leases) == 20
    assert await fetch() == []
    await rheo.nack(leases[:3], "retry")
    assert await fetch() == [(5, 1, 2), (5, 2, 2), (5, 3, 2)]
    await rheo.reject(leases[5:6], "bad")
    assert await rheo.redrive("s", "g") == 1
    assert [(p, seq) for p, seq, _ in await fetch()] == [(5, 6)]
    await rheo.ack(leases[3:5] + leases[6:])
    await rheo.replay("s", "g", from_sequence=18, partitions=[5])
    assert [seq for _, seq, _ in await fetch()] == [18, 19, 20]
    await rheo.reset("s", "g", to="earliest", partitions=[5])
    assert len(await fetch()) == 20


async def test_a_lease_renewed_shorter_is_found_when_it_expires(
        rheo: Rheo, wait_until: Any) -> None:
    # A renew with a shorter lease_ms moves a deadline earlier than the one the summary
    # holds (found by the stateful kit: the fetch skipped the partition until a resync).
    await rheo.create_stream("s", partitions=32)
    await _fill(rheo, "s", 5, 1)
    [lease] = await rheo.fetch("s", "g", consumer_id="a", limit=5, lease_ms=HOUR_MS)
    [renewed] = await rheo.renew([lease], lease_ms=10)
    assert renewed.ok

    async def taken_again() -> bool:
        got = await rheo.fetch("s", "g", consumer_id="b", limit=5, lease_ms=HOUR_MS)
        return [(x.event.partition, x.event.sequence, x.attempt) for x in got] == [(5, 1, 2)]

    # The resync's clock stands still: only the renew's note can lead the fetch there.
    await wait_until(taken_again, timeout=10, message="the expired lease taken again")


async def test_a_key_released_by_an_ack_or_a_trim_is_found(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=8)
    await rheo.create_group("s", "g", ordering="key")
    await rheo.fetch("s", "g", consumer_id="a", limit=1)
    await rheo.append("s", [NewEvent("t", {"n": n}, key="k", partition=3) for n in range(3)])
    first = await rheo.fetch("s", "g", consumer_id="a", limit=10)
    assert [lease.event.sequence for lease in first] == [1]
    await rheo.ack(first)
    second = await rheo.fetch("s", "g", consumer_id="a", limit=10)
    assert [lease.event.sequence for lease in second] == [2]
    await rheo.trim("s", up_to={3: 2}, force=True)
    third = await rheo.fetch("s", "g", consumer_id="a", limit=10)
    assert [lease.event.sequence for lease in third] == [3]


async def test_an_append_is_seen_by_every_group(rheo: Rheo, other: Rheo) -> None:
    await rheo.create_stream("s", partitions=64)
    for group in ("g1", "g2"):
        await rheo.fetch("s", group, consumer_id="a", limit=1)
    await _fill(other, "s", 40, 3)
    for group in ("g1", "g2"):
        got = await rheo.fetch("s", group, consumer_id="a", limit=10)
        assert [(lease.event.partition, lease.event.sequence) for lease in got] == [
            (40, 1), (40, 2), (40, 3)]


async def test_a_wiped_summary_loses_nothing(rheo: Rheo) -> None:
    backend = _backend(rheo)
    await rheo.create_stream("s", partitions=16)
    await rheo.fetch("s", "g", consumer_id="a", limit=1)
    await _fill(rheo, "s", 4, 10)
    leases = await rheo.fetch("s", "g", consumer_id="a", limit=4, lease_ms=HOUR_MS)
    await rheo.nack(leases[:2], "retry")
    await _fill(rheo, "s", 11, 5)
    await backend.client.delete(*backend._keys.work_keys("s", "g"))
    # Not written in full since it was (re)created: this fetch visits every partition.
    got = await rheo.fetch("s", "g", consumer_id="b", limit=100)
    assert sorted((lease.event.partition, lease.event.sequence) for lease in got) == [
        (4, 1), (4, 2), *((4, n) for n in range(5, 11)), *((11, n) for n in range(1, 6))]
    assert (await _plan(rheo, "s", "g")).written


async def test_a_missed_note_is_healed_by_the_resync(
    rheo: Rheo, other: Rheo, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append whose note never came (its process died after the append) and a
    summary that lost an entry: not seen until the resync, then fetched."""
    await rheo.create_stream("s", partitions=16)
    await rheo.fetch("s", "g", consumer_id="a", limit=1)
    await other.fetch("s", "g", consumer_id="b", limit=1)

    async def no_note(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(_backend(other), "_note_appended", no_note)
    await _fill(other, "s", 7, 3)
    await _fill(rheo, "s", 9, 2)
    backend = _backend(rheo)
    keys = backend._keys.work_keys("s", "g")
    await rheo.fetch("s", "g", consumer_id="a", limit=1, lease_ms=HOUR_MS)  # folds 9 in
    await backend.client.srem(keys[3], "9")  # the summary loses partition 9
    assert await rheo.fetch("s", "g", consumer_id="a", limit=100) == []
    clock.sweep()
    got = await rheo.fetch("s", "g", consumer_id="a", limit=100)
    assert sorted((lease.event.partition, lease.event.sequence) for lease in got) == [
        (7, 1), (7, 2), (7, 3), (9, 2)]


async def test_a_failed_note_makes_this_backend_resync(
    rheo: Rheo, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = _backend(rheo)
    await rheo.create_stream("s", partitions=16)
    await rheo.fetch("s", "g", consumer_id="a", limit=1)
    run = _scripts.ScriptRunner.run

    async def failing(self: Any, calls: Sequence[Any], **kwargs: Any) -> Any:
        if calls and calls[0][0] == "work" and calls[0][2][0] == "a":
            raise BackendUnavailable("the summary's node is down")
        return await run(self, calls, **kwargs)

    monkeypatch.setattr(_scripts.ScriptRunner, "run", failing)
    events = await rheo.append("s", [NewEvent("t", partition=6)])  # no error: it is stored
    assert [e.sequence for e in events] == [1]
    assert ("s", "g") not in backend._swept
    got = await rheo.fetch("s", "g", consumer_id="a", limit=10)
    assert [(lease.event.partition, lease.event.sequence) for lease in got] == [(6, 1)]


async def test_a_fetch_never_clears_work_noted_after_its_plan(
    rheo: Rheo, other: Rheo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the versions guard: a fetch drains partition 3, then (after its visit,
    before its write) another process appends there and notes it; the fetch's write
    that says partition 3 has nothing must not undo that note."""
    backend = _backend(rheo)
    await rheo.create_stream("s", partitions=8)
    await rheo.fetch("s", "g", consumer_id="a", limit=1)
    await _fill(rheo, "s", 3, 2)
    write_work = backend._write_work
    raced: list[bool] = []

    async def append_first(stream: str, call: Any) -> None:
        if not raced:
            raced.append(True)
            await _fill(other, "s", 3, 1)
        await write_work(stream, call)

    monkeypatch.setattr(backend, "_write_work", append_first)
    got = await rheo.fetch("s", "g", consumer_id="a", limit=10, lease_ms=HOUR_MS)
    assert [lease.event.sequence for lease in got] == [1, 2]
    assert raced
    again = await rheo.fetch("s", "g", consumer_id="a", limit=10, lease_ms=HOUR_MS)
    assert [lease.event.sequence for lease in again] == [3]


async def test_the_version_guard_in_the_script(rheo: Rheo) -> None:
    """``work.lua``: a write raises or clears an entry only when no note of its
    partition came after its plan; it lowers one always."""
    backend = _backend(rheo)
    await rheo.create_stream("s", partitions=4)
    keys = backend._keys.work_keys("s", "g")
    plan = await _plan(rheo, "s", "g")
    later = plan.now + HOUR_MS
    await backend._eval([("work", keys, ["n", "0", 1]), ("work", keys[:2], ["a", 2])])
    await backend._eval([("work", keys, ["x", plan.version, "0", 1, 0, "0", 2, 0, "0",
                                        3, later, "1"])])
    after = await _plan(rheo, "s", "g")
    assert after.due == {1: 0}  # noted after the plan: kept due
    assert set(after.fresh) == {2, 3}  # 2 noted after the plan; 3 lowered (added)
    assert after.fresh[3] == later
    await backend._eval([("work", keys, ["x", after.version, "0", 1, 0, "0", 2, 0, "0"])])
    last = await _plan(rheo, "s", "g")
    assert last.due == {}
    assert set(last.fresh) == {3}


async def test_deleting_a_group_or_stream_drops_its_summary(rheo: Rheo) -> None:
    backend = _backend(rheo)
    client = backend.client
    await rheo.create_stream("s", partitions=4)
    await _fill(rheo, "s", 1, 3)
    await rheo.fetch("s", "g", consumer_id="a", limit=1, lease_ms=HOUR_MS)
    keys = backend._keys.work_keys("s", "g")
    assert await client.exists(keys[2]) == 1
    await rheo.delete_group("s", "g")
    assert await client.exists(*keys[2:]) == 0
    got = await rheo.fetch("s", "g", consumer_id="a", limit=10, lease_ms=HOUR_MS)
    assert [lease.event.sequence for lease in got] == [1, 2, 3]
    await rheo.delete_stream("s")
    assert [key async for key in client.scan_iter(match=f"{{{backend.prefix}:s:work}}*")] == []


async def test_a_summary_call_sent_to_a_wrong_node_goes_through_the_client(
    rheo: Rheo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``work`` calls go straight to the node the slot map names; a redirection (a
    stale map after a failover) sends them again through the cluster client."""
    backend = _backend(rheo)
    client = backend.client
    await rheo.create_stream("s", partitions=8)
    await rheo.fetch("s", "g", consumer_id="a", limit=1)
    home = client.get_node_from_key(backend._keys.work_keys("s", "g")[0])
    [wrong] = [node for node in client.get_primaries() if node.name != home.name][:1]
    monkeypatch.setattr(client, "get_node_from_key", lambda key, replica=False: wrong)
    await _fill(rheo, "s", 5, 2)
    assert ("s", "g") in backend._swept  # the note did not fail
    assert 5 in (await _plan(rheo, "s", "g")).fresh
    got = await rheo.fetch("s", "g", consumer_id="a", limit=10)
    assert [(lease.event.partition, lease.event.sequence) for lease in got] == [(5, 1), (5, 2)]
