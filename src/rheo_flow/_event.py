"""Events: what is appended (:class:`NewEvent`) and what is stored (:class:`Event`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeAlias

__all__ = ["JSON", "Event", "NewEvent"]

JSON: TypeAlias = Any
"""A JSON-serialisable value: ``None``, bool, int, float, str, list or dict with str keys."""


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append.

    ``id`` makes the append idempotent: appending an event whose id is already in
    the stream returns the stored event and allocates no second sequence. When
    omitted a UUID is generated. ``key`` routes the event to a partition by a
    stable hash; ``partition`` routes it explicitly (and wins over the key).
    """

    type: str
    data: JSON = None
    id: str | None = None
    key: str | None = None
    partition: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Event:
    """An immutable event stored in a partition of a stream."""

    stream: str
    partition: int
    sequence: int
    """Gapless per-partition sequence, starting at 1."""
    id: str
    type: str
    data: JSON
    key: str | None
    headers: Mapping[str, str]
    appended_at_ms: int
    """Append time, milliseconds since the Unix epoch (backend clock where it has one)."""

    @property
    def appended_at(self) -> datetime:
        """Append time as an aware UTC datetime."""
        return datetime.fromtimestamp(self.appended_at_ms / 1000, tz=UTC)
