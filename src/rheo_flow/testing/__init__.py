"""The rheo_flow backend conformance kit.

Every backend, shipped or third-party, must pass the same cases: routing,
gapless sequences, idempotent appends, lease exclusivity and fencing, the
settle vocabulary, renew and expiry, max attempts and dead letters, the
contiguous frontier, replay and reset, queries, trimming, and a stateful test
that runs random operation sequences against a reference model. It needs the
``testing`` extra (pytest and Hypothesis): ``pip install 'rheo-flow[testing]'``.

How to test your own backend: describe how to build a fresh one (a
*harness*), then subclass :class:`BackendConformance`::

    # tests/test_my_backend_conformance.py
    import pytest
    from rheo_flow.testing import BackendConformance, BackendHarness

    from my_package import MyBackend


    class TestMyBackend(BackendConformance):
        @pytest.fixture
        def rheo_harness(self) -> BackendHarness:
            # A backend that accepts an injectable clock gets exact, instant expiry tests:
            return BackendHarness.with_manual_clock("mine", lambda clock: MyBackend(clock=clock))

A backend on a real (or server) clock uses
``url_harness("mine", "mydb://localhost/test")`` or builds a
:class:`BackendHarness` with its own ``factory`` (an async context manager
yielding a backend); the kit then waits for real time to pass. Capabilities the
backend does not declare (``push_wakeups``, ``delayed_nack``, ``trim``, ...)
skip their cases with a reason naming the capability. Without pytest::

    from rheo_flow.testing import memory_harness, run_cases

    failed = [r for r in run_cases(memory_harness()) if r.status == "fail"]

``pytest --rheo-matrix=matrix.md`` also writes a case-by-backend matrix (the
option comes with the install: rheo-flow registers a pytest plugin, which does
nothing without it).
"""

try:
    import hypothesis  # noqa: F401
    import pytest  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by the packaging test
    from .._model._errors import MissingExtra

    raise MissingExtra("conformance kit", "testing", exc.name or "pytest") from None

from ._case import CASES, Case, CaseEnv, ConformanceFailure, case
from ._harness import (
    AppTransaction,
    BackendFactory,
    BackendHarness,
    TransactionFactory,
    memory_harness,
    sqlite_harness,
    url_harness,
)
from ._runner import CaseResult, all_cases, run_case, run_cases
from ._stateful import conformance_state_machine, run_stateful
from ._suite import BackendConformance

__all__ = [
    "CASES",
    "AppTransaction",
    "BackendConformance",
    "BackendFactory",
    "BackendHarness",
    "Case",
    "CaseEnv",
    "CaseResult",
    "ConformanceFailure",
    "TransactionFactory",
    "all_cases",
    "case",
    "conformance_state_machine",
    "memory_harness",
    "run_case",
    "run_cases",
    "run_stateful",
    "sqlite_harness",
    "url_harness",
]

