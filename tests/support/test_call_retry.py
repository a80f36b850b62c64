"""The one retry loop of backends and sinks."""

from __future__ import annotations

import pytest

from rheo_flow._support._call_retry import retried, retried_sync, retrying, retrying_sync


class _Conflict(Exception):
    pass


async def test_retries_what_it_is_told_to_until_it_succeeds() -> None:
    calls = 0
    async for attempt in retrying(when=lambda e: isinstance(e, _Conflict), attempts=5,
                                  first_wait_s=0.0001, max_wait_s=0.0001):
        with attempt:
            calls += 1
            if calls < 3:
                raise _Conflict
    assert calls == 3


async def test_reraises_the_last_error_when_attempts_run_out() -> None:
    calls = 0

    async def run() -> None:
        nonlocal calls
        async for attempt in retrying(when=lambda e: isinstance(e, _Conflict), attempts=4,
                                      first_wait_s=0.0001, max_wait_s=0.0001):
            with attempt:
                calls += 1
                raise _Conflict

    with pytest.raises(_Conflict):
        await run()
    assert calls == 4


def test_other_errors_pass_through_at_once() -> None:
    calls = 0

    def run() -> None:
        nonlocal calls
        for attempt in retrying_sync(when=lambda e: isinstance(e, _Conflict), within_s=5):
            with attempt:
                calls += 1
                raise KeyError("x")

    with pytest.raises(KeyError):
        run()
    assert calls == 1


def test_a_retry_needs_a_bound() -> None:
    with pytest.raises(ValueError, match="needs a bound"):
        retrying(when=lambda e: True)


async def test_retried_passes_the_attempt_number_and_returns_the_result() -> None:
    seen: list[int] = []

    async def call(attempt: int) -> str:
        seen.append(attempt)
        if attempt < 3:
            raise _Conflict
        return "done"

    assert await retried(call, when=lambda e: isinstance(e, _Conflict), attempts=5,
                         first_wait_s=0.0001, max_wait_s=0.0001) == "done"
    assert seen == [1, 2, 3]


async def test_retried_keeps_the_attempt_bound_and_reraises() -> None:
    seen: list[int] = []

    async def call(attempt: int) -> None:
        seen.append(attempt)
        raise _Conflict

    with pytest.raises(_Conflict):
        await retried(call, when=lambda e: isinstance(e, _Conflict), attempts=4,
                      first_wait_s=0.0001, max_wait_s=0.0001)
    assert seen == [1, 2, 3, 4]
    seen.clear()
    with pytest.raises(_Conflict):
        await retried(call, when=lambda e: isinstance(e, _Conflict), attempts=1)
    assert seen == [1]


async def test_retried_lets_other_errors_through_at_once() -> None:
    seen: list[int] = []

    async def call(attempt: int) -> None:
        seen.append(attempt)
        raise KeyError("x")

    with pytest.raises(KeyError):
        await retried(call, when=lambda e: isinstance(e, _Conflict), within_s=5)
    assert seen == [1]
    with pytest.raises(ValueError, match="needs a bound"):
        await retried(call, when=lambda e: True)
    assert seen == [1]


def test_retried_sync_retries_within_its_bounds_and_lets_other_errors_through() -> None:
    seen: list[int] = []

    def call(attempt: int) -> str:
        seen.append(attempt)
        if attempt < 3:
            raise _Conflict
        return "done"

    assert retried_sync(call, when=lambda e: isinstance(e, _Conflict), within_s=5,
                        first_wait_s=0.0001, max_wait_s=0.0001) == "done"
    assert seen == [1, 2, 3]

    def conflict(attempt: int) -> None:
        seen.append(attempt)
        raise _Conflict

    seen.clear()
    with pytest.raises(_Conflict):
        retried_sync(conflict, when=lambda e: isinstance(e, _Conflict), attempts=3,
                     first_wait_s=0.0001, max_wait_s=0.0001)
    assert seen == [1, 2, 3]

    def other(attempt: int) -> None:
        seen.append(attempt)
        raise KeyError("x")

    seen.clear()
    with pytest.raises(KeyError):
        retried_sync(other, when=lambda e: isinstance(e, _Conflict), within_s=5)
    assert seen == [1]
    with pytest.raises(ValueError, match="needs a bound"):
        retried_sync(other, when=lambda e: True)
    assert seen == [1]
