"""The retry policy: how long a failed delivery waits before it is delivered again.

Exponential backoff with full jitter and a cap: after the failure of attempt
``n`` the delivery is nacked with a delay drawn uniformly from
``[0, min(cap_ms, base_ms * 2 ** (n - 1))]``. Full jitter spreads the retries of
many consumers that failed together (a database that went away) instead of
bringing them back in step; the cap bounds the wait. The exponential ceiling is
tenacity's ``wait_exponential``; the draw uses an injectable random source so
that tests can replay a schedule.
"""

from __future__ import annotations

import random

import tenacity

from .._model._errors import InvalidArgument
from .._model._validation import check_duration_ms

__all__ = ["RetryPolicy"]


class RetryPolicy:
    """Exponential backoff with full jitter, capped, for redeliveries after failures.

    The delay after the failure of attempt ``n`` (1 on the first delivery) is
    uniform in ``[0, min(cap_ms, base_ms * 2 ** (n - 1))]``; with
    ``jitter=False`` it is the upper bound itself. The defaults (1 s doubling up
    to 5 min) keep a failing handler from hammering what it depends on.
    ``RetryPolicy(base_ms=0)`` redelivers at once (no backoff). ``rng`` is the
    random source of the jitter (a seeded ``random.Random`` makes it
    reproducible).
    """

    __slots__ = ("_ceiling", "_state", "base_ms", "cap_ms", "jitter", "rng")

    def __init__(self, *, base_ms: int = 1_000, cap_ms: int = 300_000, jitter: bool = True,
                 rng: random.Random | None = None) -> None:
        check_duration_ms("RetryPolicy base_ms", base_ms)
        check_duration_ms("RetryPolicy cap_ms", cap_ms)
        if cap_ms < base_ms:
            raise InvalidArgument(f"RetryPolicy cap_ms ({cap_ms}) is below base_ms ({base_ms})")
        if rng is not None and not isinstance(rng, random.Random):
            raise InvalidArgument(f"rng must be a random.Random, got {type(rng).__name__}")
        self.base_ms = base_ms
        """The ceiling of the first retry's delay."""
        self.cap_ms = cap_ms
        """The largest delay."""
        self.jitter = jitter
        """Whether the delay is drawn in ``[0, ceiling]`` (full jitter) or is the ceiling."""
        self.rng = rng if rng is not None else random.Random()
        """The random source of the jitter."""
        self._ceiling = tenacity.wait_exponential(multiplier=base_ms, max=cap_ms, exp_base=2)
        self._state = tenacity.RetryCallState(
            retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]

    @classmethod
    def immediate(cls) -> RetryPolicy:
        """A policy without backoff: every failed delivery is available again at once."""
        return cls(base_ms=0, cap_ms=0)

    def ceiling_ms(self, attempt: int) -> int:
        """The largest delay after the failure of ``attempt``:
        ``min(cap_ms, base_ms * 2 ** (attempt - 1))``."""
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise InvalidArgument(f"attempt must be an integer >= 1, got {attempt!r}")
        if self.base_ms == 0:
            return 0
        self._state.attempt_number = attempt
        return int(self._ceiling(self._state))

    def delay_ms(self, attempt: int) -> int:
        """The delay before the redelivery that follows the failure of ``attempt``."""
        ceiling = self.ceiling_ms(attempt)
        if not self.jitter or ceiling == 0:
            return ceiling
        return round(self.rng.uniform(0, ceiling))

    def __repr__(self) -> str:
        return (f"RetryPolicy(base_ms={self.base_ms}, cap_ms={self.cap_ms}, "
                f"jitter={self.jitter})")
