"""Input validation shared by the facade and the backends.

Every check raises :class:`InvalidArgument` with a message naming the problem,
before anything is written.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import orjson

from ._errors import InvalidArgument

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
"""A whole name (``fullmatch``: ``$`` would let a final newline through)."""
MAX_PARTITIONS = 4096
MAX_APPEND = 100_000
"""The most events one append takes."""
MAX_REASON = 2000
MAX_ERROR = 1000
"""The longest last-error text a nack or reject records (see :func:`error_text`)."""
MAX_ID = 200
MAX_TYPE = 256
MAX_DEPTH: Final = 254
"""The deepest nesting of lists and objects in event data (what orjson encodes)."""
MAX_SEQUENCE: Final = 2**63 - 1
"""Sequences and millisecond timestamps are signed 64-bit integers in every store."""
MAX_LEASE_MS: Final = 86_400_000
"""A lease lasts at most one day."""
MAX_DELAY_MS: Final = 2**31 - 1
"""A nack delay (and any other duration in milliseconds) is at most about 24.8 days."""
MAX_WAIT_S: Final = MAX_DELAY_MS / 1000
"""A wait or block timeout in seconds is at most as long as the longest delay."""


_VALID_NAMES: set[str] = set()
"""Names already checked: a hot path names the same few streams and groups on every call."""
_MAX_VALID_NAMES: Final = 4096


def check_name(kind: str, value: object) -> str:
    """A stream, group or consumer name: 1-128 of ``A-Z a-z 0-9 _ . -``, starting alphanumeric."""
    if value.__class__ is str and value in _VALID_NAMES:
        return value
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise InvalidArgument(
            f"invalid {kind} name {value!r}: use 1-128 characters of A-Z a-z 0-9 _ . - "
            "starting with a letter or digit"
        )
    if value.__class__ is str:
        if len(_VALID_NAMES) >= _MAX_VALID_NAMES:
            _VALID_NAMES.clear()  # many one-off names (generated consumer ids): start over
        _VALID_NAMES.add(value)
    return value


def check_positive_int(name: str, value: object, *, maximum: int | None = None) -> int:
    """An int >= 1 (and <= maximum)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{name} must be a positive integer, got {value!r}")
    if maximum is not None and value > maximum:
        raise InvalidArgument(f"{name} must be at most {maximum}, got {value!r}")
    return value


def check_non_negative_int(name: str, value: object) -> int:
    """An int >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"{name} must be a non-negative integer, got {value!r}")
    return value


def check_sequence(name: str, value: object, *, minimum: int = 0) -> int:
    """A sequence number (or millisecond timestamp): an int in ``minimum..2**63-1``."""
    if (isinstance(value, bool) or not isinstance(value, int)
            or not minimum <= value <= MAX_SEQUENCE):
        raise InvalidArgument(
            f"{name} must be an integer in {minimum}..{MAX_SEQUENCE} (2**63-1), got {value!r}"
        )
    return value


def check_duration_ms(name: str, value: object, *, minimum: int = 0,
                      maximum: int = MAX_DELAY_MS) -> int:
    """A duration in milliseconds: an int in ``minimum..maximum`` (by default 0..2**31-1)."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidArgument(
            f"{name} must be an integer number of milliseconds in {minimum}..{maximum}, "
            f"got {value!r}"
        )
    return value


def check_timeout_s(name: str, value: object) -> float:
    """A wait in seconds: a finite number in ``0..MAX_WAIT_S``."""
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not 0 <= value <= MAX_WAIT_S):  # NaN fails both comparisons
        raise InvalidArgument(f"{name} must be a number of seconds in 0..{MAX_WAIT_S}, "
                              f"got {value!r}")
    return float(value)


def check_start(name: str, value: object) -> None:
    """A start position: ``"earliest"``, ``"latest"`` or a sequence."""
    if value in ("earliest", "latest"):
        return
    if (isinstance(value, bool) or not isinstance(value, int)
            or not 0 <= value <= MAX_SEQUENCE):
        raise InvalidArgument(
            f'{name} must be "earliest", "latest" or a sequence in 0..{MAX_SEQUENCE} (2**63-1), '
            f"got {value!r}"
        )


ORDERINGS: Final = ("none", "key")
"""A group's orderings (docs/ordering.md)."""


def check_ordering(value: object) -> str:
    """A group ordering: ``"none"`` or ``"key"``."""
    if value.__class__ is not str or value not in ORDERINGS:
        raise InvalidArgument(f'ordering must be "none" or "key", got {value!r}')
    return str(value)


def ordering_mismatch(stream: str, group: str, existing: str, asked: str) -> InvalidArgument:
    """The error for asking an existing group for another ordering than it has."""
    return InvalidArgument(
        f"group {group!r} of stream {stream!r} exists with ordering {existing!r}, "
        f"not {asked!r} (the ordering is fixed when a group is created)"
    )


def check_text(what: str, value: str) -> str:
    """A string every store can hold: encodable as UTF-8 (no lone surrogate)."""
    if not value.isascii():  # O(1): ASCII text is always valid
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise unicode_error(what, exc) from None
    return value


def unicode_error(what: str, exc: UnicodeEncodeError) -> InvalidArgument:
    """The InvalidArgument for text that UTF-8 cannot encode."""
    bad = exc.object[exc.start:exc.end] if isinstance(exc.object, str) else ""
    return InvalidArgument(
        f"{what} is not valid Unicode text: it holds the lone surrogate {bad!r} "
        f"at position {exc.start}"
    )


def check_record_text(type_: str, event_id: str, key: str | None) -> None:
    """The type, id and key of one event, for a store that does not encode them itself.

    (Headers are checked by :func:`check_headers`, data by :func:`encode_json`.)
    """
    check_text("event type", type_)
    check_text("event id", event_id)
    if key is not None:
        check_text("key", key)


def refused_text(exc: BaseException) -> bool:
    """Whether ``exc`` is an encoder refusing text that is not valid Unicode (a
    ``TypeError`` of orjson or hiredis); it quotes no secret."""
    return isinstance(exc, TypeError) and "not valid UTF-8" in str(exc)


def invalid_text(exc: BaseException) -> InvalidArgument | None:
    """The InvalidArgument for an error a store or driver raised for text it cannot encode.

    Appends leave it to the encoders (the routing hash, the driver) to meet a lone
    surrogate rather than check every string of every event; the error they raise,
    possibly wrapped by a driver, becomes InvalidArgument here. None: another error.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, UnicodeEncodeError):
            return unicode_error("a string of the event", current)
        if refused_text(current):
            return InvalidArgument(
                "a string of the event is not valid Unicode text: it holds a lone surrogate"
            )
        current = current.__cause__ or current.__context__
    return None


def check_partition(value: object, partitions: int) -> int:
    """A partition id of a stream with ``partitions`` partitions."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < partitions:
        raise InvalidArgument(
            f"partition {value!r} is out of range: the stream has partitions 0..{partitions - 1}"
        )
    return value


def check_reason(value: object) -> str:
    """A settle reason: a non-empty string of bounded length."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"reason must be a non-empty string, got {value!r}")
    if len(value) > MAX_REASON:
        raise InvalidArgument(f"reason is longer than {MAX_REASON} characters")
    return check_text("reason", value)


def check_error(value: object) -> str | None:
    """A settle's last-error text: ``None``, or a string of at most :data:`MAX_ERROR`
    characters without NUL (no store keeps NUL in text)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(f"error must be a string or None, got {type(value).__name__}")
    if len(value) > MAX_ERROR:
        raise InvalidArgument(f"error is longer than {MAX_ERROR} characters")
    if "\x00" in value:
        raise InvalidArgument("error must not contain NUL characters")
    return check_text("error", value)


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND: Final = timedelta(milliseconds=1)


def aware_ms(name: str, value: datetime, *, round_up: bool = False) -> int:
    """``value`` as milliseconds since the Unix epoch, exactly (no float): a time inside
    a millisecond counts as that millisecond, or with ``round_up`` as the next one. A
    naive datetime is an :class:`InvalidArgument` naming ``name``: its time zone would
    be a guess."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(
            f"{name} must be an aware datetime (with a time zone, e.g. datetime.now(UTC)), "
            f"got {value!r}")
    elapsed = value - _EPOCH
    return elapsed // _MILLISECOND + (1 if round_up and elapsed % _MILLISECOND else 0)


def check_deliver_at(value: object) -> int:
    """``NewEvent.deliver_at`` as milliseconds since the Unix epoch: an aware datetime
    (:func:`aware_ms`), or an integer from 0 to :data:`MAX_SEQUENCE`."""
    if isinstance(value, datetime):
        return aware_ms("deliver_at", value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEQUENCE:
        raise InvalidArgument(
            "deliver_at must be an aware datetime or milliseconds since the Unix epoch "
            f"(an integer from 0), got {value!r}")
    return value


def check_event_id(value: object) -> str:
    """A caller-supplied event id."""
    if not isinstance(value, str) or not value or len(value) > MAX_ID:
        raise InvalidArgument(f"event id must be a string of 1-{MAX_ID} characters, got {value!r}")
    return value


def check_type(value: object) -> str:
    """An event type."""
    if not isinstance(value, str) or not value or len(value) > MAX_TYPE:
        raise InvalidArgument(
            f"event type must be a string of 1-{MAX_TYPE} characters, got {value!r}"
        )
    return value


def check_key(value: object) -> str | None:
    """A routing key (or None)."""
    if value is not None and not isinstance(value, str):
        raise InvalidArgument(f"key must be a string or None, got {type(value).__name__}")
    return value


def check_headers(value: object) -> dict[str, str]:
    """Headers: a mapping of strings to strings."""
    if not isinstance(value, Mapping):
        raise InvalidArgument(
            f"headers must be a mapping of str to str, got {type(value).__name__}"
        )
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidArgument(f"headers must map str to str, got {k!r}: {v!r}")
        out[check_text("header name", k)] = check_text("header value", v)
    return out


_ORJSON_OPTIONS: Final = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_strict_dumps = json.JSONEncoder(
    separators=(",", ":"), allow_nan=False, ensure_ascii=False, default=lambda v: _refuse(v)
).encode


def encode_json(data: Any, *, what: str = "event data") -> str:
    """Serialise ``data`` to compact JSON, refusing anything JSON cannot carry exactly.

    orjson does the work; what it refuses or cannot tell apart is left to the
    standard library, which encodes exactly or refuses: integers beyond 64 bits
    and non-string keys (orjson refuses them), and any text with ``null`` in it
    (orjson writes NaN and infinities as ``null``, which must be refused).
    """
    try:
        text = orjson.dumps(data, default=_refuse, option=_ORJSON_OPTIONS)
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        message = str(exc)
        if "not valid UTF-8" in message:  # a lone surrogate: no store can hold it
            raise InvalidArgument(
                f"{what} is not valid Unicode text: a string holds a lone surrogate"
            ) from None
        if "ecursion limit" in message:
            raise InvalidArgument(
                f"{what} is not JSON-serialisable: nested too deeply "
                f"(at most {MAX_DEPTH} levels of lists and objects)"
            ) from None
        return _encode_strict(data, what)
    if b"null" in text:
        return _encode_strict(data, what)
    return text.decode()


def _encode_strict(data: Any, what: str) -> str:
    try:
        text: str = _strict_dumps(data)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgument(f"{what} is not JSON-serialisable: {exc}") from None
    return check_text(what, text)


def _refuse(value: object) -> Any:
    raise TypeError(f"object of type {type(value).__name__} is not JSON")


def check_lease_ms(value: object) -> int:
    """A lease duration in milliseconds (10 ms .. 1 day)."""
    v = check_positive_int("lease_ms", value, maximum=MAX_LEASE_MS)
    if v < 10:
        raise InvalidArgument(f"lease_ms must be at least 10, got {v}")
    return v


def check_finite(name: str, value: float) -> float:
    """A finite float."""
    if not math.isfinite(value):
        raise InvalidArgument(f"{name} must be finite")
    return value
