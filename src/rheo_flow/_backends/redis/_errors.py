"""How the Redis backend reports failures.

redis-py's exceptions (and socket errors) are classified into settle kinds,
translated into rheo_flow's typed errors, and an owned client's reconnecting
retry never reports a request that may have reached the server as not sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..._model._errors import BackendError, BackendUnavailable, OutcomeUnknown, StoreLost
from ..._model._settle_results import SettleKind
from ._driver import Retry, rex

__all__ = ["DRIVER_ERRORS", "SentAwareRetry", "classify", "is_no_script", "store_lost",
           "translate"]

T = TypeVar("T")

DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    rex.RedisError, rex.RedisClusterException, OSError)
"""What redis-py (single server or cluster) and the socket layer raise."""


def classify(exc: BaseException) -> SettleKind | None:
    """The settle kind of a redis-py (or socket) exception; None when not recognised."""
    if isinstance(exc, BackendError):
        return SettleKind(exc.kind)
    if isinstance(exc, rex.AuthenticationError | rex.BusyLoadingError):
        return SettleKind.BACKEND_UNAVAILABLE
    if isinstance(exc, rex.ConnectionError | rex.TimeoutError):
        text = str(exc)
        if "connecting to" in text or "Timeout connecting" in text or isinstance(
                exc.__context__, ConnectionRefusedError):
            return SettleKind.BACKEND_UNAVAILABLE
        # The request may have run before the connection went away.
        return SettleKind.AMBIGUOUS
    if isinstance(exc, rex.ReadOnlyError | rex.ClusterDownError | rex.TryAgainError
                  | rex.RedisClusterException):
        # Refused before running: a replica, a cluster without a primary for the
        # slot (failover under way), a slot being migrated, or no node reachable.
        return SettleKind.BACKEND_UNAVAILABLE
    if isinstance(exc, rex.DataError):
        return SettleKind.INVALID
    if isinstance(exc, rex.RedisError):
        return SettleKind.FAILED
    if isinstance(exc, ConnectionRefusedError):
        return SettleKind.BACKEND_UNAVAILABLE
    if isinstance(exc, TimeoutError | ConnectionError):
        return SettleKind.AMBIGUOUS
    return None


def translate(exc: BaseException, prefix: str, scrub: Callable[[str], str]) -> BackendError:
    """The typed error for a driver exception; ``prefix`` names the server, ``scrub``
    removes the URL's secrets from the message."""
    kind = classify(exc) or SettleKind.FAILED
    message = scrub(f"{prefix}: {type(exc).__name__}: {exc}")
    if "rediss" in prefix and "Timeout connecting" in str(exc):
        message += " (no TLS handshake: does the server serve TLS? redis:// if not)"
    if kind is SettleKind.BACKEND_UNAVAILABLE:
        return BackendUnavailable(message)
    if kind is SettleKind.AMBIGUOUS:
        return OutcomeUnknown(message)
    return BackendError(message, kind.value)


def store_lost(prefix: str, stream: str) -> StoreLost:
    """The error of a stream whose partitions lost their presence marker."""
    return StoreLost(
        f"{prefix}: stream {stream!r} is gone from the server: it lost "
        "its data (a restart without persistence, or FLUSHDB / FLUSHALL). Nothing was "
        "written; recreate the stream once the cause is understood", stream)


def is_no_script(result: Any) -> bool:
    """Whether a pipelined reply says the script was not in the server's cache."""
    return isinstance(result, rex.NoScriptError) or (
        isinstance(result, rex.ResponseError) and str(result).startswith("NOSCRIPT"))


class SentAwareRetry(Retry):
    """redis-py's retry of commands that lost their connection, except that a command
    whose first attempt may have reached the server is never reported as not sent
    because a later attempt could not reconnect (that would read as "nothing was
    written" for an append that may be stored)."""

    async def call_with_retry(
        self, do: Callable[[], Awaitable[T]], fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        sent = False

        async def failed(error: Exception, *count: int) -> Any:
            nonlocal sent
            if classify(error) is not SettleKind.BACKEND_UNAVAILABLE:
                sent = True
            return await fail(error, *count)

        def retryable(error: Exception) -> bool:
            # A connect that timed out spent its whole connect timeout: another try
            # would only make the caller wait longer for the same answer.
            if isinstance(error, rex.TimeoutError) and "Timeout connecting" in str(error):
                return False
            return is_retryable is None or is_retryable(error)

        try:
            return await super().call_with_retry(do, failed, retryable, with_failure_count)
        except (rex.ConnectionError, rex.TimeoutError) as exc:
            if sent and classify(exc) is SettleKind.BACKEND_UNAVAILABLE:
                raise rex.ConnectionError(
                    "the connection was lost after the request was sent, and reconnecting "
                    f"failed ({type(exc).__name__})") from exc
            raise
