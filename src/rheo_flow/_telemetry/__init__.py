"""OpenTelemetry instrumentation of rheo_flow (internal; see :mod:`rheo_flow.telemetry`).

The instrumented modules call the helpers re-exported here: :func:`send`,
:func:`receive` and :func:`settling` in the facade, :func:`process_event` in
consumer groups, :func:`process_messages` in pipeline stages,
:func:`track_lag` and :func:`detached` in the runtimes, :func:`follow_up` in
the settle decision table. Each one costs a provider check and nothing more
when no OpenTelemetry SDK is configured or instrumentation is disabled.
"""

from __future__ import annotations

from ._client import Settling, decision_for, follow_up, receive, send, settling
from ._context import carrier, creation_context
from ._lag import LagTracker, track_lag
from ._metrics import Instruments, instruments
from ._process import EventProcessing, MessagesProcessing, detached, process_event, process_messages
from ._state import ENV_SWITCH, STATE, tracer

__all__ = [
    "ENV_SWITCH",
    "STATE",
    "EventProcessing",
    "Instruments",
    "LagTracker",
    "MessagesProcessing",
    "Settling",
    "carrier",
    "creation_context",
    "decision_for",
    "detached",
    "follow_up",
    "instruments",
    "process_event",
    "process_messages",
    "receive",
    "send",
    "settling",
    "tracer",
    "track_lag",
]
