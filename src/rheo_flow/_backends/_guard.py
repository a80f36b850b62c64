"""Every backend operation raises rheo_flow's typed errors, within one time limit.

:func:`guard_operations` wraps the contract's operations of a backend class:

* a driver exception (or a socket error) becomes a :class:`~rheo_flow.BackendError`
  classified by the backend's own ``classify_error`` and then the generic rules
  (docs/concepts.md, "Settling"): :class:`~rheo_flow.BackendUnavailable` when nothing was
  written, :class:`~rheo_flow.OutcomeUnknown` when a write may have taken effect;
* an operation still running after the backend's operation timeout is cancelled
  and reported the same way: ``backend_unavailable`` when the request surely was
  not sent (the backend calls :func:`mark_sent` once it has a connection to send
  on), ``ambiguous`` for a write that may have reached the server. A read that
  times out wrote nothing: ``backend_unavailable``.

rheo_flow's own errors pass through unchanged.

The translated error keeps the driver's exception as its ``__cause__`` when that
cannot hold a secret (an error of SQLite, a local file; the text an encoder could
not encode; the deadline's own timeout). Any other driver exception may quote the
server's URL with its password, so the cause kept is :class:`MaskedDriverError`:
the same type name and message, every link of its chain, with the backend's
secrets masked (see :func:`masked_cause`).
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Final, Protocol, TypeVar

from .._model._errors import (
    BackendError,
    BackendUnavailable,
    InvalidArgument,
    OutcomeUnknown,
    RheoError,
)
from .._model._failure import scrub as scrub_any
from .._model._settle_results import SettleKind, classify
from .._model._validation import refused_text

__all__ = [
    "DEFAULT_TIMEOUT_MS",
    "MaskedDriverError",
    "check_timeout_ms",
    "guard_operations",
    "mark_sent",
    "masked_cause",
]

DEFAULT_TIMEOUT_MS: Final = 10_000
"""How long one backend operation may take before it is abandoned."""

_READS: Final = frozenset({
    "open", "stream_info", "list_streams", "describe_streams", "group_info", "list_groups",
    "frontier", "lag_report",
    "dead_letters", "query",
})
"""Operations that change nothing: any failure of theirs is ``backend_unavailable``."""
_WRITES: Final = frozenset({
    "create_stream", "append", "create_group", "fetch", "ack", "nack", "reject", "renew",
    "redrive", "replay", "reset", "trim", "ack_and_fetch",
})
_UNBOUNDED: Final = frozenset({"wait_for_append"})
"""Operations that wait on purpose: errors are translated, no deadline applies."""

_SENT: ContextVar[bool] = ContextVar("rheo_flow_backend_request_sent", default=True)

_MAX_CHAIN: Final = 16
"""The most links of a driver exception's chain a masked cause copies."""


def _secret_free(exc: BaseException) -> bool:
    """Whether ``exc`` is kept as a cause as it is: SQLite's errors name a local file and
    hold no credentials; an encoding error holds the caller's own text (so does an
    encoder's ``TypeError``, see ``refused_text``).

    ``sqlite3`` is looked up, not imported: an error of it exists only once the SQLite
    backend loaded it, and the other backends do not pay for loading it.
    """
    if isinstance(exc, UnicodeError):
        return True
    sqlite3 = sys.modules.get("sqlite3")
    return sqlite3 is not None and isinstance(exc, sqlite3.Error)


class MaskedDriverError(Exception):
    """A driver exception that may have quoted a secret, with its secrets masked.

    Stands in as the ``__cause__`` of a translated error: its message is the
    original's ``module.Type: message`` with the backend's secrets masked, and its
    own cause is the next link of the original chain, masked the same way. It
    carries no traceback: the original frames' variables may hold the password.
    """

    def __init__(self, message: str, driver_type: str) -> None:
        super().__init__(message)
        self.driver_type = driver_type
        """``module.QualifiedName`` of the exception this stands in for."""


def masked_cause(exc: BaseException, scrub: Callable[[str], str]) -> BaseException:
    """What to chain as the cause of the error translating ``exc``: ``exc`` itself
    when it cannot hold a secret, else a :class:`MaskedDriverError` copy of its chain
    with ``scrub`` (the backend's masking, then the generic one) applied to each link."""

    def copy(link: BaseException, depth: int) -> BaseException:
        if _secret_free(link) or refused_text(link):
            return link
        kind = type(link)
        name = f"{kind.__module__}.{kind.__qualname__}"
        masked = MaskedDriverError(scrub_any(scrub(f"{name}: {link}")), name)
        after = link.__cause__ or (None if link.__suppress_context__ else link.__context__)
        if after is not None and depth < _MAX_CHAIN:
            masked.__cause__ = copy(after, depth + 1)
        return masked

    return copy(exc, 1)


def mark_sent() -> None:
    """Record that the running operation is about to send its request.

    Only backends built with ``tracks_sending=True`` call it; a timeout before the
    call is then known to have sent nothing.
    """
    _SENT.set(True)


def check_timeout_ms(value: object) -> int:
    """A validated operation timeout in milliseconds (``timeout_ms``)."""
    if isinstance(value, str):
        if not value.isdigit():
            raise InvalidArgument(f"timeout_ms must be a positive integer, got {value!r}")
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 86_400_000:
        raise InvalidArgument(
            f"timeout_ms must be a positive integer of milliseconds (at most a day), got {value!r}"
        )
    return value


class _Guarded(Protocol):
    """What a guarded backend provides."""

    _timeout_ms: int
    _deadline_grace_ms: int

    def classify_error(self, exc: BaseException) -> SettleKind | None: ...

    def _error_prefix(self) -> str: ...

    def _scrub(self, text: str) -> str: ...


B = TypeVar("B", bound=type)


def guard_operations(*, tracks_sending: bool) -> Callable[[B], B]:
    """A class decorator guarding every contract operation the class defines or inherits."""

    def decorate(cls: B) -> B:
        for name in sorted(_READS | _WRITES | _UNBOUNDED):
            method = getattr(cls, name, None)
            if method is not None and not getattr(method, "_rheo_guarded", False):
                setattr(cls, name, _guard(name, method, tracks_sending))
        return cls

    return decorate


def _guard(name: str, method: Callable[..., Awaitable[Any]], tracks_sending: bool
           ) -> Callable[..., Awaitable[Any]]:
    write = name in _WRITES
    bounded = name not in _UNBOUNDED

    @functools.wraps(method)
    async def guarded(self: _Guarded, *args: Any, **kwargs: Any) -> Any:
        token = _SENT.set(False) if tracks_sending else None
        try:
            if not bounded:
                return await method(self, *args, **kwargs)
            limit = (self._timeout_ms + self._deadline_grace_ms) / 1000
            async with asyncio.timeout(limit) as deadline:
                return await method(self, *args, **kwargs)
        except OutcomeUnknown as exc:
            if write:
                raise
            raise BackendUnavailable(str(exc)) from exc
        except RheoError:
            raise
        except TimeoutError as exc:
            if bounded and deadline.expired():
                raise _timed_out(self, name, write and _SENT.get()) from exc
            # A driver's message may quote the URL and its password: a masked copy
            # of the exception is the cause, unless it cannot hold a secret.
            raise _translate(self, exc, write) from masked_cause(exc, self._scrub)
        except Exception as exc:
            raise _translate(self, exc, write) from masked_cause(exc, self._scrub)
        finally:
            if token is not None:
                _SENT.reset(token)

    guarded._rheo_guarded = True  # type: ignore[attr-defined]
    return guarded


def _timed_out(backend: _Guarded, name: str, maybe_sent: bool) -> BackendError:
    prefix = backend._error_prefix()
    limit = backend._timeout_ms
    if maybe_sent:
        return OutcomeUnknown(
            f"{prefix}: {name} got no answer within timeout_ms={limit}; it may or may not "
            "have taken effect")
    return BackendUnavailable(
        f"{prefix}: {name} could not reach the server within timeout_ms={limit}; "
        "nothing was sent")


def _translate(backend: _Guarded, exc: BaseException, write: bool) -> BackendError:
    error = classify(exc, backend.classify_error)
    message = backend._scrub(f"{backend._error_prefix()}: {error.reason}")
    kind = error.kind
    if kind is SettleKind.BACKEND_UNAVAILABLE or (
            kind is SettleKind.AMBIGUOUS and not write):
        return BackendUnavailable(message)
    if kind is SettleKind.AMBIGUOUS:
        return OutcomeUnknown(message)
    return BackendError(message, kind.value)
