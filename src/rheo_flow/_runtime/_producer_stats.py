"""The counters a :class:`~rheo_flow.Producer` keeps since it started."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["ProducerStats"]


@dataclass(slots=True)
class ProducerStats:
    """Counters of one producer since it started (a snapshot from :meth:`Producer.stats`)."""

    fetched: int = 0
    acked: int = 0
    nacked: int = 0
    rejected: int = 0
    """Rejects that took effect."""
    confirmed: int = 0
    fetch_failures: int = 0
    renewals: int = 0
    """Renew calls made (one per tick with something inflight)."""
    settle_failures: dict[str, int] = field(default_factory=dict)
    """Leases whose settle did not take effect, by classified kind."""
    peak_inflight: int = 0
    skipped: int = 0
    """Leases lost (found stale on renew) before their handler started, released unsettled."""
    fetch_failure_kinds: Counter[str] = field(default_factory=Counter)
    """Failed fetches, by classified kind."""
    renew_failures: Counter[str] = field(default_factory=Counter)
    """Renew results (or whole renew calls) that did not take effect, by classified kind."""
    dead_lettered: int = 0
    """Deliveries these settles dead-lettered: the rejects, and the nacks of a last
    attempt (reason ``"max_attempts"``). Expiries dead-lettered by a fetch are not seen."""

    def copy(self) -> ProducerStats:
        """A detached copy."""
        return ProducerStats(
            self.fetched, self.acked, self.nacked, self.rejected, self.confirmed,
            self.fetch_failures, self.renewals, dict(self.settle_failures), self.peak_inflight,
            self.skipped, Counter(self.fetch_failure_kinds), Counter(self.renew_failures),
            self.dead_lettered,
        )
