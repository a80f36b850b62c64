"""What :meth:`Rheo.append <rheo_flow.Rheo.append>` sends: the events it is given,
validated, with their ids and partitions, as :class:`AppendRecord` s (what
:meth:`Backend.append <rheo_flow.Backend.append>` takes).

One pass over the events, with a cheap path for well-formed ones (a type check
per field, the full check only when it fails): this is the hot path of every
append. Generated ids are time-ordered (UUID version 7); an event without a
partition goes by its key, else by its id, through the stable CRC-32 routing.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ._builders import positional_builder
from ._errors import InvalidArgument, Unsupported
from ._event import JSON, NewEvent
from ._typed import encode_model
from ._validation import (
    MAX_ID,
    MAX_TYPE,
    check_deliver_at,
    check_event_id,
    check_headers,
    check_key,
    check_partition,
    check_type,
    encode_json,
)

__all__ = [
    "DEFAULT_MAX_EVENT_BYTES",
    "MAX_EVENT_BYTES",
    "AppendRecord",
    "append_records",
    "check_max_event_bytes",
    "make_append_record",
]

DEFAULT_MAX_EVENT_BYTES: Final = 1_048_576
"""The default bound on one event's data, as compact JSON in UTF-8 bytes (1 MiB, as
Kafka's ``message.max.bytes`` and NATS' ``max_payload``)."""
MAX_EVENT_BYTES: Final = 64 * 1_048_576
"""The highest bound an instance may set (an engine's own limit may be lower)."""

_EVENT_FIELDS: Final = frozenset({"type", "data", "id", "key", "partition", "headers",
                                  "deliver_at"})
_UUID_VARIANT: Final = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}
"""Hex digit -> an RFC 4122 variant digit (10xx) keeping the digit's low two random bits."""
_NO_HEADERS: Final[Mapping[str, str]] = {}
_JSON_TYPES: Final = frozenset({dict, list, str, int, float, bool, type(None)})
"""Classes of data that go straight to the JSON encoder (others may be models)."""

_Fields = tuple[Any, Any, Any, Any, Any, Any, Any]
"""An event's type, data, id, key, partition, headers and deliver_at, as given."""


@dataclass(frozen=True, slots=True)
class AppendRecord:
    """One validated, routed event for :meth:`Backend.append`.

    ``data_json`` is the compact JSON text of ``data``, what backends store; ``data``
    is what the event was given: JSON, or a model instance (docs/typed-events.md).
    """

    partition: int
    id: str
    type: str
    key: str | None
    data: JSON
    data_json: str
    headers: Mapping[str, str]
    deliver_at_ms: int | None = None
    """``NewEvent.deliver_at`` in milliseconds since the Unix epoch; None: at once."""


_RECORD_DOC = """An :class:`AppendRecord` from positional fields (partition, id, type, key,
data, data_json, headers[, deliver_at_ms]), without the frozen ``__init__``'s cost."""

make_append_record: Callable[..., AppendRecord] = positional_builder(
    AppendRecord, _RECORD_DOC)


def check_max_event_bytes(value: object, ceiling: int | None = None) -> int:
    """A valid bound on an event's data in bytes: an integer from 1 to
    :data:`MAX_EVENT_BYTES`, and to ``ceiling`` (the engine's own limit) when given."""
    highest = MAX_EVENT_BYTES if ceiling is None else min(ceiling, MAX_EVENT_BYTES)
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= highest:
        raise InvalidArgument(
            f"max_event_bytes must be an integer from 1 to {highest:,}"
            f"{'' if ceiling is None else ' (this backend stores no larger event)'}, "
            f"got {value!r}")
    return value


def _too_large(records: list[AppendRecord], event_id: str, size: int, limit: int
               ) -> InvalidArgument:
    return InvalidArgument(
        f"event {len(records)} of the batch ({event_id!r}) has {size:,} bytes of data "
        f"(as JSON), over this store's limit of {limit:,} bytes: nothing was appended "
        "(raise the limit with Rheo(..., max_event_bytes=N) or ?max_event_bytes=N in "
        "the URL)")


def append_records(
    items: Sequence[NewEvent | Mapping[str, Any]], count: int, key: str | None,
    partition: int | None, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    undelayed: str | None = None,
) -> list[AppendRecord]:
    """Validate and route ``items`` over ``count`` partitions; ``key`` and ``partition``
    apply to every event that sets neither. An event whose data, as compact JSON, is
    over ``max_event_bytes`` UTF-8 bytes is refused. ``undelayed``: the name of a
    backend without delayed delivery, which refuses an event with ``deliver_at``."""
    # A character is at most 4 bytes: shorter texts are under the limit uncounted.
    surely_small = max_event_bytes // 4
    records: list[AppendRecord] = []
    append = records.append
    crc32 = zlib.crc32
    ids = _Ids(len(items))
    for item in items:
        if isinstance(item, NewEvent):
            type_, data, event_id = item.type, item.data, item.id
            event_key, target, headers = item.key, item.partition, item.headers
            deliver_at = item.deliver_at
        else:
            type_, data, event_id, event_key, target, headers, deliver_at = _mapping_fields(item)
        if event_key is None:
            event_key = key
        elif event_key.__class__ is not str:
            check_key(event_key)
        if event_id is None:
            event_id = ids.next()
        elif event_id.__class__ is not str or not 0 < len(event_id) <= MAX_ID:
            check_event_id(event_id)
        if target is None:
            target = partition
        if target is not None:
            if target.__class__ is not int or not 0 <= target < count:
                target = check_partition(target, count)
        elif count == 1:
            target = 0
        else:
            # By the key, else by the id: random for generated ids, and a retried
            # append of the same event lands where the first one did.
            target = crc32((event_id if event_key is None else event_key).encode()) % count
        if type_.__class__ is not str or not 0 < len(type_) <= MAX_TYPE:
            check_type(type_)
        headers = {} if headers.__class__ is dict and not headers else check_headers(headers)
        if data.__class__ in _JSON_TYPES:
            text = encode_json(data)
        else:
            text, headers = _encode(data, headers)
        if len(text) > surely_small:
            size = len(text.encode("utf-8", "surrogatepass"))
            if size > max_event_bytes:
                raise _too_large(records, event_id, size, max_event_bytes)
        if deliver_at is None:
            append(make_append_record(target, event_id, type_, event_key, data, text, headers))
        else:
            append(make_append_record(target, event_id, type_, event_key, data, text, headers,
                                      _delivery_ms(deliver_at, undelayed)))
    return records


def _encode(data: object, headers: Mapping[str, str]) -> tuple[str, Mapping[str, str]]:
    """The JSON text of data that is not plain JSON (a model, or what encode_json refuses)."""
    typed = encode_model(data, headers)
    return (encode_json(data), headers) if typed is None else typed


def _delivery_ms(deliver_at: object, undelayed: str | None) -> int:
    at = check_deliver_at(deliver_at)
    if undelayed is not None:
        raise Unsupported(undelayed, "append with deliver_at")
    return at


def _mapping_fields(item: object) -> _Fields:
    """The fields of an event given as a mapping (its keys checked)."""
    if not isinstance(item, Mapping):
        raise InvalidArgument(f"events must be NewEvent or mappings, got {type(item).__name__}")
    if not item.keys() <= _EVENT_FIELDS:
        unknown = set(item) - _EVENT_FIELDS
        raise InvalidArgument(f"unknown event fields: {', '.join(sorted(unknown))}")
    if "type" not in item:
        raise InvalidArgument("an event needs a 'type'")
    return (item["type"], item.get("data"), item.get("id"), item.get("key"),
            item.get("partition"), item.get("headers", _NO_HEADERS), item.get("deliver_at"))


class _Ids:
    """Generated event ids for one append: time-ordered UUIDs (version 7: milliseconds,
    then random bits), the random bits drawn for the whole batch at once, on first use.

    Time-ordered ids land next to each other in the stores' unique id index, where
    random ids touch a different index page per insert once a stream is large.
    """

    __slots__ = ("_count", "_generated", "_prefix", "_random")

    def __init__(self, count: int) -> None:
        self._count = count
        self._generated = 0
        self._prefix = ""
        self._random = ""

    def next(self) -> str:
        """The next id."""
        if not self._random:
            self._random = os.urandom(10 * self._count).hex()
            millis = f"{time.time_ns() // 1_000_000 & 0xFFFFFFFFFFFF:012x}"
            self._prefix = f"{millis[:8]}-{millis[8:]}-7"
        r = self._random
        o = 20 * self._generated
        self._generated += 1
        return (f"{self._prefix}{r[o:o + 3]}-{_UUID_VARIANT[r[o + 3]]}{r[o + 4:o + 7]}-"
                f"{r[o + 7:o + 19]}")
