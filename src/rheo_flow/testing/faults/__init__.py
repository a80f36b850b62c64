"""Fault injection: run a workload against a backend while faults hit it, then check.

A *producer* process appends uniquely numbered events and records every
append's outcome (``ok``, ``failed``, ``ambiguous``); *worker* processes (a
:class:`~rheo_flow.Group` or a :class:`~rheo_flow.pipeline.Pipeline`) record
every delivery and every settle result in append-only JSON-lines files, one per
process, flushed per record. A :class:`Scenario` disrupts the run meanwhile
(kill -9 and restart, SIGSTOP past the lease, poison events, lost append
answers, ...). The :func:`check` function then turns the histories and the
backend's final state into a :class:`Report`: lost, unexpected and duplicated
events, stale settles the backend accepted, final lag and dead letters.

::

    from rheo_flow.testing.faults import RunSettings, run_scenario, scenarios

    report = await run_scenario("sqlite:///torture.db", scenarios()["kill-restart"],
                                "group", RunSettings(events=500))
    assert report.ok and report.complete

``rheo-flow torture URL`` runs every applicable scenario from the command line.
A new scenario is a :class:`Scenario` with an async ``disrupt(run)`` taking a
:class:`RunControl`, added with :func:`register`. See docs/reliability.md.
"""

from ..._faults._catalog import scenarios
from ..._faults._checker import FinalState, Report, StaleSettle, check
from ..._faults._history import (
    AppendRecord,
    DeliveryRecord,
    History,
    Recorder,
    SettleRecord,
    read_history,
)
from ..._faults._render import report_dict, report_table
from ..._faults._runner import STREAM_PREFIX, run_scenario, run_torture, selected_scenarios
from ..._faults._scenario import (
    DURABLE,
    Endpoints,
    EndpointsFactory,
    Progress,
    RunControl,
    RunSettings,
    Scenario,
    WorkerProcess,
    Workload,
    backend_family,
    direct_endpoints,
    register,
)
from ..._faults._worker import WorkerConfig

__all__ = [
    "DURABLE",
    "STREAM_PREFIX",
    "AppendRecord",
    "DeliveryRecord",
    "Endpoints",
    "EndpointsFactory",
    "FinalState",
    "History",
    "Progress",
    "Recorder",
    "Report",
    "RunControl",
    "RunSettings",
    "Scenario",
    "SettleRecord",
    "StaleSettle",
    "WorkerConfig",
    "WorkerProcess",
    "Workload",
    "backend_family",
    "check",
    "direct_endpoints",
    "read_history",
    "register",
    "report_dict",
    "report_table",
    "run_scenario",
    "run_torture",
    "scenarios",
    "selected_scenarios",
]
