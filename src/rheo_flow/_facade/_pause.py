"""Pausing and resuming a consumer group (:meth:`~rheo_flow.Rheo.pause_group`,
:meth:`~rheo_flow.Rheo.resume_group`): the input checked, then the backend asked."""

from __future__ import annotations

import time
from datetime import datetime

from .._backend import Backend
from .._model._errors import InvalidArgument
from .._model._stream import GroupInfo
from .._model._validation import aware_ms, check_name

__all__ = ["pause_group", "pause_until_ms", "resume_group"]


def pause_until_ms(until: object) -> int | None:
    """The end of a pause as ms since the epoch: ``until`` is ``None`` (until resumed) or
    an aware :class:`~datetime.datetime` in the future."""
    if until is None:
        return None
    if not isinstance(until, datetime):
        raise InvalidArgument(f"until must be a datetime or None, got {type(until).__name__}")
    ms = aware_ms("until", until)
    if ms <= int(time.time() * 1000):
        raise InvalidArgument(f"until must be in the future, got {until.isoformat()}")
    return ms


async def pause_group(backend: Backend, stream: str, group: str, until: object) -> GroupInfo:
    """Check the input, then pause the group on ``backend``."""
    check_name("stream", stream)
    check_name("group", group)
    return await backend.pause_group(stream, group, pause_until_ms(until))


async def resume_group(backend: Backend, stream: str, group: str) -> GroupInfo:
    """Check the input, then resume the group on ``backend``."""
    check_name("stream", stream)
    check_name("group", group)
    return await backend.resume_group(stream, group)
