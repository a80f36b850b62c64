"""The :class:`Rheo` facade: one instance over one backend."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

from ._backend import Backend
from ._backends._urls import backend_from_url, split_url_option
from ._facade._delay import scheduled_counts, undelayed
from ._facade._groups import create_group_checked
from ._facade._in_transaction import ack_in_transaction, open_in_transaction
from ._facade._lag import composed_lag_report
from ._facade._pause import pause_group, resume_group
from ._facade._positions import replay_at, reset_at
from ._facade._reads import check_query_fields, dead_letter_positions, page_of
from ._facade._retention import apply_retention, check_retention, store_retention, trim_bounds
from ._facade._transaction import Transaction
from ._model._append_records import DEFAULT_MAX_EVENT_BYTES, append_records, check_max_event_bytes
from ._model._capabilities import Capabilities
from ._model._errors import InvalidArgument, Unsupported
from ._model._event import Event, NewEvent
from ._model._lag import LagReport
from ._model._lease import Lease
from ._model._query import Page, Query, decode_cursor
from ._model._settle_results import SettleResult, classify
from ._model._stream import DeadLetter, GroupInfo, Retention, StartPosition, StreamInfo
from ._model._validation import (
    MAX_APPEND,
    MAX_PARTITIONS,
    check_duration_ms,
    check_error,
    check_key,
    check_lease_ms,
    check_name,
    check_ordering,
    check_partition,
    check_positive_int,
    check_reason,
    check_sequence,
    check_start,
    check_timeout_s,
    invalid_text,
)
from ._support._lazy import LazyModule

if TYPE_CHECKING:
    from . import _telemetry
else:  # OpenTelemetry's API loads with the first append, fetch or settle, not with Rheo
    _telemetry = LazyModule("rheo_flow._telemetry", globals(), "_telemetry")

__all__ = ["Partitions", "Rheo"]

Partitions = Literal["all"] | Sequence[int]
"""``"all"`` or a list of partition ids."""

MAX_FETCH = 10_000
DEFAULT_LEASE_MS = 30_000


class Rheo:
    """One rheo_flow instance over one backend; use it as an async context manager.

    ``backend`` is a URL (``memory://``, ``sqlite:///events.db``,
    ``postgresql://...``, ``redis://...``, ``mongodb://...``) or a backend object
    the host built around its own connection pool or client. A backend built by
    the host is not closed by :meth:`close` beyond what the backend itself owns.

    Every operation validates its input first: bad input raises
    :class:`~rheo_flow.InvalidArgument` and changes nothing.

    ``max_event_bytes`` bounds one event's data, as compact JSON in UTF-8 bytes
    (default 1 MiB; at most 64 MiB, and 4 MiB on MongoDB); an append holding a
    larger event is refused before anything is written. A URL may set it too:
    ``sqlite:///events.db?max_event_bytes=10485760``.
    """

    def __init__(self, backend: Backend | str = "memory://", *,
                 max_event_bytes: int | None = None) -> None:
        requested: object = max_event_bytes
        if isinstance(backend, str):
            url, from_url = split_url_option(backend, "max_event_bytes")
            requested = from_url if requested is None else requested
            backend = backend_from_url(url)
        if not isinstance(backend, Backend):
            raise InvalidArgument("backend must be a URL or a Backend, not "
                                  + type(backend).__name__)
        ceiling = backend.max_event_bytes_ceiling
        self._max_event_bytes = check_max_event_bytes(
            min(DEFAULT_MAX_EVENT_BYTES, ceiling or DEFAULT_MAX_EVENT_BYTES)
            if requested is None else requested, ceiling)
        self._backend = backend
        self._opened = False
        self._instance_id = uuid.uuid4().hex[:8]
        self._partitions_cache: dict[str, int] = {}
        self._known_groups: set[tuple[str, str]] = set()
        self._max_attempts: dict[tuple[str, str], int] = {}
        """Each known group's last seen max_attempts (telemetry tells dead letters by it)."""

    @property
    def max_event_bytes(self) -> int:
        """The bound on one event's data, as compact JSON in UTF-8 bytes."""
        return self._max_event_bytes

    # Lifecycle ---------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        """The backend this instance talks to."""
        return self._backend

    @property
    def capabilities(self) -> Capabilities:
        """The backend's validated capabilities."""
        return self._backend.capabilities

    @property
    def instance_id(self) -> str:
        """A short random id of this instance (part of generated consumer ids)."""
        return self._instance_id

    async def open(self) -> Self:
        """Open the backend (idempotent)."""
        if not self._opened:
            await self._backend.open()
            self._opened = True
        return self

    async def close(self) -> None:
        """Close what the backend owns (idempotent).

        Also after operations that opened the backend on first use without
        :meth:`open`: the connections they made are closed too.
        """
        self._opened = False
        await self._backend.close()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def new_consumer_id(self) -> str:
        """A consumer id unique to this process and instance."""
        host = socket.gethostname().split(".")[0] or "host"
        safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in host)[:40]
        return f"{safe}-{os.getpid()}-{self._instance_id}-{uuid.uuid4().hex[:6]}"

    # Streams -----------------------------------------------------------------

    async def create_stream(self, name: str, *, partitions: int = 1,
                            retention: Retention | None = None) -> StreamInfo:
        """Create a stream (idempotent); another partition count is a ConflictError.
        ``retention`` (when given) becomes its policy, an existing stream's too."""
        check_name("stream", name)
        check_positive_int("partitions", partitions, maximum=MAX_PARTITIONS)
        policy = check_retention(self._backend, retention)
        info = await self._backend.create_stream(name, partitions)
        if policy is not None and info.retention != policy:
            info = await store_retention(self._backend, name, policy)
        self._partitions_cache[name] = info.partitions
        return info

    async def set_retention(self, stream: str, retention: Retention | None) -> StreamInfo:
        """Make ``retention`` the stream's policy (``None`` clears it); see
        :meth:`apply_retention`. Returns the stream's info."""
        check_name("stream", stream)
        return await store_retention(self._backend, stream, check_retention(
            self._backend, retention))

    async def stream_info(self, name: str) -> StreamInfo:
        """A stream's metadata (partitions, high and low water marks)."""
        check_name("stream", name)
        info = await self._backend.stream_info(name)
        self._partitions_cache[name] = info.partitions
        return info

    async def streams(self) -> list[str]:
        """Every stream's name."""
        return await self._backend.list_streams()

    async def describe_streams(self) -> list[tuple[StreamInfo, list[GroupInfo]]]:
        """Every stream's :class:`StreamInfo` with its groups, by stream name, in a
        constant number of round trips where the backend can (what ``rheo-flow
        streams`` lists)."""
        return await self._backend.describe_streams()

    async def _partition_count(self, stream: str) -> int:
        check_name("stream", stream)
        count = self._partitions_cache.get(stream)
        if count is None:
            count = (await self.stream_info(stream)).partitions
        return count

    async def append(self, stream: str,
                     events: NewEvent | Mapping[str, Any] | Iterable[NewEvent | Mapping[str, Any]],
                     *, key: str | None = None, partition: int | None = None,
                     connection: Any = None) -> list[Event]:
        """Append one or many events atomically; returns the stored events in order.

        ``key`` and ``partition`` apply to every event that sets neither. An event
        whose id is already in the stream is returned as stored (no new sequence).
        Events may be :class:`NewEvent` objects or mappings with the same fields.

        ``connection``: the application's connection (or SQLAlchemy connection or session),
        in a transaction it opened (docs/outbox.md): visible at its commit, gone on rollback.
        """
        if connection is not None:
            connection = await open_in_transaction(self._backend, "append", connection)
        count = await self._partition_count(stream)
        items = [events] if isinstance(events, NewEvent | Mapping) else list(events)
        if not items:
            return []
        if len(items) > MAX_APPEND:
            raise InvalidArgument(f"at most {MAX_APPEND} events per append, got {len(items)}")
        check_key(key)
        if partition is not None:
            check_partition(partition, count)
        try:
            records = append_records(items, count, key, partition, self._max_event_bytes,
                                     undelayed(self._backend))
            if connection is not None:
                return await self._backend.append_in_transaction(connection, stream, records)
            return await _telemetry.send(self._backend, stream, records)
        except Exception as exc:
            # A lone surrogate in a type, id, key or header is left to the encoders
            # (routing hash, driver) to meet: no per-event check on this hot path.
            error = invalid_text(exc)
            if error is None or isinstance(exc, InvalidArgument):
                raise
            # exc is the encoder's error or the backend's translation of it, whose
            # driver cause is already masked (_backends/_guard.py): safe to keep.
            raise error from exc

    # Groups ------------------------------------------------------------------

    async def create_group(self, stream: str, group: str, *, start: StartPosition = "earliest",
                           max_attempts: int | None = None,
                           ordering: Literal["none", "key"] = "none") -> GroupInfo:
        """Create a consumer group (idempotent).

        ``start`` (``"earliest"``, ``"latest"`` or a sequence) applies at creation
        only; ``max_attempts`` updates an existing group. ``ordering`` is fixed at
        creation: ``"key"`` leases a delivery only once every earlier delivery of
        its key in its partition is settled (docs/ordering.md; the backend must
        declare ``key_ordering``). Asking an existing group for another ordering
        raises :class:`~rheo_flow.InvalidArgument`.
        """
        return await self._create_group(stream, group, start, max_attempts,
                                        check_ordering(ordering))

    async def _create_group(self, stream: str, group: str, start: StartPosition,
                            max_attempts: int | None, ordering: str | None) -> GroupInfo:
        """:meth:`create_group`; ``ordering=None``: an existing group's, whatever it is."""
        info = await create_group_checked(self._backend, stream, group, start, max_attempts,
                                          ordering)
        self._known_groups.add((stream, group))
        self._max_attempts[(stream, group)] = info.max_attempts
        return info

    async def _ensure_group(self, stream: str, group: str, *, max_attempts: int | None = None,
                            ordering: str | None = None) -> GroupInfo:
        """Create a group at ``"earliest"`` unless it exists (what the runtimes do on start).

        ``max_attempts`` (when given) updates it; ``ordering`` (when given) applies at
        creation and must match an existing group's (``None``: whatever it has).
        """
        return await self._create_group(stream, group, "earliest", max_attempts,
                                        None if ordering is None else check_ordering(ordering))

    async def groups(self, stream: str) -> list[GroupInfo]:
        """Every group of a stream."""
        check_name("stream", stream)
        return await self._backend.list_groups(stream)

    async def group_info(self, stream: str, group: str) -> GroupInfo:
        """A group's settings."""
        check_name("stream", stream)
        check_name("group", group)
        info = await self._backend.group_info(stream, group)
        self._max_attempts[(stream, group)] = info.max_attempts
        return info

    async def pause_group(self, stream: str, group: str, *,
                          until: datetime | None = None) -> GroupInfo:
        """Pause a group: its fetches return nothing, in every process, until :meth:`resume_group`
        or ``until`` (an aware datetime in the future; ``None``: until resumed). Leases out
        still settle and renew; pausing again replaces the end (``capabilities.pause``)."""
        return await pause_group(self._backend, stream, group, until)

    async def resume_group(self, stream: str, group: str) -> GroupInfo:
        """End a group's pause and wake its waiting consumers (nothing when not paused)."""
        return await resume_group(self._backend, stream, group)

    # Leases ------------------------------------------------------------------

    async def fetch(self, stream: str, group: str, *, consumer_id: str | None = None,
                    limit: int = 10, lease_ms: int = DEFAULT_LEASE_MS,
                    partitions: Partitions = "all") -> list[Lease]:
        """Claim up to ``limit`` deliveries for ``group``; creates the group on first use."""
        count = await self._partition_count(stream)
        check_name("group", group)
        consumer = check_name("consumer", consumer_id) if consumer_id is not None else (
            self.new_consumer_id())
        check_positive_int("limit", limit, maximum=MAX_FETCH)
        check_lease_ms(lease_ms)
        selected = self._partitions(partitions, count)
        if (stream, group) not in self._known_groups:
            await self._create_group(stream, group, "earliest", None, None)
        return await _telemetry.receive(self._backend, stream, group, consumer, limit, lease_ms,
                                        selected, count)

    def _partitions(self, partitions: Partitions, count: int) -> list[int] | None:
        if partitions == "all":
            return None
        if isinstance(partitions, str) or not isinstance(partitions, Sequence):
            raise InvalidArgument(f'partitions must be "all" or a list of ids, got {partitions!r}')
        return sorted({check_partition(p, count) for p in partitions})

    def _all_or(self, partitions: Partitions, count: int) -> list[int]:
        selected = self._partitions(partitions, count)
        return list(range(count)) if selected is None else selected

    @staticmethod
    def _leases(leases: Lease | Iterable[Lease]) -> list[Lease]:
        items = [leases] if isinstance(leases, Lease) else list(leases)
        # One type check per lease is all the facade does: a lease's fields are
        # the backend's to judge (a lease naming nothing of it settles `invalid`).
        for lease in items:
            if lease.__class__ is not Lease and not isinstance(lease, Lease):
                raise InvalidArgument(f"expected Lease objects, got {type(lease).__name__}")
        return items

    async def _settle_call(self, op: str, leases: list[Lease],
                           call: Callable[[], Awaitable[list[SettleResult]]]
                           ) -> list[SettleResult]:
        if not leases:
            return []
        with _telemetry.settling(op, leases, self._backend, self._max_attempts) as telemetry:
            try:
                results = await call()
            except Exception as exc:  # classified, never leaked (docs/concepts.md, "Settling")
                error = classify(exc, self._backend.classify_error)
                results = [SettleResult(lease.lease_id, error) for lease in leases]
            if telemetry is not None:
                telemetry.done(results)
        return results

    async def ack(self, leases: Lease | Iterable[Lease], *, connection: Any = None
                  ) -> list[SettleResult]:
        """Acknowledge leases; one classified result per lease, in order.

        ``connection``: as for :meth:`append` (check the results before committing: a
        stale lease's ack took no effect); a refused connection raises InvalidArgument.
        """
        items = self._leases(leases)
        if connection is not None:
            return await ack_in_transaction(self._backend, self._settle_call, items,
                                            connection)
        return await self._settle_call("ack", items, lambda: self._backend.ack(items))

    def transaction(self, connection: Any, leases: Lease | Iterable[Lease] = ()
                    ) -> Transaction:
        """Read, process, write exactly once (docs/outbox.md): ``async with
        rheo.transaction(conn, leases) as tx:`` commits the acks of ``leases``, the block's
        writes on ``conn`` and ``tx.append``'s events together; a stale lease rolls it all
        back and raises :class:`~rheo_flow.StaleLease`."""
        return Transaction(self, connection, leases)

    async def nack(self, leases: Lease | Iterable[Lease], reason: str, *, delay_ms: int = 0,
                   error: str | None = None) -> list[SettleResult]:
        """Return leases for redelivery (after ``delay_ms``); one result per lease.

        ``error`` (at most 1,000 characters, e.g. ``"TimeoutError: db busy"``) is
        recorded as the deliveries' last error: a dead letter keeps it even when it
        runs out of attempts later.
        """
        items = self._leases(leases)
        check_reason(reason)
        check_duration_ms("delay_ms", delay_ms)
        error = check_error(error)
        backend = self._backend
        if error is None or not backend.capabilities.last_error:
            return await self._settle_call(
                "nack", items, lambda: backend.nack(items, reason, delay_ms))
        return await self._settle_call(
            "nack", items, lambda: backend.nack(items, reason, delay_ms, error))

    async def reject(self, leases: Lease | Iterable[Lease], reason: str, *,
                     error: str | None = None) -> list[SettleResult]:
        """Dead-letter leases for their group; one result per lease. ``error`` is recorded
        as the dead letters' last error (see :meth:`nack`)."""
        items = self._leases(leases)
        check_reason(reason)
        error = check_error(error)
        backend = self._backend
        if error is None or not backend.capabilities.last_error:
            return await self._settle_call("reject", items, lambda: backend.reject(items, reason))
        return await self._settle_call("reject", items,
                                       lambda: backend.reject(items, reason, error))

    async def renew(self, leases: Lease | Iterable[Lease], *, lease_ms: int = DEFAULT_LEASE_MS
                    ) -> list[SettleResult]:
        """Extend leases to now + ``lease_ms``; results carry the new deadline."""
        items = self._leases(leases)
        check_lease_ms(lease_ms)
        return await self._settle_call(
            "renew", items, lambda: self._backend.renew(items, lease_ms))

    # Progress ----------------------------------------------------------------

    async def frontier(self, stream: str, group: str) -> dict[int, int]:
        """Contiguous frontier per partition (every delivery up to it is settled)."""
        check_name("stream", stream)
        check_name("group", group)
        return await self._backend.frontier(stream, group)

    async def frontiers(self, stream: str) -> dict[str, dict[int, int]]:
        """Every group's frontier per partition, by group name, in a constant number of
        round trips where the backend can."""
        check_name("stream", stream)
        return await self._backend.frontiers(stream)

    async def high_water(self, stream: str) -> dict[int, int]:
        """Highest appended sequence per partition."""
        return dict((await self.stream_info(stream)).high_water)

    async def lag(self, stream: str, group: str) -> dict[int, int]:
        """``high_water - frontier`` per partition."""
        frontier = await self.frontier(stream, group)
        high = await self.high_water(stream)
        return {p: max(0, high[p] - frontier.get(p, 0)) for p in high}

    async def lag_report(self, streams: Sequence[str] | None = None) -> LagReport:
        """Lag, scheduled events, oldest unsettled event, dead letters and pause of every
        group of ``streams`` (default: every stream), read from the store in one go."""
        if isinstance(streams, str):
            raise InvalidArgument(f"streams must be a list of names, got the string {streams!r}")
        if streams is not None:
            streams = [check_name("stream", name) for name in streams]
        try:
            return await self._backend.lag_report(streams)
        except Unsupported:
            return await composed_lag_report(self._backend, streams)

    async def scheduled(self, stream: str, group: str) -> dict[int, int]:
        """Per partition, how many events of :meth:`lag` wait for their ``deliver_at``."""
        return await scheduled_counts(self._backend, stream, await self.frontier(stream, group),
                                      await self.high_water(stream))

    async def dead_letters(self, stream: str, group: str, *, limit: int = 100,
                           after: DeadLetter | None = None) -> list[DeadLetter]:
        """Rejected deliveries of a group, by (partition, sequence), after ``after``."""
        check_name("stream", stream)
        check_name("group", group)
        check_positive_int("limit", limit, maximum=MAX_FETCH)
        position = None if after is None else (
            check_sequence("after.partition", after.partition),
            check_sequence("after.sequence", after.sequence))
        return await self._backend.dead_letters(stream, group, limit, position)

    async def redrive(self, stream: str, group: str,
                      dead_letters: Iterable[DeadLetter] | None = None) -> int:
        """Make dead letters deliverable again (all when none are given); returns the count."""
        check_name("stream", stream)
        check_name("group", group)
        positions = dead_letter_positions(stream, group, dead_letters)
        return await self._backend.redrive(stream, group, positions)

    async def replay(self, stream: str, group: str, *, from_sequence: int = 1,
                     from_time: datetime | None = None, partitions: Partitions = "all") -> None:
        """Re-deliver every event from ``from_sequence`` on, without copying events; with
        ``from_time``, from each partition's first event appended at or after it."""
        count = await self._partition_count(stream)
        check_name("group", group)
        check_sequence("from_sequence", from_sequence, minimum=1)
        selected = self._all_or(partitions, count)
        if from_time is not None:
            if from_sequence != 1:
                raise InvalidArgument("replay takes from_sequence or from_time, not both")
            return await replay_at(self._backend, stream, group, from_time, selected)
        await self._backend.group_info(stream, group)
        await self._backend.replay(stream, group, from_sequence, selected)

    async def reset(self, stream: str, group: str, *, to: StartPosition | datetime = "earliest",
                    partitions: Partitions = "all") -> None:
        """Move a group to the earliest event, past the latest, past a sequence, or (``to``
        a datetime) past the events each partition had appended before that time."""
        count = await self._partition_count(stream)
        check_name("group", group)
        selected = self._all_or(partitions, count)
        if isinstance(to, datetime):
            return await reset_at(self._backend, stream, group, to, selected)
        check_start("to", to)
        await self._backend.group_info(stream, group)
        await self._backend.reset(stream, group, to, selected)

    # Reads and retention -----------------------------------------------------

    async def query_page(self, query: Query, *, limit: int = 100, cursor: str | None = None
                         ) -> Page:
        """One page of events matching ``query``; pass ``page.cursor`` for the next."""
        if not isinstance(query, Query):
            raise InvalidArgument(f"expected a Query, got {type(query).__name__}")
        count = await self._partition_count(query.stream)
        check_positive_int("limit", limit, maximum=MAX_FETCH)
        if query.partitions is not None:
            self._partitions(query.partitions, count)
        check_query_fields(query)
        after = None if cursor is None else decode_cursor(cursor)
        return page_of(await self._backend.query(query, limit + 1, after), limit)

    async def stream_query(self, query: Query, *, page_size: int = 500) -> AsyncIterator[Event]:
        """Every event matching ``query``, fetched page by page."""
        cursor: str | None = None
        while True:
            page = await self.query_page(query, limit=page_size, cursor=cursor)
            for event in page.events:
                yield event
            if page.cursor is None:
                return
            cursor = page.cursor

    async def trim(self, stream: str, *, up_to: int | Mapping[int, int] | None = None,
                   force: bool = False) -> dict[int, int]:
        """Remove old events; returns how many were removed per partition.

        ``up_to`` is an inclusive sequence (for every partition, or per partition);
        ``None`` means as far as every group has settled. Unless ``force`` is true,
        the bound is capped at the lowest frontier of the stream's groups, so no
        event a group has not settled is removed.
        """
        count = await self._partition_count(stream)
        bounds = await trim_bounds(self._backend, stream, count, up_to, force)
        return await self._backend.trim(stream, bounds)

    async def apply_retention(self, stream: str, retention: Retention | None = None, *,
                              force: bool = False) -> dict[int, int]:
        """Trim as ``retention`` says (default: the stream's stored policy; none removes
        nothing): only events every group has settled unless ``force``. Returns how many
        events were removed per partition (docs/contract.md, ``retention.settled``)."""
        check_name("stream", stream)
        return await apply_retention(self._backend, stream, retention, force)

    async def delete_stream(self, stream: str) -> None:
        """Remove a stream and everything of it: events, groups, deliveries, dead letters.

        Irreversible. Stop the stream's producers and consumers first: what they do
        meanwhile is undefined. A stream created again with the same name starts
        fresh (sequence 1, no group). :class:`~rheo_flow.UnknownStream` when missing.
        """
        check_name("stream", stream)
        await self._backend.delete_stream(stream)
        self._forget(stream)

    async def delete_group(self, stream: str, group: str) -> None:
        """Remove a consumer group: its progress, deliveries and dead letters.

        The stream's events and other groups stay. Leases the group handed out no
        longer settle; a group created again with the same name starts afresh from
        its start position. :class:`~rheo_flow.UnknownGroup` when missing.
        """
        check_name("stream", stream)
        check_name("group", group)
        await self._backend.delete_group(stream, group)
        self._forget(stream, group)

    def _forget(self, stream: str, group: str | None = None) -> None:
        """Drop what this instance remembers of a deleted stream or group."""
        if group is None:
            self._partitions_cache.pop(stream, None)
        for known in [k for k in self._known_groups | self._max_attempts.keys()
                      if k[0] == stream and (group is None or k[1] == group)]:
            self._known_groups.discard(known)
            self._max_attempts.pop(known, None)

    async def wait_for_append(self, stream: str, timeout: float) -> bool:
        """Wait for an append (push wake-ups) or ``timeout`` seconds; True when woken."""
        check_name("stream", stream)
        timeout = check_timeout_s("timeout", timeout)
        return await self._backend.wait_for_append(stream, timeout)

