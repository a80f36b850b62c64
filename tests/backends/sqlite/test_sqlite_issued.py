"""The leases an SQLite backend object vouches for by identity (``_issued``): only the very
objects it built from their range, a bounded number of them, and none once settled; a
copy or a forged lease takes the full checks and gets the same answers."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rheo_flow import ManualClock, NewEvent, Rheo, SettleKind
from rheo_flow._backends.sqlite import _issued
from rheo_flow._backends.sqlite._issued import Issued
from rheo_flow.backends import SQLiteBackend


@pytest.fixture
async def backend(tmp_path: Path, clock: ManualClock) -> AsyncIterator[SQLiteBackend]:
    backend = SQLiteBackend(tmp_path / "events.db", clock=clock, synchronous="NORMAL")
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        await rheo.append("s", [NewEvent("t", i) for i in range(6)])
        yield backend


async def test_only_the_leases_a_fetch_built_are_vouched_for(backend: SQLiteBackend) -> None:
    rheo = Rheo(backend)
    leases = await rheo.fetch("s", "g", limit=4)
    issued = backend._issued
    assert issued.vouch(leases) == {0, 1, 2, 3}
    copies = [dataclasses.replace(lease) for lease in leases]
    assert copies == leases
    assert issued.vouch(copies) == set()  # equal is not enough: only the same object
    assert issued.vouch([copies[0], leases[1]]) == {1}


async def test_a_settle_forgets_its_leases_and_a_renewal_keeps_them(
        backend: SQLiteBackend) -> None:
    rheo = Rheo(backend)
    leases = await rheo.fetch("s", "g", limit=4)
    assert all(r.ok for r in await rheo.renew(leases[:2], lease_ms=60_000))
    assert backend._issued.vouch(leases) == {0, 1, 2, 3}
    assert all(r.ok for r in await rheo.ack(leases[:2]))
    assert backend._issued.vouch(leases) == {2, 3}
    # Repeats take the full checks and still answer as repeats.
    assert all(r.ok and r.repeated for r in await rheo.ack(leases[:2]))
    assert [r.kind for r in await rheo.nack(leases[2:3], "retry")] == [None]
    assert backend._issued.vouch(leases) == {3}


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
    # Once the range expired and was leased again, a vouched original is stale.
    clock.advance(2_000)
    again = await rheo.fetch("s", "g", limit=2)
    assert [lease.sequence for lease in again] == [1, 2]
    assert backend._issued.vouch(leases[:3]) == {0, 1, 2}
    # The first two were leased again (stale); the third, expired but not leased again
    # (the tail the limit cut off keeps its old token), still acks.
    assert [r.kind for r in await rheo.ack(leases[:3])] == [SettleKind.STALE_LEASE] * 2 + [None]
    assert all(r.ok for r in await rheo.ack(again))


def test_the_registry_holds_a_bounded_number_of_leases(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_issued, "LIMIT", 8)
    issued = Issued()
    batches = [[object() for _ in range(4)] for _ in range(3)]
    for batch in batches:
        issued.register(batch)  # type: ignore[arg-type]
    # Past the limit the oldest go first, down to three quarters of it.
    assert len(issued) == 6
    assert issued.vouch(batches[0]) == set()  # type: ignore[arg-type]
    assert issued.vouch(batches[2]) == {0, 1, 2, 3}  # type: ignore[arg-type]
    issued.forget(batches[2])  # type: ignore[arg-type]
    assert len(issued) == 2
