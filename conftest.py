"""Loaded first by every pytest run of this repository (tests/ and conformance/).

``RHEO_MONGO_URLS`` (comma-separated, as ``.ci/run`` sets it) puts each pytest-xdist
worker on its own MongoDB test server: the wire emulator CI runs answers one request
at a time, so workers sharing one would wait on each other's calls.
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Point ``RHEO_MONGO_URL`` at this worker's server when several are given."""
    urls = [url for url in os.environ.get("RHEO_MONGO_URLS", "").split(",") if url]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if urls and worker.startswith("gw") and worker[2:].isdigit():
        os.environ["RHEO_MONGO_URL"] = urls[int(worker[2:]) % len(urls)]
