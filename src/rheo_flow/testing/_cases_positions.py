"""Cases about time as a position (rule ``position.time``): ``replay(from_time=...)`` and
``reset(to=<a time>)`` move each partition to its first event appended at or after it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from .._model._event import Event, NewEvent
from ._case import CaseEnv, case, check_equal, positions

_GAP_MS = 20
"""Backend time let pass between two appends whose stamps must differ."""


def _at(ms: int) -> datetime:
    """Epoch milliseconds as an aware datetime, exactly (no float)."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


async def _three_moments(env: CaseEnv) -> tuple[str, list[Event]]:
    """A stream of two partitions: (0, 1) at t1; (0, 2) later; (0, 3) and (1, 1) after
    that; a group ``g`` that settled all of it."""
    stream = await env.stream(partitions=2)
    first = await env.rheo.append(stream, NewEvent("t", {"n": 1}), partition=0)
    await env.advance(_GAP_MS)
    second = await env.rheo.append(stream, NewEvent("t", {"n": 2}), partition=0)
    await env.advance(_GAP_MS)
    third = await env.rheo.append(stream, NewEvent("t", {"n": 3}), partition=0)
    other = await env.rheo.append(stream, NewEvent("t", {"n": 4}), partition=1)
    await env.ack_ok(await env.drain(stream, "g"))
    return stream, first + second + third + other


async def _redelivered(env: CaseEnv, stream: str) -> list[tuple[int, int]]:
    """The (partition, sequence) of what group ``g`` is given now, in order."""
    return sorted(positions(await env.drain(stream, "g")))


@case(rules=["position.time", "replay.from_sequence"])
async def case_replay_from_a_time(env: CaseEnv) -> None:
    """replay(from_time=T) delivers again, per partition, from its first event at or after T."""
    stream, (first, second, _, _) = await _three_moments(env)
    await env.rheo.replay(stream, "g", from_time=_at(second.appended_at_ms))
    check_equal(await _redelivered(env, stream), [(0, 2), (0, 3), (1, 1)],
                "from a stamp: that event and every later one")
    between = first.appended_at_ms + 1  # after the first's stamp, at or before the second's
    await env.rheo.replay(stream, "g", from_time=_at(between), partitions=[0])
    check_equal(await _redelivered(env, stream), [(0, 2), (0, 3)],
                "a time between two events names the later one")
    await env.rheo.replay(stream, "g", from_time=_at(first.appended_at_ms - 60_000))
    check_equal(await _redelivered(env, stream), [(0, 1), (0, 2), (0, 3), (1, 1)],
                "a time before the first event names it")
    await env.rheo.replay(stream, "g", from_time=_at(await env.now() + 60_000))
    check_equal(await env.drain(stream, "g"), [], "a time after the last event: nothing again")


@case(rules=["position.time", "reset.position"])
async def case_reset_to_a_time(env: CaseEnv) -> None:
    """reset(to=T): the events appended before T count as settled, the later ones are
    delivered again."""
    stream, (_, second, _, _) = await _three_moments(env)
    await env.rheo.reset(stream, "g", to=_at(second.appended_at_ms))
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1, 1: 0}, "the frontier is T's - 1")
    check_equal(await _redelivered(env, stream), [(0, 2), (0, 3), (1, 1)],
                "the events at or after T, delivered again")
    await env.rheo.reset(stream, "g", to=_at(await env.now() + 60_000))
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3, 1: 1},
                "a time after the last event: everything counts as settled")
