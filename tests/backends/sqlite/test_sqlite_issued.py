"""The leases an SQLite backend object vouches for (``_issued``): those carrying exactly the
fields it built them with (the same objects), a bounded number of them, and none once
settled; a forged lease takes the full checks and gets the answers it always got."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rheo_flow import Lease, ManualClock, NewEvent, Rheo, SettleKind
from rheo_flow._backends import _issued
from rheo_flow._backends._issued import Issued
from rheo_flow._model._event import make_event
from rheo_flow._model._lease import make_lease
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
    # A copy carries the very same field objects: what was issued, vouched for.
    assert issued.vouch([dataclasses.replace(lease) for lease in leases]) == {0, 1, 2, 3}
    # Equal is not enough: a field rebuilt (an equal string, another object), or
    # changed, is checked in full.
    rebuilt = dataclasses.replace(leases[0], receipt="".join(leases[0].receipt))
    assert rebuilt == leases[0]
    assert rebuilt.receipt is not leases[0].receipt
    forged = dataclasses.replace(leases[1], group="other")
    other_event = dataclasses.replace(leases[2], event=dataclasses.replace(
        leases[2].event, sequence=leases[3].event.sequence))
    assert issued.vouch([rebuilt, forged, other_event, leases[3]]) == {3}


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
    # Settling the forgeries forgot their lease ids (the first and third leases'): only
    # the second is still vouched for, and it is stale all the same.
    assert backend._issued.vouch(leases[:3]) == {1}
    # The first two were leased again (stale); the third, expired but not leased again
    # (the tail the limit cut off keeps its old token), still acks.
    assert [r.kind for r in await rheo.ack(leases[:3])] == [SettleKind.STALE_LEASE] * 2 + [None]
    assert all(r.ok for r in await rheo.ack(again))


def _leases(start: int, count: int) -> list[Lease]:
    return [make_lease(f"{'0' * 24}{seq:08x}", f"0-{seq}-1", "g", "c",
                       make_event("s", 0, seq, f"e{seq}", "t", {}, None, {}, 0), 1, 0)
            for seq in range(start, start + count)]


def test_the_registry_holds_a_bounded_number_of_leases(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_issued, "LIMIT", 8)
    issued = Issued()
    batches = [_leases(1 + 4 * i, 4) for i in range(3)]
    for batch in batches:
        issued.register(batch)
    # Past the limit the oldest go first, down to three quarters of it.
    assert len(issued) == 6
    assert issued.vouch(batches[0]) == set()
    assert issued.vouch(batches[2]) == {0, 1, 2, 3}
    issued.forget(batches[2])
    assert len(issued) == 2
    # A lease id that is not a string is never vouched for, nor an error.
    assert issued.vouch([dataclasses.replace(batches[1][0], lease_id=["x"])]) == set()
