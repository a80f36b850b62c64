"""What a PyMongo (or Motor) error means: retry it, report it as which settle kind.

Motor raises PyMongo's exception classes, so one classification serves both.
"""

from __future__ import annotations

from typing import Final

from pymongo import errors as mongo_errors

from ..._model._settle_results import SettleKind

__all__ = [
    "AUTH_CODES",
    "CHANGE_STREAMS_UNSUPPORTED",
    "DUPLICATE_KEY",
    "classify",
    "is_duplicate",
    "is_transient",
]

NOT_PRIMARY_CODES: Final = frozenset({10107, 13435, 13436, 189, 91})
"""Server error codes meaning "this node refused the operation before applying it"."""
INTERRUPTED_CODES: Final = frozenset({11600, 11602})
"""Interrupted while running: part of a multi-document write may have been applied."""
AUTH_CODES: Final = frozenset({13, 18})
"""Unauthorized, authentication failed."""
DUPLICATE_KEY: Final = 11000
CHANGE_STREAMS_UNSUPPORTED: Final = frozenset({40573, 40324, 115})
"""``$changeStream`` only on replica sets / unknown stage / command not supported."""


def is_duplicate(exc: BaseException) -> bool:
    """A duplicate key error, alone or as every write error of a bulk write."""
    if isinstance(exc, mongo_errors.DuplicateKeyError):
        return True
    if isinstance(exc, mongo_errors.BulkWriteError):
        errors = exc.details.get("writeErrors", [])
        return bool(errors) and all(e.get("code") == DUPLICATE_KEY for e in errors)
    return isinstance(exc, mongo_errors.OperationFailure) and exc.code == DUPLICATE_KEY


def is_transient(exc: BaseException) -> bool:
    """An error the server labels worth running the whole transaction again for."""
    return isinstance(exc, mongo_errors.PyMongoError) and exc.has_error_label(
        "TransientTransactionError"
    )


def classify(exc: BaseException) -> SettleKind | None:
    """Map PyMongo errors (Motor raises the same) to settle kinds.

    * No server could be selected (refused, unreachable, timed out before
      sending), credentials refused, client closed, bad configuration:
      nothing was sent → ``backend_unavailable``. So is a node that refused
      a write because it is not (or no longer) the primary.
    * Network error or timeout during an operation, write concern not
      satisfied, an unknown transaction commit result, an operation
      interrupted by a shutdown or step-down: it may have been applied →
      ``ambiguous``.
    * Duplicate key and other write errors, aborted transactions, any other
      server error: nothing (more) was committed → ``failed``.

    ``None`` for an exception that is not PyMongo's.
    """
    e = mongo_errors
    if not isinstance(exc, e.PyMongoError):
        return None
    if isinstance(exc, e.ServerSelectionTimeoutError | e.ConfigurationError):
        return SettleKind.BACKEND_UNAVAILABLE
    if isinstance(exc, e.InvalidOperation):
        closed = "after close" in str(exc) or "closed" in str(exc)
        return SettleKind.BACKEND_UNAVAILABLE if closed else SettleKind.FAILED
    if exc.has_error_label("UnknownTransactionCommitResult"):
        return SettleKind.AMBIGUOUS
    if isinstance(exc, e.NotPrimaryError):
        return SettleKind.BACKEND_UNAVAILABLE
    if isinstance(exc, e.WriteConcernError | e.ExecutionTimeout | e.ConnectionFailure):
        return SettleKind.AMBIGUOUS
    if isinstance(exc, e.BulkWriteError) and exc.details.get("writeConcernErrors"):
        return SettleKind.AMBIGUOUS
    if isinstance(exc, e.OperationFailure):
        if exc.code in INTERRUPTED_CODES:
            return SettleKind.AMBIGUOUS
        if exc.code in NOT_PRIMARY_CODES or exc.code in AUTH_CODES:
            return SettleKind.BACKEND_UNAVAILABLE
    return SettleKind.FAILED
