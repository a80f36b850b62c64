"""The in-memory backend: ephemeral, single-process, the reference semantics.

All state lives in dicts; every operation runs without awaiting, so it is atomic
with respect to other tasks on the event loop. Time comes from an injectable
clock so lease expiry is deterministic in tests.

What a settle, renew or expiry does to a delivery, and how far the frontier
moves, is decided by the lease rules of ``_transitions``; this package stores
their outcomes. The modules, by concern: ``_backend`` (the class: streams,
appends, groups, queries, trim), ``_core`` (the state every part shares),
``_state`` (the stored dataclasses), ``_fetch``, ``_settle`` and ``_progress``
(the operations on deliveries).
"""

from __future__ import annotations

from ._backend import MemoryBackend

__all__ = ["MemoryBackend"]
