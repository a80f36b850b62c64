"""Routing messages to a fixed task by a stable hash (``partition_by``)."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, TypeAlias

from .._model._errors import InvalidArgument

if TYPE_CHECKING:
    from ._message import Message

__all__ = ["PartitionBy", "Router", "router"]

PartitionBy: TypeAlias = "Literal['key', 'partition'] | Callable[[Message], object]"
"""How messages are spread over a stage's tasks so that equal values run in order on
one task: ``"key"`` (the event key; events without one go by partition),
``"partition"`` (the stream partition), or a function of the message returning an
int, a str, bytes or any hashable value."""

Router = Callable[["Message"], int]


def router(partition_by: PartitionBy, tasks: int, what: str) -> Router:
    """A function mapping a message to a task index in ``range(tasks)``."""
    if partition_by == "partition":
        return lambda m: m.lease.event.partition % tasks
    if partition_by == "key":
        def by_key(m: Message) -> int:
            event = m.lease.event
            if event.key is None:
                return event.partition % tasks
            return zlib.crc32(event.key.encode()) % tasks
        return by_key
    if callable(partition_by):
        fn = partition_by

        def by_fn(m: Message) -> int:
            return stable_index(fn(m), tasks)
        return by_fn
    raise InvalidArgument(
        f'{what} partition_by must be "key", "partition" or a function of the message, '
        f"got {partition_by!r}"
    )


def stable_index(value: object, tasks: int) -> int:
    """``value`` mapped to ``range(tasks)``, the same in every run for ints, str and bytes."""
    if isinstance(value, bool):
        return int(value) % tasks
    if isinstance(value, int):
        return value % tasks
    if isinstance(value, str):
        return zlib.crc32(value.encode()) % tasks
    if isinstance(value, bytes):
        return zlib.crc32(value) % tasks
    # Other hashables: stable within the process, which is all routing needs.
    return hash(value) % tasks
