"""The message of an unknown stream or group on the command line: what was not found,
the closest existing name ("did you mean"), and the ``rheo-flow`` command that creates it.

The library's own message speaks Python (``create_stream()``); a command's user needs
the command instead. The names are read only when the error happens, with one call
(the streams, or the stream's groups), and a failure to read them leaves the hint out.
"""

from __future__ import annotations

import asyncio
import difflib
import shlex

from .._model._errors import UnknownGroup, UnknownStream

__all__ = ["LOOKUP_TIMEOUT_S", "unknown_message"]

LOOKUP_TIMEOUT_S = 5.0
"""How long the names may take to read before the message goes without a suggestion."""


def unknown_message(exc: UnknownStream | UnknownGroup, url: str | None,
                    stream_fix: str | None = None) -> str:
    """The message for ``exc`` on the store at ``url`` (opened as it is: give it
    ``migrate=false``); ``stream_fix`` replaces the
    command suggested for a missing stream (``append`` suggests its ``--create``)."""
    names = _names(exc, url) if url else []
    if isinstance(exc, UnknownGroup):
        text = f"unknown group {exc.group!r} on stream {exc.stream!r}"
        fix = f"rheo-flow create-group {shlex.quote(exc.stream)} {shlex.quote(exc.group)}"
        missing = exc.group
    else:
        text = f"unknown stream {exc.stream!r}"
        fix = stream_fix or f"rheo-flow create-stream {shlex.quote(exc.stream)}"
        missing = exc.stream
    close = difflib.get_close_matches(missing, names, n=1)
    if close:
        text += f"; did you mean {close[0]!r}?"
    return f"{text} (to create it: {fix})"


def _names(exc: UnknownStream | UnknownGroup, url: str) -> list[str]:
    from .._rheo import Rheo

    async def read() -> list[str]:
        async with Rheo(url) as rheo:
            if isinstance(exc, UnknownGroup):
                return [g.group for g in await rheo.groups(exc.stream)]
            return await rheo.streams()

    try:
        return asyncio.run(asyncio.wait_for(read(), LOOKUP_TIMEOUT_S))
    except Exception:  # only a suggestion: the error itself is reported all the same
        return []
