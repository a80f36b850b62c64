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
    from ._backends.mongo import MongoBackend
    from ._backends.postgres import PostgresBackend
    from ._backends.redis import RedisBackend
    from ._backends.sqlite import SQLiteBackend

__all__ = ["AppendRecord", "Backend", "MemoryBackend", "MongoBackend", "PostgresBackend",
           "RedisBackend", "SQLiteBackend"]

_LAZY = {
    "MongoBackend": "rheo_flow._backends.mongo",
    "PostgresBackend": "rheo_flow._backends.postgres",
    "RedisBackend": "rheo_flow._backends.redis",
    "SQLiteBackend": "rheo_flow._backends.sqlite",
}


# backend class -> (backend name, extra, driver module), checked before importing it.
_DRIVERS = {
    "PostgresBackend": ("PostgreSQL", "postgres", "asyncpg"),
    "RedisBackend": ("Redis", "redis", "redis"),
    "MongoBackend": ("MongoDB", "mongo", "pymongo"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rheo_flow.backends' has no attribute {name!r}")
    import importlib

    if name in _DRIVERS:
        from ._urls import require_driver

        require_driver(*_DRIVERS[name])

    return getattr(importlib.import_module(module), name)
