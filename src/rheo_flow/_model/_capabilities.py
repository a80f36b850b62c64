"""Validated capability declarations of a backend (docs/backends.md, "Capabilities").

Guarantees (what a user may rely on) are declared separately from mechanisms
(how the backend achieves them); a declaration that contradicts itself or the
contract fails at construction with :class:`InvalidCapabilities`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ._errors import InvalidCapabilities

__all__ = ["Capabilities"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """What a backend guarantees and which mechanisms it uses."""

    # Guarantees.
    durable: bool
    """Acknowledged writes survive a restart of the process (and of the server).

    For a server backend this is also the server's own setting: Redis keeps
    acknowledged writes across a restart only with AOF persistence
    (``appendfsync always``: every write; ``everysec``: all but about the last
    second on a crash of the machine); with RDB snapshots alone a restart goes
    back to the last snapshot, and with no persistence it loses everything
    (which the backend reports as :class:`~rheo_flow.StoreLost`).
    """
    distributed: bool
    """Several processes or machines may compete for one group's work."""
    fenced_settle: bool = True
    """A stale lease can never settle or renew a newer one. Required by the contract."""
    ordered_partitions: bool = True
    """Events are delivered in sequence order within a partition."""

    # Mechanisms.
    push_wakeups: bool = False
    """The backend can wake idle consumers on append (NOTIFY, blocking reads, ...)."""
    skip_locked: bool = False
    """Claims use ``FOR UPDATE SKIP LOCKED`` (or an equivalent non-blocking claim)."""
    server_clock: bool = False
    """Lease deadlines are computed with the backend's clock, not the client's."""
    delayed_nack: bool = True
    """``nack(delay_ms=...)`` postpones redelivery."""
    time_range_query: bool = True
    """Queries may filter on the append time."""
    trim: bool = True
    """``trim`` removes events."""
    retention: bool = False
    """Streams keep a retention policy (:class:`~rheo_flow.Retention`): the backend
    implements :meth:`~rheo_flow.Backend.set_retention` and reports the policy in
    ``StreamInfo.retention`` (rule ``retention.settled``)."""
    key_ordering: bool = False
    """Groups may be created with ``ordering="key"`` (docs/ordering.md): the backend's own
    fetch then leases a delivery of key K only once every earlier delivery of K in its
    partition is settled for the group, across every process sharing the store.

    Declaring it also declares that ``create_group`` takes the keyword ``ordering``;
    :class:`~rheo_flow.Rheo` passes it only to a backend declaring this (False by
    default, so a backend whose ``create_group`` predates the keyword keeps working)."""
    last_error: bool = False
    """``nack`` and ``reject`` take ``error`` and keep it as the deliveries' last error
    (``DeadLetter.last_error``). :class:`~rheo_flow.Rheo` passes ``error`` only to a
    backend declaring this (False by default, so a backend whose ``nack`` and ``reject``
    predate the argument keeps working; its dead letters carry no last error)."""
    in_transaction: bool = False
    """``append`` and ``ack`` take ``connection=``: the application's own connection to
    the backend's database, inside a transaction it opened. What they write commits or
    rolls back with that transaction (docs/outbox.md). :class:`~rheo_flow.Rheo` calls
    :meth:`~rheo_flow.Backend.append_in_transaction` and
    :meth:`~rheo_flow.Backend.ack_in_transaction` only on a backend declaring this."""

    pause: bool = False
    """Groups may be paused and resumed (``pause_group``, ``resume_group``): the pause is
    stored with the group, so every process sharing the store sees it at its next fetch,
    which returns nothing while it lasts (docs/concepts.md, "Pausing a group").
    :class:`~rheo_flow.Rheo` calls them only on a backend declaring this."""
    delayed_delivery: bool = False
    """``NewEvent(deliver_at=...)`` (docs/contract.md, "Delayed delivery"): the event takes
    its sequence at append and no group leases it before that time. An append of such
    an event to a backend not declaring this raises :class:`~rheo_flow.Unsupported`."""

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, bool):
                raise InvalidCapabilities(
                    f"capability {field.name!r} must be a bool, got {type(value).__name__}"
                )
        if not self.fenced_settle:
            raise InvalidCapabilities(
                "fenced_settle=False breaks the contract: "
                "a stale consumer could settle a newer lease"
            )
        if not self.ordered_partitions:
            raise InvalidCapabilities("ordered_partitions=False breaks the ordering invariant")
        if self.distributed and not self.durable:
            raise InvalidCapabilities("a distributed backend must be durable (shared store)")
        if self.skip_locked and not self.distributed:
            raise InvalidCapabilities("skip_locked is a mechanism of a distributed backend")

    def as_dict(self) -> dict[str, bool]:
        """The declaration as a plain mapping (for docs, logs and telemetry)."""
        return {field.name: getattr(self, field.name) for field in fields(self)}
