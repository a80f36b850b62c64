"""Lint rules of the runtimes' concurrency, checked over the source tree.

* No cancellation is swallowed: no ``contextlib.suppress(CancelledError)`` and no
  ``except CancelledError`` whose body does not raise (to wait for a cancelled
  task, use ``cancel_and_wait``, which raises its caller's own cancellation).
* No task outlives its owner: a task is created only where its owner cancels and
  awaits it on every way out. Runtimes create theirs through
  ``_runtime/_lifecycle.py``'s ``TaskSet``; the other modules allowed to create
  tasks are listed below, each with the reason their tasks end with their owner.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "rheo_flow"

TASK_OWNERS = {
    "_runtime/_lifecycle.py": "TaskSet: a runtime's stop cancels and awaits every task",
    "_support/_waiting.py": "first_of cancels and awaits every awaitable before returning",
    "_runtime/_fetch_pair.py": "lead_and_follow cancels and awaits both fetchers",
    "pipeline/_stage_tasks.py": "the stages' tasks: Stages.cancel, in every pipeline shutdown",
    "pipeline/_acknowledger.py": "the ack sender: close(), in every pipeline shutdown",
    "_backends/redis/_wakeups.py": "the reads of one wait, cancelled and awaited in it",
    "_backends/postgres/_listener.py": "the LISTEN connection's task: the backend's close",
    "_backends/mongo/_watcher.py": "the change stream's task: the backend's close",
    "_telemetry/_lag.py": "the lag refresher: aclose(), in every runtime shutdown",
    "_cli/worker/_health.py": "the health file toucher: close(), in the worker's finally",
    "_cli/worker/_observe.py": "the store probe: aclose(), in the worker's and its supervisor's"
                               " finally",
    "_cli/worker/_supervisor.py": "waits for its child processes, cancelled in its finally",
    "_cli/worker/_run.py": "the supervisor watch, cancelled in the worker's finally",
    "_cli/demo/_run.py": "the demo's producer and workers, awaited in its finally",
    "sinks/_duckdb.py": "the export loop: the sink's close",
    "_faults/_runner.py": "a scenario's disruption, awaited by the scenario",
    "_faults/_worker.py": "a fault worker's watchdog, cancelled as it exits",
    "_faults/_proxy.py": "the proxy's pumps, closed with their link",
    "testing/_cases_isolation.py": "a kit case's waiters, awaited by the case",
    "testing/_cases_reads.py": "a kit case's waiters, awaited by the case",
    "testing/_cases_pause.py": "a kit case's waiter, awaited by the case",
    "testing/_stateful_other.py": "a model step's waiter, awaited by the step",
}
"""Modules that may create tasks, and why those tasks never outlive their owner."""

_SPAWNERS = {"create_task", "ensure_future"}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(path.relative_to(SRC).as_posix(), ast.parse(path.read_text(), str(path)))
            for path in sorted(SRC.rglob("*.py"))]


def _names_cancelled_error(node: ast.expr | None) -> bool:
    if node is None:
        return False
    if isinstance(node, ast.Tuple):
        return any(_names_cancelled_error(elt) for elt in node.elts)
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name == "CancelledError"


def _raises(body: list[ast.stmt]) -> bool:
    return any(isinstance(node, ast.Raise) for stmt in body for node in ast.walk(stmt))


def test_no_cancellation_is_swallowed() -> None:
    found = []
    for name, tree in _modules():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr",
                                                       getattr(node.func, "id", "")) == "suppress"
                    and any(_names_cancelled_error(arg) for arg in node.args)):
                found.append(f"{name}:{node.lineno}: suppress(CancelledError)")
            if (isinstance(node, ast.ExceptHandler) and _names_cancelled_error(node.type)
                    and not _raises(node.body)):
                found.append(f"{name}:{node.lineno}: except CancelledError without raise")
    assert not found, "cancellations swallowed:\n" + "\n".join(found)


def test_tasks_are_created_only_by_their_owners() -> None:
    found = []
    for name, tree in _modules():
        if name in TASK_OWNERS:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in _SPAWNERS:
                found.append(f"{name}:{node.lineno}: {ast.unparse(node.func)}")
    assert not found, ("tasks created outside their owners (use the runtime's TaskSet, "
                       "or add the module to TASK_OWNERS with the reason):\n" + "\n".join(found))


def test_every_listed_owner_still_creates_tasks() -> None:
    """The list keeps no stale entry: every module in it does create tasks."""
    spawning = {name for name, tree in _modules()
                if any(isinstance(node, ast.Call) and getattr(node.func, "attr", "") in _SPAWNERS
                       for node in ast.walk(tree))}
    assert set(TASK_OWNERS) - spawning == set()
