"""Key routing: the hash is stable across processes, runs and backends, and spreads evenly."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from rheo_flow import NewEvent, Rheo, partition_for

# Golden values: changing them would move existing keys to other partitions and
# break per-key ordering for every stored stream. They must never change.
GOLDEN: dict[str, list[int]] = {
    #             n = 1  2  3  4  8  16  64  4096
    "": [0, 0, 0, 0, 0, 0, 0, 0],
    "a": [0, 1, 0, 3, 3, 3, 3, 3651],
    "cust-0001": [0, 1, 1, 3, 7, 7, 23, 791],
    "customer-42": [0, 1, 2, 1, 5, 5, 21, 2069],
    "order:1001": [0, 1, 1, 3, 3, 11, 43, 427],
    "ü-ключ-键": [0, 0, 1, 2, 2, 2, 18, 2130],
}
COUNTS = [1, 2, 3, 4, 8, 16, 64, 4096]


@pytest.mark.parametrize(("key", "expected"), GOLDEN.items())
def test_golden_partitions(key: str, expected: list[int]) -> None:
    assert [partition_for(key, n) for n in COUNTS] == expected


def test_hash_is_standard_crc32_of_utf8() -> None:
    # 0xCBF43926 is the published CRC-32 check value of b"123456789".
    check = 0xCBF43926
    assert partition_for("123456789", check + 1) == check
    assert partition_for("123456789", 4096) == check % 4096


def test_same_partition_in_another_process() -> None:
    # Python's str hash is salted per process; the routing hash must not be.
    keys = ["cust-0001", "customer-42", "order:1001"]
    code = f"from rheo_flow import partition_for; print([partition_for(k, 7) for k in {keys!r}])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "12345"})
    assert out.stdout.strip() == str([partition_for(k, 7) for k in keys])


def test_distribution_is_roughly_even() -> None:
    partitions = 8
    counts = Counter(partition_for(f"cust-{i:06d}", partitions) for i in range(16_000))
    assert set(counts) == set(range(partitions))
    mean = 16_000 / partitions
    assert all(abs(c - mean) / mean < 0.1 for c in counts.values()), counts


@pytest.mark.parametrize("partitions", [0, -1])
def test_partition_count_must_be_positive(partitions: int) -> None:
    with pytest.raises(ValueError, match="partitions"):
        partition_for("k", partitions)


async def test_append_routes_by_key_and_keeps_key_order(rheo: Rheo) -> None:
    await rheo.create_stream("orders", partitions=4)
    events = [NewEvent("order.step", {"n": n}, key=f"cust-{n % 5}") for n in range(40)]
    stored = await rheo.append("orders", events)
    for event in stored:
        assert event.key is not None
        assert event.partition == partition_for(event.key, 4)
    for customer in {e.key for e in stored}:
        mine = [e for e in stored if e.key == customer]
        assert [e.data["n"] for e in mine] == sorted(e.data["n"] for e in mine)
        assert [e.sequence for e in mine] == sorted(e.sequence for e in mine)


async def test_explicit_partition_wins_over_key(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=4)
    key = "cust-0001"  # routes to 3 of 4
    [event] = await rheo.append("s", NewEvent("t", key=key, partition=0))
    assert event.partition == 0 != partition_for(key, 4)


async def test_events_without_key_or_partition_go_by_their_id(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=4)
    stored = await rheo.append("s", [NewEvent("t") for _ in range(200)])
    assert all(e.partition == partition_for(e.id, 4) for e in stored)
    assert {e.partition for e in stored} == {0, 1, 2, 3}  # generated ids spread
    # A retried append of the same event finds it where the first one put it.
    again = await rheo.append("s", [NewEvent("t", id=e.id) for e in stored[:20]])
    assert [(e.partition, e.sequence) for e in again] == [
        (e.partition, e.sequence) for e in stored[:20]]
    [one] = await rheo.append("s", NewEvent("t", id="order-17"))
    assert one.partition == partition_for("order-17", 4)
