"""rheo_flow: durable event streams with competing consumer groups for asyncio.

Start with :class:`Rheo`::

    async with Rheo("sqlite:///events.db") as rheo:
        await rheo.create_stream("orders", partitions=4)
        await rheo.append("orders", [NewEvent("order.placed", {"id": 1}, key="c-1")])
        leases = await rheo.fetch("orders", "billing", limit=10)
        await rheo.ack(leases)
"""

from ._backend import Backend
from ._model._capabilities import Capabilities
from ._model._errors import (
    AlreadyStarted,
    BackendError,
    BackendUnavailable,
    ConflictError,
    InvalidArgument,
    InvalidCapabilities,
    MissingExtra,
    NotStarted,
    OutcomeUnknown,
    RheoError,
    SetupRefused,
    StoreLost,
    UnknownGroup,
    UnknownStream,
    Unsupported,
)
from ._model._event import Event, NewEvent
from ._model._lease import Lease
from ._model._outcome import ACK, Ack, Outcome, Reject, Retry, current_lease
from ._model._query import Page, Query
from ._model._routing import partition_for
from ._model._settle_results import Decision, SettleError, SettleKind, SettleResult, classify
from ._model._stream import DeadLetter, GroupInfo, StreamInfo
from ._rheo import Rheo
from ._runtime._backoff import Backoff
from ._runtime._group import Consumer, Group, consumer
from ._runtime._group_loop import GroupStats
from ._runtime._producer import Producer, ProducerStats
from ._runtime._retry_policy import RetryPolicy
from ._runtime._settle_calls import SettleOutcome
from ._support._clock import ManualClock
from ._version import __version__

__all__ = [
    "ACK",
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
    "GroupStats",
    "InvalidArgument",
    "InvalidCapabilities",
    "Lease",
    "ManualClock",
    "MissingExtra",
    "NewEvent",
    "NotStarted",
    "Outcome",
    "OutcomeUnknown",
    "Page",
    "Producer",
    "ProducerStats",
    "Query",
    "Reject",
    "Retry",
    "RetryPolicy",
    "Rheo",
    "RheoError",
    "SettleError",
    "SettleKind",
    "SettleOutcome",
    "SettleResult",
    "SetupRefused",
    "StoreLost",
    "StreamInfo",
    "UnknownGroup",
    "UnknownStream",
    "Unsupported",
    "__version__",
    "classify",
    "consumer",
    "current_lease",
    "partition_for",
]
