"""A batch's acks and the next fetch in one pipeline of the Redis backend."""

from __future__ import annotations

from collections.abc import Sequence

from ..._model._lease import Lease
from ..._model._settle_results import SettleResult
from ._fetch import FetchOperations
from ._settle import SettleOperations

__all__ = ["AckFetchOperations"]


class AckFetchOperations(FetchOperations, SettleOperations):
    """``ack_and_fetch``: the settle scripts of the acks run first in the fetch's first
    round trip (one pipeline; on a cluster, sent at once)."""

    one_call_ack_and_fetch = True

    async def ack_and_fetch(
        self,
        acks: Sequence[Lease],
        stream: str,
        group: str,
        consumer_id: str,
        limit: int,
        lease_ms: int,
        partitions: Sequence[int] | None,
    ) -> tuple[list[SettleResult], list[Lease]]:
        if not acks:
            return [], await self.fetch(stream, group, consumer_id, limit, lease_ms, partitions)
        plan = self._settle_op_plan(acks, "a", "", 0)
        try:
            leases, replies = await self._fetch_with(stream, group, consumer_id, limit,
                                                     lease_ms, partitions, plan.calls)
        finally:
            self._settled(acks, plan)
        await self._note_settled(plan, replies, "a")
        return self._settle_op_results(acks, plan, replies), leases
