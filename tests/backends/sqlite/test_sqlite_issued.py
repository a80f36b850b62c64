"""The new ranges an SQLite backend object leased (``_issued_runs``): acks of runs of
their leases (those very objects, in order) go per range; anything else, copies and
forgeries included, goes lease by lease with the full checks and gets the answers it
always got."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rheo_flow import Lease, ManualClock, NewEvent, Rheo, SettleKind
from rheo_flow._backends import _issued_runs
from rheo_flow._backends._issued_runs import IssuedRuns, Run
from rheo_flow._backends.sqlite import _settle
from rheo_flow._backends.sqlite._ranges import range_token
from rheo_flow._model._event import make_event
from rheo_flow._model._lease import make_lease
from rheo_flow.backends import SQLiteBackend


@pytest.fixture
async def backend(tmp_path: Path, clock: ManualClock) -> AsyncIterator[SQLiteBackend]:
    backend = SQLiteBackend(tmp_path / "events.db", clock=clock, synchronous="NORMAL")
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        await rheo.append("s", [NewEvent("t", i) for i in range(12)])
        yield backend


@pytest.fixture
def as_runs(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Per ack in the backend thread: whether it went as runs."""
    went: list[bool] = []
    ack_runs = _settle.ack_runs

    def spy(*args: object) -> object:
        result = ack_runs(*args)  # type: ignore[arg-type]
        went.append(result is not None)
        return result

    monkeypatch.setattr(_settle, "ack_runs", spy)
    return went


async def test_only_the_leases_a_fetch_built_are_vouched_for(backend: SQLiteBackend) -> None:
    rheo = Rheo(backend)
    leases = await rheo.fetch("s", "g", limit=4)
    issued = backend._issued
    assert issued.vouch(leases) == {0, 1, 2, 3}
    # A copy is another lease object: equal, not issued here, checked in full.
    copies = [dataclasses.replace(lease) for lease in leases]
    assert copies == leases
    assert issued.vouch(copies) == set()
    assert issued.runs(copies) is None
    assert issued.runs(leases) == [Run("s", "g", 0, leases[0].lease_id[:24], 1, 4)]


async def test_acks_of_runs_go_per_range_and_the_rest_lease_by_lease(
        backend: SQLiteBackend, as_runs: list[bool]) -> None:
    rheo = Rheo(backend)
    first = await rheo.fetch("s", "g", limit=4)
    second = await rheo.fetch("s", "g", limit=4)
    issued = backend._issued
    # Out of order: runs of two ranges, and one lease alone between them.
    batch = [first[2], first[3], second[0], second[1], first[0]]
    assert [(r.lo, r.hi) for r in issued.runs(batch) or []] == [(3, 4), (5, 6), (1, 1)]
    assert all(r.ok and not r.repeated for r in await rheo.ack(batch))
    assert as_runs == [True]
    assert await rheo.frontier("s", "g") == {0: 1}
    # A repeat finds its events acked: the whole batch goes lease by lease, as repeats.
    results = await rheo.ack([first[1], first[0]])
    assert [(r.ok, r.repeated) for r in results] == [(True, False), (True, True)]
    assert as_runs == [True, False]
    assert await rheo.frontier("s", "g") == {0: 6}
    # Every lease of the first range was settled: it left the registry, the second stays.
    assert len(issued) == 1
    assert issued.leases_held == 4
    assert all(r.ok for r in await rheo.ack(second[2:]))
    assert as_runs == [True, False, True]
    assert len(issued) == 0
    assert await rheo.frontier("s", "g") == {0: 8}


async def test_settled_leases_leave_the_registry_and_renewed_ones_stay(
        backend: SQLiteBackend) -> None:
    rheo = Rheo(backend)
    leases = await rheo.fetch("s", "g", limit=4)
    issued = backend._issued
    assert all(r.ok for r in await rheo.renew(leases, lease_ms=60_000))
    assert issued.vouch(leases) == {0, 1, 2, 3}
    assert [r.kind for r in await rheo.nack(leases[2:3], "retry")] == [None]
    assert [r.kind for r in await rheo.reject(leases[3:], "bad")] == [None]
    assert issued.vouch(leases) == {0, 1, 2, 3}  # the range holds two leases to settle
    assert all(r.ok for r in await rheo.ack(leases[1::-1]))  # out of order: lease by lease
    assert len(issued) == 0
    assert issued.vouch(leases) == set()


async def test_the_list_a_fetch_returned_may_change_and_acks_settle_what_they_name(
        backend: SQLiteBackend) -> None:
    # The registry keeps its own copy: with a lease taken out of the fetch's list, an ack
    # of that list settles the leases it names, not the first three sequences.
    rheo = Rheo(backend)
    leases = await rheo.fetch("s", "g", limit=4)
    second = leases[1]
    del leases[1]
    assert [lease.sequence for lease in leases] == [1, 3, 4]
    assert all(r.ok and not r.repeated for r in await rheo.ack(leases))
    assert await rheo.frontier("s", "g") == {0: 1}  # sequence 2 is still in flight
    again = await rheo.ack([second])
    assert [(r.ok, r.repeated) for r in again] == [(True, False)]
    assert await rheo.frontier("s", "g") == {0: 4}


async def test_a_lease_named_twice_goes_lease_by_lease(
        backend: SQLiteBackend, as_runs: list[bool]) -> None:
    rheo = Rheo(backend)
    leases = await rheo.fetch("s", "g", limit=3)
    results = await rheo.ack([leases[0], leases[1], leases[0]])
    assert as_runs == [False]
    assert [(r.ok, r.repeated) for r in results] == [(True, False), (True, False), (True, True)]


async def test_nacks_and_renewals_of_vouched_leases_then_their_acks(
        backend: SQLiteBackend, as_runs: list[bool]) -> None:
    rheo = Rheo(backend)
    leases = await rheo.fetch("s", "g", limit=4)
    assert all(r.ok for r in await rheo.renew(leases[:2], lease_ms=60_000))
    assert [r.kind for r in await rheo.nack(leases[2:3], "retry")] == [None]
    # The third was nacked: the run of all four is not in flight, each lease is answered.
    results = await rheo.ack(leases)
    assert as_runs == [False]
    assert [r.ok for r in results] == [True, True, False, True]
    assert results[2].kind is SettleKind.STALE_LEASE
    assert results[2].error is not None
    assert results[2].error.reason == "already settled by nack"


async def test_copies_and_forgeries_get_the_answers_the_originals_would(
        backend: SQLiteBackend, clock: ManualClock) -> None:
    rheo = Rheo(backend)
    leases = await rheo.fetch("s", "g", limit=4, lease_ms=1_000)
    forged = dataclasses.replace(leases[0], receipt="0-1-2")
    assert [r.kind for r in await rheo.ack([forged])] == [SettleKind.RECEIPT_MISMATCH]
    wrong_offset = dataclasses.replace(leases[1], lease_id=leases[2].lease_id)
    assert not (await rheo.ack([wrong_offset]))[0].ok
    # A copy acks as its original would; the original then repeats.
    assert all(r.ok and not r.repeated for r in await rheo.ack([dataclasses.replace(leases[3])]))
    assert (await rheo.ack(leases[3:]))[0].repeated
    # Once the range expired and was leased again, the originals are stale.
    clock.advance(2_000)
    again = await rheo.fetch("s", "g", limit=2)
    assert [lease.sequence for lease in again] == [1, 2]
    # The first two were leased again (stale); the third, expired but not leased again
    # (the tail the limit cut off keeps its old token), still acks.
    assert [r.kind for r in await rheo.ack(leases[:3])] == [SettleKind.STALE_LEASE] * 2 + [None]
    assert all(r.ok for r in await rheo.ack(again))


def _leases(token: str, start: int, count: int) -> list[Lease]:
    return [make_lease(f"{token}{seq - start:08x}", f"0-{seq}-1", "g", "c",
                       make_event("s", 0, seq, f"e{seq}", "t", {}, None, {}, 0), 1, 0)
            for seq in range(start, start + count)]


def test_the_registry_holds_a_bounded_number_of_ranges(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_issued_runs, "LIMIT", 32)
    issued = IssuedRuns(range_token)
    batches = [_leases(f"{i:024x}", 1 + 4 * i, 4) for i in range(9)]
    for i, batch in enumerate(batches):
        issued.register("s", "g", 0, f"{i:024x}", 1 + 4 * i, batch)
    # Past the limit of leases the oldest ranges go first, down to three quarters of it.
    assert len(issued) == 6
    assert issued.leases_held == 24
    assert issued.vouch(batches[0]) == set()
    assert issued.runs(batches[0]) is None
    assert issued.vouch(batches[8]) == {0, 1, 2, 3}
    issued.acked(issued.runs(batches[8]) or [])
    assert len(issued) == 5
    # A lease id that is not a string is never vouched for, nor an error.
    assert issued.vouch([dataclasses.replace(batches[7][0], lease_id=["x"])]) == set()
    assert issued.runs([dataclasses.replace(batches[7][0], lease_id=["x"])]) is None
