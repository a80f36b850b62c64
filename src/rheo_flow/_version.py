"""The version of rheo_flow, in one place.

The distribution's metadata reads it at build time (``[tool.hatch.version]`` in
pyproject.toml); ``rheo_flow.__version__``, ``rheo-flow --version`` and the
OpenTelemetry instrumentation scope import it from here.
"""

__version__ = "0.1.0"
