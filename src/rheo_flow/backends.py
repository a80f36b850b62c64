"""Backends a host can build itself (around its own pool or client), and the
building blocks for writing one.

Drivers are optional extras: importing this module never imports a driver;
building a backend whose driver is missing raises
:class:`~rheo_flow.MissingExtra` naming the extra to install.

A third-party backend subclasses :class:`Backend` and may use the same pieces
the shipped Python-side backends use, so the lease rules are not written
again: :func:`settle_delivery`, :func:`renew_delivery` and :func:`expire`
decide what a settle, renew or expiry does to one delivery;
:func:`advance_frontier` moves a frontier over settled positions;
:func:`fence` and :func:`missing_delivery` classify a lease that no longer
holds its delivery; :func:`round_robin`, :func:`query_window`,
:func:`query_matches` and :func:`start_position` are the fair fetch order, the
read window and filters of a query and a group's start; :class:`Waiters`
parks idle consumers until an append; :func:`make_lease` builds leases in
bulk. The conformance kit (:mod:`rheo_flow.testing`) then checks the result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._backend import AppendRecord, Backend
from ._backends._shared import (
    Waiters,
    fence,
    missing_delivery,
    query_matches,
    query_window,
    round_robin,
    start_position,
)
from ._backends._transitions import (
    Settled,
    advance_frontier,
    expire,
    not_leased,
    renew_delivery,
    settle_delivery,
)
from ._backends.memory import MemoryBackend
from ._model._lease import make_lease

if TYPE_CHECKING:
    from ._backends.mongo import MongoBackend
    from ._backends.postgres import PostgresBackend
    from ._backends.redis import RedisBackend
    from ._backends.sqlite import SQLiteBackend

__all__ = [
    "AppendRecord",
    "Backend",
    "MemoryBackend",
    "MongoBackend",
    "PostgresBackend",
    "RedisBackend",
    "SQLiteBackend",
    "Settled",
    "Waiters",
    "advance_frontier",
    "expire",
    "fence",
    "make_lease",
    "missing_delivery",
    "not_leased",
    "query_matches",
    "query_window",
    "renew_delivery",
    "round_robin",
    "settle_delivery",
    "start_position",
]

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
        from ._backends._urls import require_driver

        require_driver(*_DRIVERS[name])

    return getattr(importlib.import_module(module), name)
