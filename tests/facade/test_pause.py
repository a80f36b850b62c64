"""Pausing and resuming through the facade: the checks of ``until`` and of names, and the
default of a backend that does not pause (the conformance kit checks every backend)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from rheo_flow import GroupInfo, InvalidArgument, Rheo, Unsupported
from rheo_flow._backend import Backend
from rheo_flow.backends import MemoryBackend


class _NoPause(MemoryBackend):
    """A backend that inherits Backend's pause_group and resume_group, as a third-party
    one written before them does."""

    pause_group = Backend.pause_group  # type: ignore[assignment]
    resume_group = Backend.resume_group  # type: ignore[assignment]


async def test_a_backend_without_pause_raises_unsupported() -> None:
    async with Rheo(_NoPause()) as rheo:
        await rheo.create_stream("s")
        await rheo.create_group("s", "g")
        with pytest.raises(Unsupported, match=r"does not support pause_group\(\)"):
            await rheo.pause_group("s", "g")
        with pytest.raises(Unsupported, match=r"does not support resume_group\(\)"):
            await rheo.resume_group("s", "g")


@pytest.mark.parametrize(("until", "message"), [
    (datetime(2099, 1, 1), "aware datetime"),
    (datetime.now(UTC) - timedelta(seconds=1), "in the future"),
    ("2099-01-01T00:00:00Z", "datetime or None, got str"),
    (4_102_444_800_000, "datetime or None, got int"),
])
async def test_until_must_be_an_aware_datetime_in_the_future(until: Any, message: str) -> None:
    async with Rheo("memory://") as rheo:
        await rheo.create_stream("s")
        await rheo.create_group("s", "g")
        with pytest.raises(InvalidArgument, match=message):
            await rheo.pause_group("s", "g", until=until)
        assert not (await rheo.group_info("s", "g")).paused


async def test_until_in_any_time_zone_is_the_same_instant() -> None:
    async with Rheo("memory://") as rheo:
        await rheo.create_stream("s")
        await rheo.create_group("s", "g")
        end = datetime(2099, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
        info = await rheo.pause_group("s", "g", until=end)
        assert (info.paused, info.paused_until_ms) == (True, int(end.timestamp() * 1000))
        assert info.paused_until_ms == int(datetime(2099, 1, 1, 10, tzinfo=UTC).timestamp()
                                           * 1000)


async def test_names_are_checked_first() -> None:
    async with Rheo("memory://") as rheo:
        with pytest.raises(InvalidArgument, match="stream"):
            await rheo.pause_group("bad name", "g")
        with pytest.raises(InvalidArgument, match="group"):
            await rheo.resume_group("s", "")


def test_group_info_keeps_its_positional_fields() -> None:
    info = GroupInfo("s", "g", 3, 1_700_000_000_000, "key")
    assert (info.paused, info.paused_until_ms) == (False, None)
    assert GroupInfo("s", "g", 3, 0) == GroupInfo("s", "g", 3, 0, "none", False, None)
