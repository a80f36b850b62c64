"""rheo_flow: durable event streams with competing consumer groups for asyncio.

Start with :class:`Rheo`::

    async with Rheo("sqlite:///events.db") as rheo:
        await rheo.create_stream("orders", partitions=4)
        await rheo.append("orders", [NewEvent("order.placed", {"id": 1}, key="c-1")])
        leases = await rheo.fetch("orders", "billing", limit=10)
        await rheo.ack(leases)
"""

from ._backend import Backend
from ._backoff import Backoff
from ._capabilities import Capabilities
from ._clock import ManualClock
from ._errors import (
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
from ._event import Event, NewEvent
from ._group import Consumer, Group, consumer
from ._group_loop import GroupStats
from ._lease import Lease
from ._outcome import ACK, Ack, Outcome, Reject, Retry, current_lease
from ._producer import Producer, ProducerStats
from ._query import Page, Query
from ._retry_policy import RetryPolicy
from ._rheo import Rheo
from ._routing import partition_for
from ._settle_calls import SettleOutcome
from ._settle_results import Decision, SettleError, SettleKind, SettleResult, classify
from ._stream import DeadLetter, GroupInfo, StreamInfo
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
