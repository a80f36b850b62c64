"""Input validation: bad input raises InvalidArgument naming the problem and changes nothing."""

from __future__ import annotations

import math
from typing import Any

import pytest

from rheo_flow import InvalidArgument, NewEvent, Query, Rheo, RheoError, UnknownStream
from rheo_flow._model._query import decode_cursor
from rheo_flow._model._validation import (
    MAX_DELAY_MS,
    MAX_REASON,
    MAX_SEQUENCE,
    check_duration_ms,
    check_event_id,
    check_headers,
    check_key,
    check_lease_ms,
    check_name,
    check_non_negative_int,
    check_partition,
    check_positive_int,
    check_reason,
    check_sequence,
    check_start,
    check_text,
    check_timeout_s,
    check_type,
    encode_json,
    invalid_text,
)


def test_invalid_argument_is_a_value_error_and_a_rheo_error() -> None:
    assert issubclass(InvalidArgument, ValueError)
    assert issubclass(InvalidArgument, RheoError)
    assert issubclass(UnknownStream, InvalidArgument)


@pytest.mark.parametrize("name", ["orders", "a", "A1", "orders.v2", "billing-eu_1", "x" * 128])
def test_valid_names(name: str) -> None:
    assert check_name("stream", name) == name


@pytest.mark.parametrize(
    "name", ["", "-orders", ".hidden", "_x", "x" * 129, "has space", "émile", "a/b", "a:b", None, 7,
             "abc\n", "abc\r\n", "\nabc", "ab\nc", "x" * 128 + "\n"]
)
def test_invalid_names(name: object) -> None:
    with pytest.raises(InvalidArgument, match=r"invalid group name .*1-128 characters"):
        check_name("group", name)


@pytest.mark.parametrize("value", [0, -1, True, 1.0, "3", None])
def test_positive_int_refuses(value: object) -> None:
    with pytest.raises(InvalidArgument, match="limit must be a positive integer"):
        check_positive_int("limit", value)


def test_positive_int_maximum() -> None:
    assert check_positive_int("limit", 10, maximum=10) == 10
    with pytest.raises(InvalidArgument, match="limit must be at most 10, got 11"):
        check_positive_int("limit", 11, maximum=10)


def test_non_negative_int() -> None:
    assert check_non_negative_int("delay_ms", 0) == 0
    for bad in (-1, False, 0.5):
        with pytest.raises(InvalidArgument, match="delay_ms must be a non-negative integer"):
            check_non_negative_int("delay_ms", bad)


@pytest.mark.parametrize("value", [-1, 4, True, "1", None])
def test_partition_out_of_range(value: object) -> None:
    with pytest.raises(InvalidArgument, match=r"partitions 0\.\.3"):
        check_partition(value, 4)


def test_lease_ms_bounds() -> None:
    assert check_lease_ms(10) == 10
    assert check_lease_ms(86_400_000) == 86_400_000
    with pytest.raises(InvalidArgument, match="at least 10"):
        check_lease_ms(9)
    with pytest.raises(InvalidArgument, match="at most 86400000"):
        check_lease_ms(86_400_001)


@pytest.mark.parametrize("reason", ["", "   ", None, 3, "x" * (MAX_REASON + 1)])
def test_invalid_reasons(reason: object) -> None:
    with pytest.raises(InvalidArgument, match="reason"):
        check_reason(reason)


def test_valid_reason() -> None:
    assert check_reason("x" * MAX_REASON) == "x" * MAX_REASON


@pytest.mark.parametrize("value", ["", None, 5, "x" * 201])
def test_invalid_event_ids(value: object) -> None:
    with pytest.raises(InvalidArgument, match="event id"):
        check_event_id(value)


@pytest.mark.parametrize("value", ["", None, b"t", "t" * 257])
def test_invalid_types(value: object) -> None:
    with pytest.raises(InvalidArgument, match="event type"):
        check_type(value)


def test_keys() -> None:
    assert check_key(None) is None
    assert check_key("") == ""
    with pytest.raises(InvalidArgument, match="key must be a string or None, got int"):
        check_key(5)


@pytest.mark.parametrize("headers", [None, [("a", "b")], {"a": 1}, {1: "a"}, {"a": None}])
def test_invalid_headers(headers: object) -> None:
    with pytest.raises(InvalidArgument, match="headers"):
        check_headers(headers)


def test_headers_are_copied() -> None:
    source = {"trace": "abc"}
    out = check_headers(source)
    assert out == source
    assert out is not source


@pytest.mark.parametrize(
    "data",
    [math.nan, math.inf, {"x": -math.inf}, {1, 2}, b"bytes", object(), {"nested": [complex(1, 2)]}],
    ids=["nan", "inf", "neg-inf", "set", "bytes", "object", "complex"],
)
def test_data_that_json_cannot_carry(data: Any) -> None:
    with pytest.raises(InvalidArgument, match="event data is not JSON-serialisable"):
        encode_json(data)


def _nested(depth: int) -> Any:
    data: Any = "leaf"
    for i in range(depth):
        data = [data] if i % 2 else {"k": data}
    return data


@pytest.mark.parametrize("depth", [255, 1_000, 10_000])
def test_data_nested_too_deeply(depth: int) -> None:
    with pytest.raises(InvalidArgument,
                       match=r"not JSON-serialisable: nested too deeply \(at most 254"):
        encode_json(_nested(depth))


def test_data_nested_254_levels_is_fine() -> None:
    assert encode_json(_nested(254)).count("[") == 127


@pytest.mark.parametrize(
    "data",
    ["\ud800", {"k": "a\udfffb"}, {"\ud83d": 1}, ["ok", "\udc00"],
     {"big": 2**70, "s": "\ud800"}, {"none": None, "s": "\ud800"}],
    ids=["str", "value", "key", "list", "big-int-path", "null-path"],
)
def test_data_with_a_lone_surrogate(data: Any) -> None:
    with pytest.raises(InvalidArgument, match="event data is not valid Unicode text"):
        encode_json(data)


def test_text_checks() -> None:
    assert check_text("key", "plain") == "plain"
    assert check_text("key", "\U0001f680 émile") == "\U0001f680 émile"
    with pytest.raises(InvalidArgument, match=r"key is not valid Unicode text: .*'\\ud800' at "
                                              "position 2"):
        check_text("key", "ab\ud800")
    with pytest.raises(InvalidArgument, match="reason is not valid Unicode"):
        check_reason("failed \udc00")
    with pytest.raises(InvalidArgument, match="header value is not valid Unicode"):
        check_headers({"h": "\ud800"})


def test_invalid_text_finds_an_encoding_error_in_a_chain() -> None:
    try:
        "\ud800".encode()
    except UnicodeEncodeError as inner:
        wrapped = RuntimeError("driver: invalid input")
        wrapped.__cause__ = inner
        error = invalid_text(wrapped)
    assert isinstance(error, InvalidArgument)
    assert "lone surrogate" in str(error)
    assert invalid_text(RuntimeError("something else")) is None
    assert invalid_text(TypeError("str is not valid UTF-8: surrogates not allowed")) is not None


def test_sequence_bounds() -> None:
    assert check_sequence("from_sequence", MAX_SEQUENCE) == 2**63 - 1
    assert check_sequence("to_sequence", 0) == 0
    for bad in (2**63, 2**70, -1, True, 1.0, "1"):
        with pytest.raises(InvalidArgument, match=r"from_sequence must be an integer in "
                                                  r"0\.\.9223372036854775807 \(2\*\*63-1\)"):
            check_sequence("from_sequence", bad)
    with pytest.raises(InvalidArgument, match=r"in 1\.\."):
        check_sequence("from_sequence", 0, minimum=1)
    check_start("start", "latest")
    check_start("start", MAX_SEQUENCE)
    with pytest.raises(InvalidArgument, match=r"start must be .* a sequence in 0\.\."):
        check_start("start", 2**63)


def test_duration_bounds() -> None:
    assert MAX_DELAY_MS == 2**31 - 1
    assert check_duration_ms("delay_ms", MAX_DELAY_MS) == MAX_DELAY_MS
    for bad in (2**31, 2**70, -1, False, 0.5):
        with pytest.raises(InvalidArgument,
                           match=r"delay_ms must be an integer number of milliseconds in "
                                 r"0\.\.2147483647"):
            check_duration_ms("delay_ms", bad)
    assert check_timeout_s("timeout", 0) == 0.0
    assert check_timeout_s("timeout", 1.5) == 1.5
    for bad_timeout in (math.inf, math.nan, -0.1, 3e6, True, "1"):
        with pytest.raises(InvalidArgument, match="timeout must be a number of seconds"):
            check_timeout_s("timeout", bad_timeout)


@pytest.mark.parametrize(
    "cursor", [f"v1.0.{2**63}", f"v1.{2**70}.1", "v1.0.\uff11\uff12", "v1.0.99999999999999999999"]
)
def test_cursor_out_of_range(cursor: str) -> None:
    with pytest.raises(InvalidArgument, match="malformed query cursor"):
        decode_cursor(cursor)


def test_runtime_delays_are_bounded() -> None:
    from rheo_flow import Retry
    from rheo_flow.pipeline._acknowledger import Acknowledger
    from rheo_flow.pipeline._message import Message

    class Discarding(Acknowledger):
        async def _ack(self, messages: list[Message]) -> None:
            return None

        async def _nack(self, messages: list[Message], reason: str, delay_ms: int,
                        error: str | None) -> None:
            return None

        async def _reject(self, messages: list[Message], reason: str,
                          error: str | None) -> None:
            return None

    assert Retry("later", delay_ms=MAX_DELAY_MS).delay_ms == MAX_DELAY_MS
    with pytest.raises(InvalidArgument, match=r"Retry delay_ms must be .* 0\.\.2147483647"):
        Retry("later", delay_ms=2**70)
    assert Discarding(retry_delay_ms=MAX_DELAY_MS).retry_delay_ms == MAX_DELAY_MS
    with pytest.raises(InvalidArgument, match=r"retry_delay_ms must be .* 0\.\.2147483647"):
        Discarding(retry_delay_ms=2**31)


async def test_nack_with_an_out_of_range_delay_settles_nothing(rheo: Rheo) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", {"type": "t"})
    leases = await rheo.fetch("s", "g")
    with pytest.raises(InvalidArgument, match=r"delay_ms must be .* 0\.\.2147483647, got 2361"):
        await rheo.nack(leases, "later", delay_ms=2**71)
    [result] = await rheo.ack(leases)
    assert result.ok
    assert not result.repeated


def test_json_encoding_is_compact_and_unicode() -> None:
    assert encode_json({"a": [1, 2.5, None, True], "b": "ü"}) == '{"a":[1,2.5,null,true],"b":"ü"}'


# Through the facade: nothing is written when any event of a batch is invalid. ---


async def _high_water(rheo: Rheo) -> int:
    return sum((await rheo.high_water("s")).values())


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ({"type": "t", "colour": "red"}, "unknown event fields: colour"),
        ({"data": 1}, "an event needs a 'type'"),
        (NewEvent("t", partition=2), "out of range"),
        (NewEvent("t", data={"when": object()}), "not JSON"),
        (NewEvent("t", headers={"h": 1}), "headers"),  # type: ignore[dict-item]
        (NewEvent("", data=1), "event type"),
        (NewEvent("t", key=3), "key must be"),  # type: ignore[arg-type]
        (NewEvent("t", id=""), "event id"),
        ("not an event", "events must be NewEvent or mappings"),
    ],
)
async def test_bad_append_writes_nothing(rheo: Rheo, events: Any, message: str) -> None:
    await rheo.create_stream("s", partitions=2)
    batch = [NewEvent("fine", {"n": 1}), events]
    with pytest.raises(InvalidArgument, match=message):
        await rheo.append("s", batch)
    assert await _high_water(rheo) == 0


async def test_facade_limits(rheo: Rheo) -> None:
    with pytest.raises(InvalidArgument, match="partitions must be at most 4096"):
        await rheo.create_stream("s", partitions=4097)
    with pytest.raises(InvalidArgument, match="partitions must be a positive integer"):
        await rheo.create_stream("s", partitions=0)
    await rheo.create_stream("s", partitions=2)
    with pytest.raises(InvalidArgument, match="limit must be at most 10000"):
        await rheo.fetch("s", "g", limit=10_001)
    with pytest.raises(InvalidArgument, match="limit must be a positive integer"):
        await rheo.fetch("s", "g", limit=0)
    with pytest.raises(InvalidArgument, match="lease_ms"):
        await rheo.fetch("s", "g", lease_ms=5)
    with pytest.raises(InvalidArgument, match="partitions must be"):
        await rheo.fetch("s", "g", partitions="0")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="out of range"):
        await rheo.fetch("s", "g", partitions=[2])
    with pytest.raises(InvalidArgument, match="max_attempts"):
        await rheo.create_group("s", "g", max_attempts=0)
    with pytest.raises(InvalidArgument, match="start must be"):
        await rheo.create_group("s", "g", start="newest")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="invalid consumer name"):
        await rheo.fetch("s", "g", consumer_id="bad id")
    with pytest.raises(InvalidArgument, match="malformed query cursor"):
        await rheo.query_page(Query(stream="s"), cursor="v2.0.0")


async def test_settle_input_is_checked_before_the_backend(rheo: Rheo) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", {"type": "t"})
    leases = await rheo.fetch("s", "g")
    with pytest.raises(InvalidArgument, match="reason must be a non-empty string"):
        await rheo.nack(leases, "")
    with pytest.raises(InvalidArgument, match="reason must be a non-empty string"):
        await rheo.reject(leases, "  ")
    with pytest.raises(InvalidArgument, match="delay_ms"):
        await rheo.nack(leases, "later", delay_ms=-1)
    with pytest.raises(InvalidArgument, match="expected Lease objects, got str"):
        await rheo.ack(["lease-1"])  # type: ignore[list-item]
    # The lease is untouched by the refused calls.
    [result] = await rheo.ack(leases)
    assert result.ok
    assert not result.repeated


async def test_unknown_stream(rheo: Rheo) -> None:
    with pytest.raises(UnknownStream, match="unknown stream 'missing'"):
        await rheo.append("missing", {"type": "t"})


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "not a backend URL"),
        ("events.db", "not a backend URL"),
        ("ftp://user:hunter2@host/x", "unknown backend scheme 'ftp'"),
        ("ftp://user:hunter2@host/x", r"ftp://user:\*\*\*@host/x"),
    ],
)
def test_bad_urls_and_no_secrets_in_messages(url: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as info:
        Rheo(url)
    assert "hunter2" not in str(info.value)


def test_backend_must_be_url_or_backend() -> None:
    with pytest.raises(InvalidArgument, match="backend must be a URL or a Backend, not int"):
        Rheo(42)  # type: ignore[arg-type]
