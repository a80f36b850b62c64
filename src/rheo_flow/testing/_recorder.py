"""The conformance matrix recorder: one cell per (case, backend) of a pytest run.

:class:`MatrixRecorder` is what both plugins register (this kit's
:mod:`rheo_flow.testing.plugin` and the light entry point
:mod:`rheo_flow._pytest_plugin`, which imports this module only when
``--rheo-matrix`` is given); it lives apart from both so that neither imports the
other's module back.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from ._case import CASES
from ._matrix import Cell, update_matrix
from ._suite import HARNESS_NAME, BackendConformance

__all__ = ["STATEFUL_CASE", "MatrixRecorder", "case_order"]

_RANK = {"pass": 0, "skip": 1, "fail": 2}
_WORKER_KEY = "rheo_matrix"
"""Where a pytest-xdist worker leaves its cells for the controller (``workeroutput``)."""

STATEFUL_CASE = "stateful_model"
"""The matrix row of :meth:`BackendConformance.test_stateful_model`."""


def case_order() -> list[str]:
    """Every row of the matrix, in kit order."""
    return [c.name for c in CASES] + [STATEFUL_CASE]


def _identify(item: pytest.Item) -> tuple[str, str] | None:
    cls = getattr(item, "cls", None)
    if cls is None or not issubclass(cls, BackendConformance):
        return None
    name = getattr(item, "originalname", item.name).removeprefix("test_")
    backend = item.stash.get(HARNESS_NAME, None)
    if backend is None:
        callspec = getattr(item, "callspec", None)
        param = callspec.params.get("rheo_harness") if callspec is not None else None
        backend = param if isinstance(param, str) else (
            callspec.id if callspec is not None else "backend")
    return name, backend


def _detail(report: pytest.TestReport) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    text = report.longreprtext.strip().splitlines()
    # The last lines of a failure hold the exception and its message.
    errors = [line for line in text if line.startswith("E ")]
    return " ".join(line[1:].strip() for line in errors[:3]) or (text[-1] if text else "")


class MatrixRecorder:
    """Collects conformance results and writes them to ``path`` at the end of the session."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.results: dict[tuple[str, str], Cell] = {}
        self.docs: dict[str, str] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """Record the outcome of each phase of a conformance test."""
        report = yield
        identity = _identify(item)
        if identity is None:
            return report
        function = getattr(item, "function", None)
        doc = (getattr(function, "__doc__", None) or "").strip().splitlines()
        self.docs[identity[0]] = doc[0] if doc else ""
        if report.failed:
            cell: Cell = ("fail", _detail(report))
        elif report.skipped:
            cell = ("skip", _detail(report))
        elif report.when == "call":
            cell = ("pass", "")
        else:
            return report
        self._keep(identity, cell)
        return report

    def _keep(self, identity: tuple[str, str], cell: Cell) -> None:
        # A test's worst phase (or worker) decides its cell: fail over skip over pass.
        previous = self.results.get(identity)
        if previous is None or _RANK[cell[0]] > _RANK[previous[0]]:
            self.results[identity] = cell

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Merge this run's cells into the matrix file.

        Under pytest-xdist a worker hands its cells to the controller instead
        (:meth:`pytest_testnodedown`), which writes the file once, after all of them.
        """
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[_WORKER_KEY] = {
                "cells": [[name, backend, *cell] for (name, backend), cell in self.results.items()],
                "docs": self.docs,
            }
        elif self.results:
            update_matrix(self.path, self.results, self.docs, case_order())

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """Collect the cells of a pytest-xdist worker that finished."""
        sent = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
        if not sent:
            return
        self.docs.update(sent["docs"])
        for name, backend, state, detail in sent["cells"]:
            self._keep((name, backend), (state, detail))
