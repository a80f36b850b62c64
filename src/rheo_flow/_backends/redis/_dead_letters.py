"""Dead letters of the Redis backend: listing them and driving them back to delivery."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

from ..._model._errors import UnknownGroup
from ..._model._stream import DeadLetter
from ._scripts import ScriptCall
from ._work import WorkNotes

__all__ = ["DeadLetterOperations"]

_DEAD_CHUNK: Final = 64
"""How many partitions one round trip of ``dead_letters`` reads."""


class DeadLetterOperations(WorkNotes):
    """``dead_letters`` and ``redrive``."""

    async def dead_letters(
        self, stream: str, group: str, limit: int, after: tuple[int, int] | None
    ) -> list[DeadLetter]:
        count = await self._require_group(stream, group)
        first = 0 if after is None else after[0]
        out: list[DeadLetter] = []
        pids = list(range(max(0, first), count))
        for start in range(0, len(pids), _DEAD_CHUNK):
            chunk = pids[start:start + _DEAD_CHUNK]
            calls: list[ScriptCall] = []
            for p in chunk:
                keys = self._keys.group(stream, group, p)
                since = after[1] if after is not None and p == after[0] else 0
                calls.append(("dead_letters", [keys.stream, keys.records, keys.dead],
                              [since, limit - len(out)]))
            for p, reply in zip(chunk, await self._eval(calls), strict=True):
                for seq, attempts, at, reason, meta, error in json.loads(reply):
                    out.append(DeadLetter(stream, group, p, seq, meta[0], attempts, reason,
                                          int(at), error))
                    if len(out) >= limit:
                        return out
        return out

    async def redrive(
        self, stream: str, group: str, positions: Sequence[tuple[int, int]] | None
    ) -> int:
        count = await self._require_group(stream, group)
        wanted: dict[int, list[int]] = {}
        if positions is None:
            arg: dict[int, str] = dict.fromkeys(range(count), "all")
        else:
            for p, seq in positions:
                if 0 <= p < count:
                    wanted.setdefault(p, []).append(seq)
            arg = {p: json.dumps(seqs) for p, seqs in wanted.items()}
        calls = [("redrive", self._keys.script_keys(stream, group, p), [value])
                 for p, value in arg.items()]
        replies = await self._eval(calls)
        if any(int(r) < 0 for r in replies):
            raise UnknownGroup(stream, group)
        await self._note_work(stream, [group], [p for p, r in zip(arg, replies, strict=True)
                                                if int(r) > 0], fresh=False)
        return sum(int(r) for r in replies)
