"""Test doubles shared by the runtime tests."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from rheo_flow import Capabilities, Lease, ManualClock, SettleResult
from rheo_flow.backends import MemoryBackend


class FlakyBackend(MemoryBackend):
    """The memory backend with injectable failures, counting its calls."""

    def __init__(self, *, clock: ManualClock | None = None, push: bool = True) -> None:
        super().__init__(clock=clock)
        self.calls: Counter[str] = Counter()
        self.nacks: list[tuple[str, list[int]]] = []
        self.renewed: list[int] = []
        self.fetch_failures = 0
        self.combined_failures = 0
        self.ack_error: BaseException | None = None
        self._caps = dataclasses.replace(MemoryBackend._CAPABILITIES, push_wakeups=push)

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    async def fetch(self, stream: str, group: str, consumer_id: str, limit: int, lease_ms: int,
                    partitions: Sequence[int] | None) -> list[Lease]:
        self.calls["fetch"] += 1
        if self.fetch_failures:
            self.fetch_failures -= 1
            raise ConnectionRefusedError("connection refused")
        return await super().fetch(stream, group, consumer_id, limit, lease_ms, partitions)

    async def ack(self, leases: Sequence[Lease]) -> list[SettleResult]:
        self.calls["ack"] += 1
        if self.ack_error is not None:
            raise self.ack_error
        return await super().ack(leases)

    async def ack_and_fetch(self, acks: Sequence[Lease], stream: str, group: str,
                            consumer_id: str, limit: int, lease_ms: int,
                            partitions: Sequence[int] | None
                            ) -> tuple[list[SettleResult], list[Lease]]:
        self.calls["ack_and_fetch"] += 1
        if self.combined_failures:
            self.combined_failures -= 1
            raise ConnectionResetError("connection reset")
        return await super().ack_and_fetch(acks, stream, group, consumer_id, limit, lease_ms,
                                           partitions)

    async def nack(self, leases: Sequence[Lease], reason: str, delay_ms: int,
                   error: str | None = None) -> list[SettleResult]:
        self.calls["nack"] += 1
        self.nacks.append((reason, [lease.sequence for lease in leases]))
        return await super().nack(leases, reason, delay_ms, error)

    async def renew(self, leases: Sequence[Lease], lease_ms: int) -> list[SettleResult]:
        self.calls["renew"] += 1
        self.renewed.append(len(leases))
        return await super().renew(leases, lease_ms)

    async def wait_for_append(self, stream: str, timeout: float) -> bool:
        self.calls["wait"] += 1
        return await super().wait_for_append(stream, timeout)
