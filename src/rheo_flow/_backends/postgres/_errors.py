"""How the PostgreSQL backend reports failures: asyncpg errors as settle kinds, messages
without secrets."""

from __future__ import annotations

import asyncio
import sys
from urllib.parse import urlsplit

from ..._model._settle_results import SettleKind
from .._urls import redact_url

__all__ = ["classify_error", "error_prefix", "scrub"]

_UNAVAILABLE_STATES = frozenset({"08001", "08004", "53300", "57P03", "3D000"})
"""Could not connect, refused, too many connections, starting up, no such database."""


def classify_error(exc: BaseException) -> SettleKind | None:
    """Map asyncpg errors (and psycopg's, of an application's connection) to settle kinds.

    * could not connect, pool closed, server refusing connections, too many
      connections: nothing was sent → ``backend_unavailable``;
    * connection lost during the call, server shut down under it, timeout:
      the write may have committed → ``ambiguous``;
    * serialization failure, deadlock, constraint violation, statement timeout
      and every other server error: the statement was rolled back → ``failed``.
    """
    psycopg = sys.modules.get("psycopg")  # loaded by the application, never here
    if psycopg is not None and isinstance(exc, psycopg.Error):
        # On the application's connection (the outbox): its transaction decides, so a
        # failure there committed nothing of the call's.
        state = getattr(exc, "sqlstate", None)
        return _server_error(state) if state else SettleKind.FAILED
    try:
        import asyncpg
    except ImportError:  # pragma: no cover - the backend cannot exist without it
        return None
    if isinstance(exc, asyncpg.InterfaceError):
        text = str(exc).lower()
        if "pool is clos" in text or "connection is closed" in text:
            return SettleKind.BACKEND_UNAVAILABLE
        return SettleKind.FAILED
    if isinstance(exc, asyncpg.PostgresError):
        return _server_error(getattr(exc, "sqlstate", None) or "")
    if isinstance(exc, ConnectionRefusedError):
        return SettleKind.BACKEND_UNAVAILABLE
    if isinstance(exc, asyncio.TimeoutError | ConnectionError):
        return SettleKind.AMBIGUOUS
    if isinstance(exc, OSError):
        return SettleKind.BACKEND_UNAVAILABLE
    return None


def _server_error(state: str) -> SettleKind:
    """The kind of a server error by its SQLSTATE (``28...``: authentication failed)."""
    if state in _UNAVAILABLE_STATES or state.startswith("28"):
        return SettleKind.BACKEND_UNAVAILABLE
    if state.startswith("08") or state in ("57P01", "57P02"):
        return SettleKind.AMBIGUOUS
    if state == "RF001":  # raised by the fetch function: the group id is gone
        return SettleKind.INVALID
    return SettleKind.FAILED


def error_prefix(url: str | None) -> str:
    """Where an error happened: the redacted URL, or the host's pool."""
    where = redact_url(url) if url is not None else "the pool given as pool"
    return f"PostgreSQL at {where}"


def scrub(url: str | None, text: str) -> str:
    """``text`` with the URL's password (should a driver message quote it) masked."""
    password = urlsplit(url).password if url is not None else None
    return text.replace(password, "***") if password else text
