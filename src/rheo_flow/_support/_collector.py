"""The cyclic garbage collector paused while a batch's objects are built.

A fetch builds its leases in one burst: per delivery an event, its data not
decoded yet and a lease, hundreds at a time, and a settle a result per lease.
None of them is in a reference cycle, yet every 700 container objects allocated
start a young collection: it frees nothing of the burst (all of it is still
referenced), walks it and moves it to an older generation, and every tenth such
collection walks all the leases still in flight, every tenth of those the
whole process. On Redis, where the client's Python is all of a ``Group``'s
cost, those walks were a fifth to a quarter of it (docs/benchmarks.md,
2026-12-07, fifth session).

:func:`collector_paused` holds the collector off for such a burst. The code it
wraps is synchronous: nothing else of this thread runs meanwhile (other threads'
collections wait too, for as long as the burst). The
allocations still count, so the collection they call for comes at the first
allocation after the burst, once, instead of several times inside it; cyclic
garbage is collected as before, a burst later at most. A collector the
application switched off stays off.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the ``with`` body (synchronous, building a batch's objects) with the cyclic
    collector paused, if it is enabled; it is enabled again after, whatever happens."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
