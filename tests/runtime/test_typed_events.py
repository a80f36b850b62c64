"""Typed events (docs/typed-events.md): pydantic v2 models, msgspec Structs and dataclasses
as event data, from append to handler, on every backend; invalid data dead-lettered on its
first attempt with its field errors, in a Consumer, a Group and a Pipeline."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any, ClassVar

import msgspec
import pydantic
import pytest

from rheo_flow import (
    ACK,
    SCHEMA_VERSION_HEADER,
    Consumer,
    Event,
    Group,
    InvalidArgument,
    InvalidPayload,
    NewEvent,
    Query,
    Rheo,
    consumer,
)
from rheo_flow.pipeline import Pipeline


class PlacedModel(pydantic.BaseModel):
    order_id: int
    total: float
    items: list[str]
    at: datetime


class PlacedStruct(msgspec.Struct):
    order_id: int
    total: float
    items: list[str]
    at: datetime


@dataclasses.dataclass(frozen=True)
class PlacedData:
    order_id: int
    total: float
    items: list[str]
    at: datetime


AT = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
KINDS = {"pydantic": PlacedModel, "msgspec": PlacedStruct, "dataclass": PlacedData}


def placed(model: type, order_id: int) -> Any:
    return model(order_id=order_id, total=12.5, items=["a", "é"], at=AT)


async def consume(rheo: Rheo, models: dict[str, type], expected: int, **options: Any
                  ) -> tuple[list[Event], Group]:
    """Every event the handler received, and the group (drained)."""
    received: list[Event] = []

    @consumer(stream="orders", group="billing", poll_ms=10, models=models, **options)
    async def handle(event: Event, context: Any) -> Any:
        received.append(event)
        return ACK

    async with handle.start(rheo) as group:
        assert await group.run_until_empty(timeout=15)
    assert group.stats.fetched >= expected
    return received, group


# Append ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_a_model_is_appended_as_its_json(rheo: Rheo, kind: str) -> None:
    await rheo.create_stream("orders")
    [stored] = await rheo.append("orders", NewEvent("order.placed", placed(KINDS[kind], 7)))
    assert stored.data == {"order_id": 7, "total": 12.5, "items": ["a", "é"],
                           "at": stored.data["at"]}
    assert datetime.fromisoformat(stored.data["at"].replace("Z", "+00:00")) == AT
    [read] = (await rheo.query_page(Query(stream="orders"))).events
    assert read.data == stored.data


async def test_a_model_version_is_stamped_in_a_header(rheo: Rheo) -> None:
    class Versioned(msgspec.Struct):
        __schema_version__: ClassVar[int] = 3
        n: int

    await rheo.create_stream("orders")
    first, second = await rheo.append("orders", [
        NewEvent("t", Versioned(1)),
        NewEvent("t", Versioned(2), headers={SCHEMA_VERSION_HEADER: "2", "x": "y"}),
    ])
    assert dict(first.headers) == {SCHEMA_VERSION_HEADER: "3"}
    assert dict(second.headers) == {SCHEMA_VERSION_HEADER: "2", "x": "y"}


async def test_a_model_that_is_not_json_is_refused(rheo: Rheo) -> None:
    @dataclasses.dataclass
    class Holder:
        value: object

    await rheo.create_stream("orders")
    with pytest.raises(InvalidArgument, match="Holder"):
        await rheo.append("orders", NewEvent("t", Holder(object())))
    assert (await rheo.query_page(Query(stream="orders"))).events == []


# Consumption -----------------------------------------------------------------------


async def test_bad_models_options_are_refused(rheo: Rheo) -> None:
    await rheo.create_stream("orders")
    with pytest.raises(InvalidArgument, match=r"models\['t'\] must be a pydantic model"):
        Group(rheo, consumer(stream="orders", group="g", models={"t": dict})(_ack))
    with pytest.raises(InvalidArgument, match="upcasters keys must be"):
        Group(rheo, consumer(stream="orders", group="g", models={"t": PlacedStruct},
                             upcasters={("other", 1): lambda d: d})(_ack))
    with pytest.raises(InvalidArgument, match="must map event types"):
        Pipeline(rheo, stream="orders", group="g", handler=_Collect(), models=[PlacedStruct])


async def _ack(event: Event, context: Any) -> Any:
    return ACK


async def test_a_consumer_class_declares_models_and_invalid_data_is_dead_lettered_at_once(
    rheo: Rheo,
) -> None:
    class Billing(Consumer):
        stream = "orders"
        group = "billing"
        poll_ms = 10
        max_attempts = 5
        models = {"order.placed": PlacedStruct}

        def __init__(self) -> None:
            super().__init__()
            self.received: list[Any] = []

        async def handle_event(self, event: Event, context: Any) -> Any:
            self.received.append(event.data)
            return ACK

    await rheo.create_stream("orders")
    await rheo.append("orders", [
        NewEvent("order.placed", placed(PlacedStruct, 1)),
        NewEvent("order.placed", {"order_id": "7", "total": 1, "items": [], "at": "x",
                                  "password": "hunter2"}, id="bad"),
        NewEvent("order.note", {"text": "plain"}),
        NewEvent("order.placed", placed(PlacedStruct, 3)),
    ])
    billing = Billing()
    async with billing.start(rheo) as group:
        assert await group.run_until_empty(timeout=15)
    assert billing.received == [placed(PlacedStruct, 1), {"text": "plain"},
                                placed(PlacedStruct, 3)]
    [letter] = await rheo.dead_letters("orders", "billing")
    assert (letter.event_id, letter.attempts, letter.reason) == ("bad", 1, "invalid_payload")
    assert letter.last_error is not None
    assert letter.last_error.startswith("InvalidPayload: 'order.placed' data does not match "
                                        "PlacedStruct: Expected `int`, got `str` - at "
                                        "`$.order_id`")
    assert "hunter2" not in letter.last_error
    stats = group.stats
    assert (stats.invalid_payloads, stats.rejected, stats.dead_lettered, stats.acked,
            stats.handler_errors) == (1, 1, 1, 3, 0)


async def test_pydantic_field_errors_name_every_field(rheo: Rheo) -> None:
    await rheo.create_stream("orders")
    await rheo.append("orders", [
        NewEvent("order.placed", {"order_id": "seven", "total": 1, "items": ["a", 2],
                                  "at": AT.isoformat()}, id="bad"),
        NewEvent("order.placed", placed(PlacedModel, 2)),
    ])
    received, group = await consume(rheo, {"order.placed": PlacedModel}, 2, max_attempts=3)
    assert [e.data for e in received] == [placed(PlacedModel, 2)]
    [letter] = await rheo.dead_letters("orders", "billing")
    assert (letter.attempts, letter.reason) == (1, "invalid_payload")
    assert letter.last_error == (
        "InvalidPayload: 'order.placed' data does not match PlacedModel: order_id: Input "
        "should be a valid integer, unable to parse string as an integer; items.1: Input "
        "should be a valid string")
    assert group.stats.invalid_payloads == 1


async def test_a_long_validation_error_is_bounded(rheo: Rheo) -> None:
    class Many(pydantic.BaseModel):
        values: list[int]

    await rheo.create_stream("orders")
    await rheo.append("orders", NewEvent("t", {"values": ["x"] * 2_000}))
    await consume(rheo, {"t": Many}, 1)
    [letter] = await rheo.dead_letters("orders", "billing")
    assert letter.last_error is not None
    assert len(letter.last_error) <= 2_000
    assert letter.last_error.endswith("...")


async def test_a_pipeline_rejects_invalid_data_before_its_processors(rheo: Rheo) -> None:
    await rheo.create_stream("orders")
    await rheo.append("orders", [
        NewEvent("order.placed", placed(PlacedData, 1)),
        NewEvent("order.placed", {"order_id": 2}, id="bad"),
        NewEvent("order.note", {"text": "plain"}),
    ])
    handler = _Collect()
    pipeline = Pipeline(rheo, stream="orders", group="billing", handler=handler, poll_ms=10,
                        max_attempts=5, models={"order.placed": PlacedData})
    async with pipeline:
        assert await pipeline.run_until_empty(timeout=15)
    assert handler.data == [placed(PlacedData, 1), {"text": "plain"}]
    [letter] = await rheo.dead_letters("orders", "billing")
    assert (letter.event_id, letter.attempts, letter.reason) == ("bad", 1, "invalid_payload")
    assert letter.last_error is not None
    assert "total" in letter.last_error
    stats = pipeline.stats()
    assert (stats.invalid_payloads, stats.rejected, stats.acked) == (1, 1, 2)


class _Collect:
    def __init__(self) -> None:
        self.data: list[Any] = []

    async def handle_message(self, processor: str, message: Any, context: Any) -> Any:
        self.data.append(message.data)
        return message


def test_invalid_payload_is_a_value_error() -> None:
    error = InvalidPayload("t", PlacedStruct, "$.x: bad")
    assert isinstance(error, ValueError)
    assert (error.event_type, error.model, error.errors) == ("t", PlacedStruct, "$.x: bad")


# Every backend ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_a_model_round_trips_on_every_backend(any_backend: Rheo, kind: str) -> None:
    rheo = any_backend
    model = KINDS[kind]
    await rheo.create_stream("orders")
    sent = [placed(model, n) for n in range(3)]
    await rheo.append("orders", [NewEvent("order.placed", m) for m in sent])
    received, _ = await consume(rheo, {"order.placed": model}, 3)
    assert sorted((e.data for e in received), key=lambda m: m.order_id) == sent
    assert all(type(e.data) is model for e in received)


# Schema evolution ------------------------------------------------------------------


class PlacedV1(msgspec.Struct):
    order_id: int
    amount_cents: int


class PlacedV2(msgspec.Struct):
    __schema_version__: ClassVar[int] = 2
    order_id: int
    total: float
    currency: str = "EUR"  # an added optional field: old events validate without it


def v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    return {"order_id": data["order_id"], "total": data["amount_cents"] / 100}


async def test_old_events_are_upcast_on_replay(rheo: Rheo) -> None:
    await rheo.create_stream("orders")
    await rheo.append("orders", [NewEvent("order.placed", PlacedV1(n, 1250 + n))
                                 for n in range(2)])
    await rheo.append("orders", NewEvent("order.placed", PlacedV2(9, 3.5, "USD")))
    stored = (await rheo.query_page(Query(stream="orders"))).events
    assert [e.headers.get(SCHEMA_VERSION_HEADER) for e in stored] == [None, None, "2"]
    received, _ = await consume(rheo, {"order.placed": PlacedV2}, 3,
                                upcasters={("order.placed", 1): v1_to_v2})
    assert [e.data for e in received] == [PlacedV2(0, 12.5), PlacedV2(1, 12.51),
                                          PlacedV2(9, 3.5, "USD")]


async def test_a_failing_upcaster_dead_letters_the_event(rheo: Rheo) -> None:
    await rheo.create_stream("orders")
    await rheo.append("orders", NewEvent("order.placed", {"order_id": 1}, id="old"))
    await consume(rheo, {"order.placed": PlacedV2}, 1,
                  upcasters={("order.placed", 1): v1_to_v2})
    [letter] = await rheo.dead_letters("orders", "billing")
    assert (letter.event_id, letter.attempts, letter.reason) == ("old", 1, "invalid_payload")
    assert letter.last_error is not None
    assert "upcaster of version 1 failed: KeyError: 'amount_cents'" in letter.last_error


async def test_a_renamed_type_maps_both_names_to_the_model(rheo: Rheo) -> None:
    await rheo.create_stream("orders")
    await rheo.append("orders", [NewEvent("order.created", {"order_id": 1, "total": 2.0}),
                                 NewEvent("order.placed", PlacedV2(2, 3.0))])
    received, _ = await consume(rheo, {"order.created": PlacedV2, "order.placed": PlacedV2}, 2)
    assert [(e.type, e.data) for e in received] == [("order.created", PlacedV2(1, 2.0)),
                                                    ("order.placed", PlacedV2(2, 3.0))]
