"""The facade's side of retention: bad policies are refused before anything changes, and a
backend that does not declare ``retention`` refuses to store one but still applies a
policy given to ``apply_retention``."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from rheo_flow import (
    Capabilities,
    InvalidArgument,
    NewEvent,
    Retention,
    Rheo,
    UnknownStream,
    Unsupported,
)
from rheo_flow.backends import MemoryBackend


class NoRetention(MemoryBackend):
    """A backend that predates retention: it does not declare the capability."""

    @property
    def capabilities(self) -> Capabilities:
        return dataclasses.replace(super().capabilities, retention=False)


@pytest.mark.parametrize("kwargs", [
    {}, {"max_events": 0}, {"max_events": -3}, {"max_events": 2**62 + 1},
    {"max_events": 1.5}, {"max_events": True}, {"max_age": timedelta(0)},
    {"max_age": timedelta(seconds=-1)}, {"max_age": timedelta(microseconds=1)},
    {"max_age": 60},
])
def test_a_bad_policy_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        Retention(**kwargs)  # type: ignore[arg-type]


def test_a_policy_round_trips_through_milliseconds() -> None:
    policy = Retention(max_age=timedelta(days=7, milliseconds=3), max_events=10)
    assert policy.max_age_ms == 7 * 86_400_000 + 3
    assert Retention.from_ms(policy.max_age_ms, policy.max_events) == policy
    assert Retention.from_ms(None, None) is None


async def test_a_backend_without_the_capability_stores_nothing() -> None:
    async with Rheo(NoRetention()) as rheo:
        with pytest.raises(Unsupported, match="set_retention"):
            await rheo.create_stream("s", retention=Retention(max_events=1))
        assert await rheo.streams() == []  # refused before the stream was created
        await rheo.create_stream("s")
        with pytest.raises(Unsupported):
            await rheo.set_retention("s", None)
        await rheo.append("s", [NewEvent("t", {}) for _ in range(4)])
        assert await rheo.apply_retention("s") == {0: 0}  # no policy stored
        assert await rheo.apply_retention("s", Retention(max_events=1)) == {0: 3}


async def test_wrong_types_and_missing_streams() -> None:
    async with Rheo("memory://") as rheo:
        with pytest.raises(InvalidArgument, match="Retention"):
            await rheo.create_stream("s", retention={"max_events": 3})  # type: ignore[arg-type]
        assert await rheo.streams() == []
        await rheo.create_stream("s")
        with pytest.raises(InvalidArgument, match="Retention"):
            await rheo.apply_retention("s", 3)  # type: ignore[arg-type]
        with pytest.raises(UnknownStream):
            await rheo.apply_retention("nope")
        with pytest.raises(UnknownStream):
            await rheo.set_retention("nope", Retention(max_events=1))
