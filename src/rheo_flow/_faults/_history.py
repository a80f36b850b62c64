"""What producers and workers record, and how the records reach the checker.

Every process writes its own append-only JSON-lines file and flushes each
record as it happens, so a ``kill -9`` loses at most the record being written
(the reader tolerates a truncated last line). A record is written *before* a
call that may take effect (the intent) and again with its result, so a process
killed in between leaves an intent without a result: an ambiguous append or
settle, which the checker treats as "may or may not have happened".

Times are microseconds of the host's wall clock (``time.time_ns() // 1000``),
comparable across the processes of one run because they share the host.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

import orjson

from .._model._errors import InvalidArgument

__all__ = [
    "AppendOutcome",
    "AppendRecord",
    "DeliveryRecord",
    "History",
    "Recorder",
    "SettleRecord",
    "now_us",
    "read_history",
]

AppendOutcome = Literal["ok", "failed", "ambiguous"]
"""How one append call ended: ``ok`` (acknowledged, positions known), ``failed`` (a
definite failure: nothing was stored) or ``ambiguous`` (it may have been stored)."""

SettleOp = Literal["ack", "nack", "reject"]


def now_us() -> int:
    """The host's wall clock in microseconds (comparable across processes)."""
    return time.time_ns() // 1000


@dataclass(frozen=True, slots=True)
class AppendRecord:
    """One append call of a producer: the event ids it carried and how it ended."""

    ids: tuple[str, ...]
    outcome: AppendOutcome
    positions: tuple[tuple[int, int], ...] = ()
    """``(partition, sequence)`` of each id, in order, when ``outcome`` is ``ok``."""
    process: str = ""
    at_us: int = 0
    error: str = ""


@dataclass(frozen=True, slots=True)
class DeliveryRecord:
    """One lease handed to a handler (recorded when the handler starts)."""

    event_id: str
    partition: int
    sequence: int
    attempt: int
    lease_id: str
    worker: str
    at_us: int
    """When the handler started: the lease was granted before this."""


@dataclass(frozen=True, slots=True)
class SettleRecord:
    """One settle of one lease: what was asked and what the backend answered.

    ``result`` is ``"ok"``, a :class:`~rheo_flow.SettleKind` value (``"stale_lease"``,
    ...) or ``None`` when the process died before the answer was recorded.
    """

    event_id: str
    op: SettleOp
    lease_id: str
    attempt: int
    worker: str
    started_us: int | None
    """A lower bound of when the settle call was issued (the handler's end), or
    ``None`` when unknown (a shutdown nack of a lease no handler saw)."""
    result: str | None = None
    repeated: bool = False
    finished_us: int | None = None


@dataclass(slots=True)
class History:
    """Everything recorded during one run, from every process."""

    appends: list[AppendRecord] = field(default_factory=list)
    deliveries: list[DeliveryRecord] = field(default_factory=list)
    settles: list[SettleRecord] = field(default_factory=list)
    truncated: int = 0
    """Files whose last line was cut short (a process killed while writing)."""


class Recorder:
    """An append-only JSON-lines history file of one process, flushed per record.

    Flushing hands each record to the kernel, which keeps it through a ``kill -9``
    of the process; ``fsync=True`` also forces it to disk (only a host crash needs it).
    """

    def __init__(self, path: str | os.PathLike[str], process: str, *, fsync: bool = False) -> None:
        self.process = process
        """The name of the recording process (worker or producer)."""
        self._file: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives with self
        self._fsync = fsync

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(orjson.dumps(record).decode() + "\n")
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())

    def append_intent(self, ids: Sequence[str]) -> None:
        """Record that an append of ``ids`` is about to be sent."""
        self._write({"k": "append?", "ids": list(ids), "t": now_us(), "w": self.process})

    def append_result(self, ids: Sequence[str], outcome: AppendOutcome,
                      positions: Iterable[tuple[int, int]] = (), error: str = "") -> None:
        """Record how an append of ``ids`` ended."""
        self._write({"k": "append", "ids": list(ids), "r": outcome,
                     "pos": [list(p) for p in positions], "t": now_us(), "w": self.process,
                     "err": error})

    def delivery(self, event_id: str, partition: int, sequence: int, attempt: int,
                 lease_id: str) -> None:
        """Record a lease handed to a handler."""
        self._write({"k": "deliver", "id": event_id, "p": partition, "s": sequence,
                     "a": attempt, "l": lease_id, "t": now_us(), "w": self.process})

    def settle_intent(self, event_id: str, op: SettleOp, lease_id: str, attempt: int) -> None:
        """Record that a lease is about to be settled with ``op`` (its handler ended)."""
        self._write({"k": "settle?", "id": event_id, "op": op, "l": lease_id, "a": attempt,
                     "t": now_us(), "w": self.process})

    def settle_result(self, event_id: str, op: SettleOp, lease_id: str, attempt: int,
                      result: str, repeated: bool) -> None:
        """Record the backend's answer to a settle."""
        self._write({"k": "settle", "id": event_id, "op": op, "l": lease_id, "a": attempt,
                     "r": result, "rep": repeated, "t": now_us(), "w": self.process})

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def read_history(directory: str | os.PathLike[str]) -> History:
    """Every ``*.jsonl`` history file of ``directory``, merged into one :class:`History`.

    A last line cut short is skipped (and counted in ``truncated``); any other
    malformed line raises :class:`~rheo_flow.InvalidArgument`.
    """
    history = History()
    for path in sorted(Path(directory).glob("*.jsonl")):
        records: list[dict[str, Any]] = []
        lines = path.read_bytes().split(b"\n")
        last = len(lines) - 1
        for number, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                records.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                if number == last:  # no newline after it: the write was cut short
                    history.truncated += 1
                    continue
                raise InvalidArgument(f"{path.name} line {number + 1} is not JSON") from None
        _merge(history, records)
    return history


def _merge(history: History, records: list[dict[str, Any]]) -> None:
    """Pair intents with results within one process's records."""
    open_appends: dict[tuple[str, ...], dict[str, Any]] = {}
    intents: dict[str, dict[str, Any]] = {}
    answered: set[str] = set()
    for r in records:
        kind = r["k"]
        if kind == "append?":
            open_appends[tuple(r["ids"])] = r
        elif kind == "append":
            ids = tuple(r["ids"])
            open_appends.pop(ids, None)
            history.appends.append(AppendRecord(
                ids, r["r"], tuple((p, s) for p, s in r["pos"]), r["w"], r["t"], r["err"]))
        elif kind == "deliver":
            history.deliveries.append(DeliveryRecord(
                r["id"], r["p"], r["s"], r["a"], r["l"], r["w"], r["t"]))
        elif kind == "settle?":
            intents.setdefault(r["l"], r)
        elif kind == "settle":
            # A follow-up nack (after a failed ack) shares the ack's intent.
            intent = intents.get(r["l"])
            started = intent["t"] if intent is not None else None
            answered.add(r["l"])
            history.settles.append(SettleRecord(
                r["id"], r["op"], r["l"], r["a"], r["w"], started, r["r"], r["rep"], r["t"]))
    # Intents left without a result: the process died (or stopped) in between.
    for r in open_appends.values():
        history.appends.append(AppendRecord(tuple(r["ids"]), "ambiguous", (), r["w"], r["t"],
                                            "no result recorded"))
    for lease_id, r in intents.items():
        if lease_id in answered:
            continue
        history.settles.append(SettleRecord(r["id"], r["op"], r["l"], r["a"], r["w"], r["t"]))
