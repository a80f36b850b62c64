"""A store for the lag report tests of the backends answering ``lag_report`` themselves
(Redis, Redis Cluster, MongoDB, Motor): several streams, groups and partitions, acks in
and out of order, rejects (dead letters), scheduled events and paused groups; and the
check that the backend's report is the one composed from its other reads."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from rheo_flow import NewEvent, Rheo
from rheo_flow._backend import Backend
from rheo_flow._facade._lag import composed_lag_report

HOUR_MS = 3_600_000


async def build_lag_store(rheo: Rheo) -> list[str]:
    """The store; returns its streams' names (``lag-quiet`` has no group)."""
    now = await rheo.backend.now_ms()
    await rheo.create_stream("lag-orders", partitions=3)
    await rheo.create_stream("lag-mail", partitions=1)
    await rheo.create_stream("lag-quiet", partitions=2)
    await rheo.create_stream("lag-empty", partitions=2)
    await rheo.create_group("lag-orders", "billing")
    await rheo.create_group("lag-orders", "audit")
    await rheo.create_group("lag-mail", "sender")
    await rheo.create_group("lag-empty", "idle")
    await rheo.append("lag-orders", [NewEvent("order", {"n": n}, key=f"k{n}")
                                     for n in range(12)])
    await rheo.append("lag-orders", [NewEvent("later", {"n": n}, partition=n % 3,
                                              deliver_at=now + HOUR_MS) for n in range(4)])
    await rheo.append("lag-quiet", [NewEvent("note", partition=p) for p in (0, 1, 1)])
    await rheo.append("lag-mail", [NewEvent("mail", {"n": n}) for n in range(5)])
    await rheo.append("lag-mail", NewEvent("later", deliver_at=now + HOUR_MS))

    leases = await rheo.fetch("lag-orders", "billing", limit=8)
    await rheo.ack(leases[:2] + leases[4:6])  # some in order, some past a gap
    await rheo.reject(leases[2:4], "bad order")
    mail = await rheo.fetch("lag-mail", "sender", limit=3)
    await rheo.ack(mail[1:])  # past mail[0], still leased: the frontier stays
    await rheo.create_group("lag-orders", "late", start="latest")
    await rheo.append("lag-orders", [NewEvent("order", {"n": n}, key=f"k{n}")
                                     for n in range(12, 15)])
    await rheo.pause_group("lag-orders", "audit")
    # In the future by the system clock (the facade's check) and the backend's.
    until = datetime.fromtimestamp(max(now, time.time() * 1000) / 1000 + 7200, UTC)
    await rheo.pause_group("lag-mail", "sender", until=until)
    return ["lag-empty", "lag-mail", "lag-orders", "lag-quiet"]


async def check_lag_report(backend: Backend) -> None:
    """The backend's report equals the composed one (its time aside), for every stream
    and for a list naming an unknown stream; and the store shows what it was built for."""
    report = await backend.lag_report(None)
    composed = await composed_lag_report(backend, None)
    assert [(g.stream, g.group) for g in report.groups] == [
        ("lag-empty", "idle"), ("lag-mail", "sender"), ("lag-orders", "audit"),
        ("lag-orders", "billing"), ("lag-orders", "late")]
    for mine, reference in zip(report.groups, composed.groups, strict=True):
        assert mine == reference, (mine, reference)
    assert abs(report.read_at_ms - composed.read_at_ms) < 60_000
    billing = report.group("lag-orders", "billing")
    assert billing is not None
    assert billing.dead_letters == 2
    assert billing.scheduled == 4
    assert billing.lag > 0
    assert billing.oldest_unsettled_ms is not None
    audit = report.group("lag-orders", "audit")
    assert audit is not None
    assert audit.paused
    assert audit.paused_until_ms is None
    sender = report.group("lag-mail", "sender")
    assert sender is not None
    assert sender.paused
    assert sender.paused_until_ms is not None
    assert sender.lag == 6
    assert sender.scheduled == 1
    idle = report.group("lag-empty", "idle")
    assert idle is not None
    assert idle.lag == 0
    assert idle.oldest_unsettled_ms is None

    some = await backend.lag_report(["lag-mail", "lag-unknown", "lag-quiet"])
    assert some.groups == (sender,)
    assert (await backend.lag_report(["lag-unknown"])).groups == ()
    assert (await backend.lag_report([])).groups == ()
