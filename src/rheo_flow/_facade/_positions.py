"""Time as a position (docs/contract.md, rule ``position.time``): where ``replay`` starts
and ``reset`` moves a group when given a time instead of a sequence.

A partition's position at a time T is its first retained event appended at or after
T, found by its sequence: appends to a partition take their stamps in sequence order
(one append at a time per partition, stamped by the backend's clock), so the events
appended at or after T are the partition's tail from that event on. A time between
two events names the later one; a time before the first retained event names that
event; a time after the last event names the next sequence to come (high water + 1):
nothing stored is at or after it.

Each partition's position is found by a binary search over its retained sequences,
one single-event query per step (at most 64 per partition, about 17 for 100,000
events), whatever the backend: a read of the stream, no lock, no change.
"""

from __future__ import annotations

from datetime import datetime

from .._backend import Backend
from .._model._errors import InvalidArgument
from .._model._query import Query
from .._model._validation import aware_ms

__all__ = ["positions_at", "replay_at", "reset_at", "time_ms"]



def time_ms(name: str, value: object) -> int:
    """An aware ``datetime`` as epoch milliseconds; anything else is an InvalidArgument."""
    if not isinstance(value, datetime):
        raise InvalidArgument(f"{name} must be a datetime, got {type(value).__name__}")
    # A time inside a millisecond stands for the next one (stamps are whole
    # milliseconds: the events at or after it are those from the next on).
    return aware_ms(name, value, round_up=True)


async def replay_at(backend: Backend, stream: str, group: str, at: datetime,
                    partitions: list[int]) -> None:
    """``replay(from_time=at)``: each partition from its position at ``at``."""
    at_ms = time_ms("from_time", at)
    await backend.group_info(stream, group)
    for first, parts in _by_position(await positions_at(backend, stream, at_ms, partitions)):
        await backend.replay(stream, group, first, parts)


async def reset_at(backend: Backend, stream: str, group: str, at: datetime,
                   partitions: list[int]) -> None:
    """``reset(to=at)``: each partition past the events it had appended before ``at``."""
    at_ms = time_ms("to", at)
    await backend.group_info(stream, group)
    for first, parts in _by_position(await positions_at(backend, stream, at_ms, partitions)):
        await backend.reset(stream, group, first - 1, parts)


def _by_position(at: dict[int, int]) -> list[tuple[int, list[int]]]:
    """The partitions of ``at`` grouped by their position (one backend call each)."""
    grouped: dict[int, list[int]] = {}
    for part, first in sorted(at.items()):
        grouped.setdefault(first, []).append(part)
    return sorted(grouped.items())


async def positions_at(backend: Backend, stream: str, at_ms: int,
                       partitions: list[int]) -> dict[int, int]:
    """Per partition of ``partitions``: the sequence of its first retained event appended
    at or after ``at_ms``, or its high water + 1 when it holds none."""
    info = await backend.stream_info(stream)
    return {part: await _first_at(backend, stream, part, at_ms, info.low_water.get(part, 1),
                                  info.high_water.get(part, 0))
            for part in partitions}


async def _first_at(backend: Backend, stream: str, part: int, at_ms: int, low: int,
                    high: int) -> int:
    """The least sequence in ``low..high`` whose event was appended at or after
    ``at_ms`` (``high + 1`` if none): a lower-bound search, one event read per step.

    Each step reads the first retained event from the middle on: sequences a trim
    removes meanwhile are passed over, and an answer among them names the same
    position as the first retained event after them (nothing lies between)."""
    lo, hi = max(low, 1), high + 1
    while lo < hi:
        middle = (lo + hi) // 2
        query = Query(stream=stream, partitions=[part], from_sequence=middle, to_sequence=high)
        found = await backend.query(query, 1, None)
        if found and found[0].appended_at_ms < at_ms:
            lo = found[0].sequence + 1
        else:
            hi = middle
    return lo
