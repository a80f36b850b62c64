"""A module imported when one of its attributes is first read through a global.

For a module a hot path reads through a module-level name (``_telemetry.send``):
the name starts as a :class:`LazyModule` and becomes the module itself on the
first read, so that importing the reader does not import the module, and every
read after the first costs what a plain global does::

    if TYPE_CHECKING:
        from . import _telemetry
    else:
        _telemetry = LazyModule("rheo_flow._telemetry", globals(), "_telemetry")
"""

from __future__ import annotations

import importlib
from collections.abc import MutableMapping
from typing import Any

__all__ = ["LazyModule"]


class LazyModule:
    """Stands in for module ``name`` as the global ``alias`` of ``namespace``."""

    __slots__ = ("_alias", "_name", "_namespace")

    def __init__(self, name: str, namespace: MutableMapping[str, Any], alias: str) -> None:
        self._name = name
        self._namespace = namespace
        self._alias = alias

    def __getattr__(self, attribute: str) -> Any:
        """Import the module, put it in the global's place and read ``attribute``."""
        module = importlib.import_module(self._name)
        self._namespace[self._alias] = module
        return getattr(module, attribute)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported on first use>"
