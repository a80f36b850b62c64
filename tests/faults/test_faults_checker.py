"""The fault checker over hand-made histories: every finding, and clean runs.

Also the history files (a truncated last line is tolerated, intents without a
result become ambiguous) and the renderers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from rheo_flow import InvalidArgument
from rheo_flow.testing.faults import (
    AppendRecord,
    DeliveryRecord,
    FinalState,
    History,
    Recorder,
    Report,
    SettleRecord,
    check,
    read_history,
    report_dict,
    report_table,
)


def appended(*ids: str, outcome: str = "ok", first: int = 1) -> AppendRecord:
    positions = tuple((0, first + i) for i in range(len(ids))) if outcome == "ok" else ()
    return AppendRecord(tuple(ids), outcome, positions, "p0", 0)  # type: ignore[arg-type]


def delivered(event_id: str, sequence: int, attempt: int = 1, *, at: int = 100,
              worker: str = "w0") -> DeliveryRecord:
    return DeliveryRecord(event_id, 0, sequence, attempt, f"{event_id}-L{attempt}", worker, at)


def settled(event_id: str, attempt: int = 1, *, result: str | None = "ok", op: str = "ack",
            started: int | None = 200, worker: str = "w0") -> SettleRecord:
    return SettleRecord(event_id, op, f"{event_id}-L{attempt}", attempt,  # type: ignore[arg-type]
                        worker, started, result, False, None if result is None else started)


def state(frontier: int, high: int | None = None, *, dead: dict[str, int] | None = None,
          stored: dict[str, tuple[tuple[int, int], ...]] | None = None) -> FinalState:
    return FinalState({0: frontier if high is None else high}, {0: frontier}, dead or {},
                      stored)


def clean_history(n: int = 3) -> History:
    ids = [f"e{i}" for i in range(1, n + 1)]
    return History(
        appends=[appended(*ids)],
        deliveries=[delivered(i, s) for s, i in enumerate(ids, 1)],
        settles=[settled(i) for i in ids],
    )


def stored_of(n: int) -> dict[str, tuple[tuple[int, int], ...]]:
    return {f"e{i}": ((0, i),) for i in range(1, n + 1)}


def test_a_clean_run_has_no_finding() -> None:
    report = check(clean_history(), state(3, stored=stored_of(3)), scenario="s",
                   workload="group", backend="sqlite")
    assert report.ok
    assert report.complete
    assert (report.acknowledged, report.delivered, report.acked, report.lag) == (3, 3, 3, 0)
    assert report.violations == 0
    assert report.duplicated == 0


def test_an_acknowledged_event_never_acked_but_passed_by_the_frontier_is_lost() -> None:
    history = clean_history()
    history.settles = [s for s in history.settles if s.event_id != "e2"]
    report = check(history, state(3))
    assert report.lost == ("e2",)
    assert not report.ok
    assert report.unfinished == ()


def test_an_acknowledged_event_missing_from_the_stream_is_lost() -> None:
    history = clean_history()
    history.deliveries = [d for d in history.deliveries if d.event_id != "e3"]
    history.settles = [s for s in history.settles if s.event_id != "e3"]
    stored = stored_of(2)
    report = check(history, FinalState({0: 2}, {0: 2}, {}, stored))
    assert report.lost == ("e3",)


def test_an_acknowledged_event_still_pending_is_unfinished_not_lost() -> None:
    history = clean_history()
    history.settles = [s for s in history.settles if s.event_id != "e3"]
    report = check(history, state(2, high=3, stored=stored_of(3)))
    assert report.lost == ()
    assert report.unfinished == ("e3",)
    assert report.ok
    assert not report.complete
    assert report.lag == 1


def test_a_delivery_of_an_event_never_appended_is_unexpected() -> None:
    history = clean_history()
    history.deliveries.append(delivered("ghost", 4))
    report = check(history, state(3))
    assert report.unexpected == ("ghost",)
    assert not report.ok


def test_a_stored_event_never_appended_is_unexpected() -> None:
    stored = {**stored_of(3), "ghost": ((0, 4),)}
    report = check(clean_history(), state(4, stored=stored))
    assert report.unexpected == ("ghost",)


def test_an_event_whose_only_append_failed_definitely_must_not_be_delivered() -> None:
    history = clean_history()
    history.appends.append(appended("refused", outcome="failed"))
    history.deliveries.append(delivered("refused", 4))
    report = check(history, state(3))
    assert report.failed_appends == 1
    assert report.unexpected == ("refused",)


def test_a_failed_append_retried_successfully_is_not_unexpected() -> None:
    history = clean_history()
    history.appends.insert(0, appended("e1", "e2", "e3", outcome="failed"))
    report = check(history, state(3, stored=stored_of(3)))
    assert report.ok
    assert report.complete
    assert report.failed_appends == 1


def test_redeliveries_are_counted_not_violations() -> None:
    history = clean_history()
    # e1's first delivery is nacked (issued at 120), its second starts at 150 and is acked.
    history.deliveries.append(delivered("e1", 1, attempt=2, at=150))
    history.settles[0] = settled("e1", 1, op="nack", started=120)
    history.settles.append(settled("e1", 2))
    report = check(history, state(3))
    assert report.duplicated == 1
    assert report.deliveries == 4
    assert report.ok


def test_an_id_stored_twice_is_a_duplicate_append() -> None:
    stored = {**stored_of(3), "e2": ((0, 2), (0, 4))}
    report = check(clean_history(), state(4, stored=stored))
    assert report.duplicate_appends == ("e2",)
    assert not report.ok


def test_two_ok_appends_of_one_id_at_different_positions_are_a_duplicate_append() -> None:
    history = clean_history()
    history.appends.append(appended("e1", first=9))
    report = check(history, state(3))
    assert report.duplicate_appends == ("e1",)


def test_a_retried_append_returning_the_same_positions_is_fine() -> None:
    history = clean_history()
    history.appends.insert(0, appended("e1", "e2", "e3", outcome="ambiguous"))
    history.appends.append(appended("e1", "e2", "e3"))
    report = check(history, state(3, stored=stored_of(3)))
    assert report.ok
    assert report.complete
    assert report.ambiguous_appends == 1


def test_an_ok_settle_issued_after_a_newer_delivery_started_is_a_stale_settle_accepted() -> None:
    history = clean_history()
    # e1: lease 1 (w0) expires; lease 2 goes to w1 at t=300; w0's ack is issued at t=400.
    history.deliveries.append(delivered("e1", 1, attempt=2, at=300, worker="w1"))
    history.settles = [settled("e1", 1, started=400), settled("e1", 2, started=350,
                                                              worker="w1"),
                       settled("e2"), settled("e3")]
    report = check(history, state(3))
    assert len(report.stale_accepted) == 1
    stale = report.stale_accepted[0]
    assert (stale.event_id, stale.attempt, stale.newer_attempt) == ("e1", 1, 2)
    assert (stale.worker, stale.newer_worker, stale.lead_us) == ("w0", "w1", 100)
    assert not report.ok


def test_a_settle_issued_before_the_newer_delivery_started_is_not_stale() -> None:
    # The settle may have reached the backend before the event was leased again.
    history = clean_history()
    history.deliveries.append(delivered("e1", 1, attempt=2, at=300, worker="w1"))
    history.settles = [settled("e1", 1, started=250), settled("e2"), settled("e3")]
    report = check(history, state(3))
    assert report.stale_accepted == ()


def test_a_stale_settle_refused_by_the_backend_is_fencing_at_work() -> None:
    history = clean_history()
    history.deliveries.append(delivered("e1", 1, attempt=2, at=300, worker="w1"))
    history.settles = [settled("e1", 1, started=400, result="stale_lease"),
                       settled("e1", 2, started=350, worker="w1"), settled("e2"), settled("e3")]
    report = check(history, state(3))
    assert report.stale_accepted == ()
    assert report.stale_rejected == 1
    assert report.ok
    assert report.complete


def test_a_settle_of_unknown_start_is_never_called_stale() -> None:
    history = clean_history()
    history.deliveries.append(delivered("e1", 1, attempt=2, at=300, worker="w1"))
    history.settles.append(settled("e1", 1, op="nack", started=None))
    assert check(history, state(3)).stale_accepted == ()


def test_an_unanswered_ack_covered_by_the_frontier_counts_as_settled() -> None:
    history = clean_history()
    history.settles = [settled("e1"), settled("e2"), settled("e3", result=None)]
    report = check(history, state(3))
    assert report.lost == ()
    assert report.ambiguous_settles == 1
    assert report.ok
    assert report.complete


def test_an_unanswered_ack_not_covered_by_the_frontier_is_unfinished() -> None:
    history = clean_history()
    history.settles = [settled("e1"), settled("e2"), settled("e3", result=None)]
    report = check(history, state(2, high=3))
    assert report.unfinished == ("e3",)


def test_poison_events_in_the_dead_letters_are_neither_lost_nor_unexpected() -> None:
    history = clean_history()
    history.settles = [settled("e1"), settled("e3"),
                       settled("e2", op="nack", result="ok")]
    report = check(history, state(3, dead={"e2": 4}), poison=["e2"])
    assert report.lost == ()
    assert report.dead_letters == 1
    assert report.unexpected_dead_letters == ()
    assert report.ok
    assert report.complete


def test_dead_letters_of_events_that_were_not_poison_are_reported() -> None:
    history = clean_history()
    history.settles = [settled("e1"), settled("e3")]
    report = check(history, state(3, dead={"e2": 4}))
    assert report.unexpected_dead_letters == ("e2",)
    assert report.lost == ()


def test_poison_not_dead_lettered_makes_the_run_incomplete() -> None:
    history = clean_history()
    history.settles = [settled("e1"), settled("e3")]
    report = check(history, state(1, high=3), poison=["e2"])
    assert report.poison_not_dead_lettered == ("e2",)
    assert not report.complete


def test_an_ambiguous_append_that_was_stored_must_be_consumed() -> None:
    history = History(appends=[appended("m1", outcome="ambiguous")])
    report = check(history, state(0, high=1, stored={"m1": ((0, 1),)}))
    assert report.unfinished == ("m1",)
    assert report.unexpected == ()


def test_an_ambiguous_append_that_was_not_stored_is_nothing_to_consume() -> None:
    history = History(appends=[appended("m1", outcome="ambiguous")])
    report = check(history, state(0, stored={}))
    assert report.ok
    assert report.complete
    assert report.attempted == 1
    assert report.acknowledged == 0


def test_recorded_files_round_trip_and_tolerate_a_truncated_last_line(tmp_path: Path) -> None:
    producer = Recorder(tmp_path / "p0-1.jsonl", "p0")
    producer.append_intent(["a", "b"])
    producer.append_result(["a", "b"], "ok", [(0, 1), (0, 2)])
    producer.append_intent(["c"])  # killed before the answer: ambiguous
    producer.close()
    worker = Recorder(tmp_path / "w0-2.jsonl", "w0", fsync=True)
    worker.delivery("a", 0, 1, 1, "La")
    worker.settle_intent("a", "ack", "La", 1)
    worker.settle_result("a", "ack", "La", 1, "ok", False)
    worker.delivery("b", 0, 2, 1, "Lb")
    worker.settle_intent("b", "ack", "Lb", 1)  # killed before the answer
    worker.close()
    with (tmp_path / "w0-2.jsonl").open("a") as f:
        f.write('{"k":"deliver","id":"b","p"')  # the record being written at kill -9

    history = read_history(tmp_path)
    assert history.truncated == 1
    outcomes = sorted((a.ids, a.outcome, a.positions) for a in history.appends)
    assert outcomes == [(("a", "b"), "ok", ((0, 1), (0, 2))), (("c",), "ambiguous", ())]
    assert [(d.event_id, d.worker) for d in history.deliveries] == [("a", "w0"), ("b", "w0")]
    by_event = {s.event_id: s for s in history.settles}
    assert by_event["a"].result == "ok"
    assert by_event["a"].started_us is not None
    assert by_event["b"].result is None

    report = check(history, state(2, stored={"a": ((0, 1),), "b": ((0, 2),)}))
    assert report.ok
    assert report.complete
    assert report.ambiguous_settles == 1


def test_a_malformed_line_before_the_last_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "w0-1.jsonl").write_text('{"k":\n{"k":"deliver"}\n')
    with pytest.raises(InvalidArgument, match="line 1"):
        read_history(tmp_path)


def _violating() -> Report:
    history = clean_history()
    history.settles = [s for s in history.settles if s.event_id != "e2"]
    return check(history, state(3), scenario="kill-restart", workload="pipeline",
                 backend="sqlite")


def test_the_table_shows_each_run_and_its_verdict() -> None:
    clean = check(clean_history(), state(3), scenario="poison", workload="group")
    console = Console(record=True, width=250, color_system=None)
    console.print(report_table([clean, _violating()]))
    text = console.export_text()
    assert "kill-restart" in text
    assert "pipeline" in text
    rows = {line.split()[1]: line for line in text.splitlines() if line.startswith("│")}
    assert "VIOLATION" in rows["kill-restart"]
    assert rows["poison"].rstrip(" │").endswith("ok")


def test_the_json_summary_counts_findings_and_lists_examples() -> None:
    summary = report_dict(_violating())
    assert summary["lost"] == 1
    assert summary["lost_examples"] == ["e2"]
    assert summary["ok"] is False
    assert summary["violations"] == 1
    assert summary["unexpected"] == 0
    assert "unexpected_examples" not in summary
