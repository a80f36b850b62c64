"""The pure lease rules every Python-side backend uses."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from rheo_flow import Event, Lease, SettleKind, SettleResult
from rheo_flow._backends._transitions import (
    Settled,
    advance_frontier,
    expire,
    not_leased,
    renew_delivery,
    settle_delivery,
)
from rheo_flow._model._lease import make_lease


def _lease() -> Lease:
    event = Event(id="e", stream="s", partition=0, sequence=3, type="t", key=None, data={},
                  headers={}, appended_at_ms=0)
    return make_lease("lease-1", "0-3-1", "g", "c", event, 1, 0)


def test_ack_settles_for_good() -> None:
    out = settle_delivery(_lease(), "leased", None, 1, 5, "ack", "ignored", 0, 100)
    assert out == Settled("acked", "", "ack")
    assert out.terminal


def test_reject_dead_letters_with_the_callers_reason_and_time() -> None:
    out = settle_delivery(_lease(), "leased", None, 1, 5, "reject", "bad", 0, 100)
    assert out == Settled("rejected", "bad", "reject", rejected_at_ms=100)


def test_nack_below_max_attempts_is_eligible_after_the_delay() -> None:
    out = settle_delivery(_lease(), "leased", None, 4, 5, "nack", "later", 30, 100)
    assert out == Settled("available", "later", "nack", available_at_ms=130)
    assert not out.terminal


def test_nack_of_the_last_attempt_is_a_dead_letter() -> None:
    out = settle_delivery(_lease(), "leased", None, 5, 5, "nack", "later", 30, 100)
    assert out == Settled("rejected", "max_attempts", "nack", rejected_at_ms=100)


def test_same_settle_again_is_a_repeat_and_another_is_stale() -> None:
    lease = _lease()
    repeat = settle_delivery(lease, "acked", "ack", 1, 5, "ack", "", 0, 100)
    assert isinstance(repeat, SettleResult)
    assert repeat.ok
    assert repeat.repeated
    other = settle_delivery(lease, "acked", "ack", 1, 5, "reject", "x", 0, 100)
    assert isinstance(other, SettleResult)
    assert other.kind is SettleKind.STALE_LEASE
    assert "already settled by ack" in str(other.error)


def test_renew_moves_the_deadline_and_is_never_a_repeat() -> None:
    lease = _lease()
    ok = renew_delivery(lease, "leased", None, 100, 50)
    assert ok.ok
    assert ok.deadline_ms == 150
    assert not ok.repeated
    stale = renew_delivery(lease, "acked", "ack", 100, 50)
    assert stale.kind is SettleKind.STALE_LEASE
    assert not_leased(lease, "nack", "renew").kind is SettleKind.STALE_LEASE


def test_expiry_dead_letters_only_at_max_attempts() -> None:
    assert expire(4, 5, 100) is None
    assert expire(5, 5, 100) == Settled("rejected", "max_attempts", None, rejected_at_ms=100)


@given(st.integers(0, 20), st.sets(st.integers(1, 40)))
def test_frontier_covers_exactly_the_contiguous_settled_run(
    frontier: int, settled: set[int]
) -> None:
    moved = advance_frontier(frontier, settled)
    assert moved >= frontier
    assert all(s in settled for s in range(frontier + 1, moved + 1))
    assert moved + 1 not in settled


def test_the_building_blocks_example_in_the_docs_runs() -> None:
    root = Path(__file__).resolve().parents[2]
    blocks = re.findall(r"```python\n(.*?)```", (root / "docs/conformance.md").read_text(), re.S)
    [example] = [b for b in blocks if "advance_frontier" in b]
    exec(compile(example, "docs/conformance.md", "exec"), {})
