"""The pytest11 entry point of rheo-flow: ``--rheo-matrix=PATH`` with no ``-p`` flag.

pytest loads this module at start-up in every environment where rheo-flow is
installed, with or without the ``testing`` extra, so it stays outside the
:mod:`rheo_flow.testing` package (whose import needs Hypothesis), imports
nothing beyond pytest and never raises at start-up. The conformance kit is
imported only when ``--rheo-matrix`` is given; its recorder is
:class:`rheo_flow.testing.plugin.MatrixRecorder`. Without the option the plugin
does nothing (no file is written).

Old command lines keep working: ``-p rheo_flow.testing.plugin`` loads that
module as a plugin as well, and whichever of the two pytest registers first
adds the option; the recorder is registered once, under :data:`RECORDER_NAME`
(a ``conftest.py`` that registers its own recorder uses that name too, so only
one recorder ever runs). ``-p no:rheo_flow`` disables this plugin.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ENTRY_POINT_NAME = "rheo_flow"
"""The plugin's name in pytest (the entry point's name in ``pyproject.toml``)."""
LEGACY_PLUGIN_NAME = "rheo_flow.testing.plugin"
"""The name pytest gives the kit's module when loaded with ``-p rheo_flow.testing.plugin``."""
RECORDER_NAME = "rheo-matrix-recorder"
"""The name of the one registered :class:`~rheo_flow.testing.plugin.MatrixRecorder`."""


def add_matrix_option(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager,
                      other: str) -> None:
    """Add ``--rheo-matrix`` unless the plugin named ``other`` already did.

    ``pytest_addoption`` runs as each plugin is registered, so a registered
    ``other`` has already added the option.
    """
    if pluginmanager.has_plugin(other):
        return
    parser.addoption("--rheo-matrix", default=None, metavar="PATH",
                     help="write the rheo_flow conformance matrix (markdown) to PATH")


def register_recorder(config: pytest.Config) -> None:
    """Register the matrix recorder when ``--rheo-matrix`` is given and none is registered."""
    path = config.getoption("rheo_matrix", None)
    if not path or config.pluginmanager.has_plugin(RECORDER_NAME):
        return
    from rheo_flow._model._errors import MissingExtra

    try:
        from rheo_flow.testing._recorder import MatrixRecorder
    except MissingExtra as exc:
        raise pytest.UsageError(f"--rheo-matrix: {exc}") from None
    config.pluginmanager.register(MatrixRecorder(Path(path)), RECORDER_NAME)


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """``--rheo-matrix=PATH``: write the conformance matrix there."""
    add_matrix_option(parser, pluginmanager, LEGACY_PLUGIN_NAME)


def pytest_configure(config: pytest.Config) -> None:
    """Register the recorder when ``--rheo-matrix`` is given."""
    register_recorder(config)
