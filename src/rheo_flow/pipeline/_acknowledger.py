"""Settling messages in batches: one ack call per batch, one nack / reject call per group."""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable

from .._model._errors import InvalidArgument
from .._model._failure import bounded
from .._model._lease import Lease
from .._model._validation import check_duration_ms
from .._runtime._producer import Producer
from .._runtime._retry_policy import RetryPolicy
from .._runtime._settle_calls import by_settle_call
from .._support._waiting import cancel_and_wait
from ._message import Message, MessageOutcome, OnFailure

__all__ = ["Acknowledger", "ProducerAcknowledger"]

log = logging.getLogger("rheo_flow.pipeline")

_SettleCall = tuple[MessageOutcome, str, int, str | None]
"""What one settle call of failed messages is keyed by: operation, reason, delay, last error."""


class Acknowledger(ABC):
    """Turns finished messages into settle calls.

    Successful messages are acked together; failed ones are grouped by
    (``nack`` or ``reject``, reason, delay, error) so each group is one call.
    Messages already settled (:meth:`Message.ack_immediately`) are skipped.

    A retried message waits ``retry_delay_ms`` when given (the message's own, else
    the acknowledger's), else the ``retry_policy`` delay of its attempt: drawn
    once per (reason, attempt) and settle call, so that a batch that failed
    together stays one nack.
    """

    def __init__(self, *, on_failure: OnFailure = "retry", retry_delay_ms: int | None = None,
                 retry_policy: RetryPolicy | None = None) -> None:
        if on_failure not in ("retry", "reject"):
            raise InvalidArgument(f'on_failure must be "retry" or "reject", got {on_failure!r}')
        if retry_policy is not None and not isinstance(retry_policy, RetryPolicy):
            raise InvalidArgument(
                f"retry_policy must be a RetryPolicy, got {type(retry_policy).__name__}")
        self.on_failure: OnFailure = on_failure
        self.retry_delay_ms: int | None = (
            None if retry_delay_ms is None else check_duration_ms("retry_delay_ms",
                                                                  retry_delay_ms))
        self.retry_policy: RetryPolicy = RetryPolicy() if retry_policy is None else retry_policy

    async def settle(self, successful: Iterable[Message], failed: Iterable[Message]) -> None:
        """Settle ``successful`` (status ``ok``) and ``failed`` messages."""
        acks: list[Message] = []
        for message in successful:
            if message.outcome is None:
                message.outcome = "ack"
                acks.append(message)
        drawn: dict[tuple[str, int], int] = {}
        # A generator: a message listed twice is decided once (its outcome set, the filter
        # skips it the second time).
        calls = by_settle_call((message for message in failed if message.outcome is None),
                               lambda message: self._decide(message, drawn))
        if acks:
            await self._guarded(self._ack, acks)
        for (op, reason, delay, error), messages in calls.items():
            if op == "reject":
                await self._guarded(self._reject, messages, reason, error)
            else:
                await self._guarded(self._nack, messages, reason, delay, error)

    def _decide(self, message: Message, drawn: dict[tuple[str, int], int]) -> _SettleCall:
        """Record a failed message's outcome (``nack`` or ``reject``) and return the settle
        call it goes out in: operation, reason, delay and last error. A delay from the retry
        policy is drawn once per (reason, attempt) and kept in ``drawn``, so that messages
        that failed together stay one call."""
        reason = message.reason or "failed"
        last_error = message.error if message.error is not None else bounded(reason)
        if (message.on_failure or self.on_failure) == "reject":
            message.outcome = "reject"
            return ("reject", reason, 0, last_error)
        delay = self.retry_delay_ms if message.retry_delay_ms is None else message.retry_delay_ms
        if delay is None:
            attempt = message.lease.attempt
            delay = drawn.get((reason, attempt))
            if delay is None:
                delay = drawn[(reason, attempt)] = self.retry_policy.delay_ms(attempt)
        message.outcome = "nack"
        return ("nack", reason, delay, last_error)

    async def _guarded(
        self, call: Callable[..., Awaitable[None]], messages: list[Message], *args: object
    ) -> None:
        try:
            await call(messages, *args)
        except Exception:
            # A settle path that raises must not keep leases inflight forever:
            # release them and let them expire (at-least-once redelivers).
            log.exception("settling %d messages failed; leaving their leases to expire",
                          len(messages))
            self._abandon(messages)

    async def hand_back(self, messages: Iterable[Message]) -> None:
        """Give messages no stage has handled back to the group at once (a nack with
        reason ``"shutdown"`` and no delay) so another consumer takes them."""
        back = [m for m in messages if m.outcome is None]
        for m in back:
            m.outcome = "nack"
        if back:
            await self._guarded(self._hand_back, back)

    async def _hand_back(self, messages: list[Message]) -> None:
        await self._nack(messages, "shutdown", 0, None)

    @abstractmethod
    async def _ack(self, messages: list[Message]) -> None: ...

    @abstractmethod
    async def _nack(self, messages: list[Message], reason: str, delay_ms: int,
                    error: str | None) -> None: ...

    @abstractmethod
    async def _reject(self, messages: list[Message], reason: str,
                      error: str | None) -> None: ...

    def _abandon(self, messages: list[Message]) -> None:  # noqa: B027 - optional hook
        """Stop tracking messages whose settle raised."""

    def confirm(self, messages: Iterable[Message]) -> list[Message]:
        """Record messages whose leases were acked elsewhere (e.g. by a sink, in its own
        transaction) as acked, and release them without a settle call."""
        done = [m for m in messages if m.outcome is None]
        for m in done:
            m.outcome = "ack"
        if done:
            self._confirm(done)
        return done

    def _confirm(self, messages: list[Message]) -> None:  # noqa: B027 - optional hook
        """Release messages settled elsewhere."""

    def abandon(self, messages: Iterable[Message]) -> None:
        """Give up on messages that will never be settled (a stage crashed or was cancelled):
        their leases are released and left to expire."""
        self._abandon([m for m in messages if m.outcome is None])


class ProducerAcknowledger(Acknowledger):
    """Settles through a :class:`~rheo_flow.Producer`, which frees its demand.

    Once :meth:`start`-ed on a backend whose ``ack_and_fetch`` is one round trip, acks
    are queued rather than awaited: the producer's next fetch carries them (as a
    ``Group``'s do), and a sender task settles the ones no fetch is under way to take.
    A batch's stage goes on meanwhile; its leases stay inflight until acked.
    """

    def __init__(
        self, producer: Producer, *, on_failure: OnFailure = "retry",
        retry_delay_ms: int | None = None, retry_policy: RetryPolicy | None = None,
    ) -> None:
        super().__init__(on_failure=on_failure, retry_delay_ms=retry_delay_ms,
                         retry_policy=retry_policy)
        self.producer = producer
        self._queued: list[Message] = []
        self._more = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Queue acks for the producer's fetches from now on (see the class docstring)."""
        if self.producer.rheo.backend.one_call_ack_and_fetch and self._sender is None:
            self.producer._collect_acks(self._take_queued)
            self._sender = asyncio.create_task(self._send_queued(),
                                               name="rheo-pipeline-acks")

    async def close(self) -> None:
        """Settle the acks still queued, then stop queueing."""
        sender, self._sender = self._sender, None
        await cancel_and_wait([sender])
        await self._send_now()

    def _take_queued(self) -> list[Lease]:
        """The leases of the queued acks, taken (for the producer's next fetch)."""
        queued, self._queued = self._queued, []
        return [m.lease for m in queued]

    async def _send_queued(self) -> None:
        """Settle queued acks whenever no fetch is under way to carry them."""
        producer = self.producer
        while True:
            if not self._queued:
                self._more.clear()
                await self._more.wait()
            elif producer._acks_wait_for_fetch():
                await producer._fetch_landed()
            else:
                await self._send_now()

    async def _send_now(self) -> None:
        queued, self._queued = self._queued, []
        if queued:
            await self._guarded(self._ack_now, queued)

    async def _ack_now(self, messages: list[Message]) -> None:
        await self.producer.ack([m.lease for m in messages])

    async def _ack(self, messages: list[Message]) -> None:
        if self._sender is None:
            await self._ack_now(messages)
            return
        self._queued.extend(messages)
        self._more.set()

    async def _nack(self, messages: list[Message], reason: str, delay_ms: int,
                    error: str | None) -> None:
        await self.producer.nack([m.lease for m in messages], reason, delay_ms, error)

    async def _reject(self, messages: list[Message], reason: str, error: str | None) -> None:
        await self.producer.reject([m.lease for m in messages], reason, error)

    async def _hand_back(self, messages: list[Message]) -> None:
        await self.producer.hand_back([m.lease for m in messages])

    def _abandon(self, messages: list[Message]) -> None:
        self.producer.confirm([m.lease for m in messages])

    def _confirm(self, messages: list[Message]) -> None:
        self.producer.confirm([m.lease for m in messages])
