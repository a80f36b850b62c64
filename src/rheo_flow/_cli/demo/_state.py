"""What one demo run is given, counts and shows: its settings, live counters and result."""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the app reads DemoConfig's defaults without loading the demo
    from ..._model._settle_results import SettleResult
    from ..._model._stream import DeadLetter
    from ._orders import Faults

__all__ = ["GROUPS", "MAX_ATTEMPTS", "STREAM", "DemoConfig", "DemoResult", "DemoState",
           "GroupStats"]

STREAM = "orders"
GROUPS = ("billing", "shipping")
MAX_ATTEMPTS = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoConfig:
    """Knobs of one demo run."""

    url: str
    events: int = 5000
    partitions: int = 6
    workers: int = 3
    """Workers per group."""
    rate: float = 300.0
    """Events per second appended after the initial backlog (0: as fast as possible)."""
    backlog: float = 0.3
    """Share of the events appended up front, before the steady flow."""
    burst: float = 0.15
    """Share appended at once two thirds into the steady flow (a flash sale)."""
    batch: int = 20
    lease_ms: int = 1_000
    work_ms: float = 4.0
    """Simulated handler work per relevant event."""
    seed: int = 7
    timeout_s: float = 120.0


@dataclass(slots=True)
class GroupStats:
    """Live counters of one consumer group."""

    name: str
    workers: int
    handled: int = 0
    """Handler invocations, redeliveries included."""
    acked: int = 0
    retried: int = 0
    dead_letters: list[DeadLetter] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    """Settle results by outcome: ``ok``, ``repeated`` or a settle kind."""
    lag: dict[int, int] = field(default_factory=dict)
    settled_ids: set[str] = field(default_factory=set)
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))

    @property
    def settled(self) -> int:
        """Events of this run acked or dead-lettered."""
        return self.acked + len(self.dead_letters)

    def rate(self, window_s: float = 1.0) -> float:
        """Settled events per second over the last ``window_s``."""
        if len(self.samples) < 2:
            return 0.0
        now, latest = self.samples[-1]
        for t, count in self.samples:
            if now - t <= window_s:
                return (latest - count) / (now - t) if now > t else 0.0
        return 0.0

    def record(self, results: Sequence[SettleResult]) -> None:
        """Count the outcome of one settle call."""
        for result in results:
            if result.ok:
                self.outcomes["repeated" if result.repeated else "ok"] += 1
            else:
                self.outcomes[str(result.kind)] += 1


@dataclass(slots=True)
class DemoState:
    """Everything the live view and the summary show."""

    config: DemoConfig
    run_id: str
    total: int
    faults: Faults
    groups: dict[str, GroupStats]
    appended: int = 0
    produced: bool = False
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    high_water: dict[int, int] = field(default_factory=dict)
    description: str = ""

    @property
    def elapsed(self) -> float:
        """Seconds since the start (frozen once finished)."""
        return (self.finished or time.monotonic()) - self.started

    done: bool = False
    """Every event appended and every group caught up."""

    def caught_up(self) -> bool:
        """Whether every group's lag, as last observed, is zero on every partition."""
        return all(sum(g.lag.values()) == 0 and len(g.lag) == self.config.partitions
                   for g in self.groups.values())


@dataclass(frozen=True, slots=True)
class DemoResult:
    """The outcome of a run; ``ok`` when every group settled every event."""

    ok: bool
    events: int
    elapsed_s: float
    missing: dict[str, int]
    """Events of this run a group neither acked nor dead-lettered."""
