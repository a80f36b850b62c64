"""The JSON text of a sink's JSON columns (rheo_flow.sinks._json).

What a pipeline handler puts in the data is written whatever else the data holds: a
date beside a ``None``, or beside a string containing "null", is encoded like a date
alone (it used to fall back to the standard library, which refuses dates, so such rows
were dead-lettered as ``sink_invalid``). Non-finite floats and types JSON has no form
for still raise ValueError and TypeError.
"""

from __future__ import annotations

import enum
import json
import math
import time
import uuid
from dataclasses import dataclass, field, fields
from datetime import UTC, date, datetime, timedelta, timezone
from datetime import time as dtime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rheo_flow import Event, Lease
from rheo_flow.pipeline import Message
from rheo_flow.sinks import Column, MappingError, RowMapping
from rheo_flow.sinks._json import dumps

DAY = date(2026, 12, 2)


def message(data: Any, *, seq: int = 1) -> Message:
    now = int(time.time() * 1000)
    event = Event("orders", 0, seq, f"e-{seq}", "t", data, None, {}, now)
    return Message(Lease(lease_id=f"{seq:032x}", receipt="r", group="g", consumer_id="c",
                         event=event, attempt=1, deadline_ms=now + 60_000))


# The reported bug ------------------------------------------------------------------------


@pytest.mark.parametrize("data", [
    {"day": DAY, "note": None},
    {"day": DAY, "note": "null"},
    {"day": DAY, "note": "annulled"},
    {"day": DAY, "items": [None, {"x": None}]},
], ids=["none", "null-text", "null-inside-text", "nested-none"])
def test_a_date_beside_null_or_null_text_is_encoded(data: dict[str, Any]) -> None:
    text = dumps(data)
    expected = {**data, "day": "2026-12-02"}
    assert json.loads(text) == expected
    mapping = RowMapping([Column("event_id", "VARCHAR", "event.id"), Column("d", "JSON", "data")])
    assert json.loads(mapping.row(message(data))[1]) == expected


def test_orjson_types_beside_what_only_the_standard_library_writes() -> None:
    # Integers beyond 64 bits and non-string keys go to the standard library, which
    # must still write the dates, UUIDs, enums and dataclasses orjson writes.
    u = uuid.UUID(int=7)
    assert dumps({"n": 2**70, "day": DAY}) == '{"n":1180591620717411303424,"day":"2026-12-02"}'
    assert dumps({1: DAY, "u": u}) == '{"1":"2026-12-02","u":"' + str(u) + '"}'
    assert dumps([Color.BIG, Point(2**65, None)]) == f'[{2**70},{{"x":{2**65},"y":null}}]'


def test_non_finite_floats_are_refused_whatever_else_the_data_holds() -> None:
    for bad in ({"day": DAY, "x": math.nan}, [DAY, None, -math.inf], {"n": 2**70, "x": math.inf},
                {1: math.nan, "day": DAY}, Point(math.nan, DAY), [Color.NAN, DAY],
                {math.nan: 1}):
        with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
            dumps(bad)


def test_unsupported_types_keep_the_typed_error() -> None:
    for bad, name in ((Decimal("1.5"), "Decimal"), (b"x", "bytes"), ({1, 2}, "set"),
                      (object(), "object"), (dtime(1, tzinfo=UTC), "time"),
                      (timedelta(1), "timedelta")):
        for value in (bad, {"day": DAY, "v": bad, "n": None}, [2**70, bad], {1: bad}):
            with pytest.raises(TypeError, match=f"Object of type {name} is not JSON serializable"):
                dumps(value)
    with pytest.raises(TypeError, match="keys must be str, int, float, bool or None"):
        dumps({DAY: 1})


async def test_a_sink_writes_rows_holding_dates_and_nulls(tmp_path: Path) -> None:
    pytest.importorskip("duckdb")
    from rheo_flow import NewEvent, Rheo
    from rheo_flow.pipeline import Pipeline, Processors
    from rheo_flow.sinks import DuckDBSink, SinkHandler, sink_batcher

    class Dated(SinkHandler):
        async def handle_message(self, processor: str, message: Message,
                                 context: Any) -> Message:
            return message.update_data(lambda d: {**d, "day": DAY})

    notes: list[Any] = [None, "null", "plain", "annulled", None, "x"]
    columns = [Column("event_id", "VARCHAR", "event.id"), Column("data", "JSON", "data")]
    async with Rheo("memory://") as rheo, DuckDBSink(tmp_path / "wh.duckdb", table="t",
                                                     columns=columns) as sink:
        await rheo.create_stream("orders", partitions=1)
        await rheo.append("orders", [NewEvent("t", {"i": i, "note": n}, id=f"e{i}")
                                     for i, n in enumerate(notes)])
        pipeline = Pipeline(rheo, stream="orders", group="g", handler=Dated(sink),
                            processors=Processors(concurrency=1),
                            batchers={"default": sink_batcher(max_rows=100, max_age=0.05)})
        assert await pipeline.run_until_empty(timeout=30)
        assert await rheo.dead_letters("orders", "g") == []
        rows = await sink.query("SELECT event_id, data FROM t ORDER BY event_id")
        assert [(r[0], json.loads(r[1])) for r in rows] == [
            (f"e{i}", {"i": i, "note": n, "day": "2026-12-02"}) for i, n in enumerate(notes)]


# Every supported type, by property ----------------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    BIG = 2**70
    DAY = date(2000, 1, 1)
    NAN = math.nan


class Level(enum.IntEnum):
    LOW = 1


@dataclass
class Point:
    x: Any
    y: Any
    _hidden: Any = field(default=math.nan)  # orjson leaves out names starting with _


@dataclass(slots=True)
class Pair:
    a: Any
    _b: Any = math.inf


class Num(float):
    """A float subclass (orjson refuses it; the standard library writes it)."""


def _key(k: Any) -> str:
    if isinstance(k, str):
        return k
    if k is None or isinstance(k, bool):
        return json.dumps(k)
    if isinstance(k, int):
        return str(int(k))
    if not math.isfinite(k):
        raise ValueError("non-finite key")
    return repr(float(k))


def canonical(value: Any) -> Any:
    """The JSON value ``value`` should read back as; ValueError for a non-finite float."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("non-finite")
        return float(value)
    if isinstance(value, dict):
        return {_key(k): canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    if isinstance(value, enum.Enum):
        return canonical(value.value)
    if isinstance(value, Point | Pair):
        return {f.name: canonical(getattr(value, f.name)) for f in fields(value)
                if not f.name.startswith("_")}
    if isinstance(value, datetime | date | dtime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise AssertionError(f"no canonical form for {value!r}")


_texts = st.text(max_size=8) | st.sampled_from(["null", "NULL", "annulled", "null null", ""]) \
    | st.builds(lambda a, b: a + "null" + b, st.text(max_size=3), st.text(max_size=3))
_offsets = st.integers(-23 * 60 - 59, 23 * 60 + 59).map(
    lambda m: timezone(timedelta(minutes=m)) if m else UTC)
_finite = st.floats(allow_nan=False, allow_infinity=False)
_leaves = (
    st.none() | st.booleans() | st.integers() | st.integers(-(2**63), 2**64 - 1) | _texts
    | _finite | _finite.map(Num)
    | st.dates() | st.datetimes() | st.datetimes(timezones=_offsets) | st.times()
    | st.uuids() | st.sampled_from([Color.RED, Color.BIG, Color.DAY, Level.LOW])
)
_keys = _texts | st.integers() | st.booleans() | st.none() | _finite


def _values(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(_texts, inner, max_size=4)
        | st.dictionaries(_keys, inner, max_size=3)
        | st.builds(Point, inner, inner) | st.builds(Pair, inner),
        max_leaves=16,
    )


_non_finite = st.sampled_from([math.nan, math.inf, -math.inf, Color.NAN])


@settings(max_examples=500, deadline=None)
@given(_values(_leaves))
def test_every_supported_value_encodes_to_its_canonical_form(value: Any) -> None:
    text = dumps(value)
    assert json.loads(text) == canonical(value)
    assert text == dumps(value)  # the same text every time


@settings(max_examples=300, deadline=None)
@given(_values(_leaves | _non_finite))
def test_a_non_finite_float_anywhere_is_a_value_error(value: Any) -> None:
    try:
        expected = canonical(value)
    except ValueError:
        with pytest.raises(ValueError, match="Out of range float values"):
            dumps(value)
    else:
        assert json.loads(dumps(value)) == expected


@settings(max_examples=200, deadline=None)
@given(_values(_leaves), st.sampled_from([Decimal("2.5"), b"raw", frozenset({1}), object()]),
       st.integers(0, 3))
def test_an_unsupported_value_anywhere_is_a_type_error(value: Any, bad: Any, where: int) -> None:
    holder = ([value, bad], {"v": value, "bad": bad}, Point(value, bad), {1: value, 2: bad})
    with pytest.raises(TypeError, match=f"Object of type {type(bad).__name__} is not JSON "
                                        "serializable"):
        dumps(holder[where])


def test_a_mapping_error_names_the_type() -> None:
    mapping = RowMapping([Column("event_id", "VARCHAR", "event.id"), Column("d", "JSON", "data")])
    with pytest.raises(MappingError, match="TypeError: Object of type Decimal"):
        mapping.row(message({"day": DAY, "amount": Decimal("1.5"), "note": None}))
