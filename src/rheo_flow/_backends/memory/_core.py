"""What every part of the in-memory backend shares: its state and the lookups of it.

:class:`MemoryCore` is the base of the operation mixins (``_fetch``,
``_settle``, ``_progress``) that :class:`~rheo_flow._backends.memory.MemoryBackend`
combines: it holds the streams and groups, finds them by name, and stores what
a settle or an expiry made of a delivery.
"""

from __future__ import annotations

import itertools

from ..._model._errors import UnknownGroup, UnknownStream
from ..._support._clock import Clock
from .._shared import Waiters
from .._transitions import TERMINAL, Settled, advance_frontier
from ._state import Delivery, Group, GroupPartition, Stream

__all__ = ["MemoryCore"]


class MemoryCore:
    """The backend's state; set up by :class:`~rheo_flow._backends.memory.MemoryBackend`."""

    _clock: Clock
    _streams: dict[str, Stream]
    _groups: dict[tuple[str, str], Group]
    _waiters: Waiters
    """Idle consumers, by stream name."""
    _lease_prefix: str
    _lease_counter: itertools.count[int]

    def _stream(self, name: str) -> Stream:
        try:
            return self._streams[name]
        except KeyError:
            raise UnknownStream(name) from None

    def _group(self, stream: str, group: str) -> Group:
        self._stream(stream)
        try:
            return self._groups[(stream, group)]
        except KeyError:
            raise UnknownGroup(stream, group) from None

    def _apply(self, gp: GroupPartition, d: Delivery, outcome: Settled) -> None:
        """Store what a settle or an expiry made of delivery ``d``."""
        d.state = state = outcome.state
        d.reason = outcome.reason
        d.settled_by = outcome.settled_by
        if state in TERMINAL:  # for good: kept apart, the frontier may move over it
            if outcome.rejected_at_ms is not None:
                d.rejected_at_ms = outcome.rejected_at_ms
            gp.active.pop(d.sequence, None)
            gp.done[d.sequence] = d
            gp.frontier = advance_frontier(gp.frontier, gp.done)
        elif outcome.available_at_ms is not None:
            d.available_at_ms = outcome.available_at_ms
            gp.may_be_due(outcome.available_at_ms)
