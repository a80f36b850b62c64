"""Cases about streams and appends: routing, sequences, idempotency, round trips, errors."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .._model._errors import ConflictError, InvalidArgument, UnknownGroup, UnknownStream
from .._model._event import Event, NewEvent
from .._model._query import Query
from .._model._routing import partition_for
from .._model._stream import DeadLetter
from .._rheo import Rheo
from ._case import CaseEnv, case, check, check_equal, expect_error, positions

# Golden routing values: the hash must never change between versions, processes or
# backends, or events of one key would split across partitions after an upgrade.
GOLDEN_ROUTES: dict[tuple[str, int], int] = {
    ("user-1", 3): 2,
    ("user-1", 8): 4,
    ("user-1", 64): 20,
    ("user-1", 4096): 1556,
    ("user-2", 4): 2,
    ("user-2", 16): 14,
    ("order-42", 8): 6,
    ("order-42", 64): 30,
    ("customer:9000", 4): 2,
    ("customer:9000", 64): 50,
    ("\u00e9-\u00fc", 4096): 3328,
    ("", 8): 0,
}


@case(rules=["append.routing"])
async def case_routing_golden_values(env: CaseEnv) -> None:
    """Keys route to the same partitions in every version, process and backend."""
    for (key, count), expected in GOLDEN_ROUTES.items():
        check_equal(partition_for(key, count), expected, f"partition_for({key!r}, {count})")
    stream = await env.stream(partitions=8)
    for key in ("user-1", "order-42", "user-2"):
        [event] = await env.rheo.append(stream, NewEvent("t", key=key))
        check_equal(event.partition, GOLDEN_ROUTES.get((key, 8), partition_for(key, 8)),
                    f"partition of an event with key {key!r}")
        check_equal(event.key, key, "stored key")


@case(rules=["append.routing", "append.sequence"])
async def case_routing_same_key_same_partition(env: CaseEnv) -> None:
    """Every event of one key lands in one partition, in append order."""
    stream = await env.stream(partitions=5)
    keys = [f"k{i}" for i in range(12)]
    seen: dict[str, list[Event]] = defaultdict(list)
    for _ in range(3):
        events = await env.rheo.append(stream, [NewEvent("t", key=k) for k in keys])
        for event in events:
            seen[event.key or ""].append(event)
    for key, events in seen.items():
        check_equal({e.partition for e in events}, {partition_for(key, 5)},
                    f"partitions of key {key!r}")
        sequences = [e.sequence for e in events]
        check_equal(sequences, sorted(sequences), f"sequences of key {key!r} follow append order")


@case(rules=["append.sequence", "append.batch"])
async def case_sequences_gapless_from_one(env: CaseEnv) -> None:
    """Each partition numbers its events 1, 2, 3, ... without gaps, in append order."""
    stream = await env.stream(partitions=4)
    per_partition: dict[int, list[int]] = defaultdict(list)
    for batch in range(5):
        events = [NewEvent("t", {"b": batch, "i": i}, key=f"key-{batch}-{i}") for i in range(7)]
        stored = await env.rheo.append(stream, events)
        check_equal(len(stored), len(events), "one stored event per appended event")
        check_equal([e.data for e in stored], [e.data for e in events],
                    "stored events come back in the order they were given")
        for event in stored:
            per_partition[event.partition].append(event.sequence)
    for partition, sequences in per_partition.items():
        check_equal(sequences, list(range(1, len(sequences) + 1)),
                    f"sequences of partition {partition}")
    info = await env.rheo.stream_info(stream)
    check_equal(dict(info.high_water), {p: len(per_partition.get(p, [])) for p in range(4)},
                "high water per partition")


@case(rules=["append.sequence"])
async def case_sequences_gapless_under_concurrent_appends(env: CaseEnv) -> None:
    """Concurrent appends never share or skip a sequence."""
    stream = await env.stream(partitions=3)

    async def append(batch: int) -> list[Event]:
        return await env.rheo.append(
            stream, [NewEvent("t", {"b": batch}, key=f"c-{batch}-{i}") for i in range(5)]
        )

    batches = await asyncio.gather(*(append(b) for b in range(12)))
    per_partition: dict[int, list[int]] = defaultdict(list)
    for events in batches:
        in_batch: dict[int, list[int]] = defaultdict(list)
        for event in events:
            per_partition[event.partition].append(event.sequence)
            in_batch[event.partition].append(event.sequence)
        for partition, sequences in in_batch.items():
            check_equal(sequences, sorted(sequences),
                        f"sequences of one batch in partition {partition} are increasing")
    for partition, sequences in per_partition.items():
        check_equal(sorted(sequences), list(range(1, len(sequences) + 1)),
                    f"sequences of partition {partition} after concurrent appends")
    info = await env.rheo.stream_info(stream)
    check_equal(sum(info.high_water.values()), 60, "total high water")


@case(rules=["append.idempotent"])
async def case_append_idempotent_event_id(env: CaseEnv) -> None:
    """Appending an id already in the stream returns the stored event, no new sequence."""
    stream = await env.stream(partitions=4)
    [first] = await env.rheo.append(stream, NewEvent("order.placed", {"v": 1}, id="evt-1",
                                                     key="a"))
    [again] = await env.rheo.append(stream, NewEvent("order.changed", {"v": 2}, id="evt-1",
                                                     key="zzz"))
    check_equal(again, first, "re-appending an id returns the stored event unchanged")
    mixed = await env.rheo.append(stream, [NewEvent("x", id="evt-2", key="a"),
                                           NewEvent("x", id="evt-1", key="a")])
    check_equal(mixed[1], first, "a known id inside a batch returns the stored event")
    check_equal(mixed[0].sequence, first.sequence + 1, "the new event takes the next sequence")
    known_first = await env.rheo.append(stream, [NewEvent("x", id="evt-1", key="a"),
                                                 NewEvent("x", id="evt-3", key="a")])
    check_equal(known_first[0], first, "a known id first in a batch returns the stored event")
    check_equal((known_first[1].id, known_first[1].sequence), ("evt-3", first.sequence + 2),
                "a new event after a known id in a batch is stored")
    info = await env.rheo.stream_info(stream)
    check_equal(sum(info.high_water.values()), 3, "events stored")
    found = [e async for e in env.rheo.stream_query(Query(stream=stream))]
    check_equal(sorted(e.id for e in found), ["evt-1", "evt-2", "evt-3"], "ids stored")


@case(rules=["append.idempotent"])
async def case_append_idempotent_within_batch(env: CaseEnv) -> None:
    """A batch naming one id twice stores it once."""
    stream = await env.stream()
    events = await env.rheo.append(stream, [
        NewEvent("t", {"v": 1}, id="dup"), NewEvent("t", {"v": 2}, id="other"),
        NewEvent("t", {"v": 3}, id="dup"),
    ])
    check_equal(events[2], events[0], "the second occurrence returns the first stored event")
    check_equal([e.sequence for e in events], [1, 2, 1], "sequences")
    check_equal(dict((await env.rheo.stream_info(stream)).high_water), {0: 2}, "high water")


@case(rules=["append.routing"])
async def case_append_explicit_partition(env: CaseEnv) -> None:
    """An explicit partition wins over the key; keys without partition use the hash."""
    stream = await env.stream(partitions=4)
    target = (partition_for("user-1", 4) + 1) % 4
    events = await env.rheo.append(stream, [
        NewEvent("t", key="user-1", partition=target),
        NewEvent("t", key="user-1"),
    ])
    check_equal(events[0].partition, target, "event-level explicit partition")
    check_equal(events[1].partition, partition_for("user-1", 4), "key routing")
    events = await env.rheo.append(stream, [NewEvent("t"), NewEvent("t", key="user-1")],
                                   partition=3)
    check_equal([e.partition for e in events], [3, 3], "call-level explicit partition")
    events = await env.rheo.append(stream, [NewEvent("t", partition=0)], key="user-1")
    check_equal(events[0].partition, 0, "an event's own partition wins over the call's key")
    check_equal(events[0].key, "user-1", "the call's key is stored")


ROUND_TRIP_DATA: list[object] = [
    {"nested": {"list": [1, 2.5, None, True, False, "x"], "empty": {}},
     "unicode": "\u00e9\u6f22\U0001f600"},
    [1, "two", {"three": 3}],
    "just a string",
    2**53 + 1,
    -17,
    0.1,
    None,
    True,
    {"quote": "\"'\\\n\t", "tab": "a\tb"},
]


@case(rules=["append.round_trip"])
async def case_event_round_trip(env: CaseEnv) -> None:
    """Type, data, key, id and headers come back unchanged from append, fetch and query."""
    stream = await env.stream(partitions=2)
    sent = [
        NewEvent(f"type.{i}", data, id=f"id-{i}", key=f"key-{i}",
                 headers={"h": str(i), "content-type": "application/json", "empty": ""})
        for i, data in enumerate(ROUND_TRIP_DATA)
    ]
    stored = await env.rheo.append(stream, sent)
    for new, event in zip(sent, stored, strict=True):
        check_equal(event.stream, stream, "event.stream")
        check_equal((event.id, event.type, event.key), (new.id, new.type, new.key), "id/type/key")
        check_equal(event.data, new.data, f"data of {new.id}")
        check_equal(type(event.data), type(new.data), f"JSON type of the data of {new.id}")
        check_equal(dict(event.headers), dict(new.headers), f"headers of {new.id}")
    leases = await env.drain(stream, "g")
    by_id = {lease.event.id: lease.event for lease in leases}
    check_equal(set(by_id), {e.id for e in stored}, "fetched ids")
    for event in stored:
        check_equal(by_id[event.id], event, f"fetched event {event.id} equals the stored one")
    queried = [e async for e in env.rheo.stream_query(Query(stream=stream))]
    check_equal(sorted(queried, key=lambda e: e.id), sorted(stored, key=lambda e: e.id),
                "queried events equal the stored ones")


@case(rules=["append.round_trip"])
async def case_trace_context_headers(env: CaseEnv) -> None:
    """W3C trace-context headers (traceparent, tracestate) survive the round trip.

    Both literal headers and a creation context injected with OpenTelemetry's W3C
    propagator: extracting it from the fetched and the queried event gives back
    the same span context (trace id, span id, sampled flag, trace state).
    """
    stream = await env.stream()
    headers = {
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
        "baggage": "userId=alice,serverNode=DF%2028,isProduction=false",
    }
    [event] = await env.rheo.append(stream, NewEvent("t", {"x": 1}, headers=headers))
    check_equal(dict(event.headers), headers, "headers returned by append")
    [lease] = await env.fetch(stream, "g")
    check_equal(dict(lease.event.headers), headers, "headers of the fetched event")
    page = await env.rheo.query_page(Query(stream=stream))
    check_equal(dict(page.events[0].headers), headers, "headers of the queried event")

    propagator = TraceContextTextMapPropagator()
    sent = [_span_context(sampled=True, state=[("rheo", "conformance"), ("vendor", "a-1")]),
            _span_context(sampled=False, state=[])]
    news = []
    for i, context in enumerate(sent):
        carrier: dict[str, str] = {"other": f"kept-{i}"}
        propagator.inject(carrier, context=trace.set_span_in_context(NonRecordingSpan(context)))
        news.append(NewEvent("t", {"x": i}, id=f"traced-{i}", headers=carrier))
    stored = await env.rheo.append(stream, news)
    for new, event in zip(news, stored, strict=True):
        check_equal(dict(event.headers), dict(new.headers), f"headers of {new.id} from append")
    fetched = {lease.event.id: lease.event for lease in await env.fetch(stream, "g")}
    queried = {e.id: e async for e in env.rheo.stream_query(Query(stream=stream))}
    for i, (new, context) in enumerate(zip(news, sent, strict=True)):
        for source, events in (("fetched", fetched), ("queried", queried)):
            event_id = f"traced-{i}"
            check(event_id in events, f"{source} events lack {event_id}")
            carried = events[event_id].headers
            check_equal(dict(carried), dict(new.headers), f"headers of the {source} {event_id}")
            got = trace.get_current_span(propagator.extract(dict(carried))).get_span_context()
            check_equal(
                (got.trace_id, got.span_id, int(got.trace_flags), got.trace_state.to_header()),
                (context.trace_id, context.span_id, int(context.trace_flags),
                 context.trace_state.to_header()),
                f"span context extracted from the {source} {event_id}",
            )
            check(got.is_remote, f"the span context of the {source} {event_id} must be remote")


def _span_context(*, sampled: bool, state: list[tuple[str, str]]) -> SpanContext:
    """A fresh, valid span context (as a producer's span would have)."""
    return SpanContext(
        trace_id=uuid.uuid4().int | 1,
        span_id=(uuid.uuid4().int >> 64) | 1,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT),
        trace_state=TraceState(state),
    )


@case(rules=["append.timestamp"])
async def case_append_timestamp(env: CaseEnv) -> None:
    """Events are stamped with the backend's time at append."""
    stream = await env.stream()
    before = await env.now()
    events = await env.append(stream, 3)
    after = await env.now()
    for event in events:
        check(before - env.margin_ms <= event.appended_at_ms <= after + env.margin_ms,
              f"appended_at_ms {event.appended_at_ms} outside [{before}, {after}]")
    await env.advance(env.short_ms)
    [later] = await env.append(stream, 1)
    check(later.appended_at_ms > events[-1].appended_at_ms,
          "an event appended later has a later timestamp")


@case(rules=["stream.lifecycle"])
async def case_stream_info_water_marks(env: CaseEnv) -> None:
    """A new stream is empty (high water 0, low water 1); appends raise the high water."""
    before = await env.now()
    stream = env.name("s")
    created = await env.rheo.create_stream(stream, partitions=3)
    after = await env.now()
    info = await env.rheo.stream_info(stream)
    check_equal(created, info, "create_stream returns the stream's info")
    check_equal((info.name, info.partitions), (stream, 3), "name and partitions")
    check_equal(dict(info.high_water), {0: 0, 1: 0, 2: 0}, "high water of a new stream")
    check_equal(dict(info.low_water), {0: 1, 1: 1, 2: 1}, "low water of a new stream")
    check(before - env.margin_ms <= info.created_at_ms <= after + env.margin_ms,
          f"created_at_ms {info.created_at_ms} is the creation time ({before}..{after})")
    await env.append(stream, 4, partition=1)
    info = await env.rheo.stream_info(stream)
    check_equal(dict(info.high_water), {0: 0, 1: 4, 2: 0}, "high water after appends")
    check_equal(dict(info.low_water), {0: 1, 1: 1, 2: 1}, "low water after appends")
    check_equal((list(info.high_water), list(info.low_water)), ([0, 1, 2], [0, 1, 2]),
                "the water marks list the partitions in order")


@case(rules=["stream.lifecycle"])
async def case_create_stream_idempotent(env: CaseEnv) -> None:
    """create_stream twice with the same partitions returns the same stream."""
    name = env.name("s")
    first = await env.rheo.create_stream(name, partitions=3)
    await env.append(name, 2, partition=2)
    second = await env.rheo.create_stream(name, partitions=3)
    check_equal((second.name, second.partitions, second.created_at_ms),
                (first.name, first.partitions, first.created_at_ms), "the existing stream")
    check_equal(second.high_water[2], 2, "re-creating keeps the events")
    other = await env.stream(partitions=1)
    names = await env.rheo.streams()
    check(name in names and other in names, "list_streams includes the created streams")
    check_equal(names, sorted(names), "list_streams is sorted")


@case(rules=["stream.lifecycle"])
async def case_create_stream_conflict(env: CaseEnv) -> None:
    """create_stream with another partition count is a ConflictError and changes nothing."""
    stream = await env.stream(partitions=2)
    await expect_error(ConflictError, env.rheo.create_stream(stream, partitions=3),
                       "create_stream with another partition count")
    check_equal((await env.rheo.stream_info(stream)).partitions, 2, "partitions after conflict")


@case(rules=["stream.lifecycle", "group.lifecycle"])
async def case_concurrent_create_is_idempotent(env: CaseEnv) -> None:
    """Concurrent create_stream / create_group calls all return the same stream or group."""
    name = env.name("s")
    infos = await asyncio.gather(*(env.rheo.create_stream(name, partitions=2) for _ in range(6)))
    check_equal({(i.name, i.partitions, i.created_at_ms) for i in infos},
                {(infos[0].name, 2, infos[0].created_at_ms)}, "concurrently created streams")
    groups = await asyncio.gather(*(env.rheo.create_group(name, "g") for _ in range(6)))
    check_equal(len(set(groups)), 1, "concurrently created groups are one group")
    check_equal([g.group for g in await env.rheo.groups(name)], ["g"], "groups of the stream")


@case(rules=["errors.unknown"])
async def case_unknown_stream_errors(env: CaseEnv) -> None:
    """Operations on a missing stream raise UnknownStream and create nothing."""
    missing = env.name("missing")
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "stream_info": lambda: env.rheo.stream_info(missing),
        "append": lambda: env.rheo.append(missing, NewEvent("t")),
        "fetch": lambda: env.rheo.fetch(missing, "g"),
        "create_group": lambda: env.rheo.create_group(missing, "g"),
        "groups": lambda: env.rheo.groups(missing),
        "query_page": lambda: env.rheo.query_page(Query(stream=missing)),
        "frontier": lambda: env.rheo.frontier(missing, "g"),
        "lag": lambda: env.rheo.lag(missing, "g"),
        "group_info": lambda: env.rheo.group_info(missing, "g"),
        "dead_letters": lambda: env.rheo.dead_letters(missing, "g"),
        "redrive": lambda: env.rheo.redrive(missing, "g"),
        "replay": lambda: env.rheo.replay(missing, "g"),
        "reset": lambda: env.rheo.reset(missing, "g"),
        "delete_group": lambda: env.rheo.delete_group(missing, "g"),
        "delete_stream": lambda: env.rheo.delete_stream(missing),
    }
    if env.backend.capabilities.trim:
        calls["trim"] = lambda: env.rheo.trim(missing, up_to=1, force=True)
    for what, call in calls.items():
        exc = await expect_error(UnknownStream, call(), f"{what} on a missing stream")
        check(missing in str(exc), f"the {what} error names the stream")
        check_equal(getattr(exc, "stream", None), missing, f"the stream the {what} error names")
    check(missing not in await env.rheo.streams(), "no stream was created")


@case(rules=["errors.unknown"])
async def case_unknown_group_errors(env: CaseEnv) -> None:
    """Operations on a missing group raise UnknownGroup and create nothing."""
    stream = await env.stream()
    await env.append(stream, 1)
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "group_info": lambda: env.rheo.group_info(stream, "nope"),
        "frontier": lambda: env.rheo.frontier(stream, "nope"),
        "dead_letters": lambda: env.rheo.dead_letters(stream, "nope"),
        "redrive": lambda: env.rheo.redrive(stream, "nope"),
        "replay": lambda: env.rheo.replay(stream, "nope"),
        "reset": lambda: env.rheo.reset(stream, "nope"),
        "lag": lambda: env.rheo.lag(stream, "nope"),
        "delete_group": lambda: env.rheo.delete_group(stream, "nope"),
    }
    for what, call in calls.items():
        exc = await expect_error(UnknownGroup, call(), f"{what} on a missing group")
        check_equal((getattr(exc, "stream", None), getattr(exc, "group", None)),
                    (stream, "nope"), f"the stream and group the {what} error names")
    check_equal(await env.rheo.groups(stream), [], "no group was created")


@case(rules=["errors.invalid_input", "append.batch"])
async def case_invalid_append_changes_nothing(env: CaseEnv) -> None:
    """Bad names, partitions, data or headers raise InvalidArgument and write nothing."""
    stream = await env.stream_with(1, partitions=2)
    good = NewEvent("t", {"ok": True}, id="good")
    bad_batches: dict[str, list[NewEvent]] = {
        "non-JSON data": [good, NewEvent("t", {"x": object()})],
        "NaN data": [good, NewEvent("t", {"x": math.nan})],
        "non-string header": [good, NewEvent("t", headers={"h": 1})],  # type: ignore[dict-item]
        "empty type": [good, NewEvent("")],
        "partition out of range": [good, NewEvent("t", partition=2)],
        "empty id": [good, NewEvent("t", id="")],
    }
    for what, batch in bad_batches.items():
        await expect_error(InvalidArgument, env.rheo.append(stream, batch), f"append with {what}")
    await expect_error(InvalidArgument, env.rheo.append(stream, [good], partition=-1),
                       "append with partition -1")
    info = await env.rheo.stream_info(stream)
    check_equal(dict(info.high_water), {0: 1, 1: 0}, "nothing was appended by failed appends")
    page = await env.rheo.query_page(Query(stream=stream))
    check("good" not in {e.id for e in page.events}, "the valid event of a failed batch is absent")
    for bad in ("", "has space", "-lead", "x" * 129, "sl/ash"):
        await expect_error(InvalidArgument, env.rheo.create_stream(bad), f"stream name {bad!r}")
    await expect_error(InvalidArgument, env.rheo.create_stream(env.name("s"), partitions=0),
                       "partitions=0")
    await expect_error(InvalidArgument, env.rheo.create_group(stream, "bad group"),
                       "a bad group name")
    check_equal(await env.rheo.groups(stream), [], "no group was created")


@case(rules=["errors.invalid_input"])
async def case_invalid_fetch_and_settle_change_nothing(env: CaseEnv) -> None:
    """Bad limits, lease times, partitions or reasons raise InvalidArgument and change nothing."""
    stream = await env.stream_with(2, partitions=2)
    await env.rheo.create_group(stream, "g")
    bad_fetches: dict[str, dict[str, Any]] = {
        "limit=0": {"limit": 0},
        "limit=10001": {"limit": 10_001},
        "lease_ms=5": {"lease_ms": 5},
        "partitions=[2]": {"partitions": [2]},
        "a bad consumer id": {"consumer_id": "not ok"},
    }
    for what, kwargs in bad_fetches.items():
        await expect_error(InvalidArgument, env.rheo.fetch(stream, "g", **kwargs),
                           f"fetch with {what}")
    [lease] = await env.fetch(stream, "g", 1)
    check_equal(lease.attempt, 1, "no failed fetch leased anything")
    await expect_error(InvalidArgument, env.rheo.nack(lease, ""), "nack with an empty reason")
    await expect_error(InvalidArgument, env.rheo.nack(lease, "r", delay_ms=-1), "nack delay -1")
    await expect_error(InvalidArgument, env.rheo.reject(lease, " "), "reject with a blank reason")
    await expect_error(InvalidArgument, env.rheo.renew(lease, lease_ms=1), "renew lease_ms=1")
    await expect_error(InvalidArgument, env.rheo.ack(["not a lease"]),  # type: ignore[list-item]
                       "ack of something that is not a lease")
    await env.ack_ok([lease])


def _nested(depth: int) -> Any:
    data: Any = 1
    for _ in range(depth):
        data = [data]
    return data


@case(rules=["errors.invalid_input"])
async def case_invalid_text_changes_nothing(env: CaseEnv) -> None:
    """Lone surrogates, over-deep data and names ending in a newline raise InvalidArgument."""
    stream = await env.stream(partitions=2)
    single = await env.stream()
    good = NewEvent("t", {"ok": True}, id="good")
    lone = "\ud800"
    bad_events: dict[str, NewEvent] = {
        "a lone surrogate in data": NewEvent("t", {"x": f"a{lone}b"}),
        "a lone surrogate in a data key": NewEvent("t", {lone: 1}),
        "a lone surrogate in the type": NewEvent(f"t{lone}"),
        "a lone surrogate in the id": NewEvent("t", id=f"id{lone}"),
        "a lone surrogate in the key": NewEvent("t", key=f"k{lone}"),
        "a lone surrogate in a header": NewEvent("t", headers={"h": lone}),
        "a lone surrogate in a header name": NewEvent("t", headers={lone: "v"}),
        "data nested 10,000 levels deep": NewEvent("t", _nested(10_000)),
        "data nested 255 levels deep": NewEvent("t", _nested(255)),
    }
    for target in (stream, single):
        for what, bad in bad_events.items():
            await expect_error(InvalidArgument, env.rheo.append(target, [good, bad]),
                               f"append with {what}")
        await expect_error(InvalidArgument, env.rheo.append(target, [good], key=lone),
                           "append with a lone surrogate in the batch key")
    for target in (stream, single):
        info = await env.rheo.stream_info(target)
        check(not any(info.high_water.values()), f"nothing was appended by failed appends: {info}")
    [deepest] = await env.rheo.append(single, NewEvent("t", _nested(254)))
    check_equal(deepest.data, _nested(254), "data nested 254 levels deep round trips")
    for bad_query in (Query(stream=stream, type=lone), Query(stream=stream, key=lone)):
        await expect_error(InvalidArgument, env.rheo.query_page(bad_query),
                           f"query with a lone surrogate: {bad_query}")
    for name in ("abc\n", "abc\r", "\nabc", "ab\nc"):
        await expect_error(InvalidArgument, env.rheo.create_stream(name), f"stream name {name!r}")
        await expect_error(InvalidArgument, env.rheo.create_group(stream, name),
                           f"group name {name!r}")
        await expect_error(InvalidArgument, env.rheo.fetch(stream, "g", consumer_id=name),
                           f"consumer id {name!r}")
        await expect_error(InvalidArgument, env.rheo.stream_info(name), f"stream name {name!r}")
    names = await env.rheo.streams()
    check(not any("\n" in n or "\r" in n for n in names), f"no stream name has a newline: {names}")
    check_equal(await env.rheo.groups(stream), [], "no group was created")


@case(rules=["errors.invalid_input"])
async def case_out_of_range_arguments_change_nothing(env: CaseEnv) -> None:
    """Sequences past 2**63-1, delays past 2**31-1 ms and such raise InvalidArgument first."""
    stream = await env.stream_with(2, partitions=2)
    [lease] = await env.fetch(stream, "g", 1)
    before = await env.rheo.stream_info(stream)
    huge = 2**70
    far = DeadLetter(stream, "g", 0, huge, "id", 1, "r", 0)
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "nack delay_ms=2**70": lambda: env.rheo.nack(lease, "later", delay_ms=huge),
        "nack delay_ms=2**31": lambda: env.rheo.nack(lease, "later", delay_ms=2**31),
        "renew lease_ms=2**70": lambda: env.rheo.renew(lease, lease_ms=huge),
        "fetch lease_ms=2**70": lambda: env.rheo.fetch(stream, "g", lease_ms=huge),
        "fetch limit=2**70": lambda: env.rheo.fetch(stream, "g", limit=huge),
        "fetch partitions=[2**70]": lambda: env.rheo.fetch(stream, "g", partitions=[huge]),
        "replay from_sequence=2**63": lambda: env.rheo.replay(stream, "g", from_sequence=2**63),
        "reset to=2**63": lambda: env.rheo.reset(stream, "g", to=2**63),
        "create_group start=2**63": lambda: env.rheo.create_group(stream, "h", start=2**63),
        "create_group max_attempts=2**70": lambda: env.rheo.create_group(
            stream, "h", max_attempts=huge),
        "query since_ms=2**70": lambda: env.rheo.query_page(Query(stream=stream, since_ms=huge)),
        "query until_ms=2**70": lambda: env.rheo.query_page(Query(stream=stream, until_ms=huge)),
        "query from_sequence=2**63": lambda: env.rheo.query_page(
            Query(stream=stream, from_sequence=2**63)),
        "query to_sequence=2**70": lambda: env.rheo.query_page(
            Query(stream=stream, to_sequence=huge)),
        "query limit=2**70": lambda: env.rheo.query_page(Query(stream=stream), limit=huge),
        "a cursor past 2**63-1": lambda: env.rheo.query_page(
            Query(stream=stream), cursor=f"v1.0.{2**64}"),
        "dead_letters limit=2**70": lambda: env.rheo.dead_letters(stream, "g", limit=huge),
        "dead_letters after.sequence=2**70": lambda: env.rheo.dead_letters(
            stream, "g", after=far),
        "redrive sequence=2**70": lambda: env.rheo.redrive(stream, "g", [far]),
        "trim up_to=2**63": lambda: env.rheo.trim(stream, up_to=2**63, force=True),
        "trim up_to={0: 2**70}": lambda: env.rheo.trim(stream, up_to={0: huge}, force=True),
        "create_stream partitions=2**70": lambda: env.rheo.create_stream(
            env.name("s"), partitions=huge),
        "wait_for_append timeout=inf": lambda: env.rheo.wait_for_append(stream, math.inf),
        "wait_for_append timeout=nan": lambda: env.rheo.wait_for_append(stream, math.nan),
        "wait_for_append timeout=-1": lambda: env.rheo.wait_for_append(stream, -1),
    }
    for what, call in calls.items():
        error = await expect_error(InvalidArgument, call(), what)
        name = what.split()[1].split("=")[0].split(".")[-1]
        check(name in str(error) or "cursor" in str(error),
              f"{what}: the message names the argument: {error}")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 0, 1: 0}, "the frontier did not move")
    check_equal([g.group for g in await env.rheo.groups(stream)], ["g"], "no group was created")
    check_equal(await env.rheo.stream_info(stream), before, "nothing was appended or trimmed")
    [result] = await env.rheo.nack(lease, "later", delay_ms=2**31 - 1)
    check(result.ok, f"a nack with the longest delay takes effect: {result}")
    check_equal(positions(await env.fetch(stream, "g")), [(0, 2)],
                "the delivery nacked with the longest delay is not redelivered at once")


@case(rules=["append.round_trip"])
async def case_event_data_edge_strings(env: CaseEnv) -> None:
    """Valid JSON edge cases round trip: NUL and control characters, surrogate-free astral text."""
    stream = await env.stream()
    data = {"nul": "a\u0000b", "controls": "\u0001\u001f\u007f", "astral": "\U0001f680",
            "escapes": "\\u0000 is not a NUL", "": "empty key"}
    [stored] = await env.rheo.append(stream, NewEvent("t", data))
    check_equal(stored.data, data, "data returned by append")
    [lease] = await env.fetch(stream, "g")
    check_equal(lease.event.data, data, "data of the fetched event")


@case(rules=["append.size_limit", "append.batch", "errors.invalid_input"])
async def case_an_event_over_the_size_limit_is_refused(env: CaseEnv) -> None:
    """Data over max_event_bytes (in UTF-8 bytes) is refused; exactly the limit is stored.

    The refused batch writes nothing; the stored event is read back whole. The case
    works through a second instance over the same backend, with a small limit."""
    stream = await env.stream()
    limit = 1_000
    rheo = Rheo(env.backend, max_event_bytes=limit)  # shares env's backend: not closed
    small = NewEvent("t", {"ok": True}, id="small")
    over = NewEvent("t", "x" * (limit - 1), id="over")  # two quotes: limit + 1 bytes
    wide = NewEvent("t", "\u00e9" * (limit // 2), id="wide")  # 2 bytes a character
    for what, bad in (("one byte over", over), ("two-byte characters", wide)):
        await expect_error(InvalidArgument, rheo.append(stream, [small, bad]),
                           f"append of an event {what} the limit of {limit:,} bytes")
    info = await env.rheo.stream_info(stream)
    check(not any(info.high_water.values()), f"a refused batch wrote nothing: {info}")
    exact = NewEvent("t", "x" * (limit - 2), id="exact")
    [stored] = await rheo.append(stream, [exact])
    [read] = (await env.rheo.query_page(Query(stream=stream))).events
    check(read.data == exact.data and stored.id == "exact",
          "an event of exactly the limit is stored and read back whole")
