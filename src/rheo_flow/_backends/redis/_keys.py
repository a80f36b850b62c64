"""The key layout of the Redis backend (see the package docstring): key names and hash tags.

Every key of one partition shares the hash tag ``{P:s:p}``; the stream-level keys
(``P:streams``, ``P:groups:<s>``, ``P:ids:<s>``) carry none.
"""

from __future__ import annotations

import re
from typing import Final

from ..._model._errors import InvalidArgument

__all__ = ["DEFAULT_PREFIX", "KeyLayout", "check_prefix"]

DEFAULT_PREFIX: Final = "rheo"
_PREFIX_PATTERN: Final = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def check_prefix(prefix: object) -> str:
    """A validated key prefix: no ``:``, so that no prefix is the start of another's keys."""
    if not isinstance(prefix, str) or not _PREFIX_PATTERN.match(prefix):
        raise InvalidArgument(
            f"invalid Redis key prefix {prefix!r}: use 1-64 characters of "
            "A-Z a-z 0-9 _ . -"
        )
    return prefix


class KeyLayout:
    """The names of the keys under one prefix; the keys of each partition are cached.

    ``cache`` maps ``(stream, group, partition)`` (``group`` empty for the partition's
    own keys) to the key names, so that a deleted stream or group can be dropped from it.
    """

    __slots__ = ("cache", "prefix", "streams")

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.streams = f"{prefix}:streams"
        """The hash of stream records: name -> ``partitions|created_ms``."""
        self.cache: dict[tuple[str, str, int], tuple[str, ...]] = {}

    def tag(self, stream: str, partition: int) -> str:
        """The hash tag every key of the partition shares."""
        return f"{{{self.prefix}:{stream}:{partition}}}"

    def partition(self, stream: str, partition: int) -> tuple[str, ...]:
        """The partition's Redis stream ``x``, metadata ``m`` and id index ``i``."""
        key = (stream, "", partition)
        keys = self.cache.get(key)
        if keys is None:
            tag = self.tag(stream, partition)
            keys = self.cache[key] = (f"{tag}:x", f"{tag}:m", f"{tag}:i")
        return keys

    def group(self, stream: str, group: str, partition: int) -> tuple[str, ...]:
        """``x``, ``m``, then the group's ``G``, ``D``, ``Z``, ``R``, ``B``, ``Y``, ``K``
        and ``N`` keys in the partition (the keys a group script takes, in that order)."""
        key = (stream, group, partition)
        keys = self.cache.get(key)
        if keys is None:
            tag = self.tag(stream, partition)
            base = f"{tag}:g:{group}"
            keys = self.cache[key] = (f"{tag}:x", f"{tag}:m", base, f"{base}:d",
                                      f"{base}:z", f"{base}:r", f"{base}:b", f"{base}:y",
                                      f"{base}:k", f"{base}:n")
        return keys

    def groups(self, stream: str) -> str:
        """The hash of the stream's group records: name -> ``max_attempts|created_ms|start``
        (then ``|key`` for a key-ordered group)."""
        return f"{self.prefix}:groups:{stream}"

    def ids(self, stream: str) -> str:
        """The hash of which partition owns each event id (streams with several partitions)."""
        return f"{self.prefix}:ids:{stream}"

    def patterns(self) -> tuple[str, str]:
        """``SCAN`` patterns that match every key under the prefix, tagged or not."""
        return f"{self.prefix}:*", f"{{{self.prefix}:*"
