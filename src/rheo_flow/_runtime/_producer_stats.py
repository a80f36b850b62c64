"""The counters a :class:`~rheo_flow.Producer` keeps since it started."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["ProducerStats"]


@dataclass(slots=True)
class ProducerStats:
    """Counters of one producer since it started (a snapshot from :meth:`Producer.stats`).

    The counters a :class:`~rheo_flow.GroupStats` has too mean the same there, with the
    same types: counts are ints, failures by kind are ``Counter`` objects keyed by the
    classified :class:`~rheo_flow.SettleKind` value (``"stale_lease"``, ...).
    """

    fetched: int = 0
    """Leases received from fetch."""
    acked: int = 0
    """Acks that took effect."""
    nacked: int = 0
    """Nacks that took effect."""
    rejected: int = 0
    """Rejects that took effect."""
    handed_back: int = 0
    """Nacks of :meth:`Producer.hand_back` that took effect (among ``nacked``): leases
    given back for immediate redelivery on a stop or a drain."""
    confirmed: int = 0
    """Leases released unsettled by :meth:`Producer.confirm` (settled elsewhere)."""
    renewals: int = 0
    """Renew calls made (one per tick with something inflight)."""
    settle_failures: Counter[str] = field(default_factory=Counter)
    """Settle results that did not take effect, by kind."""
    peak_inflight: int = 0
    """The most leases inflight at once."""
    skipped: int = 0
    """Leases lost (found stale on renew) before their handler started, released unsettled."""
    fetch_failures_by_kind: Counter[str] = field(default_factory=Counter)
    """Failed fetches, by kind (:attr:`fetch_failures` is their total)."""
    renew_failures: Counter[str] = field(default_factory=Counter)
    """Renew results (or whole renew calls) that did not take effect, by kind."""
    dead_lettered: int = 0
    """Deliveries these settles dead-lettered: the rejects, and the nacks of a last
    attempt (reason ``"max_attempts"``). Expiries dead-lettered by a fetch are not seen."""

    @property
    def fetch_failures(self) -> int:
        """Failed fetches (each one retried after a back-off)."""
        return self.fetch_failures_by_kind.total()

    def copy(self) -> ProducerStats:
        """A detached copy."""
        return ProducerStats(
            fetched=self.fetched, acked=self.acked, nacked=self.nacked, rejected=self.rejected,
            handed_back=self.handed_back, confirmed=self.confirmed, renewals=self.renewals,
            settle_failures=Counter(self.settle_failures), peak_inflight=self.peak_inflight,
            skipped=self.skipped, fetch_failures_by_kind=Counter(self.fetch_failures_by_kind),
            renew_failures=Counter(self.renew_failures), dead_lettered=self.dead_lettered,
        )
