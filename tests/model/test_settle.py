"""The settlement vocabulary: six kinds, their decisions, and the classifier."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from rheo_flow import (
    BackendError,
    BackendUnavailable,
    Decision,
    InvalidArgument,
    Lease,
    ManualClock,
    Rheo,
    SettleError,
    SettleKind,
    SettleResult,
    UnknownStream,
    classify,
)
from rheo_flow.backends import MemoryBackend

DECISIONS = {
    SettleKind.STALE_LEASE: Decision.DROP,
    SettleKind.RECEIPT_MISMATCH: Decision.DROP,
    SettleKind.BACKEND_UNAVAILABLE: Decision.EXPIRE,
    SettleKind.AMBIGUOUS: Decision.EXPIRE,
    SettleKind.FAILED: Decision.NACK,
    SettleKind.INVALID: Decision.NACK,
}


def test_vocabulary_has_exactly_six_kinds() -> None:
    assert {k.value for k in SettleKind} == {
        "stale_lease", "receipt_mismatch", "backend_unavailable", "ambiguous", "failed", "invalid",
    }
    assert {d.value for d in Decision} == {"drop", "expire", "nack"}


@pytest.mark.parametrize(("kind", "decision"), DECISIONS.items())
def test_each_kind_has_its_decision(kind: SettleKind, decision: Decision) -> None:
    assert kind.decision is decision
    assert SettleError(kind, "why").decision is decision
    result = SettleResult.failure("lease-1", kind, "why")
    assert not result.ok
    assert result.kind is kind
    assert result.decision is decision
    assert result.error == SettleError(kind, "why")


def test_success_has_no_kind_or_decision() -> None:
    result = SettleResult.success("lease-1", repeated=True, deadline_ms=123)
    assert result.ok
    assert result.repeated
    assert result.deadline_ms == 123
    assert result.kind is None
    assert result.decision is None


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ConnectionRefusedError("refused"), SettleKind.BACKEND_UNAVAILABLE),
        (OSError("no route to host"), SettleKind.BACKEND_UNAVAILABLE),
        (BackendUnavailable("server down"), SettleKind.BACKEND_UNAVAILABLE),
        (TimeoutError(), SettleKind.AMBIGUOUS),
        (ConnectionResetError("reset mid-write"), SettleKind.AMBIGUOUS),
        (BrokenPipeError(), SettleKind.AMBIGUOUS),
        (BackendError("maybe", kind="ambiguous"), SettleKind.AMBIGUOUS),
        (BackendError("lost", kind="stale_lease"), SettleKind.STALE_LEASE),
        (BackendError("boom"), SettleKind.FAILED),
        (InvalidArgument("bad reason"), SettleKind.INVALID),
        (UnknownStream("nope"), SettleKind.INVALID),
        (RuntimeError("whatever"), SettleKind.FAILED),
        (KeyError("k"), SettleKind.FAILED),
        (ValueError("not ours"), SettleKind.FAILED),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_classify(exc: BaseException, kind: SettleKind) -> None:
    error = classify(exc)
    assert error.kind is kind
    assert error.reason.startswith(type(exc).__name__)


def test_classify_reason_names_the_exception_and_message() -> None:
    assert classify(RuntimeError("disk full")).reason == "RuntimeError: disk full"
    assert classify(TimeoutError()).reason == "TimeoutError"


def test_backend_classifier_is_asked_first_and_may_pass() -> None:
    class DriverError(Exception):
        pass

    def driver_rules(exc: BaseException) -> SettleKind | None:
        return SettleKind.RECEIPT_MISMATCH if isinstance(exc, DriverError) else None

    assert classify(DriverError("x"), driver_rules).kind is SettleKind.RECEIPT_MISMATCH
    # Not recognised by the backend: the generic rules apply.
    assert classify(TimeoutError(), driver_rules).kind is SettleKind.AMBIGUOUS
    # The backend's rules win over the generic ones.
    assert classify(TimeoutError(), lambda _: SettleKind.FAILED).kind is SettleKind.FAILED


class _FlakyAck(MemoryBackend):
    """A memory backend whose acks raise a chosen exception."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    async def ack(self, leases: Sequence[Lease]) -> list[SettleResult]:
        raise self.error


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (ConnectionRefusedError(), SettleKind.BACKEND_UNAVAILABLE),
        (TimeoutError(), SettleKind.AMBIGUOUS),
        (RuntimeError("driver bug"), SettleKind.FAILED),
    ],
)
async def test_driver_errors_never_leak_from_settle(error: BaseException, kind: SettleKind
                                                    ) -> None:
    async with Rheo(_FlakyAck(error)) as rheo:
        await rheo.create_stream("s", partitions=2)
        await rheo.append("s", [{"type": "t", "partition": p} for p in (0, 1, 1)])
        leases = await rheo.fetch("s", "g", limit=10)
        results = await rheo.ack(leases)
    assert [r.lease_id for r in results] == [lease.lease_id for lease in leases]
    assert {r.kind for r in results} == {kind}
    assert all(not r.ok for r in results)


async def test_stale_lease_is_classified_and_dropped(rheo: Rheo, clock: ManualClock) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", {"type": "t"})
    [old] = await rheo.fetch("s", "g", lease_ms=1000)
    clock.advance(1001)
    [new] = await rheo.fetch("s", "g", lease_ms=1000)
    assert new.attempt == old.attempt + 1
    [stale] = await rheo.ack(old)
    assert stale.kind is SettleKind.STALE_LEASE
    assert stale.decision is Decision.DROP
    [fresh] = await rheo.ack(new)
    assert fresh.ok
