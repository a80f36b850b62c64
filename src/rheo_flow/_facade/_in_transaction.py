"""``connection=`` on :class:`~rheo_flow.Rheo`'s ``append`` and ``ack``: writing in the
application's own transaction (docs/outbox.md), on a backend declaring
``capabilities.in_transaction``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .._backend import Backend
from .._model._errors import InvalidArgument
from .._model._lease import Lease
from .._model._settle_results import SettleResult

__all__ = ["ack_in_transaction", "check_in_transaction"]

SettleCall = Callable[[str, list[Lease], Callable[[], Awaitable[list[SettleResult]]]],
                      Awaitable[list[SettleResult]]]
"""The facade's settle call: the operation, the leases, the backend call to classify."""


def check_in_transaction(backend: Backend, operation: str) -> None:
    """Refuse ``connection=`` on a backend that cannot write in a caller's transaction."""
    if not backend.capabilities.in_transaction:
        raise InvalidArgument(
            f"{operation}(connection=...) needs a backend that writes in the "
            f"application's transaction; backend {backend.name!r} does not "
            f"(capabilities.in_transaction is false)")


async def ack_in_transaction(backend: Backend, settle_call: SettleCall, leases: list[Lease],
                             connection: Any) -> list[SettleResult]:
    """Ack ``leases`` on ``connection``: results classified as every ack's, except that a
    connection the backend refuses raises its :class:`InvalidArgument` (a mistake of the
    call, not an outcome of the leases)."""
    check_in_transaction(backend, "ack")
    refused: list[InvalidArgument] = []

    async def call() -> list[SettleResult]:
        try:
            return await backend.ack_in_transaction(connection, leases)
        except InvalidArgument as exc:
            refused.append(exc)
            raise

    results = await settle_call("ack", leases, call)
    if refused:
        raise refused[0]
    return results
