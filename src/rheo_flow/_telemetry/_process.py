"""Process spans: one per handled event in consumer groups, one per batch in pipelines.

Process spans are CONSUMER spans linked to the creation context of every event
they handle (a link per message, carrying ``messaging.message.id``). They are
children of the current context, which the runtimes detach from whatever was
current when they started (:func:`detached`), so in practice they start new
traces; the handler runs with the process span current, so spans it opens
are its children.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from time import perf_counter
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind

from . import _names as n
from ._client import common, fail
from ._context import link, links
from ._metrics import Instruments, instruments
from ._state import OFF, Off, tracer

if TYPE_CHECKING:
    from .._model._lease import Lease

__all__ = ["EventProcessing", "MessagesProcessing", "StepBatch", "StepMessage", "detached",
           "process_event",
           "process_messages"]

log = logging.getLogger("rheo_flow.telemetry")

_PROCESS_NAME_CATEGORIES = frozenset({n.HANDLER_ERROR, n.BATCH_ERROR, n.INVALID_OUTCOME,
                                      n.INVALID_PAYLOAD})


@contextmanager
def detached() -> Iterator[None]:
    """Run the block (typically: creating a runtime's tasks) with an empty OpenTelemetry
    context, so that long-lived tasks do not inherit the span that started them."""
    token = otel_context.attach(otel_context.Context())
    try:
        yield
    finally:
        otel_context.detach(token)


class _Step:
    """A started process span (or just a timer, when only metrics are on)."""

    __slots__ = ("_base", "_bundle", "_span", "_started", "_token")

    def __init__(self, bundle: Instruments | None, base: dict[str, Any]) -> None:
        self._bundle = bundle
        self._base = base
        self._span: Span | None = None
        self._token: object = None
        self._started = 0.0

    def _start(self, tracer_: trace.Tracer | None, stream: str, attributes: dict[str, Any],
               span_links: Sequence[Link]) -> None:
        if tracer_ is not None:
            self._span = tracer_.start_span(f"{n.PROCESS} {stream}", kind=SpanKind.CONSUMER,
                                            attributes=attributes, links=span_links)
            self._token = otel_context.attach(trace.set_span_in_context(self._span))
        self._started = perf_counter()

    def _finish(self, error: str | None, exc: BaseException | None = None) -> None:
        elapsed = perf_counter() - self._started
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._token = None
        span = self._span
        if span is not None:
            if error is not None:
                fail(span, error, exc)
            span.end()
        if self._bundle is not None:
            attributes = {**self._base, n.OPERATION_TYPE: n.PROCESS}
            if error is not None:
                attributes[n.ERROR_TYPE] = error
            self._bundle.process_duration.record(elapsed, attributes)


# Consumer groups: one span per event --------------------------------------------


def process_event(lease: Lease, consumer_id: str) -> EventProcessing | Off:
    """A context manager around one handler call of a consumer group; yields an
    :class:`EventProcessing` to report the outcome to, or ``None`` when telemetry is off."""
    tracer_ = tracer()
    bundle = instruments()
    if tracer_ is None and bundle is None:
        return OFF
    return EventProcessing(tracer_, bundle, lease, consumer_id)


class EventProcessing(_Step):
    """The ``process`` span of one event handled by a consumer group."""

    __slots__ = ("_consumer_id", "_error", "_lease", "_outcome", "_tracer")

    def __init__(self, tracer_: trace.Tracer | None, bundle: Instruments | None, lease: Lease,
                 consumer_id: str) -> None:
        event = lease.event
        super().__init__(bundle, {
            n.MESSAGING_SYSTEM: n.SYSTEM, n.OPERATION_NAME: n.PROCESS,
            n.DESTINATION: event.stream, n.CONSUMER_GROUP: lease.group,
            n.PARTITION: str(event.partition),
        })
        self._tracer = tracer_
        self._lease = lease
        self._consumer_id = consumer_id
        self._outcome: str | None = None
        self._error: BaseException | None = None

    def __enter__(self) -> EventProcessing:
        lease = self._lease
        event = lease.event
        span_links: list[Link] = []
        attributes: dict[str, Any] = {}
        if self._tracer is not None:
            creation = link(event)
            if creation is not None:
                span_links.append(creation)
            attributes = {
                **self._base, n.OPERATION_TYPE: n.PROCESS, n.MESSAGE_ID: event.id,
                n.CLIENT_ID: self._consumer_id, n.EVENT_SEQUENCE: event.sequence,
                n.EVENT_TYPE: event.type, n.ATTEMPT: lease.attempt,
            }
        self._start(self._tracer, event.stream, attributes, span_links)
        return self

    def outcome(self, category: str, error: BaseException | None = None) -> None:
        """What the runtime made of the handler's result: ``ack``, ``retry``, ``reject``,
        ``handler_error``, ``invalid_outcome``, ``invalid_payload`` or ``settled`` (and the
        exception it raised)."""
        self._outcome = category
        self._error = error

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        outcome = self._outcome
        error_exc = self._error
        if exc is not None:
            outcome = n.CANCELLED if not isinstance(exc, Exception) else n.HANDLER_ERROR
            error_exc = exc
        error = outcome if outcome in (n.HANDLER_ERROR, n.INVALID_OUTCOME, n.INVALID_PAYLOAD,
                                       n.CANCELLED) else None
        if self._span is not None and outcome is not None:
            self._span.set_attribute(n.PROCESS_OUTCOME, outcome)
        self._finish(error, error_exc)


# Pipelines: one span per processor chunk and per batch ---------------------------


class StepMessage(Protocol):
    """What a pipeline step's span reads of a message (a pipeline ``Message``: the
    telemetry layer sits below the pipeline and names none of its classes)."""

    @property
    def lease(self) -> Lease:
        """The message's lease."""

    @property
    def status(self) -> str:
        """``ok`` or a failure status."""

    @property
    def reason(self) -> str | None:
        """Why the message failed, if it did."""


class StepBatch(Protocol):
    """What a batch step's span reads of the batch (a pipeline ``BatchInfo``)."""

    @property
    def trigger(self) -> str:
        """Why the batch was emitted."""



def process_messages(
    messages: Sequence[StepMessage], stage: str, stage_name: str,
    info: StepBatch | None = None
) -> MessagesProcessing | Off:
    """A context manager around one pipeline step over ``messages`` (a processor's chunk
    or a batcher's batch); failures are read from the messages' status at exit."""
    if not messages:
        return OFF
    tracer_ = tracer()
    bundle = instruments()
    if tracer_ is None and bundle is None:
        return OFF
    return MessagesProcessing(tracer_, bundle, messages, stage, stage_name, info)


class MessagesProcessing(_Step):
    """The ``process`` span of a pipeline step over a batch of messages."""

    __slots__ = ("_info", "_messages", "_stage", "_stage_name", "_tracer")

    def __init__(self, tracer_: trace.Tracer | None, bundle: Instruments | None,
                 messages: Sequence[StepMessage], stage: str, stage_name: str,
                 info: StepBatch | None) -> None:
        first = messages[0].lease
        stream, group, partition = first.stream, first.group, first.partition
        one_partition = all(m.lease.partition == partition for m in messages)
        base: dict[str, Any] = {
            n.MESSAGING_SYSTEM: n.SYSTEM, n.OPERATION_NAME: n.PROCESS,
            n.DESTINATION: stream, n.CONSUMER_GROUP: group,
        }
        if one_partition:
            base[n.PARTITION] = str(partition)
        super().__init__(bundle, base)
        self._tracer = tracer_
        self._messages = messages
        self._stage = stage
        self._stage_name = stage_name
        self._info = info

    def __enter__(self) -> MessagesProcessing:
        messages = self._messages
        attributes: dict[str, Any] = {}
        span_links: list[Link] = []
        if self._tracer is not None:
            attributes = {
                **self._base, n.OPERATION_TYPE: n.PROCESS, n.BATCH_COUNT: len(messages),
                n.PIPELINE_STAGE: self._stage, n.PIPELINE_STAGE_NAME: self._stage_name,
            }
            if len(messages) == 1:
                attributes[n.MESSAGE_ID] = messages[0].lease.event.id
            if self._info is not None:
                attributes[n.BATCH_TRIGGER] = self._info.trigger
            span_links = links(m.lease.event for m in messages)
        self._start(self._tracer, messages[0].lease.stream, attributes, span_links)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None:
            self._finish(n.OTHER if isinstance(exc, Exception) else n.CANCELLED, exc)
            return
        error: str | None = None
        try:
            error = self._describe_failures()
        except Exception:  # telemetry must never break a pipeline stage
            log.exception("describing a %s step of %d messages failed", self._stage,
                          len(self._messages))
        self._finish(error)

    def _describe_failures(self) -> str | None:
        failed = [m for m in self._messages if m.status != "ok"]
        error: str | None = None
        if failed:
            categories = {_category(m.reason) for m in failed}
            error = common(categories)
            span = self._span
            if span is not None and span.is_recording():
                span.set_attribute(n.FAILED_MESSAGES, len(failed))
                for m in failed:
                    span.add_event(n.EVENT_MESSAGE_FAILED, {
                        n.MESSAGE_ID: m.lease.event.id, n.PARTITION: str(m.lease.partition),
                        n.EVENT_SEQUENCE: m.lease.sequence, n.ERROR_TYPE: _category(m.reason),
                        n.FAILURE_REASON: m.reason or "",
                    })
        return error


def _category(reason: str | None) -> str:
    """The low-cardinality category of a failure reason (``handler_error: ...`` ->
    ``handler_error``); reasons a handler chose itself are ``message_failed``."""
    if reason:
        head = reason.split(":", 1)[0]
        if head in _PROCESS_NAME_CATEGORIES:
            return head
    return n.MESSAGE_FAILED
