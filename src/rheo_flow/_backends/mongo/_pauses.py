"""Pausing and resuming a group on MongoDB: the end of the pause is a field of the group
document (``pz``; absent or 0: not paused), which every fetch reads with the rest of
the document, so a paused group's fetch returns nothing at no extra cost."""

from __future__ import annotations

from ..._model._errors import UnknownGroup
from ..._model._stream import PAUSED_UNTIL_RESUMED, GroupInfo
from ._core import MongoCore

__all__ = ["PauseOps"]


class PauseOps(MongoCore):
    """``pause_group`` and ``resume_group``."""

    async def pause_group(self, stream: str, group: str, until_ms: int | None) -> GroupInfo:
        """Store the pause with the group: every process's next fetch of it finds it."""
        return await self._set_pause(stream, group,
                                     PAUSED_UNTIL_RESUMED if until_ms is None else until_ms)

    async def resume_group(self, stream: str, group: str) -> GroupInfo:
        """End the pause, and wake this process's consumers waiting on the stream (those
        of other processes find it at their next poll)."""
        info = await self._set_pause(stream, group, 0)
        self._waiters.wake(stream)
        return info

    async def _set_pause(self, stream: str, group: str, until: int) -> GroupInfo:
        await self._ready()
        found = await self._groups.update_one({"s": stream, "n": group},
                                              {"$set": {"pz": until}})
        if found.matched_count == 0:
            await self._stream_doc(stream)  # UnknownStream when the stream is missing
            raise UnknownGroup(stream, group)
        return (await self._group(stream, group, whole=False)).info(self._clock())
