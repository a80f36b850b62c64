"""rheo_flow: durable event streams with competing consumer groups for asyncio.

Start with :class:`Rheo`::

    async with Rheo("sqlite:///events.db") as rheo:
        await rheo.create_stream("orders", partitions=4)
        await rheo.append("orders", [NewEvent("order.placed", {"id": 1}, key="c-1")])
        leases = await rheo.fetch("orders", "billing", limit=10)
        await rheo.ack(leases)
"""

from ._backend import Backend
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
    RheoError,
    SetupRefused,
    UnknownGroup,
    UnknownStream,
)
from ._event import Event, NewEvent
from ._lease import Lease
from ._query import Page, Query
from ._rheo import Rheo
from ._routing import partition_for
from ._settle import Decision, SettleError, SettleKind, SettleResult, classify
from ._stream import DeadLetter, GroupInfo, StreamInfo

__version__ = "0.1.0"

__all__ = [
    "AlreadyStarted",
    "Backend",
    "BackendError",
    "BackendUnavailable",
    "Capabilities",
    "ConflictError",
    "DeadLetter",
    "Decision",
    "Event",
    "GroupInfo",
    "InvalidArgument",
    "InvalidCapabilities",
    "Lease",
    "ManualClock",
    "MissingExtra",
    "NewEvent",
    "NotStarted",
    "Page",
    "Query",
    "Rheo",
    "RheoError",
    "SettleError",
    "SettleKind",
    "SettleResult",
    "SetupRefused",
    "StreamInfo",
    "UnknownGroup",
    "UnknownStream",
    "__version__",
    "classify",
    "partition_for",
]
