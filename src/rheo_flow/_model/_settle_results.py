"""What a settle returns, and how its failures are classified: the settlement
vocabulary shared by every backend and runtime (the model layer).

A handler can succeed and its ack can still fail. :func:`classify` maps every
settle, renew and fetch error to exactly one :class:`SettleKind`, and each kind
carries the runtime's :class:`Decision` (docs/concepts.md, "Settling").
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass

from ._builders import positional_builder
from ._errors import BackendError, InvalidArgument
from ._failure import describe

__all__ = ["Decision", "SettleError", "SettleKind", "SettleResult", "classify", "settle_ok"]


class Decision(enum.StrEnum):
    """What the runtime does with a lease whose settle did not succeed."""

    DROP = "drop"
    """The lease is no longer ours: do nothing, the backend redelivers."""
    EXPIRE = "expire"
    """Leave the lease to expire; fencing protects a possibly committed settle."""
    NACK = "nack"
    """Nack for immediate redelivery."""


class SettleKind(enum.StrEnum):
    """The six classified outcomes of a settle, renew or fetch that did not succeed."""

    STALE_LEASE = "stale_lease"
    RECEIPT_MISMATCH = "receipt_mismatch"
    BACKEND_UNAVAILABLE = "backend_unavailable"
    AMBIGUOUS = "ambiguous"
    FAILED = "failed"
    INVALID = "invalid"

    @property
    def decision(self) -> Decision:
        """The runtime decision for this kind."""
        return _DECISIONS[self]


_DECISIONS: dict[SettleKind, Decision] = {
    SettleKind.STALE_LEASE: Decision.DROP,
    SettleKind.RECEIPT_MISMATCH: Decision.DROP,
    SettleKind.BACKEND_UNAVAILABLE: Decision.EXPIRE,
    SettleKind.AMBIGUOUS: Decision.EXPIRE,
    SettleKind.FAILED: Decision.NACK,
    SettleKind.INVALID: Decision.NACK,
}


@dataclass(frozen=True, slots=True)
class SettleError:
    """A classified settle failure: its kind, a human reason, and the decision."""

    kind: SettleKind
    reason: str = ""

    @property
    def decision(self) -> Decision:
        """What the runtime does about it."""
        return self.kind.decision


@dataclass(frozen=True, slots=True)
class SettleResult:
    """The outcome of settling (or renewing) one lease.

    ``ok`` is true when the operation took effect, or when it is an idempotent
    repeat of the settle that already took effect with the same lease
    (``repeated`` is then true).
    """

    lease_id: str
    error: SettleError | None = None
    repeated: bool = False
    deadline_ms: int | None = None
    """For a successful renew: the new deadline (epoch milliseconds)."""

    @property
    def ok(self) -> bool:
        """Whether the operation took effect."""
        return self.error is None

    @property
    def kind(self) -> SettleKind | None:
        """The classified kind of the failure, or ``None`` on success."""
        return None if self.error is None else self.error.kind

    @property
    def decision(self) -> Decision | None:
        """The runtime decision for the failure, or ``None`` on success."""
        return None if self.error is None else self.error.decision

    @classmethod
    def success(cls, lease_id: str, *, repeated: bool = False, deadline_ms: int | None = None
                ) -> SettleResult:
        """A result that took effect."""
        return cls(lease_id, None, repeated, deadline_ms)

    @classmethod
    def failure(cls, lease_id: str, kind: SettleKind, reason: str = "") -> SettleResult:
        """A classified failure."""
        return cls(lease_id, SettleError(kind, reason))


_OK_DOC = """``SettleResult.success(lease_id)`` without the frozen ``__init__``'s cost
(hot paths)."""

settle_ok: Callable[[str], SettleResult] = positional_builder(
    SettleResult, _OK_DOC)


ErrorClassifier = Callable[[BaseException], SettleKind | None]
"""A backend's own mapping of its driver's exceptions (``None``: not recognised)."""


def classify(exc: BaseException, backend_classifier: ErrorClassifier | None = None) -> SettleError:
    """Classify an exception raised by a settle, renew or fetch into one kind.

    The backend's own classifier is asked first (it knows its driver); then
    rheo_flow's own errors; then generic Python errors. Anything else is
    ``failed``: a definite failure on which nothing was committed.
    """
    reason = describe(exc)
    if backend_classifier is not None:
        kind = backend_classifier(exc)
        if kind is not None:
            return SettleError(kind, reason)
    if isinstance(exc, BackendError):
        return SettleError(SettleKind(exc.kind), reason)
    if isinstance(exc, InvalidArgument):
        return SettleError(SettleKind.INVALID, reason)
    if isinstance(exc, ConnectionRefusedError):
        return SettleError(SettleKind.BACKEND_UNAVAILABLE, reason)
    if isinstance(exc, TimeoutError | asyncio.TimeoutError | ConnectionError):
        # The request may have reached the backend before the connection went away.
        return SettleError(SettleKind.AMBIGUOUS, reason)
    if isinstance(exc, OSError):
        return SettleError(SettleKind.BACKEND_UNAVAILABLE, reason)
    return SettleError(SettleKind.FAILED, reason)
