"""The checks of what reads and dead-letter calls take (a :class:`~rheo_flow.Query`'s
fields, dead letters), and the pages they answer with."""

from __future__ import annotations

from collections.abc import Iterable

from .._model._errors import InvalidArgument
from .._model._event import Event
from .._model._query import Page, Query, encode_cursor
from .._model._stream import DeadLetter
from .._model._validation import check_key, check_sequence, check_text, check_type

__all__ = ["check_query_fields", "dead_letter_positions", "page_of"]


def check_query_fields(query: Query) -> None:
    """Raise :class:`~rheo_flow.InvalidArgument` on a bad sequence, time, key or type."""
    for name in ("from_sequence", "to_sequence", "since_ms", "until_ms"):
        value = getattr(query, name)
        if value is not None:
            check_sequence(name, value)
    query_key = check_key(query.key)
    if query_key is not None:
        check_text("key", query_key)
    if query.type is not None:
        check_text("event type", check_type(query.type))


def page_of(events: list[Event], limit: int) -> Page:
    """A page of ``events`` (read ``limit + 1`` of them): its cursor continues after the
    last one kept when there are more."""
    if len(events) > limit:
        last = events[limit - 1]
        return Page(events[:limit], encode_cursor(last.partition, last.sequence))
    return Page(events, None)


def dead_letter_positions(stream: str, group: str, dead_letters: Iterable[DeadLetter] | None
                          ) -> list[tuple[int, int]] | None:
    """The (partition, sequence) of each of ``dead_letters`` (``None``: every one), which
    must be dead letters of ``stream``/``group``."""
    if dead_letters is None:
        return None
    positions = []
    for d in dead_letters:
        if not isinstance(d, DeadLetter) or (d.stream, d.group) != (stream, group):
            raise InvalidArgument(f"not a dead letter of {stream}/{group}: {d!r}")
        positions.append((check_sequence("partition", d.partition),
                          check_sequence("sequence", d.sequence)))
    return positions
