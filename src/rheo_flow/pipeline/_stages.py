"""The stages of a pipeline wired together: processors, batchers and the acknowledger.

:class:`Stages` is the pipeline minus its producer: the pipeline feeds it
fetched messages, and :mod:`rheo_flow.pipeline.testing` feeds it synthetic ones
without a backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from .._runtime._inflight import Inflight
from ._acknowledger import Acknowledger
from ._batcher import Batcher, BatcherStage
from ._handler import Callbacks
from ._message import BatchInfo, Message
from ._processor import Processors, ProcessorStage

__all__ = ["Stages"]


class Stages:
    """Processors and batchers wired to an acknowledger (the pipeline minus the producer).

    The test helpers run it without a backend.
    """

    def __init__(
        self,
        processors: Processors,
        batchers: Mapping[str, Batcher],
        callbacks: Callbacks,
        context: Any,
        acknowledger: Acknowledger,
        *,
        inflight: Inflight | None = None,
        lease_ms: int | None = None,
        on_batch: Callable[[BatchInfo, list[Message]], None] | None = None,
    ) -> None:
        self.batchers = {
            name: BatcherStage(name, config, callbacks, context, acknowledger,
                               inflight=inflight, lease_ms=lease_ms, on_batch=on_batch)
            for name, config in batchers.items()
        }
        self.processors = ProcessorStage(
            processors, callbacks, context, acknowledger,
            self._forward if self.batchers else None,
        )

    def _forward(self, m: Message) -> bool:
        stage = self.batchers.get(m.batcher)
        if stage is None:
            return False
        stage.add(m)
        return True

    def start(self) -> None:
        """Start every task."""
        for stage in self.batchers.values():
            stage.start()
        self.processors.start()

    def submit(self, messages: list[Message]) -> None:
        """Hand fetched messages to the processors."""
        self.processors.submit(messages)

    @property
    def in_processors(self) -> int:
        """Messages queued for or inside processors."""
        return self.processors.pending

    @property
    def peak_in_batchers(self) -> int:
        """The sum of every batcher's peak (an upper bound of their joint peak)."""
        return sum(stage.peak for stage in self.batchers.values())

    @property
    def in_batchers(self) -> int:
        """Messages in open batches or batches being handled."""
        return sum(stage.pending for stage in self.batchers.values())

    async def drain(self) -> None:
        """Finish the processors, flush every open batch (trigger ``drain``), settle."""
        await self.processors.close()
        await asyncio.gather(*(stage.close() for stage in self.batchers.values()))

    async def cancel(self, grace: float = 1.0) -> None:
        """Cancel every task (what they hold is left to expire) and wait up to ``grace``
        seconds for them to end."""
        tasks = self.processors.cancel()
        for stage in self.batchers.values():
            tasks += stage.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
