"""The typed exception hierarchy of rheo_flow.

Every error the library raises on purpose is a :class:`RheoError`. Errors that
describe bad input are :class:`InvalidArgument` (also a :class:`ValueError`), so
callers that already catch ``ValueError`` keep working.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AlreadyStarted",
    "BackendError",
    "BackendUnavailable",
    "ConflictError",
    "InvalidArgument",
    "InvalidCapabilities",
    "InvalidPayload",
    "MissingExtra",
    "NotStarted",
    "OutcomeUnknown",
    "RheoError",
    "SetupRefused",
    "StaleLease",
    "StoreLost",
    "UnknownGroup",
    "UnknownStream",
    "Unsupported",
]


class RheoError(Exception):
    """Base class of every error raised by rheo_flow."""


class InvalidArgument(RheoError, ValueError):
    """Bad input: a malformed name, a negative limit, data that is not JSON, ...

    Raised before anything is written: an operation that raises it changed nothing.
    """


class InvalidPayload(RheoError, ValueError):
    """An event's data does not validate against the model its consumer declared for its
    type (docs/typed-events.md). The runtimes reject such an event at once (a dead letter
    on its first attempt, ``last_error`` naming the failing fields) instead of retrying."""

    def __init__(self, event_type: str, model: type, errors: str) -> None:
        super().__init__(f"{event_type!r} data does not match {model.__name__}: {errors}")
        self.event_type = event_type
        """The event's type."""
        self.model = model
        """The model its data did not validate against."""
        self.errors = errors
        """The validation errors, with the field paths."""


class UnknownStream(InvalidArgument, LookupError):
    """The named stream does not exist (create it with ``create_stream`` first)."""

    def __init__(self, stream: str) -> None:
        super().__init__(f"unknown stream {stream!r}: create it with create_stream() first")
        self.stream = stream


class UnknownGroup(InvalidArgument, LookupError):
    """The named consumer group does not exist on that stream."""

    def __init__(self, stream: str, group: str) -> None:
        super().__init__(f"unknown group {group!r} on stream {stream!r}")
        self.stream = stream
        self.group = group


class ConflictError(RheoError):
    """A declaration conflicts with what already exists (e.g. another partition count)."""


class InvalidCapabilities(RheoError, ValueError):
    """A backend declared capabilities that contradict each other or the contract."""


class MissingExtra(RheoError, ImportError):
    """An optional driver is not installed; the message names the extra to install.

    ``backend`` names what needs it: a backend (``"Redis"``) or another feature
    (``"DuckDB sink"``, ``"conformance kit"``).
    """

    def __init__(self, backend: str, extra: str, module: str) -> None:
        what = backend if " " in backend else f"{backend} backend"
        super().__init__(
            f"the {what} needs the {module!r} package: "
            f"install it with  pip install 'rheo-flow[{extra}]'"
        )
        self.backend = backend
        self.extra = extra
        self.module = module


class BackendError(RheoError):
    """A backend operation failed; ``kind`` is its classified settle kind."""

    def __init__(self, message: str, kind: str = "failed") -> None:
        super().__init__(message)
        self.kind = kind


class BackendUnavailable(BackendError):
    """The backend could not be reached; nothing was written."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="backend_unavailable")


class OutcomeUnknown(BackendError):
    """The request may or may not have taken effect (a timeout, a connection lost mid-call).

    Its ``kind`` is ``"ambiguous"``. An append that raises it is safe to retry with
    the same event ids: an id already stored returns the stored event.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="ambiguous")


class StoreLost(BackendError):
    """The backend lost data it had acknowledged (a Redis restart without persistence,
    a ``FLUSHDB``): streams that existed are gone.

    Nothing is written over the loss: appends and fetches refuse with this error,
    and a running consumer group stops with it. Recreate the streams (and replay
    from the source of truth) once the cause is understood.
    """

    def __init__(self, message: str, stream: str | None = None) -> None:
        super().__init__(message, kind="failed")
        self.stream = stream


class StaleLease(BackendError):
    """An ack in the application's transaction (:meth:`Rheo.transaction
    <rheo_flow.Rheo.transaction>`) did not take effect: a lease expired and the event was
    leased again, or was settled already. The whole transaction was rolled back (nothing
    of it is written); the event goes to whoever holds it now.

    ``leases`` are the leases lost; ``results`` every ack's result, in the order of the
    leases given (an ``ok`` one was rolled back too). ``kind`` is the first lost
    lease's (``"stale_lease"`` or ``"receipt_mismatch"``). Acks that failed otherwise
    (the backend unreachable, ...) roll back too and raise a :class:`BackendError` of
    their kind.
    """

    def __init__(self, message: str, leases: list[Any], results: list[Any],
                 kind: str = "stale_lease") -> None:
        super().__init__(message, kind)
        self.leases = leases
        self.results = results


class AlreadyStarted(RheoError):
    """A runtime for this (instance, stream, group) already runs in this process."""


class NotStarted(RheoError):
    """The operation needs a started runtime or an opened instance."""


class SetupRefused(RheoError):
    """A consumer's ``setup`` refused to start, or returned a context that is not a mapping."""


class Unsupported(RheoError, NotImplementedError):
    """The backend does not implement this operation (a third-party backend may not)."""

    def __init__(self, backend: str, operation: str) -> None:
        super().__init__(f"backend {backend!r} does not support {operation}()")
        self.backend = backend
        self.operation = operation
