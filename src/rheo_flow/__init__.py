"""rheo_flow: durable event streams with competing consumer groups for asyncio.

Start with :class:`Rheo`::

    async with Rheo("sqlite:///events.db") as rheo:
        await rheo.create_stream("orders", partitions=4)
        await rheo.append("orders", [NewEvent("order.placed", {"id": 1}, key="c-1")])
        leases = await rheo.fetch("orders", "billing", limit=10)
        await rheo.ack(leases)

Every name loads on first use (``from rheo_flow import Rheo``, ``rheo_flow.Group``):
importing the package alone loads none of its modules, so that the ``rheo-flow``
command line and a program using a few names do not pay for all of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

from ._version import __version__

if TYPE_CHECKING:
    from ._backend import Backend
    from ._facade._transaction import Transaction
    from ._model._capabilities import Capabilities
    from ._model._errors import (
        AlreadyStarted,
        BackendError,
        BackendUnavailable,
        ConflictError,
        InvalidArgument,
        InvalidCapabilities,
        InvalidPayload,
        MissingExtra,
        NotStarted,
        OutcomeUnknown,
        RheoError,
        SetupRefused,
        StaleLease,
        StoreLost,
        UnknownGroup,
        UnknownStream,
        Unsupported,
    )
    from ._model._event import Event, NewEvent
    from ._model._lag import GroupLag, LagReport, PartitionLag
    from ._model._lease import Lease
    from ._model._outcome import (
        ACK,
        SETTLED,
        Ack,
        Outcome,
        Reject,
        Retry,
        Settled,
        current_lease,
    )
    from ._model._query import Page, Query
    from ._model._routing import partition_for
    from ._model._settle_results import Decision, SettleError, SettleKind, SettleResult, classify
    from ._model._stream import DeadLetter, GroupInfo, Retention, StreamInfo
    from ._model._typed import SCHEMA_VERSION_HEADER
    from ._rheo import Rheo
    from ._runtime._backoff import Backoff
    from ._runtime._group import Consumer, Group, consumer
    from ._runtime._group_loop import GroupStats
    from ._runtime._producer import Producer, ProducerStats
    from ._runtime._retry_policy import RetryPolicy
    from ._runtime._settle_calls import SettleOutcome
    from ._support._clock import ManualClock

__all__ = [
    "ACK",
    "SCHEMA_VERSION_HEADER",
    "SETTLED",
    "Ack",
    "AlreadyStarted",
    "Backend",
    "BackendError",
    "BackendUnavailable",
    "Backoff",
    "Capabilities",
    "ConflictError",
    "Consumer",
    "DeadLetter",
    "Decision",
    "Event",
    "Group",
    "GroupInfo",
    "GroupLag",
    "GroupStats",
    "InvalidArgument",
    "InvalidCapabilities",
    "InvalidPayload",
    "LagReport",
    "Lease",
    "ManualClock",
    "MissingExtra",
    "NewEvent",
    "NotStarted",
    "Outcome",
    "OutcomeUnknown",
    "Page",
    "PartitionLag",
    "Producer",
    "ProducerStats",
    "Query",
    "Reject",
    "Retention",
    "Retry",
    "RetryPolicy",
    "Rheo",
    "RheoError",
    "SettleError",
    "SettleKind",
    "SettleOutcome",
    "SettleResult",
    "Settled",
    "SetupRefused",
    "StaleLease",
    "StoreLost",
    "StreamInfo",
    "Transaction",
    "UnknownGroup",
    "UnknownStream",
    "Unsupported",
    "__version__",
    "classify",
    "consumer",
    "current_lease",
    "partition_for",
]

_HOMES: Final[dict[str, str]] = {
    "Backend": "._backend",
    "Capabilities": "._model._capabilities",
    "AlreadyStarted": "._model._errors",
    "BackendError": "._model._errors",
    "BackendUnavailable": "._model._errors",
    "ConflictError": "._model._errors",
    "InvalidArgument": "._model._errors",
    "InvalidCapabilities": "._model._errors",
    "InvalidPayload": "._model._errors",
    "MissingExtra": "._model._errors",
    "NotStarted": "._model._errors",
    "OutcomeUnknown": "._model._errors",
    "RheoError": "._model._errors",
    "SetupRefused": "._model._errors",
    "StaleLease": "._model._errors",
    "StoreLost": "._model._errors",
    "UnknownGroup": "._model._errors",
    "UnknownStream": "._model._errors",
    "Unsupported": "._model._errors",
    "Event": "._model._event",
    "NewEvent": "._model._event",
    "Lease": "._model._lease",
    "ACK": "._model._outcome",
    "Ack": "._model._outcome",
    "Outcome": "._model._outcome",
    "Reject": "._model._outcome",
    "Retry": "._model._outcome",
    "SCHEMA_VERSION_HEADER": "._model._typed",
    "SETTLED": "._model._outcome",
    "Settled": "._model._outcome",
    "Transaction": "._facade._transaction",
    "current_lease": "._model._outcome",
    "Page": "._model._query",
    "Query": "._model._query",
    "partition_for": "._model._routing",
    "Decision": "._model._settle_results",
    "SettleError": "._model._settle_results",
    "SettleKind": "._model._settle_results",
    "SettleResult": "._model._settle_results",
    "classify": "._model._settle_results",
    "DeadLetter": "._model._stream",
    "GroupLag": "._model._lag",
    "LagReport": "._model._lag",
    "PartitionLag": "._model._lag",
    "GroupInfo": "._model._stream",
    "Retention": "._model._stream",
    "StreamInfo": "._model._stream",
    "Rheo": "._rheo",
    "Backoff": "._runtime._backoff",
    "Consumer": "._runtime._group",
    "Group": "._runtime._group",
    "consumer": "._runtime._group",
    "GroupStats": "._runtime._group_loop",
    "Producer": "._runtime._producer",
    "ProducerStats": "._runtime._producer",
    "RetryPolicy": "._runtime._retry_policy",
    "SettleOutcome": "._runtime._settle_calls",
    "ManualClock": "._support._clock",
}
"""Where each exported name is defined (relative to this package)."""

if not TYPE_CHECKING:  # hidden from type checkers: a misspelt name stays an error there

    def __getattr__(name: str) -> Any:
        """Load an exported name from its module on first use (then it is a global)."""
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, __name__), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
