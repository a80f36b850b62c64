"""Starting a throwaway server in a test: skip without its binaries, fail under CI."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from rheo_flow._faults._servers import ServerUnavailable, ThrowawayServer

T = TypeVar("T", bound=ThrowawayServer)


def throwaway(kind: Callable[..., T], ci: bool, **options: Any) -> T:
    """A started throwaway server (``PostgresServer`` / ``RedisServer``), or skip / fail.

    Skips when the server's binaries are missing, except under ``CI=true``.
    """
    try:
        server = kind(**options)
    except ServerUnavailable as exc:
        if ci:
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    return server
