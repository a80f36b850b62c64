"""The append hot path: one validating pass per batch, same results as event-by-event."""

from __future__ import annotations

import math
import time
import uuid
from collections import OrderedDict
from typing import Any

import pytest

from rheo_flow import InvalidArgument, NewEvent, Rheo
from rheo_flow._model._routing import partition_for
from rheo_flow._model._validation import check_name, encode_json


async def test_generated_ids_are_unique_time_ordered_uuids(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=3)
    before_ms = time.time_ns() // 1_000_000
    first = await rheo.append("s", [NewEvent("t", {"n": i}) for i in range(2000)])
    second = await rheo.append("s", [{"type": "t"} for _ in range(10)])
    ids = [e.id for e in first + second]
    assert len(set(ids)) == len(ids)
    for event_id in ids:
        parsed = uuid.UUID(event_id)
        assert str(parsed) == event_id
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
        # UUID version 7: the first 48 bits are the Unix time in milliseconds.
        assert before_ms <= parsed.int >> 80 <= time.time_ns() // 1_000_000
    for event in first:
        assert event.partition == partition_for(event.id, 3)
    # 2000 random ids leave no partition empty.
    assert {e.partition for e in first} == {0, 1, 2}


async def test_mixed_batch_routes_and_stores_each_event(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=4)
    events: list[Any] = [
        NewEvent("a", {"x": None}, key="k-1"),
        {"type": "b", "data": [1, 2], "id": "given", "headers": OrderedDict(h="v")},
        NewEvent("c", 2**70, partition=3, key="k-1"),
        {"type": "d", "data": {"1": 1.5}, "key": "k-2"},
    ]
    stored = await rheo.append("s", events, key="default")
    assert [e.type for e in stored] == ["a", "b", "c", "d"]
    assert stored[0].partition == partition_for("k-1", 4)
    assert stored[1].partition == partition_for("default", 4)
    assert stored[1].key == "default"
    assert stored[1].id == "given"
    assert stored[1].headers == {"h": "v"}
    assert type(stored[1].headers) is dict
    assert stored[2].partition == 3
    assert stored[3].partition == partition_for("k-2", 4)
    assert [e.data for e in stored] == [{"x": None}, [1, 2], 2**70, {"1": 1.5}]
    again = await rheo.append("s", [{"type": "b", "id": "given"}])
    assert again == [stored[1]]


async def test_stored_data_is_a_copy(rheo: Rheo) -> None:
    await rheo.create_stream("s")
    data = {"items": [1]}
    [event] = await rheo.append("s", NewEvent("t", data))
    data["items"].append(2)
    assert event.data == {"items": [1]}


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (NewEvent("t", partition=True), "out of range"),
        (NewEvent("t", id=3), "event id"),  # type: ignore[arg-type]
        (NewEvent("t", id="x" * 201), "event id"),
        (NewEvent("t" * 257), "event type"),
        (NewEvent(3), "event type"),  # type: ignore[arg-type]
        (NewEvent("t", headers=[("h", "v")]), "headers"),  # type: ignore[arg-type]
        (NewEvent("t", {"x": math.nan, "y": None}), "not JSON"),
        (NewEvent("t", [math.inf]), "not JSON"),
    ],
)
async def test_bad_event_anywhere_in_a_batch_writes_nothing(
    rheo: Rheo, event: NewEvent, message: str
) -> None:
    await rheo.create_stream("s", partitions=2)
    batch = [NewEvent("fine", {"n": i}) for i in range(50)] + [event]
    with pytest.raises(InvalidArgument, match=message):
        await rheo.append("s", batch)
    assert sum((await rheo.high_water("s")).values()) == 0


def test_json_matches_the_standard_library_where_both_encode() -> None:
    assert encode_json({"a": [1, 2.5, None, True, "é\n"]}) == '{"a":[1,2.5,null,true,"é\\n"]}'
    assert encode_json({1: "a", "b": {2: None}}) == '{"1":"a","b":{"2":null}}'
    assert encode_json(-(2**80)) == str(-(2**80))


def test_deeply_nested_data_is_refused_cleanly() -> None:
    deep: list[Any] = []
    node = deep
    for _ in range(50_000):
        child: list[Any] = []
        node.append(child)
        node = child
    with pytest.raises(InvalidArgument, match="not JSON-serialisable"):
        encode_json(deep)


def test_checked_names_are_remembered_but_bad_names_never_are() -> None:
    for _ in range(2):
        assert check_name("stream", "orders.v1") == "orders.v1"
        with pytest.raises(InvalidArgument):
            check_name("stream", "-bad")
    many = [f"consumer-{i}" for i in range(10_000)]
    assert [check_name("consumer", name) for name in many] == many
