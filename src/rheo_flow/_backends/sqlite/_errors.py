"""How ``sqlite3`` errors map to settle kinds, and which ones are worth a retry.

SQLite's messages hold the file's path at most, never a credential: nothing in
them needs scrubbing.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from ..._model._settle_results import SettleKind

__all__ = ["classify_error", "is_locked"]

_CODE_KINDS: Final[dict[int, SettleKind]] = {
    5: SettleKind.FAILED,  # SQLITE_BUSY
    6: SettleKind.FAILED,  # SQLITE_LOCKED
    8: SettleKind.FAILED,  # SQLITE_READONLY
    9: SettleKind.FAILED,  # SQLITE_INTERRUPT
    13: SettleKind.FAILED,  # SQLITE_FULL
    19: SettleKind.FAILED,  # SQLITE_CONSTRAINT
    10: SettleKind.AMBIGUOUS,  # SQLITE_IOERR
    11: SettleKind.BACKEND_UNAVAILABLE,  # SQLITE_CORRUPT
    14: SettleKind.BACKEND_UNAVAILABLE,  # SQLITE_CANTOPEN
    15: SettleKind.BACKEND_UNAVAILABLE,  # SQLITE_PROTOCOL
    26: SettleKind.BACKEND_UNAVAILABLE,  # SQLITE_NOTADB
}


def classify_error(exc: BaseException) -> SettleKind | None:
    """Map ``sqlite3`` errors by their primary result code.

    * busy / locked (another process held the lock past ``busy_timeout_ms``),
      disk full, read-only file, constraint: the transaction was rolled back,
      nothing committed → ``failed``.
    * cannot open, corrupt or not a database, closed connection: the store
      cannot be used → ``backend_unavailable``.
    * I/O error: SQLite may have written part of the commit to the log before
      the error, so whether it committed is unknown → ``ambiguous``.
    """
    if isinstance(exc, sqlite3.ProgrammingError):
        return SettleKind.BACKEND_UNAVAILABLE if "closed" in str(exc) else None
    if not isinstance(exc, sqlite3.Error):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary is None:
        return _classify_message(str(exc).lower())
    return _CODE_KINDS.get(primary, SettleKind.FAILED)


def _classify_message(text: str) -> SettleKind:
    """The kind of an error raised without a result code, by its message."""
    if "locked" in text or "busy" in text:
        return SettleKind.FAILED
    if "disk i/o" in text:
        return SettleKind.AMBIGUOUS
    if "unable to open" in text or "not a database" in text or "malformed" in text:
        return SettleKind.BACKEND_UNAVAILABLE
    return SettleKind.FAILED


def is_locked(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "database is locked" (or busy): another connection
    holds the lock, and trying again may succeed."""
    return isinstance(exc, sqlite3.OperationalError) and (
        "locked" in str(exc) or "busy" in str(exc))
