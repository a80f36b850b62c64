"""Backends of one test on a fresh collection prefix, for the MongoDB tests (the
``backends`` fixture of conftest.py in this folder hands one to each test)."""

from __future__ import annotations

import uuid
from typing import Any

from rheo_flow import ManualClock
from rheo_flow.backends import MongoBackend

SLOW_SERVER_TIMEOUT_MS = 60_000
"""Each call's bound here: the wire emulator CI runs is slow on a busy machine, and these
tests check what the backend does, not how fast (a test of the bound sets its own)."""


def fresh_prefix() -> str:
    """A collection prefix no other test uses."""
    return f"t{uuid.uuid4().hex[:10]}_"


class Backends:
    """Builds backends on one fresh prefix (as separate processes would) and drops it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = fresh_prefix()
        self.clock = ManualClock()
        self.built: list[MongoBackend] = []
        self.clients: list[Any] = []

    def make(self, **options: Any) -> MongoBackend:
        """A backend with its own AsyncMongoClient (``clock=None``: the system clock)."""
        options.setdefault("clock", self.clock)
        options.setdefault("timeout_ms", SLOW_SERVER_TIMEOUT_MS)
        backend = MongoBackend(self.url, collection_prefix=self.prefix, **options)
        self.built.append(backend)
        return backend

    def motor(self, **options: Any) -> MongoBackend:
        """A backend around a host-owned Motor client."""
        from motor.motor_asyncio import AsyncIOMotorClient

        client = AsyncIOMotorClient(self.url)
        self.clients.append(client)
        options.setdefault("clock", self.clock)
        options.setdefault("timeout_ms", SLOW_SERVER_TIMEOUT_MS)
        backend = MongoBackend(client=client, collection_prefix=self.prefix, **options)
        self.built.append(backend)
        return backend

    async def cleanup(self) -> None:
        """Close every backend built here, then drop the prefix's collections."""
        for backend in self.built:
            await backend.close()
        cleaner = self.make()
        await cleaner.drop_all()
        for client in self.clients:
            client.close()
