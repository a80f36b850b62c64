"""Fixtures of the MongoDB tests (the server's URL, ``mongo_url``, is tests/conftest.py's)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from _mongo_backends import Backends


@pytest.fixture
async def backends(mongo_url: str) -> AsyncIterator[Backends]:
    """A factory of backends sharing one fresh collection prefix."""
    made = Backends(mongo_url)
    try:
        yield made
    finally:
        await made.cleanup()
