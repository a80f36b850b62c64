"""Events: what is appended (:class:`NewEvent`) and what is stored (:class:`Event`).

Backends build many events per call, so besides the keyword constructor there is
:func:`make_event` (positional, several times cheaper than a frozen dataclass's
``__init__``: see :mod:`._builders`) and :func:`make_event_json` (keeps the stored
JSON text and decodes ``data`` on first access). Both return ordinary, immutable
:class:`Event` objects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Generic, TypeAlias, TypeVar

import orjson

from ._builders import positional_builder

__all__ = ["JSON", "Event", "NewEvent", "decode_json", "make_event", "make_event_json",
           "pending_json"]

JSON: TypeAlias = Any
"""A JSON-serialisable value: ``None``, bool, int, float, str, list or dict with str keys."""

if TYPE_CHECKING:
    import typing_extensions

    DataT = typing_extensions.TypeVar("DataT", default=Any)
else:  # a default needs Python 3.13 at run time; only type checkers read it
    DataT = TypeVar("DataT")
"""The type of an event's data: JSON, or the model its consumer declared for its type
(``Event[OrderPlaced]``: docs/typed-events.md)."""


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append.

    ``id`` makes the append idempotent: appending an event whose id is already in
    the stream returns the stored event and allocates no second sequence. When
    omitted a UUID is generated. ``key`` routes the event to a partition by a
    stable hash; ``partition`` routes it explicitly (and wins over the key).

    ``deliver_at`` schedules the event (docs/contract.md, "Delayed delivery"): an
    aware :class:`~datetime.datetime` or milliseconds since the Unix epoch. The
    event takes its sequence at append, and no group leases it before that time
    (the backend's clock); on a backend without the ``delayed_delivery``
    capability the append raises :class:`~rheo_flow.Unsupported`. The time is
    the delivery's, not part of the stored :class:`Event`.
    """

    type: str
    data: JSON = None
    id: str | None = None
    key: str | None = None
    partition: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    deliver_at: datetime | int | None = None


@dataclass(frozen=True, slots=True)
class Event(Generic[DataT]):
    """An immutable event stored in a partition of a stream.

    ``Event[Model]`` annotates a handler's event whose ``data`` its consumer validates
    into ``Model`` (``models``: docs/typed-events.md); a bare ``Event`` has JSON data."""

    stream: str
    partition: int
    sequence: int
    """Gapless per-partition sequence, starting at 1."""
    id: str
    type: str
    data: DataT
    key: str | None
    headers: Mapping[str, str]
    appended_at_ms: int
    """Append time, milliseconds since the Unix epoch (backend clock where it has one)."""

    @property
    def appended_at(self) -> datetime:
        """Append time as an aware UTC datetime."""
        return datetime.fromtimestamp(self.appended_at_ms / 1000, tz=UTC)


class _Pending:
    """JSON text in the ``data`` slot, not decoded yet."""

    __slots__ = ("text",)

    def __init__(self, text: str | bytes) -> None:
        self.text = text


# A backend often hands over the JSON text of ``data``: it is decoded when (and
# only when) ``data`` is first read. The ``data`` slot then holds a _Pending and
# ``data`` is a property over the slot.
_DATA_SLOT: Final[Any] = Event.__dict__["data"]
_get_data = _DATA_SLOT.__get__
_set_data = _DATA_SLOT.__set__

# orjson parses integers beyond 64 bits as floats; the standard library keeps
# them exact. Only text with a run of 19 digits can hold such an integer.
_LONG_DIGITS: Final = re.compile(r"[0-9]{19}")
_LONG_DIGITS_BYTES: Final = re.compile(rb"[0-9]{19}")


def decode_json(text: str | bytes) -> JSON:
    """Decode JSON text exactly as :func:`json.loads` does, with orjson where that is exact."""
    if len(text) >= 19:
        if isinstance(text, str):
            if _LONG_DIGITS.search(text) is not None:
                return json.loads(text)
        elif _LONG_DIGITS_BYTES.search(text) is not None:
            return json.loads(text)
    return orjson.loads(text)


def _data(self: Event) -> JSON:
    """The event's JSON payload."""
    value = _get_data(self, Event)
    if value.__class__ is _Pending:
        value = decode_json(value.text)
        _set_data(self, value)
    return value


type.__setattr__(Event, "data", property(_data, _set_data))


def pending_json(event: Event) -> _Pending | None:
    """The JSON text of an event's data not decoded yet (its ``text`` may be replaced
    before the first read: a backend that stores large data elsewhere fills it in), or
    None once decoded."""
    value = _get_data(event, Event)
    return value if value.__class__ is _Pending else None


_EVENT_DOC = """An :class:`Event` from positional fields (stream, partition, sequence, id,
type, data, key, headers, appended_at_ms), without the frozen ``__init__``'s
cost.

For backends, which build events in bulk from values they already trust."""

make_event: Callable[
    [str, int, int, str, str, JSON, str | None, Mapping[str, str], int], Event,
] = positional_builder(
    Event, _EVENT_DOC)


_new: Final = object.__new__


def make_event_json(
    stream: str, partition: int, sequence: int, id: str, type: str, data_json: str | bytes,
    key: str | None, headers: Mapping[str, str], appended_at_ms: int,
) -> Event:
    """Like :func:`make_event`, from the JSON text of ``data``: decoded on first access."""
    pending = _new(_Pending)  # without __init__'s frame: one per event fetched
    pending.text = data_json
    return make_event(stream, partition, sequence, id, type, pending, key, headers,
                      appended_at_ms)

