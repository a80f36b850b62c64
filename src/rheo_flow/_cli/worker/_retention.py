"""The worker's retention schedule: every ``--retention-interval`` it applies the stored
retention policy of each stream it consumes (``Rheo.apply_retention``: only events every
group has settled), logs what it removed, and never lets a failure end the worker (the
next round tries again)."""

from __future__ import annotations

import asyncio
import logging

from ..._backends._urls import scrub_secrets
from ..._rheo import Rheo

__all__ = ["apply_retention_once", "retention_schedule"]

log = logging.getLogger("rheo_flow.worker")


async def apply_retention_once(rheo: Rheo, streams: list[str], url: str) -> dict[str, int]:
    """Apply each stream's stored policy once; events removed per stream (a stream without
    a policy, or whose round failed, is left out). Failures are logged, not raised."""
    removed: dict[str, int] = {}
    for stream in streams:
        try:
            if (await rheo.stream_info(stream)).retention is None:
                continue
            count = sum((await rheo.apply_retention(stream)).values())
        except Exception as exc:  # logged; the next round tries again
            log.warning("retention of stream %s failed (next try in one interval): %s",
                        stream, scrub_secrets(f"{type(exc).__name__}: {exc}", url))
            continue
        removed[stream] = count
        if count:
            log.info("retention removed %d event(s) from stream %s", count, stream)
        else:
            log.debug("retention removed nothing from stream %s", stream)
    return removed


async def retention_schedule(rheo: Rheo, streams: list[str], interval: float, url: str,
                             stop: asyncio.Event) -> None:
    """Apply the streams' policies every ``interval`` seconds until ``stop`` is set (the
    first round right away)."""
    while not stop.is_set():
        await apply_retention_once(rheo, streams, url)
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except TimeoutError:
            continue
