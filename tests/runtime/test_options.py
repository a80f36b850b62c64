"""One options schema (``rheo_flow._runtime._options``) for every runtime.

An option accepted by several runtimes has the same bounds in each: every way of
building each runtime is driven with the option's boundary values (min, min - 1,
max, max + 1, wrong types) and must accept or refuse them alike, with
InvalidArgument naming the option. Keys that look like misspelt options are
refused, with the closest option as a suggestion, wherever options come in as
keyword dicts; the schema's defaults are the code's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest

from rheo_flow import (
    ACK,
    Ack,
    Consumer,
    Event,
    Group,
    InvalidArgument,
    NewEvent,
    Producer,
    RetryPolicy,
    Rheo,
    consumer,
)
from rheo_flow._runtime._options import (
    BATCHER,
    CONSUMER,
    GROUP,
    MAX_DEMAND,
    OPTIONS,
    PIPELINE,
    PROCESSORS,
    PRODUCER,
    REQUIRED,
    RUNTIMES,
    Option,
    validate,
)
from rheo_flow.pipeline import Batcher, Message, Pipeline, Processors

WaitUntil = Callable[..., Awaitable[None]]

Build = Callable[[Rheo, dict[str, Any]], object]


class Plain(Consumer):
    stream = "orders"
    group = "billing"

    async def handle_event(self, event: Event, context: Mapping[str, Any]) -> Ack:
        return ACK


class Echo:
    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        return message


async def _handler(event: Event, context: Mapping[str, Any]) -> Ack:
    return ACK


def _with_stream(options: dict[str, Any]) -> dict[str, Any]:
    return {"stream": "orders", "group": "billing", **options}


def _subclass(options: dict[str, Any]) -> Consumer:
    return type("Configured", (Plain,), dict(options))()


# Every way of building a runtime that takes options: (label, runtime, build).
ROUTES: list[tuple[str, str, Build]] = [
    ("Consumer(...)", "Consumer", lambda rheo, kw: Plain(**kw).start(rheo)),
    ("@consumer(...)", "Consumer",
     lambda rheo, kw: consumer(**_with_stream(kw))(_handler).start(rheo)),
    ("class attribute", "Consumer", lambda rheo, kw: _subclass(kw).start(rheo)),
    ("start(rheo, ...)", "Group", lambda rheo, kw: Plain().start(rheo, **kw)),
    ("Group(...)", "Group", lambda rheo, kw: Group(rheo, Plain(), **kw)),
    ("Producer(...)", "Producer",
     lambda rheo, kw: Producer(rheo, **{"stream": "orders", "group": "billing", **kw})),
    ("Pipeline(...)", "Pipeline",
     lambda rheo, kw: Pipeline(rheo, **{"stream": "orders", "group": "billing",
                                        "handler": Echo(), **kw})),
    ("Processors(...)", "Processors", lambda rheo, kw: Processors(**kw)),
    ("Batcher(...)", "Batcher", lambda rheo, kw: Batcher(**kw)),
]


def _routes_of(name: str) -> list[tuple[str, str, Build, str]]:
    """The routes taking option ``name`` (or its counterpart: a pipeline's
    ``max_inflight`` is the others' ``max_demand``), with the name each uses."""
    found = []
    for label, runtime, build in ROUTES:
        names = RUNTIMES[runtime].names
        if name in names:
            found.append((label, runtime, build, name))
        else:
            renamed = [n for n in names if OPTIONS[n].counterpart == name]
            if renamed:
                found.append((label, runtime, build, renamed[0]))
    return found


def _context(runtime: str, name: str) -> dict[str, Any]:
    """Other options a value needs to be valid: room under ``max_demand`` (or
    ``max_inflight``) where a rule bounds the option by it."""
    rules = RUNTIMES[runtime].rules
    for bound in ("max_demand", "max_inflight"):
        if any(rule.option == name and rule.at_most == bound for rule in rules):
            return {bound: MAX_DEMAND}
    return {}


SHARED = sorted({name for option in OPTIONS.values()
                 for name in [option.counterpart or option.name]
                 if len({runtime for _, runtime, _, _ in _routes_of(name)} - {"Group"}) > 1})
"""Options taken by more than one runtime (Consumer and Group count as one)."""


def _boundary_values(option: Option) -> list[tuple[str, object, bool]]:
    """(case, value, accepted) for an option: its bounds and beyond, and wrong types."""
    if option.kind == "int":
        assert option.minimum is not None
        assert option.maximum is not None
        low, high = int(option.minimum), int(option.maximum)
        return [("min", low, True), ("min - 1", low - 1, False), ("max", high, True),
                ("max + 1", high + 1, False), ("a str", str(low), False),
                ("a float", float(low), False), ("a bool", True, False)]
    if option.kind == "seconds":
        low = option.minimum
        assert low is not None
        cases: list[tuple[str, object, bool]] = [
            ("min", low, not option.exclusive_minimum),
            ("min - 0.001", low - 0.001, False), ("an int", 1, True),
            ("NaN", math.nan, False), ("a str", "1", False), ("a bool", True, False)]
        if option.maximum is None:
            return [*cases, ("infinity", math.inf, True)]
        return [*cases, ("max", option.maximum, True), ("max + 0.001", option.maximum + 0.001,
                                                        False), ("infinity", math.inf, False)]
    if option.kind == "name":
        return [("a name", "orders-1", True), ("128 characters", "a" * 128, True),
                ("129 characters", "a" * 129, False), ("a space", "bad name", False),
                ("empty", "", False), ("an int", 5, False)]
    if option.kind == "partitions":
        return [("all", "all", True), ("a list", [0, 2], True), ("repeats", [1, 0, 1], True),
                ("a tuple", (0,), True), ("a set", {0, 1}, True), ("empty", [], False),
                ("another word", "some", False), ("negative", [-1], False),
                ("a bool", [True], False), ("an int", 5, False)]
    if option.kind == "instance":
        assert option.instance_of is RetryPolicy, option.name
        return [("an instance", RetryPolicy(), True), ("the class", RetryPolicy, False),
                ("an int", 1_000, False)]
    if option.name == "partition_by":
        return [("key", "key", True), ("partition", "partition", True),
                ("a function", lambda m: m.key, True), ("another word", "color", False),
                ("an int", 5, False)]
    raise AssertionError(f"no boundary values for {option.name}")


def _cases() -> list[Any]:
    params = []
    for name in SHARED:
        option = OPTIONS[name]
        if option.kind in ("object", "callable", "choice", "text"):
            continue
        values = _boundary_values(option)
        if all(used == name for *_, used in _routes_of(name)):
            values.append(("None", None, option.nullable))
        for case, value, accepted in values:
            params.append(pytest.param(name, value, accepted, id=f"{name}-{case}"))
    return params


def _outcome(build: Build, rheo: Rheo, options: dict[str, Any]) -> str:
    try:
        build(rheo, options)
    except InvalidArgument as exc:
        return f"InvalidArgument: {exc}"
    return "accepted"


def test_shared_options_are_the_expected_ones() -> None:
    assert set(SHARED) == {
        "stream", "group", "max_demand", "concurrency", "fetch_size", "lease_ms", "poll_ms",
        "consumer_id", "partitions", "max_attempts", "ordering", "retry_policy",
        "shutdown_timeout", "partition_by", "models", "upcasters"}


@pytest.mark.parametrize(("name", "value", "accepted"), _cases())
async def test_shared_option_has_the_same_bounds_everywhere(
        rheo: Rheo, name: str, value: object, accepted: bool) -> None:
    outcomes = {}
    for label, runtime, build, used in _routes_of(name):
        options = {**_context(runtime, used), used: value}
        outcomes[label] = _outcome(build, rheo, options)
        if accepted:
            assert outcomes[label] == "accepted", (label, outcomes[label])
        else:
            assert outcomes[label].startswith("InvalidArgument"), (label, outcomes[label])
            message = outcomes[label]
            assert used in message or name in message, (label, message)
            option = OPTIONS[used]
            if option.kind in ("int", "seconds"):
                assert option.bounds() in message, message
                assert repr(value) in message, message
    assert len(outcomes) > 1


@pytest.mark.parametrize("runtime", [r.name for r in RUNTIMES.values()])
async def test_every_numeric_option_is_bounded_as_declared(rheo: Rheo, runtime: str) -> None:
    """Options of one runtime only (batch_size, batch_timeout, retry_delay_ms, ...) too."""
    build = next(build for _, name, build in ROUTES if name == runtime)
    for name in RUNTIMES[runtime].names:
        option = OPTIONS[name]
        if option.kind not in ("int", "seconds"):
            continue
        for case, value, accepted in _boundary_values(option):
            outcome = _outcome(build, rheo, {**_context(runtime, name), name: value})
            assert (outcome == "accepted") is accepted, (runtime, name, case, outcome)


# Unknown keys ---------------------------------------------------------------------------

KEYWORD_ROUTES = [route for route in ROUTES if route[1] in ("Consumer", "Group")]


@pytest.mark.parametrize(("label", "runtime", "build"), KEYWORD_ROUTES,
                         ids=[route[0] for route in KEYWORD_ROUTES])
@pytest.mark.parametrize(("key", "suggestion"), [
    ("concurency", "concurrency"),
    ("maxdemand", "max_demand"),
    ("max_demnd", "max_demand"),
    ("fetchsize", "fetch_size"),
    ("lease_msec", "lease_ms"),
    ("partiton", "partitions"),
    ("max_attempt", "max_attempts"),
    ("retrypolicy", "retry_policy"),
    ("consumerid", "consumer_id"),
    ("max_inflight", "max_demand"),  # the pipeline's name for it
])
def test_misspelt_options_are_refused_with_a_suggestion(
        rheo: Rheo, label: str, runtime: str, build: Build, key: str, suggestion: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        build(rheo, {key: 8})
    message = str(caught.value)
    assert message.startswith(f"unknown option {key!r} for "), message
    assert message.endswith(f"; did you mean {suggestion!r}?"), message


def test_unknown_option_message() -> None:
    with pytest.raises(InvalidArgument) as caught:
        Plain(concurency=8)
    assert str(caught.value) == (
        "unknown option 'concurency' for Consumer; did you mean 'concurrency'?")
    with pytest.raises(InvalidArgument, match=r"for Consumer \(@consumer\); did you mean"):
        consumer(stream="orders", group="billing", concurency=8)


def test_misspelt_class_attribute_is_refused(rheo: Rheo) -> None:
    class Billing(Plain):
        concurency = 8

    with pytest.raises(InvalidArgument) as caught:
        Billing().start(rheo)
    assert str(caught.value) == (
        "unknown option 'concurency' for Consumer (class attribute of Billing); "
        "did you mean 'concurrency'?")

    class WithMethods(Plain):  # methods, properties and private names are not options
        _concurency = 8

        @property
        def groups(self) -> list[str]:
            return []

        def partiton(self) -> None:
            pass

    WithMethods().start(rheo)


def test_runtime_arguments_given_as_options_are_refused(rheo: Rheo) -> None:
    with pytest.raises(InvalidArgument, match=r"'observer' is not an option of Consumer.*start"):
        consumer(stream="orders", group="billing", observer=print)
    with pytest.raises(InvalidArgument, match="'backoff' is not an option of Consumer"):
        Plain(backoff=None)
    Plain().start(rheo, observer=print)  # where it belongs


async def test_application_keys_still_reach_setup(rheo: Rheo) -> None:
    keys = {"counter": 1, "tenant": "acme", "region": "eu", "partition_key": "k",
            "group_by": "x", "lease": 5, "poll": 1, "database": "db"}
    group = Plain(**keys).start(rheo, worker="w-1")
    assert {k: group.options[k] for k in [*keys, "worker"]} == {**keys, "worker": "w-1"}


@pytest.mark.parametrize(("build", "key"), [
    (lambda rheo: Producer(rheo, "orders", "billing", concurency=8), "concurency"),
    (lambda rheo: Pipeline(rheo, stream="orders", group="billing", handler=Echo(),
                           max_demand=8), "max_demand"),
    (lambda rheo: Processors(concurency=8), "concurency"),
    (lambda rheo: Batcher(batch_sise=8), "batch_sise"),
])
def test_runtimes_with_explicit_keywords_refuse_unknown_ones(
        rheo: Rheo, build: Callable[[Rheo], object], key: str) -> None:
    with pytest.raises(TypeError, match=key):
        build(rheo)


# The inconsistencies of the issue -------------------------------------------------------


def test_max_demand_of_twenty_thousand_is_accepted_everywhere(rheo: Rheo) -> None:
    assert Plain(max_demand=20_000).start(rheo).options["max_demand"] == 20_000
    assert Producer(rheo, "orders", "billing", max_demand=20_000).max_demand == 20_000
    pipeline = Pipeline(rheo, stream="orders", group="billing", handler=Echo(),
                        max_inflight=20_000)
    assert pipeline.producer.max_demand == 20_000
    assert Processors(max_demand=20_000).max_demand == 20_000
    for build in (lambda: Plain(max_demand=MAX_DEMAND + 1).start(rheo),
                  lambda: Producer(rheo, "orders", "billing", max_demand=MAX_DEMAND + 1),
                  lambda: Pipeline(rheo, stream="orders", group="billing", handler=Echo(),
                                   max_inflight=MAX_DEMAND + 1),
                  lambda: Processors(max_demand=MAX_DEMAND + 1)):
        with pytest.raises(InvalidArgument, match=r"\(1 to 1,000,000\)( or None)?, got 1000001"):
            build()


async def test_a_group_with_a_large_max_demand_runs(rheo: Rheo, wait_until: WaitUntil
                                                    ) -> None:
    await rheo.create_stream("orders", partitions=2)
    await rheo.append("orders", [NewEvent("e", {"n": n}) for n in range(30)])
    seen: list[int] = []

    @consumer(stream="orders", group="billing", max_demand=20_000, concurrency=4)
    async def handle(event: Event, context: Mapping[str, Any]) -> Ack:
        seen.append(event.data["n"])
        return ACK

    async with handle.start(rheo) as group:
        await wait_until(lambda: len(seen) == 30, timeout=10)
        assert await group.drain(timeout=5)
    assert sorted(seen) == list(range(30))


def test_shutdown_timeout_of_zero_is_accepted_everywhere(rheo: Rheo) -> None:
    assert Producer(rheo, "orders", "billing", shutdown_timeout=0)._shutdown_timeout == 0
    pipeline = Pipeline(rheo, stream="orders", group="billing", handler=Echo(),
                        shutdown_timeout=0)
    assert pipeline._shutdown_timeout == 0
    for build in (lambda: Producer(rheo, "orders", "billing", shutdown_timeout=-1),
                  lambda: Pipeline(rheo, stream="orders", group="billing", handler=Echo(),
                                   shutdown_timeout=-1)):
        with pytest.raises(InvalidArgument,
                           match=r"shutdown_timeout must be a number of seconds \(at least 0\)"):
            build()


async def test_a_pipeline_with_shutdown_timeout_zero_hands_back_at_once(
        rheo: Rheo, wait_until: WaitUntil) -> None:
    await rheo.create_stream("orders")
    await rheo.append("orders", [NewEvent("e", {"n": n}) for n in range(5)])
    release = asyncio.Event()

    class Slow:
        async def handle_message(self, processor: str, message: Message, context: Any
                                 ) -> Message:
            await release.wait()
            return message

    pipeline = Pipeline(rheo, stream="orders", group="billing", handler=Slow(),
                        shutdown_timeout=0)
    async with asyncio.timeout(10):
        async with pipeline:
            await wait_until(lambda: pipeline.stats().inflight > 0, timeout=10)
    assert pipeline.state == "stopped"
    assert not pipeline.producer.inflight
    assert sum((await rheo.lag("orders", "billing")).values()) == 5  # handed back


def test_a_default_max_inflight_above_the_bound_is_refused_naming_it(rheo: Rheo) -> None:
    with pytest.raises(InvalidArgument, match=r"default max_inflight .* pass max_inflight"):
        Pipeline(rheo, stream="orders", group="billing", handler=Echo(),
                 processors=Processors(concurrency=10, max_demand=100_000))
    Pipeline(rheo, stream="orders", group="billing", handler=Echo(), max_inflight=1_000,
             processors=Processors(concurrency=10, max_demand=100_000))


# The schema and the code ----------------------------------------------------------------


def test_consumer_class_attributes_are_the_schema_defaults() -> None:
    assert {name: getattr(Consumer, name) for name in Consumer.__annotations__} == dict(
        CONSUMER.defaults)
    assert GROUP.defaults == CONSUMER.defaults


@pytest.mark.parametrize(("cls", "runtime"), [(Producer, PRODUCER), (Pipeline, PIPELINE)],
                         ids=["Producer", "Pipeline"])
def test_signature_defaults_are_the_schema_defaults(cls: type, runtime: Any) -> None:
    parameters = list(inspect.signature(cls).parameters.values())[1:]  # after rheo
    assert {p.name: REQUIRED if p.default is p.empty else p.default
            for p in parameters} == dict(runtime.defaults)


@pytest.mark.parametrize(("cls", "runtime"), [(Processors, PROCESSORS), (Batcher, BATCHER)],
                         ids=["Processors", "Batcher"])
def test_settings_defaults_are_the_schema_defaults(cls: type, runtime: Any) -> None:
    assert {f.name: f.default for f in dataclasses.fields(cls)} == dict(runtime.defaults)


def test_every_option_is_taken_by_some_runtime_and_documented() -> None:
    taken = {name for runtime in RUNTIMES.values() for name in runtime.names}
    assert taken == set(OPTIONS)
    for option in OPTIONS.values():
        assert option.doc, option.name
        assert "\n" not in option.doc, option.name
        assert option.accepted(), option.name


def test_validate_names_the_option_the_bound_and_the_value() -> None:
    with pytest.raises(InvalidArgument) as caught:
        validate("max_demand", 0)
    assert str(caught.value) == "max_demand must be an integer (1 to 1,000,000), got 0"
    with pytest.raises(InvalidArgument) as caught:
        validate("lease_ms", 5)
    assert str(caught.value) == (
        "lease_ms must be an integer number of milliseconds (10 to 86,400,000), got 5")
    with pytest.raises(InvalidArgument) as caught:
        validate("batch_timeout", 0)
    assert str(caught.value) == (
        "batch_timeout must be a number of seconds (above 0, at most 86,400), got 0")
    with pytest.raises(InvalidArgument) as caught:
        validate("fetch_size", 0)
    assert str(caught.value) == "fetch_size must be an integer (1 to 1,000,000) or None, got 0"
    assert validate("partitions", [2, 0, 2]) == [0, 2]


def test_cross_option_rules_hold_in_every_runtime_that_has_both(rheo: Rheo) -> None:
    for build in (lambda: Plain(concurrency=11, max_demand=10).start(rheo),
                  lambda: consumer(stream="orders", group="billing", concurrency=11,
                                   max_demand=10)(_handler).start(rheo)):
        with pytest.raises(InvalidArgument, match=r"concurrency \(11\) cannot exceed "
                                                  r"max_demand \(10\)"):
            build()
    for build in (lambda: Plain(fetch_size=11, max_demand=10).start(rheo),
                  lambda: Producer(rheo, "orders", "billing", fetch_size=11, max_demand=10)):
        with pytest.raises(InvalidArgument, match=r"fetch_size \(11\) cannot exceed "
                                                  r"max_demand \(10\)"):
            build()
    Processors(concurrency=11, max_demand=10)  # a processor's demand is per task
