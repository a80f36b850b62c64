"""Pausing and resuming a group on Redis.

A pause is stored twice: in the stream's pauses hash (group -> the end of the pause,
what ``group_info`` and ``list_groups`` report) and in each partition's group hash
(field ``pz``), which the fetch script reads with the rest of that hash, so a fetch
of a paused group leases nothing at no extra cost. A resume also adds an entry to
the stream's signal stream, which every consumer's wake-up reads along with the
partitions (``_wakeups.py``): consumers waiting in any process fetch at once.
"""

from __future__ import annotations

from typing import Final

from ..._model._errors import UnknownGroup
from ..._model._stream import PAUSED_UNTIL_RESUMED, GroupInfo
from ._groups import GroupOperations
from ._scripts import ScriptCall

__all__ = ["PauseOperations"]

SIGNAL_MAXLEN: Final = 16
"""How many entries a stream's signal stream keeps (only the newest one wakes)."""


class PauseOperations(GroupOperations):
    """``pause_group`` and ``resume_group``."""

    async def pause_group(self, stream: str, group: str, until_ms: int | None) -> GroupInfo:
        """Store the pause with the group: every process's next fetch of it finds it."""
        until = PAUSED_UNTIL_RESUMED if until_ms is None else until_ms
        return await self._set_pause(stream, group, str(until))

    async def resume_group(self, stream: str, group: str) -> GroupInfo:
        """End the pause, and signal the stream: consumers waiting on it wake up."""
        info = await self._set_pause(stream, group, "0")
        await self._io(self._client.xadd(self._keys.signal(stream), {"r": group},
                                         maxlen=SIGNAL_MAXLEN, approximate=True))
        return info

    async def _set_pause(self, stream: str, group: str, value: str) -> GroupInfo:
        self._known_groups.discard((stream, group))  # ask the store, not the cache
        count = await self._require_group(stream, group)
        calls: list[ScriptCall] = [
            ("pause", [self._keys.group(stream, group, p).group], ["pz", value, "1"])
            for p in range(count)]
        calls.append(("pause", [self._keys.pauses(stream)], [group, value, "0"]))
        if not all(await self._eval(calls)):  # deleted meanwhile
            raise UnknownGroup(stream, group)
        return await self.group_info(stream, group)
