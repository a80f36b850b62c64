"""pytest plugin of the conformance kit: writes a case-by-backend matrix.

Installing ``rheo-flow[testing]`` makes the option available to pytest (through
the ``rheo_flow`` pytest11 entry point, :mod:`rheo_flow._pytest_plugin`); name
the file::

    pytest --rheo-matrix=conformance-matrix.md tests/test_mybackend.py

Every test of a :class:`~rheo_flow.testing.BackendConformance` subclass becomes a
cell (``pass``, ``fail`` or ``skip``) in the row of its case and the column of
its harness; the columns of backends that did not run are kept from the
existing file. A ``conftest.py`` can also register :class:`MatrixRecorder`
itself, under the name ``"rheo-matrix-recorder"`` (see the repository's
``conformance/conftest.py``).

Loading this module with ``-p rheo_flow.testing.plugin`` still works (older
command lines, or runs with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` set, where
``-p rheo_flow`` also does): the option is added and the recorder registered
once, whichever of the two plugins pytest loads first.
"""

from __future__ import annotations

import pytest

from .._pytest_plugin import ENTRY_POINT_NAME, add_matrix_option, register_recorder
from ._recorder import STATEFUL_CASE, MatrixRecorder, case_order

__all__ = ["STATEFUL_CASE", "MatrixRecorder", "case_order"]


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """``--rheo-matrix=PATH``, unless the ``rheo_flow`` entry-point plugin added it first."""
    add_matrix_option(parser, pluginmanager, ENTRY_POINT_NAME)


def pytest_configure(config: pytest.Config) -> None:
    """Register the recorder when ``--rheo-matrix`` is given (once, whichever plugin is first)."""
    register_recorder(config)
