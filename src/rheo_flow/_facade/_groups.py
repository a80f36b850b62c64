"""Creating a group with its arguments checked and its ordering matched (what
``Rheo.create_group`` and the runtimes' start share)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._model._errors import InvalidArgument, UnknownGroup
from .._model._stream import GroupInfo, StartPosition
from .._model._validation import check_name, check_positive_int, check_start, ordering_mismatch

if TYPE_CHECKING:
    from .._backend import Backend

__all__ = ["create_group_checked"]


async def create_group_checked(backend: Backend, stream: str, group: str,
                               start: StartPosition, max_attempts: int | None,
                               ordering: str | None) -> GroupInfo:
    """Create the group unless it exists (``max_attempts``, when given, updates it);
    ``ordering=None`` accepts an existing group's, whatever it is."""
    check_name("stream", stream)
    check_name("group", group)
    check_start("start", start)
    if max_attempts is not None:
        check_positive_int("max_attempts", max_attempts, maximum=1_000_000)
    key_ordering = backend.capabilities.key_ordering
    if ordering == "key":
        if not key_ordering:
            raise InvalidArgument(f'ordering="key" needs a backend declaring key_ordering; '
                                  f"backend {backend.name!r} does not (docs/ordering.md)")
        info = await backend.create_group(stream, group, start, max_attempts, ordering="key")
    else:
        if ordering == "none" and max_attempts is not None and key_ordering:
            await _check_unordered(backend, stream, group)  # before max_attempts changes
        info = await backend.create_group(stream, group, start, max_attempts)
    if ordering is not None and info.ordering != ordering:
        raise ordering_mismatch(stream, group, info.ordering, ordering)
    return info


async def _check_unordered(backend: Backend, stream: str, group: str) -> None:
    """Raise the mismatch when the group exists with ``ordering="key"``."""
    try:
        existing = await backend.group_info(stream, group)
    except UnknownGroup:
        return
    if existing.ordering != "none":
        raise ordering_mismatch(stream, group, existing.ordering, "none")
