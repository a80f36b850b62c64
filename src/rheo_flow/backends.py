"""Backends a host can build itself (around its own pool or client).

Drivers are optional extras: importing this module never imports a driver;
building a backend whose driver is missing raises
:class:`~rheo_flow.MissingExtra` naming the extra to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._backend import AppendRecord, Backend
from ._backends.memory import MemoryBackend

if TYPE_CHECKING:
    from ._backends.sqlite import SQLiteBackend

__all__ = ["AppendRecord", "Backend", "MemoryBackend", "SQLiteBackend"]

_LAZY = {
    "SQLiteBackend": "rheo_flow._backends.sqlite",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rheo_flow.backends' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
