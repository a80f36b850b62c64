"""Deleting streams and groups through the facade (the conformance kit checks every backend)."""

from __future__ import annotations

import pytest

from rheo_flow import InvalidArgument, NewEvent, Rheo, Unsupported
from rheo_flow._backend import Backend
from rheo_flow.backends import MemoryBackend


async def test_a_backend_without_deletion_raises_unsupported() -> None:
    # Backend's own methods, not MemoryBackend's: what a third-party backend inherits.
    backend = MemoryBackend()
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        with pytest.raises(Unsupported, match=r"does not support delete_stream\(\)"):
            await Backend.delete_stream(backend, "s")
        with pytest.raises(Unsupported, match=r"does not support delete_group\(\)"):
            await Backend.delete_group(backend, "s", "g")
        assert isinstance(Unsupported("memory", "x"), NotImplementedError)


async def test_facade_forgets_a_deleted_stream() -> None:
    async with Rheo("memory://") as rheo:
        await rheo.create_stream("s", partitions=4)
        await rheo.fetch("s", "g")
        await rheo.delete_stream("s")
        await rheo.create_stream("s", partitions=1)
        # A remembered partition count (4) would let partition 3 through to the backend.
        with pytest.raises(InvalidArgument, match="partition"):
            await rheo.append("s", NewEvent("t", partition=3))
        [event] = await rheo.append("s", NewEvent("t", partition=0))
        assert event.sequence == 1
        [lease] = await rheo.fetch("s", "g")  # the group is created again on first use
        assert lease.event.id == event.id
        with pytest.raises(InvalidArgument):
            await rheo.delete_stream("bad name!")
        with pytest.raises(InvalidArgument):
            await rheo.delete_group("s", "")
