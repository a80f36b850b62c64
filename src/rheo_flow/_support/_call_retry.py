"""Retrying a backend or sink call that failed for a reason worth retrying.

Every retry loop of the backends and sinks (a write conflict, a lock, a
duplicate key raced by a concurrent writer, a transient driver error) goes
through :func:`retried`, :func:`retried_sync`, :func:`retrying` or
:func:`retrying_sync`: tenacity's
schedule with a small exponential wait and full jitter, bounded by attempts, by
time, or both; the last error is re-raised when the budget runs out.

:func:`retried` is for hot paths (a fetch, a settle, an append): the first try
runs as a plain call, and tenacity's loop (tens of microseconds to enter, and
tenacity is only imported then) only starts once a retryable error happened, on
the same schedule; :func:`retried_sync` is the same for code on a worker thread::

    events = await retried(lambda attempt: append(exact=attempt > 1),
                           when=is_conflict, attempts=8)

:func:`retrying` is the loop itself, for calls off the hot path::

    async for attempt in retrying(when=is_conflict, attempts=8):
        with attempt:
            await write()

(For redeliveries of failed events see :class:`~rheo_flow.RetryPolicy`; that is
a different thing: how long a nacked event waits.)
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # imported when a loop is built: a first try that succeeds needs none
    import tenacity

__all__ = ["retried", "retried_sync", "retrying", "retrying_sync"]

T = TypeVar("T")


def _check_bound(attempts: int | None, within_s: float | None) -> None:
    if attempts is None and within_s is None:
        raise ValueError("a retry needs a bound: attempts, within_s or both")


def _stop(attempts: int | None, within_s: float | None) -> tenacity.stop.stop_base:
    import tenacity

    _check_bound(attempts, within_s)
    stops: list[tenacity.stop.stop_base] = []
    if attempts is not None:
        stops.append(tenacity.stop_after_attempt(attempts))
    if within_s is not None:
        stops.append(tenacity.stop_after_delay(within_s))
    return stops[0] if len(stops) == 1 else tenacity.stop_any(*stops)


def _options(
    when: Callable[[BaseException], bool],
    attempts: int | None,
    within_s: float | None,
    first_wait_s: float,
    max_wait_s: float,
) -> dict[str, object]:
    import tenacity

    stop = _stop(attempts, within_s)
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
    import tenacity

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
    import tenacity

    return tenacity.Retrying(
        **_options(when, attempts, within_s, first_wait_s, max_wait_s)  # type: ignore[arg-type]
    )


async def retried(
    call: Callable[[int], Awaitable[T]],
    *,
    when: Callable[[BaseException], bool],
    attempts: int | None = None,
    within_s: float | None = None,
    first_wait_s: float = 0.002,
    max_wait_s: float = 0.05,
) -> T:
    """``await call(attempt)`` (attempt 1, 2, ...), retried as :func:`retrying` would.

    The first try is a plain call; only a retryable failure enters tenacity's loop,
    for what is left of the bounds and with the waits the loop would have drawn
    from the second try on, so the schedule is the same.
    """
    _check_bound(attempts, within_s)  # before the first try
    started = time.monotonic()
    try:
        return await call(1)
    except BaseException as exc:
        if not _retry_after_first(exc, when, attempts, within_s, started):
            raise
    await asyncio.sleep(random.uniform(0, min(max_wait_s, first_wait_s)))
    async for attempt in _rest(started, when, attempts, within_s, first_wait_s, max_wait_s):
        with attempt:
            return await call(attempt.retry_state.attempt_number + 1)
    raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover


def retried_sync(
    call: Callable[[int], T],
    *,
    when: Callable[[BaseException], bool],
    attempts: int | None = None,
    within_s: float | None = None,
    first_wait_s: float = 0.002,
    max_wait_s: float = 0.05,
) -> T:
    """``call(attempt)`` retried as :func:`retried` does, for code on a worker thread."""
    _check_bound(attempts, within_s)
    started = time.monotonic()
    try:
        return call(1)
    except BaseException as exc:
        if not _retry_after_first(exc, when, attempts, within_s, started):
            raise
    time.sleep(random.uniform(0, min(max_wait_s, first_wait_s)))
    import tenacity

    rest = tenacity.Retrying(**_rest_options(started, when, attempts, within_s, first_wait_s,
                                             max_wait_s))  # type: ignore[arg-type]
    for attempt in rest:
        with attempt:
            return call(attempt.retry_state.attempt_number + 1)
    raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover


def _retry_after_first(exc: BaseException, when: Callable[[BaseException], bool],
                       attempts: int | None, within_s: float | None, started: float) -> bool:
    """Whether a first try that raised ``exc`` is to be tried again."""
    spent = time.monotonic() - started
    return when(exc) and attempts != 1 and (within_s is None or spent < within_s)


def _rest_options(started: float, when: Callable[[BaseException], bool], attempts: int | None,
                  within_s: float | None, first_wait_s: float, max_wait_s: float
                  ) -> dict[str, object]:
    """The loop after a failed first try: what is left of the bounds, the same waits."""
    import tenacity

    return {
        "retry": tenacity.retry_if_exception(when),
        "stop": _stop(None if attempts is None else attempts - 1,
                      None if within_s is None else within_s - (time.monotonic() - started)),
        # Wait n of this loop is wait n + 1 of a loop started with the first try.
        "wait": tenacity.wait_random_exponential(multiplier=2 * first_wait_s, max=max_wait_s),
        "reraise": True,
    }


def _rest(started: float, when: Callable[[BaseException], bool], attempts: int | None,
          within_s: float | None, first_wait_s: float, max_wait_s: float
          ) -> tenacity.AsyncRetrying:
    import tenacity

    return tenacity.AsyncRetrying(**_rest_options(  # type: ignore[arg-type]
        started, when, attempts, within_s, first_wait_s, max_wait_s))
