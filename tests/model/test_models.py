"""Lease and Event: immutable, typed values however a backend builds them."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from rheo_flow import Event, Lease
from rheo_flow._model._event import decode_json, make_event, make_event_json
from rheo_flow._model._lease import make_lease


def _keyword_event(data: object = None) -> Event:
    return Event(stream="s", partition=1, sequence=7, id="e-7", type="t", data=data, key="k",
                 headers={"h": "v"}, appended_at_ms=1_700_000_000_000)


def _built_events(data: object, text: str) -> list[Event]:
    return [
        make_event("s", 1, 7, "e-7", "t", data, "k", {"h": "v"}, 1_700_000_000_000),
        make_event_json("s", 1, 7, "e-7", "t", text, "k", {"h": "v"}, 1_700_000_000_000),
        make_event_json("s", 1, 7, "e-7", "t", text.encode(), "k", {"h": "v"},
                        1_700_000_000_000),
    ]


def test_built_events_equal_keyword_events() -> None:
    data = {"a": [1, 2.5, None, True, "é"], "b": {"c": -3}}
    expected = _keyword_event(data)
    for event in _built_events(data, '{"a":[1,2.5,null,true,"é"],"b":{"c":-3}}'):
        assert type(event) is Event
        assert event == expected
        assert repr(event) == repr(expected)
        assert event.data == data
        assert event.appended_at == expected.appended_at
        assert dataclasses.astuple(event) == dataclasses.astuple(expected)


def test_lazy_data_is_decoded_once_and_kept() -> None:
    event = make_event_json("s", 0, 1, "e", "t", '{"x":[1]}', None, {}, 0)
    first = event.data
    assert first == {"x": [1]}
    assert event.data is first


def test_integers_beyond_64_bits_decode_exactly() -> None:
    big = 2**70 + 1
    event = make_event_json("s", 0, 1, "e", "t", f'{{"n":{big},"m":-{big}}}', None, {}, 0)
    assert event.data == {"n": big, "m": -big}
    assert decode_json(b"[12345678901234567890123]") == [12345678901234567890123]
    assert decode_json("1.5") == 1.5


@pytest.mark.parametrize("field", ["stream", "sequence", "data", "headers", "appended_at_ms"])
def test_event_assignment_is_refused(field: str) -> None:
    events = [_keyword_event({"x": 1}), *_built_events({"x": 1}, '{"x":1}')]
    for event in events:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(event, field, 0)
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(event, field)
        # Python 3.11's frozen slotted dataclasses answer TypeError here, later ones
        # AttributeError: either way nothing is added.
        with pytest.raises((AttributeError, TypeError)):
            event.extra = 1  # type: ignore[attr-defined]
    assert events[2].data == {"x": 1}


def _leases() -> list[Lease]:
    event = make_event_json("s", 2, 9, "e-9", "t", '{"x":1}', None, {}, 5)
    return [
        Lease(lease_id="l-1", receipt="2-9-1", group="g", consumer_id="c", event=event,
              attempt=1, deadline_ms=1_000),
        make_lease("l-1", "2-9-1", "g", "c", event, 1, 1_000),
    ]


@pytest.mark.parametrize("field", ["lease_id", "receipt", "group", "event", "attempt",
                                   "deadline_ms"])
def test_lease_assignment_is_refused(field: str) -> None:
    for lease in _leases():
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(lease, field, "x")
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(lease, field)


def test_built_lease_behaves_like_a_keyword_lease() -> None:
    keyword, built = _leases()
    assert type(built) is Lease
    assert built == keyword
    assert repr(built) == repr(keyword)
    assert (built.stream, built.partition, built.sequence) == ("s", 2, 9)
    assert built.deadline == keyword.deadline
    forged = dataclasses.replace(built, receipt="forged")
    assert forged.receipt == "forged"
    assert forged != built
    assert dataclasses.replace(built.event, sequence=10).data == {"x": 1}


def test_models_survive_pickling() -> None:
    for lease in _leases():
        copy = pickle.loads(pickle.dumps(lease))
        assert copy == lease
        assert copy.event.data == {"x": 1}


def test_fast_built_records_results_and_outcomes_are_the_real_frozen_types() -> None:
    from rheo_flow._model._append_records import AppendRecord, make_append_record
    from rheo_flow._model._settle_results import SettleResult, settle_ok
    from rheo_flow._runtime._settle_calls import SettleOutcome, _outcome

    record = make_append_record(1, "id", "t", None, {"x": 1}, '{"x":1}', {})
    assert type(record) is AppendRecord
    assert record == AppendRecord(partition=1, id="id", type="t", key=None, data={"x": 1},
                                  data_json='{"x":1}', headers={})
    assert dataclasses.replace(record, headers={"h": "v"}).headers == {"h": "v"}
    result = settle_ok("l-1")
    assert type(result) is SettleResult
    assert result == SettleResult.success("l-1")
    assert result.ok
    assert result.kind is None
    lease = _leases()[1]
    outcome = _outcome("ack", lease, result)
    assert type(outcome) is SettleOutcome
    assert outcome == SettleOutcome("ack", lease, result)
    for value, field in ((record, "partition"), (result, "lease_id"), (outcome, "op")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, field, None)
    # One builder makes them all, and refuses a class it would build wrongly.
    from rheo_flow._model._builders import positional_builder

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            raise AssertionError("never skipped")

    for cls, problem in ((NoSlots, "not a slotted dataclass"), (Checked, "__post_init__")):
        with pytest.raises(TypeError, match=problem):
            positional_builder(cls, "doc")
    assert positional_builder(SettleResult, "doc")("l-2", None, True).repeated
