"""Running cases against a harness, each in a fresh event loop and a fresh backend."""

from __future__ import annotations

import asyncio
import os
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from .._rheo import Rheo
from . import (
    _cases_batches,
    _cases_delay,
    _cases_deletion,
    _cases_isolation,
    _cases_lag,
    _cases_leases,
    _cases_ordering,
    _cases_ordering_redrive,
    _cases_ordering_scans,
    _cases_pause,
    _cases_positions,
    _cases_progress,
    _cases_reads,
    _cases_redelivery,
    _cases_retention,
    _cases_streams,
    _cases_time,
    _cases_transaction,
    _cases_typed,
)
from ._case import CASES, Case, CaseEnv
from ._harness import BackendHarness

__all__ = ["CaseResult", "all_cases", "execute_case", "run_case", "run_cases"]

# Importing the case modules registers their cases; keep them referenced.
_CASE_MODULES = (_cases_streams, _cases_leases, _cases_redelivery, _cases_batches,
                 _cases_ordering, _cases_ordering_scans, _cases_ordering_redrive,
                 _cases_progress, _cases_reads,
                 _cases_deletion, _cases_pause, _cases_time, _cases_delay,
                 _cases_isolation, _cases_transaction, _cases_positions, _cases_retention,
                 _cases_lag, _cases_typed)

CASE_TIMEOUT_S = float(os.environ.get("RHEO_CASE_TIMEOUT", "60"))
"""Upper bound of one case: a hung backend fails the case instead of the whole run."""

Status = Literal["pass", "fail", "skip"]


@dataclass(frozen=True, slots=True)
class CaseResult:
    """The outcome of one case against one backend."""

    case: str
    backend: str
    status: Status
    detail: str = ""
    """The skip reason, or the failure with its traceback."""
    error: BaseException | None = None


def all_cases() -> list[Case]:
    """Every conformance case, in a stable order."""
    return list(CASES)


async def execute_case(harness: BackendHarness, case: Case) -> str | None:
    """Run ``case`` on a fresh backend; returns the skip reason, raises on failure."""
    async with harness.factory() as backend:
        reason = case.skip_reason(backend, harness)
        if reason is not None:
            return reason
        async with Rheo(backend) as rheo:
            await asyncio.wait_for(case.func(CaseEnv(harness, backend, rheo)), CASE_TIMEOUT_S)
    return None


def run_case(harness: BackendHarness, case: Case) -> CaseResult:
    """Run one case in a new event loop; failures are returned, not raised."""
    try:
        reason = asyncio.run(execute_case(harness, case))
    except Exception as exc:
        detail = "".join(traceback.format_exception(exc))
        if isinstance(exc, TimeoutError):
            detail = f"timed out (the limit is {CASE_TIMEOUT_S:g} s)\n{detail}"
        return CaseResult(case.name, harness.name, "fail", detail, exc)
    if reason is not None:
        return CaseResult(case.name, harness.name, "skip", reason)
    return CaseResult(case.name, harness.name, "pass")


def run_cases(harness: BackendHarness, cases: Iterable[Case | str] | None = None
              ) -> list[CaseResult]:
    """Run cases (all by default, or those named) against ``harness``, one by one."""
    known = {c.name: c for c in CASES}
    selected: list[Case] = []
    for item in CASES if cases is None else cases:
        if isinstance(item, str):
            if item not in known:
                raise ValueError(f"unknown conformance case {item!r}")
            item = known[item]
        selected.append(item)
    return [run_case(harness, c) for c in selected]
