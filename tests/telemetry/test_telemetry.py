"""OpenTelemetry spans and metrics of append, fetch, settle, renew and processing.

Each test gives rheo_flow an explicit SDK tracer provider (in-memory span
exporter) and meter provider (in-memory reader) through
:mod:`rheo_flow.telemetry`, so no global provider is ever set.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from rheo_flow import (
    ACK,
    BackendUnavailable,
    Event,
    InvalidArgument,
    Lease,
    ManualClock,
    NewEvent,
    RetryPolicy,
    Rheo,
    SettleResult,
    consumer,
    telemetry,
)
from rheo_flow import _telemetry as internal
from rheo_flow.backends import MemoryBackend
from rheo_flow.pipeline import Batcher, BatchInfo, Message, Pipeline, PipelineHandler, Processors

WaitUntil = Callable[..., Awaitable[None]]

SYSTEM = {"messaging.system": "rheo_flow"}
HIGH_CARDINALITY = {"messaging.message.id", "messaging.client.id", "rheo.event.sequence",
                    "rheo.delivery.attempt"}


class Otel:
    """An SDK tracer and meter provider wired to in-memory exporters."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.tracer = self.tracer_provider.get_tracer("tests")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        """Finished spans (named ``name``), in the order they ended."""
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def span(self, name: str) -> ReadableSpan:
        """The single finished span called ``name``."""
        found = self.spans(name)
        assert len(found) == 1, f"{len(found)} spans named {name!r}: {self.names()}"
        return found[0]

    def names(self) -> list[str]:
        """Names of the finished spans."""
        return [s.name for s in self.exporter.get_finished_spans()]

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        """``(attributes, data point)`` of every point of ``metric`` collected now."""
        data = self.reader.get_metrics_data()
        out: list[tuple[dict[str, Any], Any]] = []
        if data is None:
            return out
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name == metric:
                        out.extend((dict(p.attributes or {}), p) for p in m.data.data_points)
        return out

    def sums(self, metric: str) -> dict[frozenset[tuple[str, Any]], int]:
        """A counter's value per attribute set."""
        return {frozenset(a.items()): p.value for a, p in self.points(metric)}


@pytest.fixture
def otel() -> Iterator[Otel]:
    """rheo_flow instrumented with in-memory exporters for the length of a test."""
    setup = Otel()
    telemetry.set_tracer_provider(setup.tracer_provider)
    telemetry.set_meter_provider(setup.meter_provider)
    try:
        yield setup
    finally:
        telemetry.set_tracer_provider(None)
        telemetry.set_meter_provider(None)
        telemetry.configure(create_spans=True, lag_refresh=10)
        telemetry.enable()
        setup.meter_provider.shutdown()
        setup.tracer_provider.shutdown()


def context_of(headers: Any) -> SpanContext:
    """The span context an OpenTelemetry W3C propagator extracts from event headers."""
    extracted = TraceContextTextMapPropagator().extract(dict(headers))
    return trace.get_current_span(extracted).get_span_context()


def same_context(a: SpanContext, b: SpanContext) -> bool:
    """Same trace and span (a remote copy of a context is still the same context)."""
    return (a.trace_id, a.span_id, a.trace_flags) == (b.trace_id, b.span_id, b.trace_flags)


def link_map(span: ReadableSpan) -> dict[str, SpanContext]:
    """``messaging.message.id`` -> linked context, for every link of a span."""
    out: dict[str, SpanContext] = {}
    for link in span.links:
        attributes = dict(link.attributes or {})
        out[str(attributes["messaging.message.id"])] = link.context
    return out


def event_attributes(span: ReadableSpan, name: str) -> list[dict[str, Any]]:
    """Attributes of the span's events called ``name``."""
    return [dict(e.attributes or {}) for e in span.events if e.name == name]


class FailingBackend(MemoryBackend):
    """The memory backend with injectable failures."""

    def __init__(self, *, clock: ManualClock | None = None) -> None:
        super().__init__(clock=clock)
        self.ack_errors: list[BaseException] = []
        self.fetch_errors: list[BaseException] = []
        self.append_errors: list[BaseException] = []

    async def ack(self, leases: Sequence[Lease]) -> list[SettleResult]:
        if self.ack_errors:
            raise self.ack_errors.pop(0)
        return await super().ack(leases)

    async def fetch(self, stream: str, group: str, consumer_id: str, limit: int, lease_ms: int,
                    partitions: Sequence[int] | None) -> list[Lease]:
        if self.fetch_errors:
            raise self.fetch_errors.pop(0)
        return await super().fetch(stream, group, consumer_id, limit, lease_ms, partitions)

    async def append(self, stream: str, records: Any) -> list[Event]:
        if self.append_errors:
            raise self.append_errors.pop(0)
        return await super().append(stream, records)


@pytest.fixture
async def failing(clock: ManualClock) -> Any:
    """An opened instance over a :class:`FailingBackend`."""
    async with Rheo(FailingBackend(clock=clock)) as instance:
        yield instance


# Append ----------------------------------------------------------------------------


async def test_append_of_one_event_is_a_producer_send_span_injected_into_it(
        otel: Otel, rheo: Rheo) -> None:
    await rheo.create_stream("orders", partitions=4)
    with otel.tracer.start_as_current_span("checkout") as parent:
        [event] = await rheo.append("orders", NewEvent("order.placed", {"n": 1}, id="e-1",
                                                       key="c-1"))
    send = otel.span("send orders")
    assert send.kind is SpanKind.PRODUCER
    assert send.parent is not None
    assert send.parent.span_id == parent.get_span_context().span_id
    assert dict(send.attributes or {}) == {
        **SYSTEM, "messaging.operation.type": "send", "messaging.operation.name": "send",
        "messaging.destination.name": "orders",
        "messaging.destination.partition.id": str(event.partition),
        "messaging.message.id": "e-1", "rheo.backend": "memory",
    }
    assert not send.links
    assert same_context(context_of(event.headers), send.context)
    assert otel.spans("create orders") == []


async def test_append_of_many_events_creates_one_creation_context_each(
        otel: Otel, rheo: Rheo) -> None:
    await rheo.create_stream("orders", partitions=2)
    custom = otel.tracer.start_span("upstream producer")
    headers: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(headers, trace.set_span_in_context(custom))
    custom.end()
    events = await rheo.append("orders", [
        NewEvent("t", {"n": 0}, id="a", partition=0),
        NewEvent("t", {"n": 1}, id="b", partition=1),
        NewEvent("t", {"n": 2}, id="c", partition=1, headers={**headers, "x": "y"}),
    ])
    creates = otel.spans("create orders")
    assert [dict(s.attributes or {})["messaging.message.id"] for s in creates] == ["a", "b"]
    for span, event in zip(creates, events, strict=False):
        assert span.kind is SpanKind.PRODUCER
        assert dict(span.attributes or {}) == {
            **SYSTEM, "messaging.operation.type": "create", "messaging.operation.name": "create",
            "messaging.destination.name": "orders",
            "messaging.destination.partition.id": str(event.partition),
            "messaging.message.id": event.id, "rheo.backend": "memory",
        }
        assert same_context(context_of(event.headers), span.context)
    # The caller's creation context is kept untouched, and no create span made for it.
    assert dict(events[2].headers) == {**headers, "x": "y"}
    send = otel.span("send orders")
    assert send.kind is SpanKind.CLIENT
    attributes = dict(send.attributes or {})
    assert attributes["messaging.batch.message_count"] == 3
    assert "messaging.destination.partition.id" not in attributes  # two partitions
    assert "messaging.message.id" not in attributes
    linked = link_map(send)
    assert set(linked) == {"a", "b", "c"}
    assert same_context(linked["a"], creates[0].context)
    assert same_context(linked["c"], custom.get_span_context())
    sent = otel.sums("messaging.client.sent.messages")
    assert sent == {frozenset({**SYSTEM, "messaging.operation.name": "send",
                               "messaging.destination.name": "orders"}.items()): 3}


async def test_without_create_spans_the_send_context_goes_into_every_event(
        otel: Otel, rheo: Rheo) -> None:
    telemetry.configure(create_spans=False)
    await rheo.create_stream("orders")
    events = await rheo.append("orders", [NewEvent("t", {"n": i}) for i in range(5)])
    assert otel.names() == ["send orders"]
    send = otel.span("send orders")
    assert send.kind is SpanKind.PRODUCER
    assert dict(send.attributes or {})["messaging.destination.partition.id"] == "0"
    for event in events:
        assert same_context(context_of(event.headers), send.context)


async def test_a_failed_append_carries_its_classified_kind(otel: Otel, failing: Rheo) -> None:
    await failing.create_stream("orders")
    backend = failing.backend
    assert isinstance(backend, FailingBackend)
    backend.append_errors.append(ConnectionRefusedError("refused"))
    with pytest.raises(ConnectionRefusedError):
        await failing.append("orders", NewEvent("t"))
    send = otel.span("send orders")
    assert dict(send.attributes or {})["error.type"] == "backend_unavailable"
    assert send.status.status_code is StatusCode.ERROR
    assert [e.name for e in send.events] == ["exception"]
    [(attributes, _)] = otel.points("messaging.client.operation.duration")
    assert attributes["error.type"] == "backend_unavailable"


# Fetch -----------------------------------------------------------------------------


async def test_fetch_is_a_poll_span_linked_to_every_creation_context(
        otel: Otel, rheo: Rheo) -> None:
    await rheo.create_stream("orders", partitions=2)
    events = await rheo.append("orders", [NewEvent("t", {"n": i}, id=f"e{i}", partition=i % 2)
                                          for i in range(4)])
    otel.exporter.clear()
    leases = await rheo.fetch("orders", "billing", consumer_id="worker-1", limit=10)
    poll = otel.span("poll orders")
    assert poll.kind is SpanKind.CLIENT
    assert dict(poll.attributes or {}) == {
        **SYSTEM, "messaging.operation.type": "receive", "messaging.operation.name": "poll",
        "messaging.destination.name": "orders", "messaging.consumer.group.name": "billing",
        "messaging.client.id": "worker-1", "rheo.backend": "memory",
        "messaging.batch.message_count": 4,
    }
    linked = link_map(poll)
    assert set(linked) == {e.id for e in events}
    for event in events:
        assert same_context(linked[event.id], context_of(event.headers))
    # One partition selected: the span says which.
    await rheo.fetch("orders", "other", consumer_id="worker-1", partitions=[1])
    [(_, other)] = [(s, s) for s in otel.spans("poll orders")
                    if dict(s.attributes or {})["messaging.consumer.group.name"] == "other"]
    assert dict(other.attributes or {})["messaging.destination.partition.id"] == "1"
    consumed = otel.sums("messaging.client.consumed.messages")
    base = {**SYSTEM, "messaging.operation.name": "poll", "messaging.destination.name": "orders"}
    assert consumed == {
        frozenset({**base, "messaging.consumer.group.name": "billing"}.items()): len(leases),
        frozenset({**base, "messaging.consumer.group.name": "other",
                   "messaging.destination.partition.id": "1"}.items()): 2,
    }


async def test_an_empty_fetch_makes_no_span_only_a_duration(otel: Otel, rheo: Rheo) -> None:
    await rheo.create_stream("orders")
    assert await rheo.fetch("orders", "billing", consumer_id="c") == []
    assert otel.spans("poll orders") == []
    [(attributes, point)] = otel.points("messaging.client.operation.duration")
    assert attributes["messaging.operation.name"] == "poll"
    assert "error.type" not in attributes
    assert point.count == 1
    assert otel.points("messaging.client.consumed.messages") == []


async def test_a_failed_fetch_carries_its_classified_kind(otel: Otel, failing: Rheo) -> None:
    await failing.create_stream("orders")
    backend = failing.backend
    assert isinstance(backend, FailingBackend)
    backend.fetch_errors += [ConnectionRefusedError("refused"), TimeoutError("timed out")]
    for expected in ("backend_unavailable", "ambiguous"):
        otel.exporter.clear()
        with pytest.raises(OSError):  # noqa: PT011 - both errors are OSErrors
            await failing.fetch("orders", "g", consumer_id="c")
        poll = otel.span("poll orders")
        assert dict(poll.attributes or {})["error.type"] == expected
        assert poll.status.status_code is StatusCode.ERROR
    durations = {a.get("error.type"): p.count
                 for a, p in otel.points("messaging.client.operation.duration")
                 if a["messaging.operation.name"] == "poll"}
    assert durations == {"backend_unavailable": 1, "ambiguous": 1}


# Settle ------------------------------------------------------------------------------


async def test_clean_ack(otel: Otel, rheo: Rheo) -> None:
    await rheo.create_stream("orders", partitions=3)
    await rheo.append("orders", [NewEvent("t", {"n": i}, key="same-key") for i in range(3)])
    leases = await rheo.fetch("orders", "billing", consumer_id="c", limit=10)
    [result] = {r.ok for r in await rheo.ack(leases)}
    assert result
    ack = otel.span("ack orders")
    assert ack.kind is SpanKind.CLIENT
    assert dict(ack.attributes or {}) == {
        **SYSTEM, "messaging.operation.type": "settle", "messaging.operation.name": "ack",
        "messaging.destination.name": "orders", "messaging.consumer.group.name": "billing",
        "messaging.destination.partition.id": str(leases[0].partition),
        "messaging.batch.message_count": 3, "rheo.backend": "memory",
    }
    assert ack.status.status_code is StatusCode.UNSET
    assert ack.events == ()
    base = {**SYSTEM, "messaging.operation.name": "ack", "messaging.destination.name": "orders",
            "messaging.consumer.group.name": "billing",
            "messaging.destination.partition.id": str(leases[0].partition)}
    assert otel.sums("rheo.settle.outcomes") == {
        frozenset({**base, "rheo.settle.outcome": "settled"}.items()): 3}
    [(attributes, point)] = otel.points("messaging.client.operation.duration")[-1:]
    assert attributes == {**base, "messaging.operation.type": "settle"}
    assert point.count == 1
    # Acking again is an idempotent repeat.
    await rheo.ack(leases[0])
    repeat = otel.spans("ack orders")[-1]
    assert dict(repeat.attributes or {})["messaging.message.id"] == leases[0].event.id
    assert dict(repeat.attributes or {})["rheo.settle.repeated_count"] == 1


async def test_stale_lease_is_fenced_dropped_and_reported(
        otel: Otel, rheo: Rheo, clock: ManualClock) -> None:
    await rheo.create_stream("orders")
    [event] = await rheo.append("orders", NewEvent("t", id="e-1"))
    [old] = await rheo.fetch("orders", "billing", consumer_id="slow", lease_ms=1000)
    clock.advance(1001)
    [new] = await rheo.fetch("orders", "billing", consumer_id="fast", lease_ms=1000)
    assert new.attempt == 2
    [result] = await rheo.ack(old)
    assert result.kind is not None
    assert result.kind.value == "stale_lease"
    ack = otel.span("ack orders")
    attributes = dict(ack.attributes or {})
    assert attributes["error.type"] == "stale_lease"
    assert attributes["rheo.settle.decision"] == "drop"
    assert attributes["rheo.settle.failed_count"] == 1
    assert attributes["messaging.message.id"] == "e-1"
    assert ack.status.status_code is StatusCode.ERROR
    [failure] = event_attributes(ack, "rheo.settle.failure")
    assert failure == {
        "messaging.message.id": "e-1", "messaging.destination.partition.id": "0",
        "rheo.event.sequence": event.sequence, "rheo.delivery.attempt": 1,
        "error.type": "stale_lease", "rheo.settle.decision": "drop",
        "rheo.settle.reason": result.error.reason if result.error else "",
    }
    await rheo.ack(new)
    outcomes = {dict(k).get("rheo.settle.outcome"): (dict(k).get("error.type"),
                                                     dict(k).get("rheo.settle.decision"), v)
                for k, v in otel.sums("rheo.settle.outcomes").items()}
    assert outcomes == {"failed": ("stale_lease", "drop", 1), "settled": (None, None, 1)}


async def test_unavailable_backend_leaves_leases_to_expire(otel: Otel, failing: Rheo) -> None:
    await failing.create_stream("orders")
    await failing.append("orders", [NewEvent("t") for _ in range(2)])
    leases = await failing.fetch("orders", "billing", consumer_id="c")
    backend = failing.backend
    assert isinstance(backend, FailingBackend)
    backend.ack_errors.append(BackendUnavailable("the store is down"))
    results = await failing.ack(leases)
    assert {r.kind.value if r.kind else None for r in results} == {"backend_unavailable"}
    ack = otel.span("ack orders")
    attributes = dict(ack.attributes or {})
    assert attributes["error.type"] == "backend_unavailable"
    assert attributes["rheo.settle.decision"] == "expire"
    assert attributes["rheo.settle.failed_count"] == 2
    failures = event_attributes(ack, "rheo.settle.failure")
    assert [f["messaging.message.id"] for f in failures] == [le.event.id for le in leases]
    assert {f["rheo.settle.decision"] for f in failures} == {"expire"}
    [(key, count)] = otel.sums("rheo.settle.outcomes").items()
    assert count == 2
    assert dict(key)["error.type"] == "backend_unavailable"
    assert dict(key)["rheo.settle.decision"] == "expire"


async def test_mixed_failures_are_other_with_the_detail_per_lease(
        otel: Otel, rheo: Rheo, clock: ManualClock) -> None:
    await rheo.create_stream("orders")
    await rheo.append("orders", [NewEvent("t") for _ in range(3)])
    leases = await rheo.fetch("orders", "billing", consumer_id="c", lease_ms=1000)
    clock.advance(1001)
    await rheo.fetch("orders", "billing", consumer_id="d", limit=1)  # re-leases the first
    unknown = dataclasses.replace(leases[1], group="nobody")
    results = await rheo.ack([leases[0], unknown, leases[2]])
    assert [r.kind.value if r.kind else None for r in results] == ["stale_lease", "invalid",
                                                                   None]
    span = otel.spans("ack orders")[-1]
    attributes = dict(span.attributes or {})
    assert attributes["error.type"] == "_OTHER"
    assert "rheo.settle.decision" not in attributes  # drop and nack
    assert "messaging.consumer.group.name" not in attributes  # two groups in one call
    failures = event_attributes(span, "rheo.settle.failure")
    assert [(f["error.type"], f["rheo.settle.decision"]) for f in failures] == [
        ("stale_lease", "drop"), ("invalid", "nack")]


async def test_renew_reports_lost_leases(otel: Otel, rheo: Rheo, clock: ManualClock) -> None:
    await rheo.create_stream("orders")
    await rheo.append("orders", [NewEvent("t", id="e1"), NewEvent("t", id="e2")])
    leases = await rheo.fetch("orders", "billing", consumer_id="c", lease_ms=1000)
    clock.advance(1001)
    await rheo.fetch("orders", "billing", consumer_id="d", limit=1)
    results = await rheo.renew(leases, lease_ms=5000)
    assert [r.ok for r in results] == [False, True]
    renew = otel.span("renew orders")
    attributes = dict(renew.attributes or {})
    assert attributes["messaging.operation.type"] == "settle"
    assert attributes["messaging.operation.name"] == "renew"
    assert attributes["error.type"] == "stale_lease"
    assert attributes["rheo.settle.decision"] == "drop"
    [failure] = event_attributes(renew, "rheo.settle.failure")
    assert failure["messaging.message.id"] == "e1"


def test_decisions_follow_the_table_except_for_nack_and_renew() -> None:
    from rheo_flow import Decision, SettleKind

    for kind in SettleKind:
        assert internal.decision_for("ack", kind) is kind.decision
        assert internal.decision_for("reject", kind) is kind.decision
        expected = Decision.EXPIRE if kind.decision is Decision.NACK else kind.decision
        assert internal.decision_for("nack", kind) is expected
        assert internal.decision_for("renew", kind) is expected


# Consumer groups -----------------------------------------------------------------------


async def test_group_process_span_per_event_with_a_link_to_its_creation(
        otel: Otel, rheo: Rheo, wait_until: WaitUntil) -> None:
    await rheo.create_stream("orders", partitions=2)
    events = await rheo.append("orders", [NewEvent("order.placed", {"n": i}, id=f"e{i}",
                                                   partition=i % 2) for i in range(4)])
    handler_spans: dict[str, SpanContext] = {}

    @consumer(stream="orders", group="billing", consumer_id="worker-1", concurrency=2)
    async def bill(event: Event, context: Any) -> Any:
        with otel.tracer.start_as_current_span("charge card") as span:
            handler_spans[event.id] = span.get_span_context()
        return ACK

    with otel.tracer.start_as_current_span("service startup"):
        async with bill.start(rheo) as group:
            await wait_until(lambda: group.stats.acked == 4)
    processes = otel.spans("process orders")
    assert len(processes) == 4
    by_id = {dict(s.attributes or {})["messaging.message.id"]: s for s in processes}
    for event in events:
        span = by_id[event.id]
        assert span.kind is SpanKind.CONSUMER
        assert span.parent is None  # not a child of "service startup"
        assert dict(span.attributes or {}) == {
            **SYSTEM, "messaging.operation.type": "process", "messaging.operation.name": "process",
            "messaging.destination.name": "orders", "messaging.consumer.group.name": "billing",
            "messaging.destination.partition.id": str(event.partition),
            "messaging.message.id": event.id, "messaging.client.id": "worker-1",
            "rheo.event.sequence": event.sequence, "rheo.event.type": "order.placed",
            "rheo.delivery.attempt": 1, "rheo.process.outcome": "ack",
        }
        assert list(link_map(span)) == [event.id]
        assert same_context(link_map(span)[event.id], context_of(event.headers))
        charge = [s for s in otel.spans("charge card")
                  if s.context.span_id == handler_spans[event.id].span_id]
        assert charge[0].parent is not None
        assert charge[0].parent.span_id == span.context.span_id
    for name in ("poll orders", "ack orders"):
        assert all(s.parent is None for s in otel.spans(name)), name
    durations = otel.points("messaging.process.duration")
    assert sum(p.count for _, p in durations) == 4
    assert {a["messaging.destination.partition.id"] for a, _ in durations} == {"0", "1"}


async def test_a_group_running_when_telemetry_comes_on_traces_the_events_after(
        otel: Otel, rheo: Rheo, wait_until: WaitUntil) -> None:
    telemetry.set_tracer_provider(None)
    telemetry.set_meter_provider(None)
    await rheo.create_stream("orders")
    await rheo.append("orders", NewEvent("t", id="before"))

    @consumer(stream="orders", group="billing")
    async def handle(event: Event, context: Any) -> Any:
        if event.id == "failing":
            raise ValueError("cannot parse")
        return ACK

    async with handle.start(rheo) as group:
        await wait_until(lambda: group.stats.acked == 1)
        telemetry.set_tracer_provider(otel.tracer_provider)
        await rheo.append("orders", [NewEvent("t", id="after"), NewEvent("t", id="failing")])
        await wait_until(lambda: group.stats.acked == 2 and group.stats.handler_errors >= 1)
    outcomes = {dict(s.attributes or {})["messaging.message.id"]:
                dict(s.attributes or {})["rheo.process.outcome"]
                for s in otel.spans("process orders")}
    assert outcomes == {"after": "ack", "failing": "handler_error"}


async def test_failed_ack_is_nacked_by_the_runtime(
        otel: Otel, failing: Rheo, wait_until: WaitUntil) -> None:
    await failing.create_stream("orders")
    [event] = await failing.append("orders", NewEvent("t", id="e-1"))
    backend = failing.backend
    assert isinstance(backend, FailingBackend)
    backend.ack_errors.append(RuntimeError("constraint violated"))  # classified "failed"

    @consumer(stream="orders", group="billing")
    async def handle(event: Event, context: Any) -> Any:
        return ACK

    async with handle.start(failing) as group:
        await wait_until(lambda: group.stats.acked == 1)
    first_ack, second_ack = otel.spans("ack orders")
    attributes = dict(first_ack.attributes or {})
    assert attributes["error.type"] == "failed"
    assert attributes["rheo.settle.decision"] == "nack"
    [failure] = event_attributes(first_ack, "rheo.settle.failure")
    assert failure["rheo.settle.reason"] == "RuntimeError: constraint violated"
    nack = otel.span("nack orders")
    nack_attributes = dict(nack.attributes or {})
    assert nack_attributes["rheo.settle.follow_up_of"] == "ack"
    assert nack_attributes["messaging.message.id"] == "e-1"
    assert "error.type" not in nack_attributes
    assert "error.type" not in dict(second_ack.attributes or {})
    processes = otel.spans("process orders")
    assert [dict(s.attributes or {})["rheo.delivery.attempt"] for s in processes] == [1, 2]
    outcomes = otel.sums("rheo.settle.outcomes")
    by_op = {(dict(k)["messaging.operation.name"], dict(k)["rheo.settle.outcome"],
              dict(k).get("error.type"), dict(k).get("rheo.settle.decision")): v
             for k, v in outcomes.items()}
    assert by_op == {("ack", "failed", "failed", "nack"): 1, ("nack", "settled", None, None): 1,
                     ("ack", "settled", None, None): 1}
    assert event.id == "e-1"


async def test_dead_letter_at_max_attempts(otel: Otel, rheo: Rheo, wait_until: WaitUntil) -> None:
    await rheo.create_stream("orders")
    await rheo.append("orders", NewEvent("t", id="poison"))

    @consumer(stream="orders", group="billing", max_attempts=2,
              retry_policy=RetryPolicy.immediate())
    async def handle(event: Event, context: Any) -> Any:
        raise ValueError("cannot parse")

    async with handle.start(rheo):
        async def dead_lettered() -> bool:
            return bool(await rheo.dead_letters("orders", "billing"))

        await wait_until(dead_lettered)
    [letter] = await rheo.dead_letters("orders", "billing")
    assert (letter.reason, letter.last_error) == ("max_attempts", "ValueError: cannot parse")
    processes = otel.spans("process orders")
    assert len(processes) == 2
    for attempt, span in enumerate(processes, start=1):
        attributes = dict(span.attributes or {})
        assert attributes["rheo.delivery.attempt"] == attempt
        assert attributes["error.type"] == "handler_error"
        assert attributes["rheo.process.outcome"] == "handler_error"
        assert span.status.status_code is StatusCode.ERROR
        [exception] = event_attributes(span, "exception")
        assert exception["exception.type"] == "ValueError"
    first, last = otel.spans("nack orders")
    assert "rheo.settle.dead_lettered_count" not in dict(first.attributes or {})
    attributes = dict(last.attributes or {})
    assert attributes["rheo.settle.dead_lettered_count"] == 1
    assert "error.type" not in attributes
    [dead] = event_attributes(last, "rheo.dead_letter")
    assert dead["messaging.message.id"] == "poison"
    assert dead["rheo.delivery.attempt"] == 2
    assert dead["rheo.settle.reason"] == "max_attempts"
    outcomes = {dict(k)["rheo.settle.outcome"]: v
                for k, v in otel.sums("rheo.settle.outcomes").items()}
    assert outcomes == {"settled": 1, "dead_lettered": 1}
    failed = [a for a, _ in otel.points("messaging.process.duration")]
    assert {a.get("error.type") for a in failed} == {"handler_error"}


@dataclasses.dataclass
class Placed:
    """The model of events of type ``t`` in the invalid-payload tests."""

    order_id: int


async def _append_bad_and_good(rheo: Rheo) -> None:
    """Stream ``orders`` with one event whose data does not validate as :class:`Placed`
    (id ``bad``) and one that does (id ``good``)."""
    await rheo.create_stream("orders")
    await rheo.append("orders", [NewEvent("t", {"order_id": "x"}, id="bad"),
                                 NewEvent("t", Placed(1), id="good")])


async def test_invalid_payload_is_its_own_error_type(
        otel: Otel, rheo: Rheo, wait_until: WaitUntil) -> None:
    await _append_bad_and_good(rheo)

    @consumer(stream="orders", group="billing", models={"t": Placed})
    async def handle(event: Event, context: Any) -> Any:
        return ACK

    async with handle.start(rheo) as group:
        await wait_until(lambda: group.stats.acked + group.stats.rejected == 2)
    by_id = {dict(s.attributes or {})["messaging.message.id"]: dict(s.attributes or {})
             for s in otel.spans("process orders")}
    assert by_id["bad"]["rheo.process.outcome"] == "invalid_payload"
    assert by_id["bad"]["error.type"] == "invalid_payload"
    assert "error.type" not in by_id["good"]
    failed = [a.get("error.type") for a, _ in otel.points("messaging.process.duration")]
    assert set(failed) == {"invalid_payload", None}


async def test_lag_gauge_per_partition(otel: Otel, rheo: Rheo, wait_until: WaitUntil) -> None:
    telemetry.configure(lag_refresh=0)
    await rheo.create_stream("orders", partitions=2)
    await rheo.append("orders", [NewEvent("t", partition=p) for p in (0, 0, 0, 1, 1)])
    release = asyncio.Event()

    @consumer(stream="orders", group="billing", concurrency=5, max_demand=5)
    async def slow(event: Event, context: Any) -> Any:
        await release.wait()
        return ACK

    def lag() -> dict[str, int]:
        points = otel.points("rheo.consumer.lag")
        for attributes, _ in points:
            assert set(attributes) == {"messaging.system", "messaging.destination.name",
                                       "messaging.consumer.group.name",
                                       "messaging.destination.partition.id"}
        return {a["messaging.destination.partition.id"]: p.value for a, p in points
                if a["messaging.consumer.group.name"] == "billing"}

    async with slow.start(rheo) as group:
        await wait_until(lambda: lag() == {"0": 3, "1": 2}, message="lag 3 and 2")
        release.set()
        await wait_until(lambda: group.stats.acked == 5)
        await wait_until(lambda: lag() == {"0": 0, "1": 0}, message="lag 0")
    assert lag() == {}  # a stopped group reports nothing


# Pipelines -------------------------------------------------------------------------------


class Collect(PipelineHandler):
    """Fails the messages whose data says so; counts what went through."""

    def __init__(self) -> None:
        self.batches: list[tuple[BatchInfo, int]] = []

    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        if message.data.get("fail"):
            raise ValueError("bad data")
        return message

    async def handle_batch(self, batcher: str, messages: list[Message], batch_info: BatchInfo,
                           context: Any) -> list[Message]:
        self.batches.append((batch_info, len(messages)))
        return messages


async def test_batch_links_to_a_hundred_producers(
        otel: Otel, rheo: Rheo, wait_until: WaitUntil) -> None:
    await rheo.create_stream("orders", partitions=4)
    creation: dict[str, SpanContext] = {}
    for i in range(100):
        with otel.tracer.start_as_current_span(f"producer {i}"):  # a separate trace each
            [event] = await rheo.append("orders", NewEvent("t", {"n": i}, id=f"e{i}",
                                                           key=f"k{i}"))
        creation[event.id] = context_of(event.headers)
    assert len({c.trace_id for c in creation.values()}) == 100
    handler = Collect()
    pipeline = Pipeline(
        rheo, stream="orders", group="billing", handler=handler,
        processors=Processors(concurrency=2, max_demand=10),
        batchers={"default": Batcher(batch_size=100, batch_timeout=30)},
        max_inflight=200,
    )
    async with pipeline:
        await wait_until(lambda: pipeline.stats().acked == 100)
    batch_spans = [s for s in otel.spans("process orders")
                   if dict(s.attributes or {})["rheo.pipeline.stage"] == "batcher"]
    [batch] = batch_spans
    assert batch.kind is SpanKind.CONSUMER
    assert batch.parent is None
    attributes = dict(batch.attributes or {})
    assert attributes == {
        **SYSTEM, "messaging.operation.type": "process", "messaging.operation.name": "process",
        "messaging.destination.name": "orders", "messaging.consumer.group.name": "billing",
        "messaging.batch.message_count": 100, "rheo.pipeline.stage": "batcher",
        "rheo.pipeline.stage_name": "default", "rheo.pipeline.batch_trigger": "size",
    }
    linked = link_map(batch)
    assert len(batch.links) == 100
    assert set(linked) == set(creation)
    for event_id, context in linked.items():
        assert same_context(context, creation[event_id])
    # The processors' chunks are process spans too, linking the same creation contexts.
    chunk_links: dict[str, SpanContext] = {}
    for span in otel.spans("process orders"):
        if dict(span.attributes or {})["rheo.pipeline.stage"] == "processor":
            chunk_links.update(link_map(span))
    assert set(chunk_links) == set(creation)
    # The batch's ack is its child.
    acks = otel.spans("ack orders")
    assert any(a.parent is not None and a.parent.span_id == batch.context.span_id for a in acks)


async def test_pipeline_failures_are_reported_on_the_processor_span(
        otel: Otel, rheo: Rheo, wait_until: WaitUntil) -> None:
    await rheo.create_stream("orders")
    await rheo.append("orders", [NewEvent("t", {"fail": i == 1}, id=f"e{i}") for i in range(3)])
    pipeline = Pipeline(rheo, stream="orders", group="billing", handler=Collect(),
                        processors=Processors(concurrency=1, max_demand=10),
                        on_failure="reject")
    async with pipeline:
        await wait_until(lambda: pipeline.stats().acked == 2 and pipeline.stats().rejected == 1)
    [span] = [s for s in otel.spans("process orders")
              if dict(s.attributes or {})["messaging.batch.message_count"] == 3]
    attributes = dict(span.attributes or {})
    assert attributes["rheo.pipeline.stage"] == "processor"
    assert attributes["error.type"] == "handler_error"
    assert attributes["rheo.pipeline.failed_count"] == 1
    [failed] = event_attributes(span, "rheo.message.failed")
    assert failed["messaging.message.id"] == "e1"
    assert failed["rheo.failure.reason"] == "handler_error: ValueError: bad data"
    reject = otel.span("reject orders")
    assert reject.parent is not None
    assert reject.parent.span_id == span.context.span_id


async def test_a_pipeline_reports_invalid_payloads_as_their_own_error_type(
        otel: Otel, rheo: Rheo, wait_until: WaitUntil) -> None:
    await _append_bad_and_good(rheo)
    class Through(PipelineHandler):
        async def handle_message(self, processor: str, message: Message,
                                 context: Any) -> Message:
            assert isinstance(message.data, Placed)
            return message

    pipeline = Pipeline(rheo, stream="orders", group="billing", handler=Through(),
                        processors=Processors(concurrency=1, max_demand=10),
                        models={"t": Placed})
    async with pipeline:
        await wait_until(lambda: pipeline.stats().acked == 1
                         and pipeline.stats().invalid_payloads == 1)
    [span] = [s for s in otel.spans("process orders")
              if dict(s.attributes or {})["rheo.pipeline.stage"] == "validation"]
    attributes = dict(span.attributes or {})
    assert attributes["error.type"] == "invalid_payload"
    assert attributes["messaging.batch.message_count"] == 1
    [failed] = event_attributes(span, "rheo.message.failed")
    assert failed["messaging.message.id"] == "bad"
    reject = otel.span("reject orders")
    assert reject.parent is not None
    assert reject.parent.span_id == span.context.span_id
    errors = {a.get("error.type") for a, _ in otel.points("messaging.process.duration")}
    assert "invalid_payload" in errors


# Metrics never carry ids -------------------------------------------------------------------


async def test_metric_attributes_are_low_cardinality(
        otel: Otel, rheo: Rheo, wait_until: WaitUntil) -> None:
    await rheo.create_stream("orders", partitions=2)
    await rheo.append("orders", [NewEvent("t", {"n": i}) for i in range(6)])

    @consumer(stream="orders", group="billing")
    async def handle(event: Event, context: Any) -> Any:
        return ACK

    async with handle.start(rheo) as group:
        await wait_until(lambda: group.stats.acked == 6)
    data = otel.reader.get_metrics_data()
    assert data is not None
    names = set()
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "rheo_flow"
            for metric in scope.metrics:
                names.add(metric.name)
                for point in metric.data.data_points:
                    assert not HIGH_CARDINALITY & set(point.attributes or {}), metric.name
    assert {"messaging.client.operation.duration", "messaging.client.sent.messages",
            "messaging.client.consumed.messages", "messaging.process.duration",
            "rheo.settle.outcomes"} <= names
    units = {m.name: m.unit for r in data.resource_metrics for s in r.scope_metrics
             for m in s.metrics}
    assert units["messaging.client.operation.duration"] == "s"
    assert units["messaging.process.duration"] == "s"
    assert units["messaging.client.sent.messages"] == "{message}"


# Switches -----------------------------------------------------------------------------------


async def test_disabled_instrumentation_records_and_injects_nothing(
        otel: Otel, rheo: Rheo) -> None:
    telemetry.disable()
    assert not telemetry.is_enabled()
    await rheo.create_stream("orders")
    [event] = await rheo.append("orders", NewEvent("t"))
    leases = await rheo.fetch("orders", "g")
    await rheo.ack(leases)
    assert dict(event.headers) == {}
    assert otel.spans() == []
    assert otel.points("messaging.client.operation.duration") == []
    telemetry.enable()
    [event] = await rheo.append("orders", NewEvent("t"))
    assert "traceparent" in event.headers


async def test_without_an_sdk_nothing_is_recorded_or_injected(rheo: Rheo) -> None:
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        pytest.skip("a global tracer provider was set in this process")
    assert internal.tracer() is None
    assert internal.instruments() is None
    await rheo.create_stream("orders")
    [event] = await rheo.append("orders", NewEvent("t"))
    assert dict(event.headers) == {}
    leases = await rheo.fetch("orders", "g")
    assert [r.ok for r in await rheo.ack(leases)] == [True]


def test_metrics_only_or_traces_only(otel: Otel) -> None:
    telemetry.set_tracer_provider(None)
    assert internal.tracer() is None
    assert internal.instruments() is not None
    telemetry.set_tracer_provider(otel.tracer_provider)
    telemetry.set_meter_provider(None)
    assert internal.tracer() is not None
    assert internal.instruments() is None


def test_bad_settings_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="TracerProvider"):
        telemetry.set_tracer_provider("console")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="MeterProvider"):
        telemetry.set_meter_provider(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="lag_refresh"):
        telemetry.configure(lag_refresh=-1)
    with pytest.raises(InvalidArgument, match="create_spans"):
        telemetry.configure(create_spans="yes")  # type: ignore[arg-type]


def test_error_types_are_the_documented_ones() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "telemetry.md").read_text()
    table = doc.split("<!-- error-types:start -->")[1].split("<!-- error-types:end -->")[0]
    documented = [line.split("|")[1].strip().strip("`") for line in table.strip().splitlines()
                  if line.startswith("| `")]
    assert sorted(documented) == sorted(telemetry.ERROR_TYPES)


@pytest.mark.parametrize("parent", [
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future",
    " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
    "garbage",
])
@pytest.mark.parametrize("state", [None, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", "bad state"])
def test_creation_contexts_are_read_as_the_w3c_propagator_reads_them(
        parent: str, state: str | None) -> None:
    headers = {"traceparent": parent} if state is None else {"traceparent": parent,
                                                            "tracestate": state}
    expected = context_of(headers)
    got = internal.creation_context(headers)
    if not expected.is_valid:
        assert got is None
        return
    assert got is not None
    assert (got.trace_id, got.span_id, got.trace_flags, got.is_remote) == (
        expected.trace_id, expected.span_id, expected.trace_flags, expected.is_remote)
    assert got.trace_state.to_header() == expected.trace_state.to_header()
