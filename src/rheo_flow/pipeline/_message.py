"""The message that travels through a pipeline, and the batch information handlers receive."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .._model._errors import InvalidArgument
from .._model._failure import error_text, failure_fields, truncated
from .._model._lease import Lease
from .._model._validation import MAX_REASON, check_duration_ms

__all__ = [
    "BatchInfo",
    "BatchMode",
    "BatchTrigger",
    "Message",
    "MessageOutcome",
    "OnFailure",
    "Status",
    "ack_immediately",
    "confirm_settled",
    "fail_on_error",
]

Status = Literal["ok", "failed"]
BatchMode = Literal["bulk", "flush"]
OnFailure = Literal["retry", "reject"]
MessageOutcome = Literal["ack", "nack", "reject"]
BatchTrigger = Literal["size", "timeout", "flush", "drain", "deadline"]

log = logging.getLogger("rheo_flow.pipeline")

DEFAULT_BATCHER = "default"
DEFAULT_BATCH_KEY = "default"


class Settler(Protocol):
    """What settles a message: the pipeline's acknowledger. Its classes
    (``pipeline._acknowledger.Acknowledger``) build on :class:`Message`, so this module
    names only the two calls a message makes on it."""

    async def settle(self, successful: Iterable[Message], failed: Iterable[Message]) -> None:
        """Settle ``successful`` (status ``ok``) and ``failed`` messages."""
        ...

    def confirm(self, messages: Iterable[Message]) -> list[Message]:
        """Record messages whose leases were acked elsewhere as acked."""
        ...


_UNREAD: Any = object()
"""A message's data before its first read (the event's, not decoded yet)."""


class Message:
    """One leased event on its way through a pipeline.

    ``data`` starts as the event's data; handlers transform it with
    :meth:`update_data` / :meth:`put_data`, route the message with
    :meth:`put_batcher` and :meth:`put_batch_key`, and mark it
    :meth:`failed`. Every mutator changes the message in place and returns it,
    so calls chain. The pipeline settles the lease from :attr:`status` once the
    message leaves the last stage (or right away with :meth:`ack_immediately`).
    """

    __slots__ = (
        "_acknowledger",
        "_data",
        "_metadata",
        "batch_key",
        "batch_mode",
        "batcher",
        "error",
        "lease",
        "on_failure",
        "outcome",
        "reason",
        "retry_delay_ms",
        "status",
    )

    lease: Lease
    """The lease this message settles."""
    batcher: str
    """The batcher the message goes to (``"default"`` unless :meth:`put_batcher`)."""
    batch_key: Hashable
    """Messages with the same key are batched together (within a batcher)."""
    batch_mode: BatchMode
    status: Status
    reason: str | None
    """Why the message failed (``None`` while it is ok)."""
    error: str | None
    """``"Type: message"`` of what a stage raised on the message (``None`` otherwise): the
    last error its nack or reject records (without it, the reason is recorded)."""
    on_failure: OnFailure | None
    """What a failure does: ``retry`` (nack) or ``reject``; ``None``: the pipeline default."""
    retry_delay_ms: int | None
    """Delay before a retried message is redelivered; ``None``: the pipeline default."""
    outcome: MessageOutcome | None
    """How the pipeline settled the lease: ``ack``, ``nack`` or ``reject`` (``None`` before)."""

    def __init__(self, lease: Lease, acknowledger: Settler | None = None) -> None:
        self.lease = lease
        self._data: Any = _UNREAD
        self.batcher = DEFAULT_BATCHER
        self.batch_key = DEFAULT_BATCH_KEY
        self.batch_mode = "bulk"
        self.status = "ok"
        self.reason = None
        self.error = None
        self.on_failure = None
        self.retry_delay_ms = None
        self.outcome = None
        self._acknowledger = acknowledger
        self._metadata: dict[str, Any] | None = None

    @property
    def data(self) -> Any:
        """The message's data: the event's, decoded on first read, until a handler
        puts its own."""
        data = self._data
        if data is _UNREAD:
            data = self._data = self.lease.event.data
        return data

    @data.setter
    def data(self, value: Any) -> None:
        self._data = value

    def __repr__(self) -> str:
        lease = self.lease
        return (
            f"Message({lease.stream} p{lease.partition} s{lease.sequence} "
            f"attempt={lease.attempt} status={self.status!r}"
            + (f" reason={self.reason!r}" if self.reason else "")
            + (f" outcome={self.outcome!r}" if self.outcome else "")
            + ")"
        )

    # Event fields -------------------------------------------------------------

    @property
    def metadata(self) -> dict[str, Any]:
        """The event's fields: stream, partition, sequence, id, type, key, headers,
        appended_at (a datetime), appended_at_ms and attempt.

        It is a plain dict built on first access; handlers may add their own keys.
        """
        if self._metadata is None:
            lease = self.lease
            event = lease.event
            self._metadata = {
                "stream": event.stream,
                "partition": event.partition,
                "sequence": event.sequence,
                "id": event.id,
                "type": event.type,
                "key": event.key,
                "headers": dict(event.headers),
                "appended_at": event.appended_at,
                "appended_at_ms": event.appended_at_ms,
                "attempt": lease.attempt,
            }
        return self._metadata

    @property
    def partition(self) -> int:
        """The event's partition."""
        return self.lease.event.partition

    @property
    def sequence(self) -> int:
        """The event's sequence within its partition."""
        return self.lease.event.sequence

    @property
    def key(self) -> str | None:
        """The event's routing key."""
        return self.lease.event.key

    @property
    def attempt(self) -> int:
        """The delivery attempt (1 on the first delivery)."""
        return self.lease.attempt

    @property
    def settled(self) -> bool:
        """Whether the lease was already settled (e.g. by :meth:`ack_immediately`)."""
        return self.outcome is not None

    # Mutators ------------------------------------------------------------------

    def update_data(self, fn: Callable[[Any], Any]) -> Message:
        """Replace ``data`` with ``fn(data)``."""
        self.data = fn(self.data)
        return self

    def put_data(self, data: Any) -> Message:
        """Replace ``data``."""
        self.data = data
        return self

    def put_batcher(self, batcher: str) -> Message:
        """Send the message to the named batcher."""
        if not isinstance(batcher, str) or not batcher:
            raise InvalidArgument(f"batcher must be a non-empty string, got {batcher!r}")
        self.batcher = batcher
        return self

    def put_batch_key(self, batch_key: Hashable) -> Message:
        """Batch the message with others of the same key (within its batcher)."""
        try:
            hash(batch_key)
        except TypeError:
            raise InvalidArgument(
                f"batch_key must be hashable, got {type(batch_key).__name__}"
            ) from None
        self.batch_key = batch_key
        return self

    def put_batch_mode(self, mode: BatchMode) -> Message:
        """``"flush"`` emits the message's batch right after it joins; ``"bulk"`` (default)
        waits for the batch size or timeout."""
        if mode not in ("bulk", "flush"):
            raise InvalidArgument(f'batch mode must be "bulk" or "flush", got {mode!r}')
        self.batch_mode = mode
        return self

    def configure_ack(
        self, *, on_failure: OnFailure | None = None, retry_delay_ms: int | None = None
    ) -> Message:
        """Choose what a failure does: ``retry`` (nack, after ``retry_delay_ms``) or
        ``reject`` (dead-letter now)."""
        if on_failure is not None:
            if on_failure not in ("retry", "reject"):
                raise InvalidArgument(
                    f'on_failure must be "retry" or "reject", got {on_failure!r}'
                )
            self.on_failure = on_failure
        if retry_delay_ms is not None:
            self.retry_delay_ms = check_duration_ms("retry_delay_ms", retry_delay_ms)
        return self

    def failed(self, reason: object) -> Message:
        """Mark the message failed: it skips later stages and is settled as a failure."""
        self.status = "failed"
        self.reason = failure_reason(reason)
        return self

    async def ack_immediately(self) -> Message:
        """Settle the lease now, according to :attr:`status`; later stages keep the
        message but no longer settle it."""
        await ack_immediately([self])
        return self


async def ack_immediately(messages: Iterable[Message]) -> list[Message]:
    """Settle several messages now, in batched calls (see :meth:`Message.ack_immediately`)."""
    pending = [m for m in messages if m.outcome is None]
    by_acker: dict[int, tuple[Settler, list[Message]]] = {}
    for m in pending:
        acker = m._acknowledger
        if acker is None:
            raise InvalidArgument("this message has no acknowledger: it is not in a pipeline")
        by_acker.setdefault(id(acker), (acker, []))[1].append(m)
    for acker, items in by_acker.values():
        await acker.settle([m for m in items if m.status == "ok"],
                           [m for m in items if m.status != "ok"])
    return pending


def confirm_settled(messages: Iterable[Message]) -> list[Message]:
    """Mark messages whose leases were already acked elsewhere (e.g. by a sink in its
    own transaction) as acked, and release their leases without settling them again.

    Returns the messages that were not settled yet.
    """
    done: list[Message] = []
    for m in messages:
        acker = m._acknowledger
        if acker is None:
            raise InvalidArgument("this message has no acknowledger: it is not in a pipeline")
        done += acker.confirm([m])
    return done


def failure_reason(reason: object) -> str:
    """A non-empty settle reason of bounded length."""
    text = reason if isinstance(reason, str) else repr(reason)
    return truncated(text.strip() or "failed", MAX_REASON)


def fail_on_error(messages: list[Message], prefix: str, exc: BaseException, stage: str) -> None:
    """Mark ``messages`` failed by what a stage raised, and log it once (with the first
    message's stream, group, partition, sequence and attempt as structured fields)."""
    reason = describe_error(prefix, exc)
    error = error_text(exc)
    for m in messages:
        m.failed(reason)
        m.error = error
    first = messages[0].lease
    fields = failure_fields(first)
    fields["messages"] = len(messages)
    log.error("%s failed on %s/%s p%d s%d (attempt %d)%s: %s", stage, first.stream,
              first.group, first.partition, first.sequence, first.attempt,
              f" and {len(messages) - 1} more messages" if len(messages) > 1 else "", error,
              exc_info=exc, extra=fields)


def describe_error(prefix: str, exc: BaseException) -> str:
    """``prefix: ExceptionType: message`` as a failure reason."""
    text = str(exc)
    name = type(exc).__name__
    return failure_reason(f"{prefix}: {name}: {text}" if text else f"{prefix}: {name}")


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """What :meth:`PipelineHandler.handle_batch` learns about the batch it receives."""

    batcher: str
    """The batcher's name."""
    batch_key: Hashable
    """The batch key shared by every message of the batch."""
    partition: int | None
    """The batch processor partition when the batcher has ``partition_by``, else ``None``."""
    size: int
    """How many messages the batch holds."""
    trigger: BatchTrigger
    """Why it was emitted: ``size`` (full), ``timeout`` (``batch_timeout`` passed),
    ``flush`` (a message in ``flush`` mode), ``drain`` (the pipeline is draining) or
    ``deadline`` (its oldest lease neared its deadline)."""
