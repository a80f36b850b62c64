"""Client operation spans and metrics: ``send`` (append), ``poll`` (fetch) and settles.

Each function or context manager here returns at once (or yields ``None``) when
neither a tracer nor a meter is configured, so the facade pays one provider
check per call and nothing per event.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from time import perf_counter, time_ns
from types import TracebackType
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from .._model._settle_results import Decision, SettleKind, SettleResult, classify
from . import _names as n
from ._context import carrier, creation_context, links
from ._metrics import Instruments, instruments
from ._state import OFF, STATE, Off, tracer

if TYPE_CHECKING:
    from .._backend import AppendRecord, Backend
    from .._model._event import Event
    from .._model._lease import Lease

__all__ = ["Settling", "decision_for", "error_type_of", "follow_up", "receive", "send",
           "settling"]

log = logging.getLogger("rheo_flow.telemetry")

_FOLLOW_UP: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "rheo_flow_settle_follow_up", default=None)


def error_type_of(exc: BaseException, backend: Backend) -> str:
    """The ``error.type`` of an exception raised by a backend call: its classified kind,
    or ``cancelled`` when the call was cancelled."""
    if isinstance(exc, Exception):
        return classify(exc, backend.classify_error).kind.value
    return n.CANCELLED


def fail(span: Span, error_type: str, exc: BaseException | None = None,
         description: str | None = None) -> None:
    """Mark a span failed with ``error.type`` (and the exception as an event)."""
    span.set_attribute(n.ERROR_TYPE, error_type)
    if exc is not None:
        span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, description or error_type))


def common(values: set[str]) -> str:
    """The single value of a set of error types, or ``_OTHER``."""
    return next(iter(values)) if len(values) == 1 else n.OTHER


# Append ----------------------------------------------------------------------


async def send(backend: Backend, stream: str, records: list[AppendRecord]) -> list[Event]:
    """``backend.append`` inside a ``send`` span; injects creation contexts into headers."""
    tracer_ = tracer()
    bundle = instruments()
    if tracer_ is None and bundle is None:
        return await backend.append(stream, records)
    base: dict[str, Any] = {n.MESSAGING_SYSTEM: n.SYSTEM, n.DESTINATION: stream}
    first = records[0].partition
    if all(r.partition == first for r in records):
        base[n.PARTITION] = str(first)
    span = None
    token = None
    if tracer_ is not None:
        records, span = _start_send(tracer_, backend, stream, records, base)
        token = otel_context.attach(trace.set_span_in_context(span))
    started = perf_counter()
    error: str | None = None
    try:
        return await backend.append(stream, records)
    except BaseException as exc:
        error = error_type_of(exc, backend)
        if span is not None:
            fail(span, error, exc)
        raise
    finally:
        elapsed = perf_counter() - started
        if token is not None:
            otel_context.detach(token)
        if span is not None:
            span.end()
        if bundle is not None:
            attributes = {**base, n.OPERATION_NAME: n.SEND}
            if error is not None:
                attributes[n.ERROR_TYPE] = error
            bundle.sent.add(len(records), attributes)
            bundle.operation_duration.record(elapsed, {**attributes, n.OPERATION_TYPE: n.SEND})


def _start_send(
    tracer_: trace.Tracer, backend: Backend, stream: str, records: list[AppendRecord],
    base: Mapping[str, Any],
) -> tuple[list[AppendRecord], Span]:
    """Start the ``send`` span; return the records with their creation contexts injected.

    A record whose headers already carry a ``traceparent`` keeps it (a custom
    creation context); the send span links to it. With several records and
    create spans on, every other record gets a ``create`` span of its own
    (PRODUCER) whose context is injected and linked, and the send span is a
    CLIENT span; otherwise the send span's own context is injected and it is a
    PRODUCER span.
    """
    count = len(records)
    attributes: dict[str, Any] = {
        **base, n.OPERATION_TYPE: n.SEND, n.OPERATION_NAME: n.SEND, n.BACKEND: backend.name,
    }
    if count == 1:
        attributes[n.MESSAGE_ID] = records[0].id
    else:
        attributes[n.BATCH_COUNT] = count
    name = f"{n.SEND} {stream}"
    span_links: list[Link] = []
    out = list(records)
    if count > 1 and STATE.create_spans:
        create_name = f"{n.CREATE} {stream}"
        for i, record in enumerate(records):
            custom = creation_context(record.headers)
            if custom is not None:
                span_links.append(Link(custom, {n.MESSAGE_ID: record.id}))
                continue
            create = tracer_.start_span(create_name, kind=SpanKind.PRODUCER, attributes={
                n.MESSAGING_SYSTEM: n.SYSTEM, n.DESTINATION: stream,
                n.PARTITION: str(record.partition), n.OPERATION_TYPE: n.CREATE,
                n.OPERATION_NAME: n.CREATE, n.MESSAGE_ID: record.id, n.BACKEND: backend.name,
            })
            created = create.get_span_context()
            create.end()
            headers = carrier(created)
            if headers:
                out[i] = replace(record, headers={**record.headers, **headers})
                span_links.append(Link(created, {n.MESSAGE_ID: record.id}))
        return out, tracer_.start_span(name, kind=SpanKind.CLIENT, attributes=attributes,
                                       links=span_links)
    bare: list[int] = []
    for i, record in enumerate(records):
        custom = creation_context(record.headers)
        if custom is None:
            bare.append(i)
        else:
            span_links.append(Link(custom, {n.MESSAGE_ID: record.id}))
    kind = SpanKind.PRODUCER if bare else SpanKind.CLIENT
    span = tracer_.start_span(name, kind=kind, attributes=attributes, links=span_links)
    headers = carrier(span.get_span_context())
    if headers:
        for i in bare:
            record = records[i]
            out[i] = replace(record, headers={**record.headers, **headers})
    return out, span


# Fetch -----------------------------------------------------------------------


async def receive(
    backend: Backend, stream: str, group: str, consumer_id: str, limit: int, lease_ms: int,
    partitions: Sequence[int] | None, partition_count: int,
    fetch: Callable[..., Awaitable[list[Lease]]] | None = None,
) -> list[Lease]:
    """``backend.fetch`` (or ``fetch``, called with its arguments), reported as a ``poll``
    span (CLIENT) linked to each lease's event.

    The span is made once the fetch returned, with the time it started: a fetch
    that returns nothing makes no span (idle consumers poll all the time), only
    a duration point. So the links are known when the span starts, as samplers
    want; the cost is that spans the driver makes during the fetch are not
    children of the poll span.
    """
    tracer_ = tracer()
    bundle = instruments()
    call = backend.fetch if fetch is None else fetch
    if tracer_ is None and bundle is None:
        return await call(stream, group, consumer_id, limit, lease_ms, partitions)
    base: dict[str, Any] = {
        n.MESSAGING_SYSTEM: n.SYSTEM, n.DESTINATION: stream, n.CONSUMER_GROUP: group,
        n.OPERATION_NAME: n.POLL,
    }
    if partitions is not None and len(partitions) == 1:
        base[n.PARTITION] = str(partitions[0])
    elif partitions is None and partition_count == 1:
        base[n.PARTITION] = "0"
    started_ns = time_ns()
    started = perf_counter()
    error: str | None = None
    failure: BaseException | None = None
    leases: list[Lease] = []
    try:
        leases = await call(stream, group, consumer_id, limit, lease_ms, partitions)
        return leases
    except BaseException as exc:
        error = error_type_of(exc, backend)
        failure = exc
        raise
    finally:
        elapsed = perf_counter() - started
        if tracer_ is not None and (leases or failure is not None):
            span = tracer_.start_span(
                f"{n.POLL} {stream}", kind=SpanKind.CLIENT, start_time=started_ns,
                attributes={**base, n.OPERATION_TYPE: n.RECEIVE, n.CLIENT_ID: consumer_id,
                            n.BACKEND: backend.name, n.BATCH_COUNT: len(leases)},
                links=links(lease.event for lease in leases))
            if error is not None:
                fail(span, error, failure)
            span.end()
        if bundle is not None:
            attributes = dict(base)
            if error is not None:
                attributes[n.ERROR_TYPE] = error
            if leases:
                bundle.consumed.add(len(leases), attributes)
                bundle.fetch_size.record(len(leases), attributes)
            bundle.operation_duration.record(elapsed,
                                             {**attributes, n.OPERATION_TYPE: n.RECEIVE})


# Settle and renew ----------------------------------------------------------------


def decision_for(op: str, kind: SettleKind) -> Decision:
    """What the runtime does with a lease whose ``op`` failed with ``kind``.

    The decision table's, except that a failed nack is not nacked again and a
    failed renew is only retried on the next tick: both leave the lease to
    expire (``drop`` still means the lease is lost).
    """
    decision = kind.decision
    if decision is Decision.NACK and op in ("nack", "renew"):
        return Decision.EXPIRE
    return decision


def settling(
    op: str, leases: Sequence[Lease], backend: Backend, max_attempts: Mapping[tuple[str, str], int]
) -> Settling | Off:
    """A context manager around one settle (or renew) call; yields a :class:`Settling`
    to hand the results to, or ``None`` when telemetry is off.

    ``max_attempts`` maps (stream, group) to the group's last known setting: a
    nack that reaches it dead-letters the delivery.
    """
    tracer_ = tracer()
    bundle = instruments()
    if tracer_ is None and bundle is None:
        return OFF
    return Settling(tracer_, bundle, op, leases, backend, max_attempts)


class Settling:
    """The span and metrics of one ``ack`` / ``nack`` / ``reject`` / ``renew`` call."""

    __slots__ = ("_base", "_bundle", "_leases", "_max_attempts", "_op", "_results", "_span",
                 "_started", "_token")

    def __init__(
        self, tracer_: trace.Tracer | None, bundle: Instruments | None, op: str,
        leases: Sequence[Lease], backend: Backend, max_attempts: Mapping[tuple[str, str], int],
    ) -> None:
        self._op = op
        self._leases = leases
        self._bundle = bundle
        self._max_attempts = max_attempts
        self._results: list[SettleResult] | None = None
        self._token: object = None
        first = leases[0]
        stream, group, partition = first.stream, first.group, first.partition
        one_stream = one_group = one_partition = True
        for lease in leases:
            if lease.stream != stream:
                one_stream = one_partition = False
            if lease.group != group:
                one_group = False
            if lease.partition != partition:
                one_partition = False
        base: dict[str, Any] = {n.MESSAGING_SYSTEM: n.SYSTEM, n.OPERATION_NAME: op}
        if one_stream:
            base[n.DESTINATION] = stream
        if one_group:
            base[n.CONSUMER_GROUP] = group
        if one_partition:
            base[n.PARTITION] = str(partition)
        self._base = base
        self._span: Span | None = None
        if tracer_ is not None:
            attributes: dict[str, Any] = {**base, n.OPERATION_TYPE: n.SETTLE,
                                          n.BACKEND: backend.name}
            if len(leases) == 1:
                attributes[n.MESSAGE_ID] = first.event.id
            else:
                attributes[n.BATCH_COUNT] = len(leases)
            cause = _FOLLOW_UP.get()
            if cause is not None:
                attributes[n.SETTLE_FOLLOW_UP_OF] = cause
            name = f"{op} {stream}" if one_stream else op
            self._span = tracer_.start_span(name, kind=SpanKind.CLIENT, attributes=attributes)
        self._started = 0.0

    def __enter__(self) -> Settling:
        if self._span is not None:
            self._token = otel_context.attach(trace.set_span_in_context(self._span))
        self._started = perf_counter()
        return self

    def done(self, results: list[SettleResult]) -> None:
        """Record the classified results (one per lease, in order)."""
        self._results = results

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        elapsed = perf_counter() - self._started
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
        span = self._span
        bundle = self._bundle
        results = self._results
        error: str | None = None
        outcomes: dict[tuple[str, str | None, str | None], int] = {}
        if results is None:
            if exc is not None:
                error = n.OTHER if isinstance(exc, Exception) else n.CANCELLED
                if span is not None:
                    fail(span, error, exc)
        else:
            try:
                error = self._outcomes(results, outcomes)
            except Exception:  # telemetry must never break a settle
                log.exception("describing a %s of %d leases failed", self._op, len(results))
        if span is not None:
            span.end()
        if bundle is not None:
            attributes = dict(self._base)
            if error is not None:
                attributes[n.ERROR_TYPE] = error
            bundle.operation_duration.record(elapsed, {**attributes, n.OPERATION_TYPE: n.SETTLE})
            base = self._base
            for (outcome, kind, decision), count in outcomes.items():
                point = {**base, n.SETTLE_OUTCOME: outcome}
                if kind is not None and decision is not None:
                    point[n.ERROR_TYPE] = kind
                    point[n.SETTLE_DECISION] = decision
                bundle.settle_outcomes.add(count, point)

    def _outcomes(self, results: list[SettleResult],
                  outcomes: dict[tuple[str, str | None, str | None], int]) -> str | None:
        """Tally outcomes, describe failures on the span; returns the span's error type."""
        op = self._op
        span = self._span
        add_event = span.add_event if span is not None and span.is_recording() else None
        dead_letters = self._max_attempts if op == "nack" else None
        kinds: set[str] = set()
        decisions: set[str] = set()
        failed = repeated = dead = 0
        for lease, result in zip(self._leases, results, strict=False):
            err = result.error
            if err is None:
                if result.repeated:
                    repeated += 1
                    key: tuple[str, str | None, str | None] = (n.REPEATED, None, None)
                elif dead_letters is not None and lease.attempt >= dead_letters.get(
                        (lease.stream, lease.group), 1 << 62):
                    dead += 1
                    key = (n.DEAD_LETTERED, None, None)
                    if add_event is not None:
                        add_event(n.EVENT_DEAD_LETTER, _lease_attributes(lease, {
                            n.SETTLE_REASON: "max_attempts"}))
                else:
                    key = (n.SETTLED, None, None)
            else:
                failed += 1
                kind = err.kind.value
                decision = decision_for(op, err.kind).value
                kinds.add(kind)
                decisions.add(decision)
                key = (n.NOT_SETTLED, kind, decision)
                if add_event is not None:
                    add_event(n.EVENT_SETTLE_FAILURE, _lease_attributes(lease, {
                        n.ERROR_TYPE: kind, n.SETTLE_DECISION: decision,
                        n.SETTLE_REASON: err.reason}))
            outcomes[key] = outcomes.get(key, 0) + 1
        if span is not None and add_event is not None:
            if repeated:
                span.set_attribute(n.SETTLE_REPEATED, repeated)
            if dead:
                span.set_attribute(n.SETTLE_DEAD_LETTERED, dead)
        if not failed:
            return None
        error = common(kinds)
        if span is not None and add_event is not None:
            span.set_attribute(n.SETTLE_FAILED, failed)
            if len(decisions) == 1:
                span.set_attribute(n.SETTLE_DECISION, next(iter(decisions)))
            fail(span, error, description=(
                f"{failed} of {len(results)} leases not settled: " + ", ".join(sorted(kinds))))
        return error


def _lease_attributes(lease: Lease, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        n.MESSAGE_ID: lease.event.id,
        n.PARTITION: str(lease.partition),
        n.EVENT_SEQUENCE: lease.sequence,
        n.ATTEMPT: lease.attempt,
        **extra,
    }


@contextmanager
def follow_up(op: str) -> Iterator[None]:
    """Mark settles made inside as the runtime's follow-up of a failed ``op``."""
    token = _FOLLOW_UP.set(op)
    try:
        yield
    finally:
        _FOLLOW_UP.reset(token)
