"""The pytest face of the kit: a base class with one test per case."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from ._case import CASES, Case
from ._harness import BackendHarness
from ._runner import execute_case

__all__ = ["HARNESS_NAME", "BackendConformance"]

HARNESS_NAME = pytest.StashKey[str]()
"""Where each test records the name of the harness it ran against (for the matrix)."""


class BackendConformance:
    """Every conformance case as a pytest test; subclass it and provide ``rheo_harness``.

    ::

        import pytest
        from rheo_flow.testing import BackendConformance, BackendHarness

        class TestMyBackend(BackendConformance):
            @pytest.fixture
            def rheo_harness(self) -> BackendHarness:
                return BackendHarness.with_manual_clock(
                    "mine", lambda clock: MyBackend(clock=clock))

    Each test runs in its own event loop on a fresh backend from the harness, so
    the class works whatever the pytest-asyncio mode. A case whose capability the
    backend does not declare is skipped with a reason naming the capability.
    """

    def test_stateful_model(self, rheo_harness: BackendHarness, request: pytest.FixtureRequest
                            ) -> None:
        """Random operation sequences agree with a reference model, and nothing is lost."""
        from ._stateful import run_stateful

        request.node.stash[HARNESS_NAME] = rheo_harness.name
        run_stateful(rheo_harness)


def _make_test(case: Case) -> Callable[[BackendConformance, BackendHarness, pytest.FixtureRequest],
                                       None]:
    def test(self: BackendConformance, rheo_harness: BackendHarness,
             request: pytest.FixtureRequest) -> None:
        request.node.stash[HARNESS_NAME] = rheo_harness.name
        reason = asyncio.run(execute_case(rheo_harness, case))
        if reason is not None:
            pytest.skip(reason)

    test.__name__ = f"test_{case.name}"
    test.__qualname__ = f"BackendConformance.test_{case.name}"
    rules = ", ".join(f"`{rule}`" for rule in case.rules)
    # The first line of the docstring is the matrix's "checks" column.
    test.__doc__ = f"{case.doc} Rules: {rules}." if rules else case.doc
    return test


for _case in CASES:
    setattr(BackendConformance, f"test_{_case.name}", _make_test(_case))
