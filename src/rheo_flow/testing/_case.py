"""Conformance cases: the registry, the environment a case runs in, and its checks."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from .._backend import Backend
from .._model._event import Event, NewEvent
from .._model._lease import Lease
from .._model._settle_results import SettleKind, SettleResult
from .._rheo import Rheo
from ._harness import AppTransaction, BackendHarness

__all__ = [
    "CASES",
    "Case",
    "CaseEnv",
    "ConformanceFailure",
    "case",
    "check",
    "check_equal",
    "check_results",
    "expect_error",
    "positions",
]

LONG_MS = 60_000
"""A lease or delay no test lets expire."""

CaseFunc = Callable[["CaseEnv"], Awaitable[None]]


class ConformanceFailure(AssertionError):
    """A backend broke a rule of the contract; the message names the rule."""


@dataclass(frozen=True, slots=True)
class Case:
    """One conformance case: an async function of a :class:`CaseEnv`."""

    name: str
    func: CaseFunc
    doc: str
    """First line of the case's docstring: the rule it checks."""
    requires: tuple[str, ...] = ()
    """Capability flags that must be true; otherwise the case is skipped, visibly."""
    needs_peer: bool = False
    """The case needs a second backend over the same store (``harness.peer``)."""
    rules: tuple[str, ...] = ()
    """The rules of docs/contract.md the case checks (``area.rule`` names)."""
    needs_apart: bool = False
    """The case needs a backend over a store apart from the case's (``harness.apart``)."""
    needs_transaction: bool = False
    """The case writes in a transaction of the application's (``harness.transaction``)."""

    def skip_reason(self, backend: Backend, harness: BackendHarness) -> str | None:
        """Why this case does not apply to ``backend``, or ``None`` when it does."""
        declared = backend.capabilities.as_dict()
        for flag in self.requires:
            if not declared.get(flag, False):
                return f"capability {flag!r} is not declared by backend {harness.name!r}"
        if self.needs_peer and harness.peer is None:
            return f"harness {harness.name!r} provides no peer (a second backend on the same store)"
        if self.needs_apart and harness.apart is None:
            return f"harness {harness.name!r} provides no store apart (harness.apart)"
        if self.needs_transaction and harness.transaction is None:
            return (f"harness {harness.name!r} opens no transaction of the application's "
                    f"(harness.transaction)")
        return None


_AREAS = ["streams", "leases", "redelivery", "batches", "ordering", "ordering_scans",
          "ordering_redrive", "progress", "reads", "retention", "deletion", "pause", "time",
          "delay", "lag", "typed", "isolation",
          "transaction"]


def _area_rank(module: str) -> int:
    area = module.rsplit("_cases_", 1)[-1]
    return _AREAS.index(area) if area in _AREAS else len(_AREAS)


CASES: list[Case] = []
"""Every registered case, in registration order (the order of the matrix)."""


def case(
    *, rules: Sequence[str] = (), requires: Sequence[str] = (), needs_peer: bool = False,
    needs_apart: bool = False, needs_transaction: bool = False,
) -> Callable[[CaseFunc], CaseFunc]:
    """Register an async function ``case_<name>(env)`` as a conformance case.

    ``rules`` names the rules of the contract (docs/contract.md, ``area.rule``)
    the case checks; every case of the kit cites at least one.
    """
    for rule in rules:
        if not isinstance(rule, str) or rule.count(".") != 1:
            raise ValueError(f"a rule is named area.rule, got {rule!r}")

    def register(func: CaseFunc) -> CaseFunc:
        name = func.__name__.removeprefix("case_")
        if any(c.name == name for c in CASES):
            raise ValueError(f"duplicate conformance case {name!r}")
        doc = (func.__doc__ or name).strip().splitlines()[0]
        rank = _area_rank(func.__module__)
        # Keep CASES grouped by area whatever order the case modules are imported in.
        index = sum(1 for c in CASES if _area_rank(c.func.__module__) <= rank)
        CASES.insert(index, Case(name, func, doc, tuple(requires), needs_peer, tuple(rules),
                                 needs_apart, needs_transaction))
        return func

    return register


class CaseEnv:
    """What a case works with: the facade over a fresh backend, time control, unique names."""

    def __init__(self, harness: BackendHarness, backend: Backend, rheo: Rheo) -> None:
        self.harness = harness
        self.backend = backend
        self.rheo = rheo
        self._counter = 0

    @property
    def short_ms(self) -> int:
        """A lease or delay that the case lets expire with :meth:`expire`."""
        return self.harness.short_ms

    @property
    def long_ms(self) -> int:
        """A lease or delay that never expires during a case."""
        return LONG_MS

    @property
    def exact_time(self) -> bool:
        """True when time only moves through :meth:`advance` (exact timing checks apply)."""
        return self.harness.exact_time

    @property
    def margin_ms(self) -> int:
        """Tolerated skew between :meth:`now` and the backend's stamps."""
        return self.harness.clock_margin_ms

    async def now(self) -> int:
        """The backend's time, epoch milliseconds."""
        return await self.harness.current_time(self.backend)

    async def advance(self, ms: int) -> None:
        """Make ``ms`` milliseconds of backend time pass."""
        await self.harness.advance_time(self.backend, ms)

    def transaction(self) -> AbstractAsyncContextManager[AppTransaction]:
        """A transaction of the application's own on the backend's database."""
        factory = self.harness.transaction
        if factory is None:
            raise RuntimeError("the harness opens no transaction (the case should skip)")
        return factory(self.backend)

    async def expire(self) -> None:
        """Let every lease or delay of :attr:`short_ms` run out."""
        await self.advance(self.short_ms + self.margin_ms + 1)

    async def expire_at_the_deadline(self, stream: str, group: str) -> None:
        """Let leases and delays of :attr:`short_ms` taken just now run out: on a
        harness with exact time, to the millisecond, after checking that a fetch of
        ``group`` one millisecond before finds nothing; elsewhere as :meth:`expire`."""
        if not self.exact_time:
            await self.expire()
            return
        await self.advance(self.short_ms - 1)
        check_equal(await self.fetch(stream, group), [], "a fetch a millisecond before the end")
        await self.advance(1)  # the deadline itself: expired

    def name(self, prefix: str = "t") -> str:
        """A name unique to this run (servers may be shared between runs)."""
        self._counter += 1
        return f"{prefix}-{uuid.uuid4().hex[:10]}-{self._counter}"

    async def stream(self, partitions: int = 1) -> str:
        """Create a stream with a unique name."""
        name = self.name("s")
        await self.rheo.create_stream(name, partitions=partitions)
        return name

    async def stream_with(self, *counts: int, partitions: int | None = None) -> str:
        """A new stream of ``partitions`` partitions (default: one per count) where
        partition ``p`` holds ``counts[p]`` events, appended one call per partition."""
        stream = await self.stream(len(counts) if partitions is None else partitions)
        for partition, count in enumerate(counts):
            if count:
                await self.append(stream, count, partition=partition)
        return stream

    async def append(
        self, stream: str, count: int, *, key: str | None = None, partition: int | None = None,
        type: str = "test.event",
    ) -> list[Event]:
        """Append ``count`` events ``{"n": i}`` in one call."""
        events = [NewEvent(type, {"n": i}) for i in range(count)]
        return await self.rheo.append(stream, events, key=key, partition=partition)

    async def fetch(
        self, stream: str, group: str, limit: int = 100, *, lease_ms: int | None = None,
        **kwargs: Any,
    ) -> list[Lease]:
        """One fetch with a long lease unless told otherwise."""
        return await self.rheo.fetch(
            stream, group, limit=limit, lease_ms=lease_ms or self.long_ms, **kwargs
        )

    async def drain(
        self, stream: str, group: str, *, limit: int = 50, max_rounds: int = 200, **kwargs: Any
    ) -> list[Lease]:
        """Fetch until a fetch returns nothing; every lease is returned (none settled)."""
        leases: list[Lease] = []
        for _ in range(max_rounds):
            batch = await self.fetch(stream, group, limit, **kwargs)
            if not batch:
                return leases
            leases.extend(batch)
        raise ConformanceFailure(f"fetch kept returning leases after {max_rounds} rounds")

    async def ack_ok(self, leases: Sequence[Lease]) -> None:
        """Ack and require every result to be a first, successful ack."""
        check_results(await self.rheo.ack(leases), leases, [None] * len(leases), "ack")

    @asynccontextmanager
    async def peer(self) -> AsyncIterator[Rheo]:
        """A second instance over the same store, as another process would open it."""
        if self.harness.peer is None:
            raise ConformanceFailure("this case needs harness.peer")
        async with self.harness.peer(self.backend) as other, Rheo(other) as rheo:
            yield rheo

    @asynccontextmanager
    async def apart(self) -> AsyncIterator[Rheo]:
        """An instance over a store apart from this case's (a stream of the same name
        there is another stream)."""
        if self.harness.apart is None:
            raise ConformanceFailure("this case needs harness.apart")
        async with self.harness.apart() as other, Rheo(other) as rheo:
            yield rheo


def check(condition: object, message: str) -> None:
    """Fail the case with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ConformanceFailure(message)


T = TypeVar("T")


def check_equal(actual: T, expected: T, what: str) -> None:
    """Fail unless ``actual == expected``; the message shows both."""
    if actual != expected:
        raise ConformanceFailure(f"{what}: expected {expected!r}, got {actual!r}")


def check_results(
    results: Sequence[SettleResult],
    leases: Sequence[Lease],
    kinds: Iterable[SettleKind | None],
    what: str,
    *,
    repeated: Iterable[bool] | None = None,
) -> None:
    """One result per lease, in order, each with the expected kind (``None``: ok)."""
    expected = list(kinds)
    check_equal(len(results), len(leases), f"{what}: number of results")
    check_equal(
        [r.lease_id for r in results], [lease.lease_id for lease in leases],
        f"{what}: results must follow the order of the leases",
    )
    for i, (result, kind) in enumerate(zip(results, expected, strict=True)):
        got = result.kind
        if got != kind:
            reason = f" ({result.error.reason})" if result.error is not None else ""
            raise ConformanceFailure(
                f"{what}: result {i} (sequence {leases[i].sequence}): expected "
                f"{'ok' if kind is None else kind.value}, got "
                f"{'ok' if got is None else got.value}{reason}"
            )
    if repeated is not None:
        for i, (result, flag) in enumerate(zip(results, repeated, strict=True)):
            check_equal(result.repeated, flag, f"{what}: result {i} repeated flag")


async def expect_error(
    error: type[BaseException], call: Awaitable[object], what: str
) -> BaseException:
    """Await ``call`` and require it to raise ``error``."""
    try:
        await call
    except error as exc:
        return exc
    except Exception as exc:
        raise ConformanceFailure(
            f"{what}: expected {error.__name__}, got {type(exc).__name__}: {exc}"
        ) from exc
    raise ConformanceFailure(f"{what}: expected {error.__name__}, nothing was raised")


def positions(items: Iterable[Lease | Event]) -> list[tuple[int, int]]:
    """``(partition, sequence)`` of leases or events, in the given order."""
    out: list[tuple[int, int]] = []
    for item in items:
        out.append((item.partition, item.sequence))
    return out


def tried(leases: Iterable[Lease]) -> list[tuple[int, int]]:
    """``(sequence, attempt)`` of each lease: which delivery, and its how-many-th try."""
    return [(lease.sequence, lease.attempt) for lease in leases]


def states(leases: Iterable[Lease]) -> list[tuple[int, int, int]]:
    """``(partition, sequence, attempt)`` of each lease, sorted: a batch's deliveries
    whatever order the partitions came in."""
    return sorted((lease.partition, lease.sequence, lease.attempt) for lease in leases)
