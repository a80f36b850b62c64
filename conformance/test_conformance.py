"""The conformance kit against each backend selected by ``RHEO_BACKENDS`` (see conftest.py)."""

from __future__ import annotations

from rheo_flow.testing import BackendConformance


class TestConformance(BackendConformance):
    """Every case of :mod:`rheo_flow.testing`; ``rheo_harness`` comes from conftest.py."""
