"""Sink building blocks without a database: the row mapping and the sink-side frontier."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rheo_flow import Event, InvalidArgument, Lease
from rheo_flow.pipeline import Message
from rheo_flow.sinks import Column, MappingError, RowMapping, Span, event_columns
from rheo_flow.sinks._frontier import (
    GroupRows,
    by_group,
    plan_spans,
    progress_table_for,
    runs,
    split_replayed,
    union,
)
from rheo_flow.sinks._mapping import quote_table


def message(data: Any = None, *, seq: int = 1, part: int = 0, stream: str = "orders",
            group: str = "g", key: str | None = "k", headers: dict[str, str] | None = None,
            event_id: str | None = None) -> Message:
    event = Event(stream=stream, partition=part, sequence=seq, id=event_id or f"e-{part}-{seq}",
                  type="order.placed", data=data, key=key, headers=headers or {},
                  appended_at_ms=1_700_000_000_123)
    lease = Lease(lease_id="l" * 32, receipt="r", group=group, consumer_id="c", event=event,
                  attempt=2, deadline_ms=int(time.time() * 1000) + 60_000)
    return Message(lease)


# Mapping ---------------------------------------------------------------------------------


def test_event_columns_map_every_event_field() -> None:
    mapping = RowMapping(event_columns())
    m = message({"amount": 5, "note": "é"}, seq=7, part=2)
    row = mapping.row(m)
    assert mapping.names == ("event_id", "stream", "part", "seq", "type", "key", "appended_at",
                             "data")
    assert row[:6] == ("e-2-7", "orders", 2, 7, "order.placed", "k")
    assert row[6] == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
    assert json.loads(row[7]) == {"amount": 5, "note": "é"}
    assert "é" in row[7]  # not escaped: smaller rows


def test_data_paths_headers_functions_and_json_columns() -> None:
    mapping = RowMapping([
        Column("event_id", "VARCHAR", "event.id"),
        Column("customer", "VARCHAR", "data.customer.id"),
        Column("amount", "BIGINT", "data.amount"),
        Column("items", "JSON", "data.items"),
        Column("tenant", "VARCHAR", "event.headers.tenant"),
        Column("headers", "JSON", "event.headers"),
        Column("attempt", "INTEGER", "lease.attempt"),
        Column("ms", "BIGINT", "event.appended_at_ms"),
        Column("cents", "BIGINT", lambda m: m.data["amount"] * 100),
    ])
    m = message({"customer": {"id": "c-9"}, "amount": 3, "items": [1, {"a": None}]},
                headers={"tenant": "t1"})
    assert mapping.row(m) == ("e-0-1", "c-9", 3, '[1,{"a":null}]', "t1", '{"tenant":"t1"}', 2,
                              1_700_000_000_123, 300)


def test_transformed_data_is_what_gets_written() -> None:
    mapping = RowMapping([Column("event_id", "VARCHAR", "event.id"),
                          Column("total", "BIGINT", "data.total")])
    m = message({"amount": 3}).update_data(lambda d: {"total": d["amount"] * 2})
    assert mapping.row(m) == ("e-0-1", 6)


def test_missing_values_are_null_unless_required() -> None:
    mapping = RowMapping([
        Column("event_id", "VARCHAR", "event.id"),
        Column("a", "BIGINT", "data.a.b"),
        Column("j", "JSON", "data.missing"),
        Column("k", "VARCHAR", "event.key"),
    ])
    assert mapping.row(message([1, 2], key=None)) == ("e-0-1", None, None, None)
    assert mapping.row(message("scalar")) == ("e-0-1", None, None, "k")
    required = RowMapping([Column("event_id", "VARCHAR", "event.id"),
                           Column("amount", "BIGINT", "data.amount", nullable=False)])
    with pytest.raises(MappingError, match=r"column amount is required.*'data\.amount'"):
        required.row(message({"other": 1}))


def test_a_raising_source_or_unencodable_json_is_a_mapping_error() -> None:
    mapping = RowMapping([Column("event_id", "VARCHAR", "event.id"),
                          Column("x", "BIGINT", lambda m: 1 // 0)])
    with pytest.raises(MappingError, match="ZeroDivisionError"):
        mapping.row(message({}))
    nan = RowMapping([Column("event_id", "VARCHAR", "event.id"), Column("d", "JSON", "data")])
    with pytest.raises(MappingError, match="ValueError"):
        nan.row(message({"x": float("nan")}))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_json_columns_hold_the_same_value_as_the_standard_library_would_write(
        value: Any) -> None:
    # orjson writes the text; what it refuses (integers beyond 64 bits, non-string
    # keys) falls back to the standard library, so every value reads back alike.
    mapping = RowMapping([Column("event_id", "VARCHAR", "event.id"), Column("d", "JSON", "data")])
    text = mapping.row(message({"v": value}))[1]
    assert json.loads(text) == json.loads(json.dumps({"v": value}))


def test_json_columns_take_big_integers_and_refuse_what_json_cannot_carry() -> None:
    mapping = RowMapping([Column("event_id", "VARCHAR", "event.id"), Column("d", "JSON", "data")])
    assert mapping.row(message({"n": 2**70}))[1] == '{"n":1180591620717411303424}'
    assert mapping.row(message({1: "x"}))[1] == '{"1":"x"}'
    assert mapping.row(message({"a": None, "é": [1.5]}))[1] == '{"a":null,"é":[1.5]}'
    for bad in (float("inf"), [float("-inf")], {"x": object()}):
        with pytest.raises(MappingError):
            mapping.row(message({"v": bad}))
    # What handle_message put in the data that JSON has no type for, orjson writes.
    day = datetime(2026, 11, 30, 5, 21, tzinfo=UTC)
    assert mapping.row(message({"at": day}))[1] == '{"at":"2026-11-30T05:21:00+00:00"}'


def test_the_key_column_is_required_and_must_exist() -> None:
    mapping = RowMapping([Column("id", "VARCHAR", "data.id"), Column("n", "BIGINT", "data.n")],
                         key="id")
    assert mapping.key_index == 0
    assert not mapping.columns[0].nullable
    with pytest.raises(MappingError, match="column id is required"):
        mapping.row(message({"n": 1}))
    with pytest.raises(InvalidArgument, match="key column 'event_id' is not one of"):
        RowMapping([Column("id", "VARCHAR", "event.id")])


@pytest.mark.parametrize(("kwargs", "message_"), [
    ({"name": "1bad", "type": "BIGINT", "source": "event.id"}, "invalid column name"),
    ({"name": "a", "type": "", "source": "event.id"}, "type must be an SQL type"),
    ({"name": "a", "type": "INT; DROP TABLE x", "source": "event.id"}, "type must be"),
    ({"name": "a", "type": "INT", "source": "event.nope"}, "unknown source 'event.nope'"),
    ({"name": "a", "type": "INT", "source": "data."}, "unknown source"),
    ({"name": "a", "type": "INT", "source": "data..x"}, "unknown source"),
    ({"name": "a", "type": "INT", "source": 5}, "unknown source 5"),
    ({"name": "a", "type": "INT", "source": "data.a", "check": "a > 0; --"}, "check must be"),
])
def test_bad_columns_are_refused(kwargs: dict[str, Any], message_: str) -> None:
    with pytest.raises(InvalidArgument, match=message_):
        Column(**kwargs)


def test_bad_mappings_and_names_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="non-empty list of Column"):
        RowMapping([])
    with pytest.raises(InvalidArgument, match="appears twice"):
        RowMapping([Column("event_id", "VARCHAR", "event.id"), Column("EVENT_ID", "X", "data")])
    for bad in ("", "a.b.c", "x y", 'a"b', "1abc", "a;b"):
        with pytest.raises(InvalidArgument, match="invalid table name"):
            quote_table(bad)
    assert quote_table("s.t") == '"s"."t"'


def test_create_table_has_types_constraints_and_the_key() -> None:
    mapping = RowMapping([
        Column("event_id", "VARCHAR", "event.id"),
        Column("amount", "BIGINT", "data.amount", nullable=False, check="amount >= 0"),
    ])
    assert mapping.create_table('"t"') == (
        'CREATE TABLE IF NOT EXISTS "t" ("event_id" VARCHAR NOT NULL, '
        '"amount" BIGINT NOT NULL CHECK (amount >= 0), PRIMARY KEY ("event_id"))')


# Frontier spans ------------------------------------------------------------------------------


def test_runs_and_union() -> None:
    assert runs([5, 3, 4, 9, 9, 1]) == [(1, 1), (3, 5), (9, 9)]
    assert runs([]) == []
    assert union([Span(0, 5, 9), Span(0, 1, 4), Span(1, 1, 2), Span(0, 20, 30),
                  Span(0, 8, 12)]) == [Span(0, 1, 12), Span(0, 20, 30), Span(1, 1, 2)]


def test_plan_extends_the_span_a_batch_continues() -> None:
    plan = plan_spans([Span(0, 1, 100), Span(1, 1, 50)], {0: runs(range(101, 201))})
    assert plan.delete == [Span(0, 1, 100)]
    assert plan.insert == [Span(0, 1, 200)]


def test_plan_keeps_gaps_and_closes_them_later() -> None:
    first = plan_spans([], {0: runs([1, 2, 3, 5, 6])})
    assert first.insert == [Span(0, 1, 3), Span(0, 5, 6)]
    assert first.delete == []
    closing = plan_spans(first.insert, {0: [(4, 4)]})
    assert closing.insert == [Span(0, 1, 6)]
    assert sorted(closing.delete) == [Span(0, 1, 3), Span(0, 5, 6)]


def test_plan_leaves_alone_what_a_replay_already_covers() -> None:
    assert not plan_spans([Span(0, 1, 100)], {0: [(5, 6)]})


def test_split_replayed_finds_rows_inside_stored_spans() -> None:
    batch = [message(seq=s, part=p) for p, s in [(0, 4), (0, 11), (1, 3), (0, 12), (1, 9)]]
    (rows,) = by_group(batch)
    replayed, fresh = split_replayed([Span(0, 1, 11), Span(1, 5, 9)], rows)
    assert replayed == [0, 1, 4]
    assert fresh == {0: [(12, 12)], 1: [(3, 3)]}
    assert split_replayed([Span(0, 1, 3)], rows) == ([], {0: [(4, 4), (11, 12)],
                                                          1: [(3, 3), (9, 9)]})


def test_by_group_splits_mixed_streams_and_groups() -> None:
    batch = [message(seq=1), message(seq=1, group="h"), message(seq=2), message(seq=1,
                                                                                stream="s2")]
    groups = {(g.stream, g.group): g for g in by_group(batch)}
    assert set(groups) == {("orders", "g"), ("orders", "h"), ("s2", "g")}
    assert list(groups[("orders", "g")].indexes) == [0, 2]
    assert groups[("orders", "g")].bounds == (0, 3)


def test_the_progress_table_lives_in_the_table_schema() -> None:
    assert progress_table_for("orders") == "rheo_sink_progress"
    assert progress_table_for("wh.orders") == "wh.rheo_sink_progress"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(1, 60), max_size=12), max_size=8))
def test_merged_spans_hold_exactly_what_was_written(batches: list[list[int]]) -> None:
    stored: list[Span] = []
    written: set[int] = set()
    for seqs in batches:
        rows = GroupRows("s", "g", range(len(seqs)), [0] * len(seqs), seqs)
        replayed, fresh = split_replayed(stored, rows)
        assert {seqs[i] for i in replayed} == set(seqs) & written
        plan = plan_spans(stored, fresh)
        kept = [s for s in stored if s not in plan.delete]
        assert len(kept) + len(plan.delete) == len(stored)
        stored = kept + plan.insert
        written |= set(seqs)
        covered = {n for s in stored for n in range(s.lo, s.hi + 1)}
        assert covered == written
        assert stored == union(stored) or sorted(stored) == union(stored)
