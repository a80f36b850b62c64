# ruff: noqa: PT028  (helpers named after Broadway's test_message / test_batch, not tests)
"""Run messages through a pipeline's handler and stages without a backend.

::

    result = await test_message(pipeline, {"amount": 12})
    assert result.acked and not result.failed

    result = await test_batch(MyHandler(), [1, 2, 3], batchers={"default": Batcher(2)})
    assert [info.size for info, _ in result.batches] == [2, 1]

The messages go through ``prepare_messages``, ``handle_message``, the
batchers and ``handle_batch`` / ``handle_failed`` exactly as in the pipeline,
with its settings; instead of settling leases, the result records every
message with its :attr:`~Message.outcome` (``ack``, ``nack`` or ``reject``).
Batches still open once every message went through the processors are
flushed with trigger ``drain``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .._model._errors import InvalidArgument
from .._model._event import Event
from .._model._lease import Lease
from ._acknowledger import Acknowledger
from ._batcher import Batcher
from ._handler import Callbacks, callbacks_of
from ._message import BatchInfo, BatchMode, Message, OnFailure
from ._pipeline import Pipeline
from ._processor import Processors
from ._stages import Stages

__all__ = ["PipelineTestResult", "test_batch", "test_message"]


@dataclass(slots=True)
class PipelineTestResult:
    """What happened to test messages: settled successes and failures, and the batches."""

    __test__ = False  # not a pytest test class

    successful: list[Message] = field(default_factory=list)
    """Messages settled as successful (outcome ``ack``), in settle order."""
    failed: list[Message] = field(default_factory=list)
    """Messages settled as failed (outcome ``nack`` or ``reject``), in settle order."""
    batches: list[tuple[BatchInfo, list[Message]]] = field(default_factory=list)
    """Every batch handed to ``handle_batch``, in emission order."""

    @property
    def messages(self) -> list[Message]:
        """Every settled message."""
        return self.successful + self.failed

    @property
    def acked(self) -> list[Message]:
        """Messages whose outcome is ``ack``."""
        return [m for m in self.messages if m.outcome == "ack"]

    @property
    def nacked(self) -> list[Message]:
        """Messages whose outcome is ``nack`` (retried)."""
        return [m for m in self.messages if m.outcome == "nack"]

    @property
    def rejected(self) -> list[Message]:
        """Messages whose outcome is ``reject`` (dead-lettered)."""
        return [m for m in self.messages if m.outcome == "reject"]


class _RecordingAcknowledger(Acknowledger):
    def __init__(self, result: PipelineTestResult, on_failure: OnFailure, retry_delay_ms: int
                 ) -> None:
        super().__init__(on_failure=on_failure, retry_delay_ms=retry_delay_ms)
        self._result = result

    async def _ack(self, messages: list[Message]) -> None:
        self._result.successful.extend(messages)

    async def _nack(self, messages: list[Message], reason: str, delay_ms: int,
                    error: str | None) -> None:
        self._result.failed.extend(messages)

    async def _reject(self, messages: list[Message], reason: str, error: str | None) -> None:
        self._result.failed.extend(messages)

    def _confirm(self, messages: list[Message]) -> None:
        self._result.successful.extend(messages)


async def test_message(
    target: Pipeline | object,
    data: Any,
    *,
    key: str | None = None,
    partition: int = 0,
    type: str = "test",
    headers: Mapping[str, str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    attempt: int = 1,
    batch_mode: BatchMode = "flush",
    context: Any = None,
    processors: Processors | None = None,
    batchers: Mapping[str, Batcher] | None = None,
    on_failure: OnFailure | None = None,
    retry_delay_ms: int | None = None,
) -> PipelineTestResult:
    """Push one message with ``data`` through ``target`` (a pipeline or a handler).

    ``batch_mode`` defaults to ``flush``: its batch is emitted right away.
    The remaining options describe the synthetic event, or (for a handler
    target) the settings a pipeline would have: ``context``, ``processors``,
    ``batchers`` (default: one ``"default"`` batcher when the handler has a
    ``handle_batch``), ``on_failure`` and ``retry_delay_ms``. For a pipeline
    they default to the pipeline's own.
    """
    return await test_batch(
        target, [data], key=key, partition=partition, type=type, headers=headers,
        metadata=metadata, attempt=attempt, batch_mode=batch_mode, context=context,
        processors=processors, batchers=batchers, on_failure=on_failure,
        retry_delay_ms=retry_delay_ms,
    )


async def test_batch(
    target: Pipeline | object,
    data: Iterable[Any],
    *,
    key: str | None = None,
    partition: int = 0,
    type: str = "test",
    headers: Mapping[str, str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    attempt: int = 1,
    batch_mode: BatchMode = "bulk",
    context: Any = None,
    processors: Processors | None = None,
    batchers: Mapping[str, Batcher] | None = None,
    on_failure: OnFailure | None = None,
    retry_delay_ms: int | None = None,
) -> PipelineTestResult:
    """Push one message per item of ``data`` through ``target`` (see :func:`test_message`).

    Messages get sequences 1, 2, ... in ``partition``; ``batch_mode`` defaults
    to ``bulk``: batches fill up to their size, and what is still open at the
    end is flushed with trigger ``drain``.
    """
    items = list(data)
    if not items:
        raise InvalidArgument("test_batch needs at least one item of data")
    settings = _settings(target, context, processors, batchers, on_failure, retry_delay_ms)
    result = PipelineTestResult()
    acknowledger = _RecordingAcknowledger(result, settings.on_failure or "retry",
                                          settings.retry_delay_ms or 0)
    stages = Stages(settings.processors, settings.batchers, settings.callbacks,
                    settings.context, acknowledger,
                    on_batch=lambda info, batch: result.batches.append((info, list(batch))))
    messages = []
    for lease in _leases(items, key, partition, type, headers, attempt):
        message = Message(lease, acknowledger).put_batch_mode(batch_mode)
        if metadata:
            message.metadata.update(metadata)
        messages.append(message)
    stages.start()
    try:
        stages.submit(messages)
        await stages.drain()
    finally:
        await stages.cancel()
    return result


class _Settings(NamedTuple):
    """What a pipeline would run the test messages with."""

    callbacks: Callbacks
    context: Any
    processors: Processors
    batchers: Mapping[str, Batcher]
    on_failure: OnFailure | None
    retry_delay_ms: int | None


def _settings(target: Pipeline | object, context: Any, processors: Processors | None,
              batchers: Mapping[str, Batcher] | None, on_failure: OnFailure | None,
              retry_delay_ms: int | None) -> _Settings:
    """The settings given, the others from the pipeline ``target`` (or the defaults a
    pipeline of the handler ``target`` would have)."""
    if isinstance(target, Pipeline):
        if retry_delay_ms is None:
            retry_delay_ms = target.retry_delay_ms
        return _Settings(
            target._callbacks, target.context if context is None else context,
            target.processors if processors is None else processors,
            target.batchers if batchers is None else batchers,
            on_failure or target.on_failure, retry_delay_ms)
    callbacks = callbacks_of(target)
    if batchers is None:
        batchers = {"default": Batcher()} if callbacks.handle_batch is not None else {}
    return _Settings(callbacks, context, processors or Processors(concurrency=1), batchers,
                     on_failure, retry_delay_ms)


def _leases(items: list[Any], key: str | None, partition: int, type: str,
            headers: Mapping[str, str] | None, attempt: int) -> list[Lease]:
    """A lease of a synthetic event per item: sequences 1, 2, ... in ``partition``."""
    now = time.time_ns() // 1_000_000
    leases = []
    for i, item in enumerate(items, start=1):
        event = Event(stream="test", partition=partition, sequence=i, id=f"test-{i}",
                      type=type, data=item, key=key, headers=dict(headers or {}),
                      appended_at_ms=now)
        leases.append(Lease(lease_id=uuid.uuid4().hex, receipt="test", group="test",
                            consumer_id="test", event=event, attempt=attempt,
                            deadline_ms=now + 30_000))
    return leases


test_message.__test__ = False  # type: ignore[attr-defined]
test_batch.__test__ = False  # type: ignore[attr-defined]
