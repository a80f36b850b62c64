"""The key layout of the Redis backend (see the package docstring): key names and hash tags.

Every key of one partition shares the hash tag ``{P:s:p}``; the stream-level keys
(``P:streams``, ``P:groups:<s>``, ``P:ids:<s>``, and on standalone Redis the digest index
``P:eid:<s>`` and the summaries ``P:due:<s>:<g>`` and ``P:new:<s>:<g>``) carry none. On a
Redis Cluster the summaries of a stream's groups share the hash tag ``{P:s:work}`` instead
(``work.lua``; no partition's tag, whose last part is a number, is the same).
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from ..._model._errors import InvalidArgument

__all__ = ["DEFAULT_PREFIX", "GroupKeys", "KeyLayout", "PartitionKeys", "check_prefix"]

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


class PartitionKeys(NamedTuple):
    """The keys of one partition (the keys ``append.lua`` takes, in that order)."""

    stream: str
    """``x``: the Redis stream of the partition's events."""
    meta: str
    """``m``: high and low water, last append time, presence marker."""
    ids: str
    """``i``: event id -> sequence (idempotent appends)."""


class GroupKeys(NamedTuple):
    """The keys of one group in one partition (the keys a group script takes, in that
    order; the Lua scripts name them alike)."""

    stream: str
    """``x``: the Redis stream of the partition's events."""
    meta: str
    """``m``: the partition's metadata (see :class:`PartitionKeys`)."""
    group: str
    """``G``: the group's frontier ``f``, cursor ``c``, max attempts ``ma``, ordering ``o``."""
    records: str
    """``:d``: sequence -> delivery record."""
    due: str
    """``:z``: the available and leased deliveries by when they become eligible."""
    dead: str
    """``:r``: the dead-lettered (rejected) sequences."""
    blocks: str
    """``:b``: block token -> ``first|last|deadline``."""
    block_deadlines: str
    """``:y``: the unexpired block tokens by deadline."""
    key_spans: str
    """``:k``: key -> ``head|tail`` of its unsettled deliveries (key-ordered groups)."""
    key_next: str
    """``:n``: delivery -> the next delivery of its key (key-ordered groups)."""

    def own(self) -> tuple[str, ...]:
        """The group's own keys (``G`` to ``N``: not the partition's ``x`` and ``m``)."""
        return self[2:]


class KeyLayout:
    """The names of the keys under one prefix; the keys of each partition are cached.

    ``cache`` maps ``(stream, group, partition)`` to a group's keys and
    ``partition_cache`` ``(stream, "", partition)`` to a partition's own, so that a
    deleted stream or group can be dropped from them.
    """

    __slots__ = ("cache", "partition_cache", "prefix", "script_cache", "streams", "summaries")

    def __init__(self, prefix: str, *, summaries: bool = True) -> None:
        self.prefix = prefix
        self.summaries = summaries
        """Whether the backend uses the stream-level keys of standalone Redis: the group
        summaries and the digest index of event ids (a Cluster cannot pass keys of
        several slots to one script)."""
        self.streams = f"{prefix}:streams"
        """The hash of stream records: name -> ``partitions|created_ms``."""
        self.cache: dict[tuple[str, str, int], GroupKeys] = {}
        self.partition_cache: dict[tuple[str, str, int], PartitionKeys] = {}
        self.script_cache: dict[tuple[str, str, int], tuple[str, ...]] = {}
        """``(stream, group, partition)`` -> the keys a group script takes (see
        :meth:`script_keys`); ``(stream, "", partition)`` -> an append's."""

    def tag(self, stream: str, partition: int) -> str:
        """The hash tag every key of the partition shares."""
        return f"{{{self.prefix}:{stream}:{partition}}}"

    def tag_head(self, stream: str) -> str:
        """What every partition's hash tag starts with (``fetch_many.lua`` adds ``p}``)."""
        return f"{{{self.prefix}:{stream}:"

    def times(self, stream: str, partition: int) -> str:
        """``t``: the partition's scheduled events not due yet (sequence by deliver_at,
        written by the appends, which drop the past ones): what ``wait_for_append``
        wakes at and ``scheduled`` counts. Named by the scripts from the stream key."""
        return f"{self.tag(stream, partition)}:t"

    def partition(self, stream: str, partition: int) -> PartitionKeys:
        """The partition's Redis stream ``x``, metadata ``m`` and id index ``i``."""
        key = (stream, "", partition)
        keys = self.partition_cache.get(key)
        if keys is None:
            tag = self.tag(stream, partition)
            keys = self.partition_cache[key] = PartitionKeys(f"{tag}:x", f"{tag}:m", f"{tag}:i")
        return keys

    def group(self, stream: str, group: str, partition: int) -> GroupKeys:
        """``x``, ``m``, then the group's ``G``, ``D``, ``Z``, ``R``, ``B``, ``Y``, ``K``
        and ``N`` keys in the partition (the keys a group script takes, in that order)."""
        key = (stream, group, partition)
        keys = self.cache.get(key)
        if keys is None:
            tag = self.tag(stream, partition)
            base = f"{tag}:g:{group}"
            keys = self.cache[key] = GroupKeys(
                f"{tag}:x", f"{tag}:m", base, f"{base}:d", f"{base}:z", f"{base}:r",
                f"{base}:b", f"{base}:y", f"{base}:k", f"{base}:n")
        return keys

    def script_keys(self, stream: str, group: str, partition: int) -> tuple[str, ...]:
        """The keys a group script takes: the group's keys in the partition, then with
        ``summaries`` the group's summaries (``summary_keys`` in ``common.lua``)."""
        key = (stream, group, partition)
        keys = self.script_cache.get(key)
        if keys is None:
            keys = self.group(stream, group, partition)
            if self.summaries:
                keys = (*keys, *self.summary_keys(stream, group))
            self.script_cache[key] = keys
        return keys

    def append_keys(self, stream: str, partition: int) -> tuple[str, ...]:
        """The keys ``append.lua`` takes: the partition's, then with ``summaries`` the
        stream's groups hash and the head of its groups' ``fresh`` summaries."""
        key = (stream, "", partition)
        keys = self.script_cache.get(key)
        if keys is None:
            keys = self.partition(stream, partition)
            if self.summaries:
                keys = (*keys, self.groups(stream), f"{self.prefix}:new:{stream}:")
            self.script_cache[key] = keys
        return keys

    def summary_keys(self, stream: str, group: str) -> tuple[str, str]:
        """The group's summaries of its partitions (standalone Redis): due (partition ->
        no later than when it may next have a due delivery) and fresh (the partitions
        that may have events past the group's cursor)."""
        return f"{self.prefix}:due:{stream}:{group}", f"{self.prefix}:new:{stream}:{group}"

    def work_keys(self, stream: str, group: str = "") -> tuple[str, ...]:
        """The keys ``work.lua`` takes (a Redis Cluster's summaries, in one slot per
        stream): the stream's version and appended partitions, then with ``group`` the
        group's state, fresh, due and noted partitions."""
        tag = f"{{{self.prefix}:{stream}:work}}"
        keys: tuple[str, ...] = (f"{tag}:v", f"{tag}:a")
        if group:
            base = f"{tag}:g:{group}"
            keys = (*keys, base, f"{base}:new", f"{base}:due", f"{base}:nv")
        return keys

    def digests(self, stream: str) -> str:
        """The stream's digest index (standalone Redis; ``append_many.lua``): the first 8
        bytes of the SHA-1 of an event id -> ``partition:seq``."""
        return f"{self.prefix}:eid:{stream}"

    def groups(self, stream: str) -> str:
        """The hash of the stream's group records: name -> ``max_attempts|created_ms|start``
        (then ``|key`` for a key-ordered group)."""
        return f"{self.prefix}:groups:{stream}"

    def pauses(self, stream: str) -> str:
        """The hash of the stream's paused groups: name -> the end of the pause, ms since
        the epoch (2^62: until resumed); each group partition's hash holds it too (``pz``),
        for its fetch."""
        return f"{self.prefix}:pauses:{stream}"

    def signal(self, stream: str) -> str:
        """The stream's signal stream: a resume adds an entry, which wakes the consumers
        waiting on the stream (their wake-up reads it with the partitions)."""
        return f"{self.prefix}:signal:{stream}"

    def ids(self, stream: str) -> str:
        """The hash of which partition owns each event id (streams with several partitions)."""
        return f"{self.prefix}:ids:{stream}"

    def patterns(self) -> tuple[str, str]:
        """``SCAN`` patterns that match every key under the prefix, tagged or not."""
        return f"{self.prefix}:*", f"{{{self.prefix}:*"
