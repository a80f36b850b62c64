"""What a consumer's handler returns, and the lease it is handling.

:meth:`Consumer.handle_event <rheo_flow.Consumer.handle_event>` returns an
:data:`Outcome`: :data:`ACK`, :class:`Retry`, :class:`Reject` or :data:`SETTLED`; the
:class:`~rheo_flow.Group` running it settles the lease accordingly, and makes the
lease available to the handler through :func:`current_lease`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from ._errors import InvalidArgument, NotStarted
from ._lease import Lease
from ._validation import check_duration_ms

__all__ = ["ACK", "SETTLED", "Ack", "Context", "Outcome", "Reject", "Retry", "Settled",
           "current_lease"]

Context: TypeAlias = Mapping[str, Any]
"""The read-only handler context built once by :meth:`Consumer.setup`."""


@dataclass(frozen=True, slots=True)
class Ack:
    """Outcome: the event was processed; acknowledge its lease. Use the :data:`ACK` constant."""


ACK = Ack()
"""The :class:`Ack` outcome."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Outcome: a temporary failure; nack the lease for redelivery after ``delay_ms``.

    ``delay_ms=None`` (the default) takes the delay from the group's
    ``retry_policy`` (exponential backoff with jitter); ``0`` redelivers at once.
    Past the group's ``max_attempts`` the backend dead-letters the event instead;
    the reason stays on the dead letter as its ``last_error``.
    """

    reason: str
    delay_ms: int | None = None

    def __post_init__(self) -> None:
        _check_reason("Retry", self.reason)
        if self.delay_ms is not None:
            check_duration_ms("Retry delay_ms", self.delay_ms)


@dataclass(frozen=True, slots=True)
class Reject:
    """Outcome: a permanent failure; dead-letter the event for this group."""

    reason: str

    def __post_init__(self) -> None:
        _check_reason("Reject", self.reason)


@dataclass(frozen=True, slots=True)
class Settled:
    """Outcome: the handler settled its lease itself, in its own transaction
    (:meth:`Rheo.transaction <rheo_flow.Rheo.transaction>`, docs/outbox.md); the group
    releases the lease without settling it again. Use the :data:`SETTLED` constant."""


SETTLED = Settled()
"""The :class:`Settled` outcome."""


Outcome: TypeAlias = Ack | Retry | Reject | Settled
"""What :meth:`Consumer.handle_event` returns."""


def _check_reason(outcome: str, reason: object) -> None:
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidArgument(f"{outcome} needs a non-empty reason string, got {reason!r}")


_CURRENT_LEASE: contextvars.ContextVar[Lease] = contextvars.ContextVar("rheo_flow_current_lease")


def current_lease() -> Lease:
    """The lease of the event the calling handler is processing.

    Gives a handler the delivery details its ``event`` does not carry, such as
    ``attempt`` (1 on the first delivery). Raises :class:`~rheo_flow.NotStarted`
    outside a handler.
    """
    try:
        return _CURRENT_LEASE.get()
    except LookupError:
        raise NotStarted("current_lease() is only available inside handle_event") from None
