"""JSON text of the values of JSON columns: orjson, with the standard library as fallback.

Sinks encode every row's JSON columns on their hot path; orjson does it several
times faster than the standard library. What orjson refuses and the standard
library encodes exactly (integers beyond 64 bits, non-string keys) falls back to
the standard library, so no value changes on the way. Values the standard library
cannot encode at all but orjson can (dates, UUIDs, dataclasses, enums) are written
the way orjson writes them.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["dumps"]

_stdlib_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"),
                                 allow_nan=False).encode


def dumps(value: Any) -> str:
    """Compact JSON text of ``value`` (UTF-8, not ASCII-escaped).

    Raises TypeError or ValueError for what JSON cannot carry, a float that is not
    finite included.
    """
    try:
        text = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return _stdlib_dumps(value)  # e.g. an integer beyond 64 bits, non-string keys
    if b"null" in text:
        # orjson writes NaN and infinities as null; the strict encoder refuses them.
        return _stdlib_dumps(value)
    return text.decode()
