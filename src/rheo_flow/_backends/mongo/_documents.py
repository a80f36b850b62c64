"""The documents: their ``_id``s, events to and from documents, groups as read, settle updates.

Field names are short (they are stored in every document):

* event: ``st`` stream, ``p`` partition, ``n`` sequence, ``id``, ``t`` type,
  ``k`` key, ``d`` data (JSON text), ``h`` headers (JSON text, absent when
  empty), ``at`` appended at, ``da`` deliver at (absent: at once);
* stream: ``sc`` (1: it has held a scheduled event; absent: never);
* group: ``s`` stream, ``n`` name, ``ma`` max attempts, ``at`` created at,
  ``o`` ordering (``"key"``; absent: ``"none"``), ``parts`` per partition,
  ``np`` the partition count, ``w`` the work summary (partition, as text: the
  sequence appended up to), ``ws`` (1: the summary is kept; see ``_summary``)
  and ``sc`` (1: the stream has held a scheduled event; see ``_delay``);
* delivery: ``g`` group id, ``p`` partition, ``s`` sequence, ``st`` state,
  ``a`` attempt, ``lid`` lease id, ``rc`` receipt, ``c`` consumer, ``dl``
  deadline, ``r`` ready at (only while available or leased), ``sb`` settled
  by, ``rs`` reason, ``rj`` rejected at, ``le`` last error, ``tk`` the token
  of the settle call that wrote it last, ``k`` the event's key (only in a
  key-ordered group, only when the event has one, and only while the delivery
  is unsettled: settling it for good renames it ``sk``, a redrive back).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..._backend import AppendRecord
from ..._model._event import Event
from ..._model._stream import GroupInfo, paused_state
from .._transitions import Settled

__all__ = [
    "DELIVERY_FIELDS",
    "Group",
    "delivery_id",
    "event_document",
    "event_id",
    "event_of",
    "group_info_of",
    "ordering_of",
    "partition_id",
    "settled_update",
]

DELIVERY_FIELDS: Final = {
    "_id": 1, "p": 1, "s": 1, "st": 1, "a": 1, "lid": 1, "rc": 1, "sb": 1, "k": 1,
}
"""The fields of a delivery a settle decides on (and its key, which a settle releases)."""


def partition_id(stream: str, partition: int) -> str:
    """A partition document's ``_id``."""
    # Names match [A-Za-z0-9_.-]: a "/" cannot be part of one.
    return f"{stream}/{partition}"


def event_id(stream: str, partition: int, sequence: int) -> str:
    """An event document's ``_id``: its position, so lookups by position use ``_id``."""
    return f"{stream}/{partition}/{sequence}"


def delivery_id(group_id: Any, partition: int, sequence: int) -> str:
    """A delivery document's ``_id``: unique per (group, partition, sequence)."""
    return f"{group_id}/{partition}/{sequence}"


def event_document(stream: str, record: AppendRecord, sequence: int, now: int) -> dict[str, Any]:
    """The document storing ``record`` at ``sequence`` of its partition."""
    doc: dict[str, Any] = {
        "_id": event_id(stream, record.partition, sequence),
        "st": stream, "p": record.partition, "n": sequence, "id": record.id, "t": record.type,
        "k": record.key, "d": record.data_json, "at": now,
    }
    if record.deliver_at_ms is not None:
        doc["da"] = record.deliver_at_ms
    if record.headers:
        doc["h"] = json.dumps(dict(record.headers), separators=(",", ":"))
    return doc


def event_of(doc: Mapping[str, Any]) -> Event:
    """The event an event document stores."""
    headers = doc.get("h")
    return Event(
        stream=doc["st"],
        partition=doc["p"],
        sequence=doc["n"],
        id=doc["id"],
        type=doc["t"],
        data=json.loads(doc["d"]),
        key=doc.get("k"),
        headers=json.loads(headers) if headers else {},
        appended_at_ms=doc["at"],
    )


@dataclass(slots=True)
class Group:
    """A group document as read: its id, settings, per-partition progress and work summary.

    ``parts`` holds every partition of a group read whole, and only the partitions a
    fetch visits of one read in part (``_claim``); ``count`` is the partition count.
    """

    id: Any
    stream: str
    name: str
    max_attempts: int
    created_at_ms: int
    parts: dict[int, dict[str, int]]
    """Per partition: ``c`` cursor, ``f`` frontier, ``e`` epoch."""
    count: int
    """How many partitions the group has."""
    ordering: str = "none"
    """``"key"``: a delivery of key K waits for every earlier one of K (docs/ordering.md)."""
    work: dict[int, int] | None = None
    """The work summary (``_summary``): the partitions that may have events past the
    cursor, each with the sequence appended up to; ``None`` while the group has none
    (written before summaries, or not built yet)."""
    paused_until: int = 0
    """The end of the group's pause, ms (``pz``; 0 or absent: not paused; 2^62: until
    resumed): a fetch of the group returns nothing before it."""
    scheduled: bool = False
    """The stream has held scheduled events (``sc``): a fetch looks for those not due
    in its window (``_delay``); absent (every group before delayed delivery): never."""

    @classmethod
    def of(cls, doc: Mapping[str, Any], first: int = 0) -> Group:
        """The group a group document stores (one written before orderings is unordered).

        ``first``: the partition of the first entry of ``parts`` (read in part).
        """
        listed = doc.get("parts", [])
        count = doc.get("np", len(listed))
        summary = doc.get("w") or {}
        return cls(doc["_id"], doc["s"], doc["n"], doc["ma"], doc["at"],
                   {first + i: part for i, part in enumerate(listed)}, count, ordering_of(doc),
                   {int(p): top for p, top in summary.items()} if doc.get("ws") else None,
                   doc.get("pz", 0), bool(doc.get("sc")))

    @property
    def ordered(self) -> bool:
        """Whether the group is key-ordered."""
        return self.ordering == "key"

    def info(self, now: int) -> GroupInfo:
        """The group as the contract describes it, paused or not at ``now``."""
        return GroupInfo(self.stream, self.name, self.max_attempts, self.created_at_ms,
                         self.ordering, *paused_state(self.paused_until, now))


def group_info_of(doc: Mapping[str, Any], now: int) -> GroupInfo:
    """The group a group document (read without its entries) stores, paused or not at
    ``now``."""
    return GroupInfo(doc["s"], doc["n"], doc["ma"], doc["at"], ordering_of(doc),
                     *paused_state(doc.get("pz", 0), now))


def ordering_of(doc: Mapping[str, Any]) -> str:
    """A group document's ordering: ``"key"``, or ``"none"`` (also when the field is absent)."""
    return "key" if doc.get("o") == "key" else "none"


def settled_update(settled: Settled, **fields: Any) -> dict[str, Any]:
    """The update storing ``settled`` (and ``fields``) in a delivery document.

    A settled-for-good delivery loses its ready time ``r``, which takes it off
    the index of active deliveries, and its key ``k`` becomes ``sk``, which
    takes it off the index of unsettled keys; a nacked one is ready again at
    its ``available_at_ms``.
    """
    changes: dict[str, Any] = {
        "st": settled.state, "rs": settled.reason, "sb": settled.settled_by, **fields,
    }
    if settled.available_at_ms is not None:
        changes["r"] = settled.available_at_ms
    if settled.rejected_at_ms is not None:
        changes["rj"] = settled.rejected_at_ms
    update: dict[str, Any] = {"$set": changes}
    if settled.terminal:
        update["$unset"] = {"r": ""}
        update["$rename"] = {"k": "sk"}
    return update
