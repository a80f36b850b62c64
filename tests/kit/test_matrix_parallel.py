"""The conformance matrix of a pytest-xdist run is the matrix of the same run done serially.

Each worker records the cases it ran and hands them to the controller, which
writes the file once; workers merging into the file themselves would race, each
reading and rewriting it while the others do.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SUITE = """
import pytest
from rheo_flow.testing import BackendConformance, BackendHarness, memory_harness


class TestParallelBackend(BackendConformance):
    @pytest.fixture
    def rheo_harness(self) -> BackendHarness:
        return memory_harness()

    def test_routing_golden_values(self, rheo_harness):
        pytest.fail("a failure the matrix must show")
"""

ENV = {k: v for k, v in os.environ.items()
       if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")}


def _matrix(tmp_path: Path, name: str, *workers: str) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers,
         f"--rheo-matrix={name}", "test_parallel_backend.py"],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr  # the one failing case
    return (tmp_path / name).read_text()


def test_parallel_workers_write_the_serial_matrix(tmp_path: Path) -> None:
    (tmp_path / "test_parallel_backend.py").write_text(SUITE)
    serial = _matrix(tmp_path, "serial.md", "-n", "0")
    parallel = _matrix(tmp_path, "parallel.md", "-n", "3")
    assert parallel == serial
    row = next(line for line in serial.splitlines() if "`routing_golden_values`" in line)
    assert "**FAIL**" in row
    assert "a failure the matrix must show" in serial
    assert "| `stateful_model` |" in serial
