"""The conformance kit against the ``mongo`` column (PyMongo's AsyncMongoClient).

A file of its own so that pytest-xdist's ``--dist loadfile`` runs this slow
column (the CI server is an emulator) beside the others, on another worker;
``conftest.py`` gives each file its columns (``COLUMNS_BY_FILE``).
"""

from __future__ import annotations

from rheo_flow.testing import BackendConformance


class TestConformance(BackendConformance):
    """Every case of :mod:`rheo_flow.testing`; ``rheo_harness`` comes from conftest.py."""
