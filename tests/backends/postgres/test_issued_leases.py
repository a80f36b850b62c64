"""Acks of leases the PostgreSQL backend issued (``_backends/_issued.py``): a settle
batch skips its checks only for leases a fetch built, with those very fields, each
once; anything else takes the checked path, answered as before."""

from __future__ import annotations

import dataclasses

from rheo_flow import NewEvent, Rheo, SettleKind
from rheo_flow._backends._issued import Issued
from rheo_flow._backends.postgres._batch import SettleBatch
from rheo_flow._model._event import make_event_json
from rheo_flow._model._lease import Lease, make_lease

GROUPS = {("s", "g"): (7, 2), ("s", "h"): (8, 2)}
TOKEN = "ab" * 12


def _lease(seq: int, group: str = "g") -> Lease:
    event = make_event_json("s", 0, seq, f"e{seq}", "t", "{}", None, {}, 0)
    return make_lease(f"{TOKEN}{seq - 1:08x}", f"0-{seq}-1", group, "c", event, 1, 0)


def _vouched(leases: list[Lease]) -> Issued:
    issued = Issued()
    issued.register(leases)
    return issued


def test_a_batch_of_issued_leases_is_grouped_by_range_and_forgotten() -> None:
    leases = [_lease(seq) for seq in (3, 1, 2)]
    issued = _vouched(leases)
    batch = SettleBatch(leases, GROUPS, issued)
    assert len(issued) == 0
    assert batch.sends
    assert batch.range_args()[4:] == ("{1}", "{111}", "{3}")
    assert batch.order == [1, 2, 0]
    # The lease-by-lease arrays, if asked for, follow the leases by delivery too.
    assert batch.args[2] == "{1,2,3}"
    assert batch.order == [1, 2, 0]


def test_a_lease_twice_in_a_batch_is_checked() -> None:
    leases = [_lease(1), _lease(2)]
    issued = _vouched(leases)
    batch = SettleBatch([leases[0], leases[1], leases[0]], GROUPS, issued)
    assert len(issued) == 0  # forgotten all the same: settled, a repeat is checked
    assert batch.duplicates == [(2, 0)]
    assert batch.args[2] == "{1,2}"  # the duplicate folded onto its first occurrence


def test_a_lease_rebuilt_from_an_issued_one_is_checked() -> None:
    leases = [_lease(1), _lease(2)]
    issued = _vouched(leases)
    forged = dataclasses.replace(leases[1], receipt="0-2-9")
    batch = SettleBatch([leases[0], forged], GROUPS, issued)
    assert len(issued) == 2
    # Checked lease by lease: the receipt decides the attempt sent for the forged lease.
    assert batch.range_args() == ()
    assert batch.args[4] == "{1,9}"
    # So it does when the attempt was changed and the receipt kept.
    forged = dataclasses.replace(leases[1], attempt=5)
    batch = SettleBatch([leases[0], forged], GROUPS, issued)
    assert len(issued) == 2
    assert batch.args[4] == "{1,1}"


def test_a_lease_of_a_partition_the_stream_no_longer_has_is_answered_as_before() -> None:
    lease = _lease(1)
    issued = _vouched([lease])
    batch = SettleBatch([lease], {("s", "g"): (7, 0)}, issued)  # recreated, fewer partitions
    assert len(issued) == 1
    assert not batch.sends
    [result] = batch.finish(renew=False)
    assert result.error is not None
    assert (result.error.kind, result.error.reason) == (
        SettleKind.INVALID, "lease names no group of this backend")


def test_a_batch_of_two_groups_is_checked() -> None:
    leases = [_lease(1), _lease(2, group="h")]
    issued = _vouched(leases)
    batch = SettleBatch(leases, GROUPS, issued)
    assert len(issued) == 2
    assert batch.range_args() == ()
    assert batch.args[0] == "{7,8}"


async def test_acks_of_fetched_leases_skip_the_checks_and_repeat_as_before(
        postgres_rheo: Rheo) -> None:
    rheo = postgres_rheo
    await rheo.create_stream("s", partitions=2)
    await rheo.append("s", [NewEvent("t", {"i": i}, partition=i % 2) for i in range(6)])
    leases = await rheo.fetch("s", "g", limit=6)
    issued: Issued = rheo.backend._issued  # type: ignore[attr-defined]
    assert issued.vouch(leases) == set(range(6))
    first = await rheo.ack(leases[:4])
    assert all(r.ok and not r.repeated for r in first)
    assert issued.vouch(leases) == {4, 5}
    # Acked again (no record left): checked, answered as repeats by the server.
    again = await rheo.ack(leases)
    assert [(r.ok, r.repeated) for r in again] == [(True, True)] * 4 + [(True, False)] * 2
    assert await rheo.frontier("s", "g") == {0: 3, 1: 3}
    # A lease forged from a fetched one is checked: its receipt names another attempt.
    assert await rheo.fetch("s", "g", limit=1) == []
    forged = dataclasses.replace(leases[0], receipt=f"{leases[0].partition}-"
                                 f"{leases[0].sequence}-7")
    [result] = await rheo.ack([forged])
    assert result.error is not None
    assert result.error.kind == SettleKind.RECEIPT_MISMATCH


def test_leases_sharing_a_token_across_bases_are_checked() -> None:
    # A key-ordered group's fetch names its leases by one token and their place in
    # the batch: one token, a base each; each becomes an element of its own.
    events = [make_event_json("s", part, seq, f"e{seq}", "t", "{}", None, {}, 0)
              for part, seq in ((0, 5), (1, 2), (0, 9))]
    leases = [make_lease(f"{TOKEN}{ord_:08x}", f"{e.partition}-{e.sequence}-1", "g", "c", e,
                         1, 0) for ord_, e in enumerate(events, start=1)]
    issued = _vouched(leases)
    batch = SettleBatch(leases, GROUPS, issued)
    assert len(issued) == 3
    parts, _, _, bases, los, bits, counts = batch.range_args()
    assert (parts, bases, los, bits, counts) == (
        "{0,0,1}", "{4,6,0}", "{5,9,2}", "{1,1,1}", "{1,1,1}")
