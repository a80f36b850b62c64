"""Stable routing of keys to partitions.

The hash must give the same partition in every process, run and backend, so it
cannot be Python's salted ``hash()``; CRC-32 of the UTF-8 key is stable,
fast (C implementation) and well spread for short keys.
"""

from __future__ import annotations

import zlib

__all__ = ["partition_for"]


def partition_for(key: str, partitions: int) -> int:
    """The partition (``0 <= p < partitions``) that ``key`` routes to."""
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    return zlib.crc32(key.encode("utf-8")) % partitions
