"""The backend contract: semantic, batch-oriented operations over durable state.

A backend owns consumer-group correctness (leases, fencing, the frontier); the
:class:`~rheo_flow.Rheo` facade validates input and routes events before it
calls a backend, so implementations receive well-formed arguments only. Every
operation takes and returns batches: one round trip per call.

The rules every backend follows are written once, in the repository's
``docs/contract.md``, each under a name (``settle.fencing``,
``frontier.contiguous``, ...); the docstrings below name the rules of each
operation, and every case of the conformance kit (:mod:`rheo_flow.testing`)
cites the rules it checks.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ._model._append_records import AppendRecord
from ._model._capabilities import Capabilities
from ._model._errors import UnknownGroup, UnknownStream, Unsupported
from ._model._event import Event
from ._model._lag import LagReport
from ._model._lease import Lease
from ._model._query import Query
from ._model._settle_results import SettleKind, SettleResult
from ._model._stream import DeadLetter, GroupInfo, Retention, StartPosition, StreamInfo
from ._support._clock import system_clock

__all__ = ["AppendRecord", "Backend"]

DEFAULT_MAX_ATTEMPTS = 5
MAX_ATTEMPTS_REASON = "max_attempts"


class Backend(ABC):
    """Base class of every backend. Subclasses set :attr:`capabilities` and :attr:`name`."""

    name: str = "backend"
    """Short name used in logs and telemetry (``messaging.system``)."""

    @property
    @abstractmethod
    def capabilities(self) -> Capabilities:
        """The validated capability declaration."""

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Prepare the backend (connect, create schema). Idempotent."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what :meth:`open` acquired (never a host-owned pool or client)."""

    def classify_error(self, exc: BaseException) -> SettleKind | None:
        """Map a driver exception to a settle kind; ``None`` leaves it to the generic rules."""
        return None

    # Streams -----------------------------------------------------------------

    @abstractmethod
    async def create_stream(self, name: str, partitions: int) -> StreamInfo:
        """Create a stream, or return it when it exists with that partition count.

        Raises :class:`~rheo_flow.ConflictError` when it exists with another count
        (rule ``stream.lifecycle``).
        """

    @abstractmethod
    async def stream_info(self, name: str) -> StreamInfo:
        """Metadata of a stream; :class:`~rheo_flow.UnknownStream` when missing."""

    @abstractmethod
    async def list_streams(self) -> list[str]:
        """Names of every stream, sorted."""

    async def describe_streams(self) -> list[tuple[StreamInfo, list[GroupInfo]]]:
        """Every stream's info and groups, by name: what ``rheo-flow streams`` lists.

        This default asks stream by stream (a stream deleted meanwhile is left out);
        a backend overrides it to answer in a constant number of round trips.
        """
        out = []
        for name in await self.list_streams():
            try:
                out.append((await self.stream_info(name), await self.list_groups(name)))
            except UnknownStream:
                continue
        return out

    @abstractmethod
    async def append(self, stream: str, records: Sequence[AppendRecord]) -> list[Event]:
        """Append records atomically, one stored event per record, in order.

        A record whose id is already in the stream yields the stored event (no new
        sequence). Sequences are gapless per partition, starting at 1 (rules
        ``append.*``).
        """

    # Groups ------------------------------------------------------------------

    @abstractmethod
    async def create_group(
        self, stream: str, group: str, start: StartPosition, max_attempts: int | None,
        *, ordering: str = "none",
    ) -> GroupInfo:
        """Create a group starting at ``start``, or return the existing one.

        ``max_attempts`` (when given) updates an existing group's setting;
        ``start`` only applies at creation.

        ``ordering`` (``"key"`` or ``"none"``) is taken by a backend declaring
        ``capabilities.key_ordering``, applied at creation only (rules
        ``ordering.*``): it stores it with the group, reports it in
        :class:`GroupInfo`, raises :class:`~rheo_flow.InvalidArgument` when asked
        for ``"key"`` on a group that exists without it, and enforces it in its
        own :meth:`fetch`. The facade passes ``ordering`` only to a backend
        declaring the capability, and only when it is ``"key"``, so a backend
        that does not declare it may leave the keyword out of its signature.
        """

    @abstractmethod
    async def group_info(self, stream: str, group: str) -> GroupInfo:
        """A group's settings; :class:`~rheo_flow.UnknownGroup` when missing."""

    @abstractmethod
    async def list_groups(self, stream: str) -> list[GroupInfo]:
        """Every group of a stream, sorted by name."""

    async def pause_group(self, stream: str, group: str, until_ms: int | None) -> GroupInfo:
        """Pause a group until ``until_ms`` (ms since the epoch; ``None``: until resumed),
        replacing any pause it has; returns its info.

        While paused, :meth:`fetch` (and the fetch of :meth:`ack_and_fetch`) of the
        group returns nothing in every process sharing the store; leases already out
        still settle and renew (rule ``pause.fetch``). :class:`~rheo_flow.UnknownStream`
        / :class:`~rheo_flow.UnknownGroup` when missing. Declared by
        ``capabilities.pause``; this default raises :class:`~rheo_flow.Unsupported`.
        """
        raise Unsupported(self.name, "pause_group")

    async def resume_group(self, stream: str, group: str) -> GroupInfo:
        """End a group's pause (nothing changes when it is not paused) and wake the
        consumers waiting on its stream where wake-ups exist; returns its info (rule
        ``pause.resume``). Declared by ``capabilities.pause``."""
        raise Unsupported(self.name, "resume_group")

    # Leases ------------------------------------------------------------------

    @abstractmethod
    async def fetch(
        self,
        stream: str,
        group: str,
        consumer_id: str,
        limit: int,
        lease_ms: int,
        partitions: Sequence[int] | None,
    ) -> list[Lease]:
        """Claim up to ``limit`` eligible deliveries (``partitions=None``: all).

        The group exists (the facade creates it on first use). Rules ``fetch.*``,
        ``lease.*`` and ``attempts.max``.
        """

    @abstractmethod
    async def ack(self, leases: Sequence[Lease]) -> list[SettleResult]:
        """Mark deliveries acked; one result per lease, in order (rules ``settle.*``)."""

    @abstractmethod
    async def nack(self, leases: Sequence[Lease], reason: str, delay_ms: int,
                   error: str | None = None) -> list[SettleResult]:
        """Make deliveries available again after ``delay_ms``; one result per lease.

        ``error`` (when given) becomes the deliveries' last error. The facade passes
        it only to a backend declaring ``capabilities.last_error``; one that does not
        may leave it out of its signature (and its dead letters carry no error).
        """

    @abstractmethod
    async def reject(self, leases: Sequence[Lease], reason: str,
                     error: str | None = None) -> list[SettleResult]:
        """Dead-letter deliveries for their group; one result per lease.

        ``error`` (when given) becomes the deliveries' last error (see :meth:`nack`).
        """

    @abstractmethod
    async def renew(self, leases: Sequence[Lease], lease_ms: int) -> list[SettleResult]:
        """Extend leases to now + ``lease_ms``; results carry the new ``deadline_ms``."""

    async def append_in_transaction(self, connection: Any, stream: str,
                                    records: Sequence[AppendRecord]) -> list[Event]:
        """:meth:`append` on the application's ``connection``, inside the transaction it
        has open: the events become visible (to fetches, queries and wake-ups) when
        that transaction commits, and leave no trace when it rolls back, partition
        sequences included. An event id the stream holds returns the stored event
        without aborting the caller's transaction. A connection to another database,
        of a kind the backend does not take, or not in a transaction is an
        :class:`~rheo_flow.InvalidArgument`. Declared by ``capabilities.in_transaction``.
        """
        raise Unsupported(self.name, "append_in_transaction")

    async def ack_in_transaction(self, connection: Any, leases: Sequence[Lease]
                                 ) -> list[SettleResult]:
        """:meth:`ack` on the application's ``connection``, inside the transaction it has
        open: the acks (and the frontier moves they cause) commit or roll back with it.
        Declared by ``capabilities.in_transaction``; ``connection`` as for
        :meth:`append_in_transaction`."""
        raise Unsupported(self.name, "ack_in_transaction")

    max_event_bytes_ceiling: ClassVar[int | None] = None
    """The largest event data, as JSON in UTF-8 bytes, the engine can store when it is
    below the 64 MiB any instance allows (``None``: no lower engine limit). An
    instance's ``max_event_bytes`` may not exceed it."""

    one_call_ack_and_fetch: ClassVar[bool] = False
    """Whether :meth:`ack_and_fetch` is one round trip (runtimes then send a batch's
    acks with the next fetch whenever both wait; else only when the fetch waits for
    the room the acks free)."""

    async def ack_and_fetch(
        self,
        acks: Sequence[Lease],
        stream: str,
        group: str,
        consumer_id: str,
        limit: int,
        lease_ms: int,
        partitions: Sequence[int] | None,
    ) -> tuple[list[SettleResult], list[Lease]]:
        """:meth:`ack` ``acks``, then :meth:`fetch`: a consumer's last batch and its next.

        Runtimes call it when both are due at once. This default makes the two
        calls; a backend that can do both in one round trip overrides it. If it
        raises, the acks may or may not have taken effect (the caller acks again:
        an ack repeats as an ack).
        """
        results = await self.ack(acks) if acks else []
        return results, await self.fetch(stream, group, consumer_id, limit, lease_ms,
                                         partitions)

    # Progress ----------------------------------------------------------------

    async def scheduled(self, stream: str, after: Mapping[int, int]) -> dict[int, int]:
        """Per partition of ``after``, how many events past ``after[partition]`` are
        scheduled later than now (``deliver_at``, backend clock): what ``Rheo.scheduled``
        counts apart within a group's lag (rule ``delay.lag``).

        A backend declaring ``delayed_delivery`` overrides it; this default raises
        :class:`~rheo_flow.Unsupported`.
        """
        raise Unsupported(self.name, "scheduled")

    @abstractmethod
    async def frontier(self, stream: str, group: str) -> dict[int, int]:
        """Contiguous frontier per partition (rule ``frontier.contiguous``)."""

    async def frontiers(self, stream: str) -> dict[str, dict[int, int]]:
        """Every group's frontier per partition, by group name (what ``rheo-flow
        groups`` and ``lag`` show).

        This default asks group by group (a group deleted meanwhile is left out); a
        backend overrides it to answer in a constant number of round trips.
        """
        out = {}
        for info in await self.list_groups(stream):
            try:
                out[info.group] = await self.frontier(stream, info.group)
            except UnknownGroup:
                continue
        return out

    async def lag_report(self, streams: Sequence[str] | None) -> LagReport:
        """Every group of ``streams`` (``None``: every stream), per partition: high water,
        frontier, scheduled events, the oldest unsettled event's append time, and per
        group its dead letters and pause, at one reading of :meth:`now_ms` (rule
        ``lag.report``), in a bounded number of round trips however many streams
        there are (what a metrics scrape needs).

        This default raises :class:`~rheo_flow.Unsupported`: ``Rheo.lag_report`` then
        composes the report from the backend's other reads, a few round trips per
        group and partition.
        """
        raise Unsupported(self.name, "lag_report")

    @abstractmethod
    async def dead_letters(
        self, stream: str, group: str, limit: int, after: tuple[int, int] | None
    ) -> list[DeadLetter]:
        """Rejected deliveries ordered by (partition, sequence), after a position.

        Rules ``dead_letters.listing`` and ``dead_letters.rejected_at``.
        """

    @abstractmethod
    async def redrive(
        self, stream: str, group: str, positions: Sequence[tuple[int, int]] | None
    ) -> int:
        """Make rejected deliveries available again with attempt 0 (``None``: all).

        Returns how many were re-driven; anything not rejected is left alone
        (rule ``redrive.dead_letters_only``).
        """

    @abstractmethod
    async def replay(
        self, stream: str, group: str, from_sequence: int, partitions: Sequence[int]
    ) -> None:
        """Make every delivery with sequence >= ``from_sequence`` available again (attempt 0).

        Leases on them become stale; the frontier moves back to ``from_sequence - 1``
        (or stays lower). Events are not copied (rule ``replay.from_sequence``).
        """

    @abstractmethod
    async def reset(
        self, stream: str, group: str, to: StartPosition, partitions: Sequence[int]
    ) -> None:
        """Move the group so that exactly the events after ``to`` are still to deliver.

        Events up to ``to`` count as settled (the frontier becomes ``to``, capped at
        the high water); later ones become available with attempt 0; leases on the
        affected deliveries become stale; dead letters of those partitions are
        forgotten (rule ``reset.position``).
        """

    # Reads and retention -----------------------------------------------------

    @abstractmethod
    async def query(self, query: Query, limit: int, after: tuple[int, int] | None) -> list[Event]:
        """Up to ``limit`` matching events ordered by (partition, sequence), after a position."""

    @abstractmethod
    async def trim(self, stream: str, up_to: Mapping[int, int]) -> dict[int, int]:
        """Remove events with sequence <= ``up_to[p]`` per partition; returns counts removed.

        The facade has already capped ``up_to`` at every group's frontier unless forced.
        Sequences are never reused after a trim. Deliveries of removed events are
        dropped and count as settled: a group's frontier afterwards is the
        contiguous frontier counting them as settled, and their leases become
        stale (rule ``trim.removed``).
        """

    async def set_retention(self, stream: str, retention: Retention | None) -> None:
        """Store ``retention`` as the stream's policy (``None`` clears it): what
        ``StreamInfo.retention`` reports from then on (rule ``retention.settled``).
        :class:`~rheo_flow.UnknownStream` when missing. Declared by
        ``capabilities.retention``; this default raises :class:`~rheo_flow.Unsupported`.
        """
        raise Unsupported(self.name, "set_retention")

    async def now_ms(self) -> int:
        """The backend's clock in epoch milliseconds: the clock its appends are stamped
        with (what a retention's ``max_age`` is measured on). This default reads the
        system clock; a backend on a server's clock or an injected one overrides it."""
        return system_clock()

    # Deletion ----------------------------------------------------------------

    async def delete_stream(self, stream: str) -> None:
        """Remove a stream with every event, group, delivery and dead letter of it.

        :class:`~rheo_flow.UnknownStream` when missing. A stream created again with
        the same name afterwards starts fresh: sequence 1, no group. This default
        raises :class:`~rheo_flow.Unsupported`; every built-in backend overrides it.
        """
        raise Unsupported(self.name, "delete_stream")

    async def delete_group(self, stream: str, group: str) -> None:
        """Remove a group with its progress, deliveries and dead letters (not the events).

        :class:`~rheo_flow.UnknownStream` / :class:`~rheo_flow.UnknownGroup` when
        missing; leases of the group's deliveries no longer settle. This default
        raises :class:`~rheo_flow.Unsupported`; every built-in backend overrides it.
        """
        raise Unsupported(self.name, "delete_group")

    # Wake-ups ----------------------------------------------------------------

    async def wait_for_append(self, stream: str, timeout: float) -> bool:
        """Wait until something is appended to ``stream`` or ``timeout`` seconds pass.

        Returns True when woken by an append to ``stream`` (or when the push
        channel is lost; rule ``wakeup.own_stream``). Backends without push wake-ups
        (``capabilities.push_wakeups`` false) keep this default: it sleeps.
        """
        await asyncio.sleep(timeout)
        return False
