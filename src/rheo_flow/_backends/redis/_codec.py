"""How events and records travel to and from Redis.

A stream entry holds ``meta`` (JSON ``[id, type, key, headers]``), ``data``
(JSON) and ``time`` (append time, server clock); the scripts reply with those
texts as stored, so the data of an event is decoded only when first read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from ..._backend import AppendRecord
from ..._model._event import Event, make_event_json
from ..._model._lease import Lease, make_lease
from ..._model._stream import Retention

__all__ = [
    "FetchReply",
    "appended_across",
    "appended_events",
    "block_token",
    "encode_metas",
    "entry_event",
    "fetch_reply",
    "fetched_leases",
    "group_record",
    "range_leases",
    "stream_record",
    "stream_retention",
    "text",
]


def text(value: Any) -> str:
    """A reply as text, in either response mode of redis-py."""
    return value.decode() if isinstance(value, bytes) else str(value)


def stream_record(record: Any) -> tuple[int, int]:
    """(partitions, created_ms) of a stream record ``partitions|created_ms``, followed by
    ``|max_age_ms|max_events`` when the stream has a retention policy."""
    count, created = (int(v) for v in text(record).split("|")[:2])
    return count, created


def stream_retention(record: Any) -> Retention | None:
    """The retention policy of a stream record (``None`` when it has none)."""
    fields = text(record).split("|")
    if len(fields) < 4:
        return None
    return Retention.from_ms(int(fields[2]) if fields[2] else None,
                             int(fields[3]) if fields[3] else None)


def group_record(record: Any) -> tuple[str, str, str, str]:
    """(max_attempts, created_ms, start, ordering) of a group record
    ``max_attempts|created_ms|start`` (ordering ``"none"``) or
    ``max_attempts|created_ms|start|key`` (a key-ordered group)."""
    ma, created, rest = text(record).split("|", 2)
    start, bar, ordering = rest.partition("|")
    return ma, created, start, "key" if bar and ordering == "key" else "none"


def encode_metas(records: Sequence[AppendRecord]) -> list[str]:
    """The ``meta`` field of each record's entry; a string no store can hold fails here."""
    dumps = orjson.dumps
    return [dumps((r.id, r.type, r.key, r.headers if type(r.headers) is dict
                   else dict(r.headers))).decode() for r in records]


def appended_events(
    stream: str, partition: int, records: Sequence[AppendRecord], reply: list[Any]
) -> list[Event]:
    """The events of one partition's append reply ``[time, items]`` (see ``append.lua``)."""
    at, items = reply
    out: list[Event] = []
    add = out.append
    built: dict[int, Event] = {}
    for r, item in zip(records, items, strict=True):
        if type(item) is int:
            event = built.get(item)
            if event is None:
                headers = r.headers
                event = built[item] = make_event_json(
                    stream, partition, item, r.id, r.type, r.data_json, r.key,
                    dict(headers) if headers else {}, at)
        else:
            seq, stored_at, (event_id, type_, key, headers), data = item
            event = make_event_json(stream, partition, seq, event_id, type_, data, key, headers,
                                    stored_at)
        add(event)
    return out


def appended_across(stream: str, records: Sequence[AppendRecord], reply: list[Any]
                    ) -> list[Event]:
    """The events of an ``append_many.lua`` reply ``[times, items]``."""
    times_list, items = reply
    times = dict(times_list)
    out: list[Event] = []
    add = out.append
    built: dict[tuple[int, int], Event] = {}
    for r, item in zip(records, items, strict=True):
        if len(item) == 2:
            partition, seq = item
            event = built.get((partition, seq))
            if event is None:
                headers = r.headers
                event = built[partition, seq] = make_event_json(
                    stream, partition, seq, r.id, r.type, r.data_json, r.key,
                    dict(headers) if headers else {}, times[partition])
        else:
            partition, seq, stored_at, (event_id, type_, key, headers), data = item
            event = make_event_json(stream, partition, seq, event_id, type_, data, key, headers,
                                    stored_at)
        add(event)
    return out


class FetchReply(NamedTuple):
    """One partition's ``fetch.lua`` reply, its JSON head by name (see that script's
    header). A release whose head ended at ``more`` leased no range: the defaults."""

    high_water: int
    still_due: int
    """How many more deliveries the partition has due (redeliveries and new)."""
    deadline: int
    redelivered: int
    """How many of ``items`` are redeliveries (they come first)."""
    items: list[Any]
    """``[seq, attempt, time, [id, type, key, headers]]`` per lease of the reply."""
    more: int = 0
    """1 when a key-ordered group's scan stopped at its budget short of the quota."""
    first: int = 0
    """The first sequence of an unordered group's range of new deliveries (0: none)."""
    last: int = 0
    cursor: int = -1
    """Where the group's cursor is now (-1: a key-ordered group)."""
    earliest: int = 0
    """On a Cluster: the partition's earliest due delivery or block deadline (0: none)."""
    fresh: int = -1
    """On a Cluster: 1 when events are past the group's cursor, else 0 (-1: not asked)."""


def fetch_reply(reply: Sequence[Any]) -> FetchReply:
    """The head of a ``fetch.lua`` array reply (its first element), decoded and named."""
    return FetchReply(*orjson.loads(reply[0]))


def fetched_leases(
    stream: str, partition: int, group: str, consumer_id: str, token: str,
    head: FetchReply, datas: Sequence[Any],
) -> list[Lease]:
    """The leases of one partition's fetch reply: its named ``head`` and the data texts
    after it (see ``fetch.lua``); ``token`` is the block token the fetch sent.

    The redelivered items come first (lease ids ``<token>.1``, ``<token>.2``, ...), then
    the new ones, one block (lease ids ``<token>:<seq>``).
    """
    deadline, redelivered = head.deadline, head.redelivered
    prefix = f"{token}."
    block = f"{token}:"
    return [
        make_lease(
            f"{prefix}{n}" if n <= redelivered else f"{block}{seq}", f"{seq}-0",
            group, consumer_id,
            make_event_json(stream, partition, seq, event_id, type_, data, key, headers, at),
            attempt, deadline)
        for n, ((seq, attempt, at, (event_id, type_, key, headers)), data)
        in enumerate(zip(head.items, datas, strict=True), 1)
    ]


def block_token(lease_id: str) -> str | None:
    """The block token of a block lease id ``<token>:<seq>`` (``None``: not one)."""
    token, colon, _ = lease_id.rpartition(":")
    return token if colon else None


def range_leases(
    stream: str, partition: int, group: str, consumer_id: str, token: str, deadline: int,
    entries: Sequence[Any], first: int, last: int, *, whole: bool = True,
) -> list[Lease] | None:
    """The block leases (attempt 1, lease ids ``<token>:<seq>``) of the new deliveries
    ``first..last`` of one fetch, from an ``XRANGE`` reply (entries ``[id, [field, value,
    ...]]``, or redis-py's ``(id, {field: value})``).

    With ``whole``, None unless ``entries`` hold every one of them (they may start
    before ``first`` and go on past ``last``); without it, the leases of those there.
    """
    n = last - first + 1
    if entries:
        start = first - _seq(entries[0][0])
        if start >= 0 and start + n <= len(entries) and _seq(entries[start + n - 1][0]) == last:
            # Ids strictly increase: from first to last in n entries, none is missing.
            return _block_leases(stream, partition, group, consumer_id, token, deadline,
                                 entries[start:start + n], range(first, last + 1))
    if whole:
        return None
    inside = [e for e in entries if first <= _seq(e[0]) <= last]
    return _block_leases(stream, partition, group, consumer_id, token, deadline, inside,
                         [_seq(e[0]) for e in inside])


def _seq(entry_id: Any) -> int:
    """The sequence of an entry id ``<seq>-0`` (bytes or text)."""
    return int(entry_id[:-2])


def _block_leases(
    stream: str, partition: int, group: str, consumer_id: str, token: str, deadline: int,
    entries: Sequence[Any], seqs: Sequence[int],
) -> list[Lease]:
    if not entries:
        return []
    fields = [f for _, f in entries]
    if type(fields[0]) is not list:  # redis-py's dicts (see ScriptRunner.run_and_read)
        fields = [[item for pair in f.items() for item in pair] for f in fields]
    # The fields as XADD wrote them: meta, data, time. The metas are decoded at once, as
    # one JSON array (cheaper than a call per entry).
    texts = [f[1] for f in fields]
    metas = orjson.loads(b"[" + b",".join(texts) + b"]" if type(texts[0]) is bytes
                         else "[" + ",".join(texts) + "]")
    prefix = f"{token}:"
    return [
        make_lease(f"{prefix}{seq}", f"{seq}-0", group, consumer_id,
                   make_event_json(stream, partition, seq, event_id, type_, f[3], key, headers,
                                   int(f[5])),
                   1, deadline)
        # f[3], f[5]: the data and the time (a scheduled event's entry has more fields).
        for seq, f, (event_id, type_, key, headers) in zip(seqs, fields, metas, strict=True)
    ]


def entry_event(stream: str, partition: int, entry_id: Any, fields: Mapping[Any, Any]
                ) -> Event:
    """The event of a stream entry as ``XRANGE`` returns it."""
    values = {text(k): v for k, v in fields.items()}
    meta = json.loads(values["meta"])
    seq = int(text(entry_id).split("-", 1)[0])
    # The data decodes on first read: a large event's is filled in from its blob first.
    return make_event_json(stream, partition, seq, meta[0], meta[1], values["data"], meta[2],
                           meta[3], int(values["time"]))
