"""NewEvent(deliver_at=...): what the facade accepts, and a backend without the
capability refusing it (the behaviour of a scheduled event is the kit's, cases
in rheo_flow.testing._cases_delay)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from rheo_flow import Capabilities, InvalidArgument, ManualClock, NewEvent, Rheo, Unsupported
from rheo_flow._backends.memory import MemoryBackend
from rheo_flow._model._append_records import append_records


def _record_ms(deliver_at: Any) -> int | None:
    [record] = append_records([NewEvent("t", deliver_at=deliver_at)], 1, None, None)
    return record.deliver_at_ms


def test_deliver_at_takes_aware_datetimes_and_epoch_milliseconds() -> None:
    moment = datetime(2030, 1, 2, 3, 4, 5, 678_999, tzinfo=UTC)
    assert _record_ms(moment) == 1_893_553_445_678
    assert _record_ms(moment.astimezone(timezone(timedelta(hours=-5)))) == 1_893_553_445_678
    assert _record_ms(1_893_553_445_678) == 1_893_553_445_678
    assert _record_ms(0) == 0
    assert _record_ms(None) is None
    [mapped] = append_records([{"type": "t", "deliver_at": 5}], 1, None, None)
    assert mapped.deliver_at_ms == 5


@pytest.mark.parametrize("value", [datetime(2030, 1, 1), -1, True, 1.5, "2030-01-01", 2**63])
def test_bad_deliver_at_is_refused_naming_it(value: Any) -> None:
    with pytest.raises(InvalidArgument, match="deliver_at"):
        _record_ms(value)


class _Undelayed(MemoryBackend):
    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(durable=False, distributed=False)


async def test_a_backend_without_delayed_delivery_refuses_it_and_appends_nothing() -> None:
    async with Rheo(_Undelayed()) as rheo:
        await rheo.create_stream("s")
        with pytest.raises(Unsupported, match="deliver_at"):
            await rheo.append("s", [NewEvent("t", 1), NewEvent("t", 2, deliver_at=10)])
        assert await rheo.high_water("s") == {0: 0}
        await rheo.create_group("s", "g")
        assert await rheo.scheduled("s", "g") == {0: 0}


async def test_scheduled_event_waits_on_the_injectable_clock() -> None:
    clock = ManualClock(1_000)
    async with Rheo(MemoryBackend(clock=clock)) as rheo:
        await rheo.create_stream("s")
        at = datetime.fromtimestamp(1.5, tz=UTC)  # 1,500 ms
        await rheo.append("s", [NewEvent("t", 1, deliver_at=at)])
        assert await rheo.fetch("s", "g") == []
        clock.advance(499)
        assert await rheo.fetch("s", "g") == []
        clock.advance(1)
        [lease] = await rheo.fetch("s", "g")
        assert (lease.sequence, lease.attempt) == (1, 1)


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_an_idle_consumer_is_woken_when_a_scheduled_event_is_due(
        backend: str, tmp_path: Any) -> None:
    url = "memory://" if backend == "memory" else f"sqlite:///{tmp_path / 'events.db'}"
    async with Rheo(url) as rheo:
        await rheo.create_stream("s")
        await rheo.create_group("s", "g")
        at = datetime.now(UTC) + timedelta(milliseconds=500)
        await rheo.append("s", [NewEvent("t", 1, deliver_at=at)])
        assert await rheo.fetch("s", "g") == []
        assert await rheo.wait_for_append("s", 30.0), "no wake-up when it became due"
        [lease] = await rheo.fetch("s", "g")
        assert lease.sequence == 1
