"""The ``outbox`` torture scenario: handlers ack in the application's transaction with a
row and a derived event each (``Rheo.transaction``) while workers are killed -9; the
checker finds every effect exactly once. Real worker processes on SQLite and PostgreSQL;
the checker's effect findings over hand-made final states."""

from __future__ import annotations

from pathlib import Path

import pytest

from rheo_flow.testing.faults import (
    FinalState,
    History,
    Report,
    RunSettings,
    check,
    run_scenario,
    scenarios,
)

SETTINGS = RunSettings(events=200, workers=2, seconds=8)
BOUND_S = 40.0


def _effects_clean(report: Report) -> None:
    assert report.error is None, report
    assert report.ok, report
    assert report.complete, report
    assert report.lag == 0
    assert (report.duplicated_effects, report.missing_effects, report.orphan_effects) == (
        (), (), ())
    notes = " ".join(report.notes)
    assert "kill -9 w0" in notes, notes
    assert "kill -9 w1" in notes, notes


@pytest.mark.parametrize("workload", ["group", "pipeline"])
async def test_sqlite_outbox_effects_exactly_once_under_kills(tmp_path: Path,
                                                              workload: str) -> None:
    report = await run_scenario(f"sqlite:///{tmp_path / 'torture.db'}", scenarios()["outbox"],
                                workload, SETTINGS, bound_s=BOUND_S)  # type: ignore[arg-type]
    _effects_clean(report)
    # The scenario's poison events; an event whose every attempt died with a killed worker
    # is dead-lettered too (at max_attempts): without an effect, the checker found.
    assert report.dead_letters >= SETTINGS.events // 50


async def test_postgres_outbox_effects_exactly_once_under_kills(
        postgres_schema_url: str) -> None:
    report = await run_scenario(postgres_schema_url, scenarios()["outbox"], "group", SETTINGS,
                                bound_s=BOUND_S)
    _effects_clean(report)


def test_the_outbox_scenario_runs_on_sqlite_and_postgres_only() -> None:
    outbox = scenarios()["outbox"]
    assert outbox.applies_to("sqlite:///x.db")
    assert outbox.applies_to("postgresql://h/db")
    assert not outbox.applies_to("redis://h")
    assert outbox.tune(RunSettings()).outbox


# The checker ----------------------------------------------------------------------------


def _final(rows: dict[str, int], derived: dict[str, int], *, frontier: int = 3,
           dead: dict[str, int] | None = None) -> FinalState:
    stored = {"e1": ((0, 1),), "e2": ((0, 2),), "e3": ((0, 3),)}
    return FinalState({0: 3}, {0: frontier}, dead or {}, stored, rows, derived)


def _findings(final: FinalState) -> tuple[tuple[str, ...], ...]:
    report = check(History([], [], []), final)
    return report.duplicated_effects, report.missing_effects, report.orphan_effects


def test_one_row_and_one_derived_event_per_acked_event_is_clean() -> None:
    one = {"e1": 1, "e2": 1, "e3": 1}
    assert _findings(_final(one, one)) == ((), (), ())
    # Without the effect counts (other scenarios) nothing is checked.
    assert _findings(FinalState({0: 3}, {0: 3})) == ((), (), ())


def test_each_effect_finding_is_a_violation() -> None:
    # e1 twice (row), e2 acked without its derived event, e3 beyond the frontier with a row.
    final = _final({"e1": 2, "e2": 1, "e3": 1}, {"e1": 1, "e3": 1}, frontier=2)
    assert _findings(final) == (("e1",), ("e2",), ("e3",))
    clean = check(History([], [], []), _final({"e1": 1, "e2": 1, "e3": 1},
                                              {"e1": 1, "e2": 1, "e3": 1}))
    assert check(History([], [], []), final).violations == clean.violations + 3
    # A dead letter's effect, an effect of an event never stored.
    dead = _final({"e1": 1, "e2": 1, "e3": 1, "x": 1}, {"e1": 1, "e2": 1, "e3": 1, "x": 1},
                  dead={"e3": 4})
    assert _findings(dead) == ((), (), ("e3", "x"))
