"""The producer's renewal: every inflight lease renewed in one call, at a fixed rate."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from .._model._settle_results import classify
from .._rheo import Rheo
from ._inflight import Inflight
from ._producer_stats import ProducerStats

__all__ = ["renew_forever"]

log = logging.getLogger("rheo_flow.producer")


async def renew_forever(rheo: Rheo, inflight: Inflight, lease_ms: int, stats: ProducerStats,
                        stream: str, group: str) -> None:
    """Renew ``inflight`` every ``lease_ms / 2`` until cancelled, counting into ``stats``."""
    loop = asyncio.get_running_loop()
    interval = lease_ms / 2000
    next_at = loop.time() + interval
    while True:
        # A fixed rate: a slow renew call does not push the next one later.
        await asyncio.sleep(max(0.0, next_at - loop.time()))
        next_at = max(next_at + interval, loop.time())
        if not inflight:
            continue
        try:
            results = await inflight.renew_all(rheo, lease_ms)
        except Exception as exc:  # never let one bad tick end renewal
            error = classify(exc, rheo.backend.classify_error)
            stats.renew_failures[error.kind.value] += 1
            log.warning("renew for %s/%s failed: %s (%s)", stream, group,
                        error.kind.value, error.reason)
            continue
        stats.renewals += 1
        failed = Counter(r.error.kind.value for r in results if r.error is not None)
        if failed:
            stats.renew_failures.update(failed)
            log.warning("renew for %s/%s: %d of %d leases not renewed (%s)", stream,
                        group, failed.total(), len(results), dict(failed))
