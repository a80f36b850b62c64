"""The callbacks a pipeline calls: subclass :class:`PipelineHandler`."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .._model._errors import InvalidArgument
from ._message import BatchInfo, Message

__all__ = ["Callbacks", "HandlerLike", "PipelineHandler", "callbacks_of", "run_handle_failed"]


class PipelineHandler:
    """Base class of pipeline handlers; override :meth:`handle_message` at least.

    ``context`` is the object given to the pipeline (``context=...``), passed
    unchanged to every callback. Callbacks are coroutines; they may run
    concurrently (``concurrency`` of processors and batchers), so shared
    mutable state belongs in the context, guarded as needed.
    """

    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        """Process one message in a processor task and return it.

        Transform it (:meth:`Message.update_data`), route it
        (:meth:`Message.put_batcher`, :meth:`Message.put_batch_key`) or fail it
        (:meth:`Message.failed`). Raising fails this message only, with reason
        ``handler_error: ...``.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement handle_message")

    async def prepare_messages(self, messages: list[Message], context: Any) -> list[Message]:
        """Optionally pre-process the messages a processor received, before
        :meth:`handle_message` runs on each (e.g. to load data for all in one query).

        Return every message (in any order). Raising fails all of them.
        """
        return messages

    async def handle_batch(
        self, batcher: str, messages: list[Message], batch_info: BatchInfo, context: Any
    ) -> list[Message]:
        """Process a batch and return its messages; they are settled by their status.

        Raising fails the whole batch, with reason ``batch_error: ...``.
        The default acknowledges every message.
        """
        return messages

    async def handle_failed(self, messages: list[Message], context: Any) -> list[Message]:
        """Called with messages that failed (in a processor, or in a batch) before they
        are settled; may reconfigure them (:meth:`Message.configure_ack`).

        Raising is logged and the messages are still settled as they are.
        """
        return messages


class HandlerLike(Protocol):
    """Any object with an async ``handle_message``; the other callbacks are optional."""

    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        """See :meth:`PipelineHandler.handle_message`."""
        ...


@dataclass(frozen=True, slots=True)
class Callbacks:
    """The resolved callbacks of a handler (``None`` when not overridden)."""

    handle_message: Callable[[str, Message, Any], Awaitable[Message]]
    prepare_messages: Callable[[list[Message], Any], Awaitable[list[Message]]] | None
    handle_batch: Callable[[str, list[Message], BatchInfo, Any], Awaitable[list[Message]]] | None
    handle_failed: Callable[[list[Message], Any], Awaitable[list[Message]]] | None


def callbacks_of(handler: object) -> Callbacks:
    """Resolve and check a handler's callbacks."""
    if isinstance(handler, type):
        raise InvalidArgument(
            f"handler must be an instance, got the class {handler.__name__}: "
            f"pass {handler.__name__}()"
        )

    def find(name: str, required: bool = False) -> Any:
        fn = getattr(handler, name, None)
        if fn is None:
            if required:
                raise InvalidArgument(
                    f"handler {type(handler).__name__} has no {name}(): subclass PipelineHandler"
                )
            return None
        if not inspect.iscoroutinefunction(fn):
            raise InvalidArgument(
                f"handler {type(handler).__name__}.{name} must be an async def method"
            )
        base = getattr(PipelineHandler, name)
        if not required and getattr(type(handler), name, None) is base:
            return None
        return fn

    handle_message = find("handle_message", required=True)
    if getattr(type(handler), "handle_message", None) is PipelineHandler.handle_message:
        raise InvalidArgument(f"handler {type(handler).__name__} must implement handle_message")
    return Callbacks(
        handle_message=handle_message,
        prepare_messages=find("prepare_messages"),
        handle_batch=find("handle_batch"),
        handle_failed=find("handle_failed"),
    )


async def run_handle_failed(
    callbacks: Callbacks, messages: list[Message], context: Any, log: Any
) -> list[Message]:
    """Call ``handle_failed`` (when defined) and return the messages to settle as failed.

    Messages the callback did not return are kept; if it raises, the error is
    logged and the messages are settled as they are.
    """
    hook = callbacks.handle_failed
    if hook is None:
        return messages
    try:
        returned = await hook(messages, context)
    except Exception:
        log.exception("handle_failed raised; settling %d failed messages as they are",
                      len(messages))
        return messages
    if returned is messages:
        return messages
    if not isinstance(returned, list) or not all(isinstance(m, Message) for m in returned):
        log.error("handle_failed must return a list of messages, got %s; ignoring it",
                  type(returned).__name__)
        return messages
    seen = {id(m) for m in returned}
    return returned + [m for m in messages if id(m) not in seen]
