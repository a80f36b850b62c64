"""Capabilities that come with an argument are declared, and the facade trusts the declaration.

``key_ordering`` promises ``create_group``'s keyword ``ordering``, ``last_error`` the
``error`` argument of ``nack`` and ``reject``. ``Rheo`` reads the declaration (never the
signatures); the conformance case ``capabilities_declaration`` checks the promise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from rheo_flow import Capabilities, Lease, NewEvent, Rheo, SettleResult
from rheo_flow.backends import MemoryBackend
from rheo_flow.testing import BackendHarness, run_cases


class _Undeclared(MemoryBackend):
    """Does not declare ``last_error``; records the arguments beyond ``reason`` and
    ``delay_ms`` it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.passed: list[tuple[str, tuple[Any, ...]]] = []

    @property
    def capabilities(self) -> Capabilities:
        return replace(super().capabilities, last_error=False)


class _TakesErrorUndeclared(_Undeclared):
    """Its nack and reject take ``error`` all the same."""

    async def nack(self, leases: Sequence[Lease], reason: str, delay_ms: int,
                   *rest: Any) -> list[SettleResult]:
        self.passed.append(("nack", rest))
        return await super().nack(leases, reason, delay_ms, *rest)

    async def reject(self, leases: Sequence[Lease], reason: str,
                     *rest: Any) -> list[SettleResult]:
        self.passed.append(("reject", rest))
        return await super().reject(leases, reason, *rest)


class _Legacy(_Undeclared):
    """Written before ``error`` existed: its nack and reject do not take it."""

    async def nack(self, leases: Sequence[Lease], reason: str,  # type: ignore[override]
                   delay_ms: int) -> list[SettleResult]:
        self.passed.append(("nack", ()))
        return await super().nack(leases, reason, delay_ms)

    async def reject(self, leases: Sequence[Lease],  # type: ignore[override]
                     reason: str) -> list[SettleResult]:
        self.passed.append(("reject", ()))
        return await super().reject(leases, reason)


class _ErrorPromisedNotTaken(MemoryBackend):
    """Declares ``last_error`` (the memory backend's) but its nack does not take ``error``."""

    async def nack(self, leases: Sequence[Lease], reason: str,  # type: ignore[override]
                   delay_ms: int) -> list[SettleResult]:
        return await super().nack(leases, reason, delay_ms)


class _OrderingPromisedNotTaken(MemoryBackend):
    """Declares ``key_ordering`` (the memory backend's) but create_group has no ``ordering``."""

    async def create_group(self, stream: str, group: str, start: Any,  # type: ignore[override]
                           max_attempts: int | None) -> Any:
        return await super().create_group(stream, group, start, max_attempts)


@pytest.mark.parametrize("kind", [_Legacy, _TakesErrorUndeclared], ids=lambda k: k.__name__)
async def test_an_undeclared_last_error_is_never_passed_whatever_the_signature(
        kind: type[_Undeclared]) -> None:
    backend = kind()
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        await rheo.append("s", [NewEvent("t"), NewEvent("t")])
        first, second = await rheo.fetch("s", "g", limit=2)
        assert (await rheo.nack(first, "later", error="OSError: disk"))[0].ok
        assert (await rheo.reject(second, "bad", error="KeyError: 'sku'"))[0].ok
        [letter] = await rheo.dead_letters("s", "g")
    assert backend.passed == [("nack", ()), ("reject", ())]
    assert (letter.reason, letter.last_error) == ("bad", None)


async def test_a_declared_last_error_is_passed() -> None:
    async with Rheo(MemoryBackend()) as rheo:
        await rheo.create_stream("s")
        await rheo.append("s", [NewEvent("t")])
        [lease] = await rheo.fetch("s", "g")
        await rheo.reject(lease, "bad", error="KeyError: 'sku'")
        [letter] = await rheo.dead_letters("s", "g")
    assert letter.last_error == "KeyError: 'sku'"


def test_the_defaults_promise_no_argument() -> None:
    caps = Capabilities(durable=False, distributed=False)
    assert (caps.key_ordering, caps.last_error) == (False, False)


def _declaration_case(backend: type[MemoryBackend]) -> tuple[str, str]:
    harness = BackendHarness.with_manual_clock(
        backend.__name__, lambda clock: backend(clock=clock), peer=lambda b, clock: b)
    [result] = run_cases(harness, ["capabilities_declaration"])
    return result.status, result.detail


def test_the_kit_fails_a_declared_last_error_without_the_argument() -> None:
    status, detail = _declaration_case(_ErrorPromisedNotTaken)
    assert status == "fail"
    assert "nack takes 'error'" in detail


def test_the_kit_fails_a_declared_key_ordering_without_the_keyword() -> None:
    status, detail = _declaration_case(_OrderingPromisedNotTaken)
    assert status == "fail"
    assert "create_group takes 'ordering'" in detail


def test_the_kit_passes_the_memory_backends_declaration() -> None:
    assert _declaration_case(MemoryBackend) == ("pass", "")
