"""Retrying a backend or sink call that failed for a reason worth retrying.

Every retry loop of the backends and sinks (a write conflict, a lock, a
duplicate key raced by a concurrent writer, a transient driver error) goes
through :func:`retrying` or :func:`retrying_sync`: tenacity's schedule with a
small exponential wait and full jitter, bounded by attempts, by time, or both;
the last error is re-raised when the budget runs out.

Usage::

    async for attempt in retrying(when=is_conflict, attempts=8):
        with attempt:
            await write()

(For redeliveries of failed events see :class:`~rheo_flow.RetryPolicy`; that is
a different thing: how long a nacked event waits.)
"""

from __future__ import annotations

from collections.abc import Callable

import tenacity

__all__ = ["retrying", "retrying_sync"]


def _options(
    when: Callable[[BaseException], bool],
    attempts: int | None,
    within_s: float | None,
    first_wait_s: float,
    max_wait_s: float,
) -> dict[str, object]:
    if attempts is None and within_s is None:
        raise ValueError("a retry needs a bound: attempts, within_s or both")
    stops: list[tenacity.stop.stop_base] = []
    if attempts is not None:
        stops.append(tenacity.stop_after_attempt(attempts))
    if within_s is not None:
        stops.append(tenacity.stop_after_delay(within_s))
    stop = stops[0] if len(stops) == 1 else tenacity.stop_any(*stops)
    return {
        "retry": tenacity.retry_if_exception(when),
        "stop": stop,
        "wait": tenacity.wait_random_exponential(multiplier=first_wait_s, max=max_wait_s),
        "reraise": True,
    }


def retrying(
    *,
    when: Callable[[BaseException], bool],
    attempts: int | None = None,
    within_s: float | None = None,
    first_wait_s: float = 0.002,
    max_wait_s: float = 0.05,
) -> tenacity.AsyncRetrying:
    """An async retry loop: retry while ``when(error)`` holds, within the bounds.

    ``attempts`` caps the number of tries (including the first), ``within_s``
    the time since the first; at least one is required. Waits are drawn
    uniformly below an exponential ceiling starting at ``first_wait_s`` and
    capped at ``max_wait_s`` (full jitter, so racing writers fall out of step).
    """
    return tenacity.AsyncRetrying(
        **_options(when, attempts, within_s, first_wait_s, max_wait_s)  # type: ignore[arg-type]
    )


def retrying_sync(
    *,
    when: Callable[[BaseException], bool],
    attempts: int | None = None,
    within_s: float | None = None,
    first_wait_s: float = 0.002,
    max_wait_s: float = 0.05,
) -> tenacity.Retrying:
    """The same loop as :func:`retrying` for code running on a worker thread."""
    return tenacity.Retrying(
        **_options(when, attempts, within_s, first_wait_s, max_wait_s)  # type: ignore[arg-type]
    )
