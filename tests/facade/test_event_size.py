"""The bound on an event's size: configured on the instance or in its URL, checked in
UTF-8 bytes before anything is written, within the backend's own ceiling."""

from __future__ import annotations

import pytest

from rheo_flow import InvalidArgument, NewEvent, Rheo
from rheo_flow._backends._urls import split_url_option
from rheo_flow.backends import MemoryBackend


class SmallStore(MemoryBackend):
    """A backend whose engine stores no event over 2,000 bytes."""

    max_event_bytes_ceiling = 2_000


def test_the_default_is_one_mebibyte_or_the_backend_s_ceiling() -> None:
    assert Rheo("memory://").max_event_bytes == 1_048_576
    assert Rheo(SmallStore()).max_event_bytes == 2_000


def test_a_url_sets_it_and_the_backend_never_sees_the_option() -> None:
    assert Rheo("memory://?max_event_bytes=5000").max_event_bytes == 5000
    assert Rheo("memory://?max_event_bytes=5000", max_event_bytes=7000).max_event_bytes == 7000
    assert split_url_option("sqlite:///e.db?synchronous=full&max_event_bytes=9&x=1",
                            "max_event_bytes") == ("sqlite:///e.db?synchronous=full&x=1", "9")
    assert split_url_option("sqlite:///e.db?max_event_bytes=9", "max_event_bytes") == (
        "sqlite:///e.db", "9")
    assert split_url_option("sqlite:///e.db", "max_event_bytes") == ("sqlite:///e.db", None)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "12kb", 64 * 1_048_576 + 1])
def test_bad_bounds_are_refused_naming_the_option(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="max_event_bytes must be an integer"):
        Rheo("memory://", max_event_bytes=bad)  # type: ignore[arg-type]


def test_a_bound_over_the_backend_s_ceiling_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"from 1 to 2,000 \(this backend stores no larger"):
        Rheo(SmallStore(), max_event_bytes=2_001)


async def test_an_event_over_the_bound_names_itself_its_size_and_the_bound() -> None:
    async with Rheo("memory://", max_event_bytes=100) as rheo:
        await rheo.create_stream("s")
        with pytest.raises(InvalidArgument) as info:
            await rheo.append("s", [NewEvent("t", {}), NewEvent("t", "\u00e9" * 50, id="e")])
        assert "event 1 of the batch ('e') has 102 bytes of data" in str(info.value)
        assert "limit of 100 bytes: nothing was appended" in str(info.value)
        assert (await rheo.stream_info("s")).high_water == {0: 0}
        [stored] = await rheo.append("s", [NewEvent("t", "x" * 98)])
        assert stored.data == "x" * 98
