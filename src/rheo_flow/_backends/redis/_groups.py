"""Consumer groups of the Redis backend: their records, their frontier, and moving it
(replay, reset)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._backend import DEFAULT_MAX_ATTEMPTS
from ..._model._errors import UnknownGroup
from ..._model._stream import GroupInfo, StartPosition, StreamInfo, paused_state
from ..._model._validation import ordering_mismatch
from ..._support._clock import system_clock
from ._codec import group_record, stream_record, stream_retention, text
from ._scripts import ScriptCall, is_reply
from ._work import WorkNotes

__all__ = ["GroupOperations"]


class GroupOperations(WorkNotes):
    """The group operations of the contract."""

    async def create_group(
        self, stream: str, group: str, start: StartPosition, max_attempts: int | None,
        *, ordering: str = "none",
    ) -> GroupInfo:
        """Create the group (or return it, ``max_attempts`` updated when given).

        ``ordering`` applies at creation; ``"key"`` for an existing group without it is
        an InvalidArgument (and changes nothing)."""
        count = await self._partition_count(stream)
        asked = "key" if ordering == "key" else "none"
        [record] = await self._eval([(
            "group_record", [self._keys.groups(stream)],
            [group, "" if max_attempts is None else max_attempts, DEFAULT_MAX_ATTEMPTS,
             str(start), asked],
        )])
        ma, created, spec, kept = group_record(record)
        if asked == "key" and kept != "key":
            raise ordering_mismatch(stream, group, kept, asked)
        # Every creator initialises every partition from the winner's start position
        # and ordering, so a racing creator never returns before the group exists
        # everywhere.
        calls: list[ScriptCall] = []
        for p in range(count):
            keys = self._keys.group(stream, group, p)
            calls.append(("init_group", [keys.stream, keys.meta, keys.group],
                          [group, spec, ma, kept]))
        await self._eval(calls)
        self._known_groups.add((stream, group))
        return GroupInfo(stream, group, int(ma), int(created), kept)

    async def group_info(self, stream: str, group: str) -> GroupInfo:
        await self._partition_count(stream)
        pipe = self._client.pipeline(transaction=False)
        pipe.hget(self._keys.groups(stream), group)
        pipe.hget(self._keys.pauses(stream), group)
        record, paused_until = await self._io(pipe.execute())
        if record is None:
            raise UnknownGroup(stream, group)
        ma, created, _, ordering = group_record(record)
        return GroupInfo(stream, group, int(ma), int(created), ordering,
                         *paused_state(int(paused_until or 0), system_clock()))

    async def describe_streams(self) -> list[tuple[StreamInfo, list[GroupInfo]]]:
        records = await self._io(self._client.hgetall(self._keys.streams))
        streams = sorted((text(name), *stream_record(record))
                         for name, record in records.items())
        policies = {text(name): stream_retention(record) for name, record in records.items()}
        metas = [self._keys.partition(name, p).meta
                 for name, count, _ in streams for p in range(count)]
        group_keys = [self._keys.groups(name) for name, _, _ in streams]
        group_keys += [self._keys.pauses(name) for name, _, _ in streams]
        if self._cluster:  # the keys live in many slots: one pipeline of reads
            pipe = self._client.pipeline(transaction=False)
            for key in metas:
                pipe.hmget(key, "hw", "lw")
            for key in group_keys:
                pipe.hgetall(key)
            replies = await self._io(pipe.execute())
            waters, groups = replies[:len(metas)], replies[len(metas):]
        else:
            [(waters, groups)] = await self._eval(
                [("describe", [*metas, *group_keys], [len(metas)])])
        groups, pauses = groups[:len(streams)], groups[len(streams):]
        now = system_clock()
        out = []
        at = 0
        for (name, count, created), fields, paused in zip(streams, groups, pauses, strict=True):
            mine = waters[at:at + count]
            at += count
            info = StreamInfo(name, count, created,
                              {p: int(hw or 0) for p, (hw, _) in enumerate(mine)},
                              {p: int(lw or 1) for p, (_, lw) in enumerate(mine)},
                              policies[name])
            out.append((info, _groups_of(name, fields, paused, now)))
        return out

    async def list_groups(self, stream: str) -> list[GroupInfo]:
        await self._partition_count(stream)
        pipe = self._client.pipeline(transaction=False)
        pipe.hgetall(self._keys.groups(stream))
        pipe.hgetall(self._keys.pauses(stream))
        fields, paused = await self._io(pipe.execute())
        return _groups_of(stream, fields, paused, system_clock())

    async def delete_group(self, stream: str, group: str) -> None:
        count = await self._require_group(stream, group)
        if self._cluster:
            # Partitions live in many slots: the record goes first (no reader sees
            # a group whose partitions are gone), then each partition's keys.
            await self._io(self._client.hdel(self._keys.groups(stream), group))
        pipe = self._client.pipeline(transaction=not self._cluster)
        pipe.hdel(self._keys.pauses(stream), group)
        for p in range(count):
            keys = self._keys.group(stream, group, p)
            pipe.xgroup_destroy(keys.stream, group)
            pipe.execute_command("UNLINK", *keys.own())
        if not self._cluster:
            pipe.hdel(self._keys.groups(stream), group)
            pipe.execute_command("UNLINK", *self._keys.summary_keys(stream, group))
        else:
            # The group's summary (one slot): a group made again starts with a resync.
            pipe.execute_command("UNLINK", *self._keys.work_keys(stream, group)[2:])
        await self._io(pipe.execute())
        self._forget(stream, group)

    async def frontier(self, stream: str, group: str) -> dict[int, int]:
        count = await self._partition_count(stream)
        pipe = self._client.pipeline(transaction=False)
        pipe.hexists(self._keys.groups(stream), group)
        for p in range(count):
            pipe.hget(self._keys.group(stream, group, p).group, "f")
        exists, *values = await self._io(pipe.execute())
        if not exists:
            raise UnknownGroup(stream, group)
        return {p: int(v or 0) for p, v in enumerate(values)}

    async def frontiers(self, stream: str) -> dict[str, dict[int, int]]:
        names = [g.group for g in await self.list_groups(stream)]
        count = await self._partition_count(stream)
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            for p in range(count):
                pipe.hget(self._keys.group(stream, name, p).group, "f")
        values = await self._io(pipe.execute()) if names else []
        return {name: {p: int(values[i * count + p] or 0) for p in range(count)}
                for i, name in enumerate(names)}

    async def replay(
        self, stream: str, group: str, from_sequence: int, partitions: Sequence[int]
    ) -> None:
        await self._require_group(stream, group)
        await self._group_scripts("replay", stream, group, partitions, str(from_sequence))

    async def reset(
        self, stream: str, group: str, to: StartPosition, partitions: Sequence[int]
    ) -> None:
        await self._require_group(stream, group)
        await self._group_scripts("reset", stream, group, partitions, str(to))

    async def _group_scripts(
        self, script: str, stream: str, group: str, partitions: Sequence[int], arg: str
    ) -> None:
        calls = [(script, self._keys.script_keys(stream, group, p), [group, arg])
                 for p in partitions]
        for reply in await self._eval(calls):
            if is_reply(reply, "NOGROUP"):
                raise UnknownGroup(stream, group)
        await self._note_work(stream, [group], partitions, fresh=True)


def _pairs(fields: Any) -> Any:
    """The fields and values of a hash (a dict, or HGETALL's flat list from a script)."""
    return fields.items() if isinstance(fields, dict) else zip(fields[::2], fields[1::2],
                                                               strict=True)


def _groups_of(stream: str, fields: Any, paused: Any, now: int) -> list[GroupInfo]:
    """The groups of a stream's groups hash, paused or not at ``now`` by its pauses hash."""
    ends = {text(group): int(until) for group, until in _pairs(paused)}
    out = []
    for group, record in _pairs(fields):
        max_attempts, created, _, ordering = group_record(record)
        name = text(group)
        out.append(GroupInfo(stream, name, int(max_attempts), int(created), ordering,
                             *paused_state(ends.get(name, 0), now)))
    return sorted(out, key=lambda g: g.group)
