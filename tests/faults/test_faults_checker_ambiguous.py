"""The checker on an ack whose answer was lost: committed or not, it is no lost event.

A dropped connection (or a swallowed answer) makes the runtime record the ack's
result as ``ambiguous`` (the library's contract: it may have committed). When
the group's final frontier covers the event, the ack took effect: the event was
settled, not lost.
"""

from __future__ import annotations

from rheo_flow._faults._checker import FinalState, check
from rheo_flow._faults._history import AppendRecord, DeliveryRecord, History, SettleRecord


def _history(ack_result: str | None) -> History:
    return History(
        appends=[AppendRecord(("e1",), "ok", ((0, 1),), "p0", 1)],
        deliveries=[DeliveryRecord("e1", 0, 1, 1, "L1", "w0", 10)],
        settles=[SettleRecord("e1", "ack", "L1", 1, "w0", 20, ack_result)],
    )


def test_an_ambiguous_ack_covered_by_the_frontier_is_settled() -> None:
    report = check(_history("ambiguous"), FinalState({0: 1}, {0: 1}, {}, {"e1": ((0, 1),)}))
    assert report.lost == ()
    assert report.ok


def test_an_ambiguous_ack_not_covered_is_unfinished_not_lost() -> None:
    report = check(_history("ambiguous"), FinalState({0: 1}, {0: 0}, {}, {"e1": ((0, 1),)}))
    assert report.lost == ()
    assert report.ok
    assert not report.complete


def test_a_definitely_failed_ack_covered_by_the_frontier_is_lost() -> None:
    # "failed": nothing was committed, so a frontier past the event skipped it.
    report = check(_history("failed"), FinalState({0: 1}, {0: 1}, {}, {"e1": ((0, 1),)}))
    assert len(report.lost) == 1
