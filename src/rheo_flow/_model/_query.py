"""The portable query over a stream's events, and its pages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ._event import Event

__all__ = ["Page", "Query"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Query:
    """Select events of one stream; every filter is optional and they combine with AND.

    Results are ordered by ``(partition, sequence)``. Sequence bounds are
    inclusive; time bounds are ``since <= appended_at_ms < until``.
    """

    stream: str
    partitions: Sequence[int] | None = None
    key: str | None = None
    type: str | None = None
    from_sequence: int | None = None
    to_sequence: int | None = None
    since_ms: int | None = None
    until_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Page:
    """One page of query results; ``cursor`` continues after it (``None``: last page)."""

    events: list[Event] = field(default_factory=list)
    cursor: str | None = None


def encode_cursor(partition: int, sequence: int) -> str:
    """Encode the position of the last event of a page (private to backends)."""
    return f"v1.{partition}.{sequence}"


def decode_cursor(cursor: str) -> tuple[int, int]:
    """Decode a cursor made by :func:`encode_cursor`; a foreign string is an error."""
    from ._errors import InvalidArgument

    parts = cursor.split(".") if isinstance(cursor, str) else []
    if (len(parts) != 3 or parts[0] != "v1"
            or not all(p.isascii() and p.isdigit() and len(p) <= 19 for p in parts[1:])):
        raise InvalidArgument(f"malformed query cursor {cursor!r}")
    partition, sequence = int(parts[1]), int(parts[2])
    if sequence > 2**63 - 1:
        raise InvalidArgument(f"malformed query cursor {cursor!r}")
    return partition, sequence
