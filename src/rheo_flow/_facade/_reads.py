"""The checks of a :class:`~rheo_flow.Query`'s fields before a read."""

from __future__ import annotations

from .._model._query import Query
from .._model._validation import check_key, check_sequence, check_text, check_type

__all__ = ["check_query_fields"]


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
