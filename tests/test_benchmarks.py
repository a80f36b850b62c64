"""The benchmark suites import and their loops do the work they claim (never their speed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # the benchmarks package's root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import outbox as outbox_suite
from benchmarks import run as runner
from benchmarks import scaling as scaling_suite
from benchmarks import sqlite as sqlite_suite
from benchmarks import typed as typed_suite
from benchmarks._common import Result


def test_suites_are_listed_and_tools_are_not() -> None:
    names = runner.available()
    assert {"sqlite", "redis", "postgres", "outbox"} <= set(names)
    assert "profile_group" not in names
    assert callable(runner.load("sqlite"))
    with pytest.raises(SystemExit):
        runner.load("profile_group")


def test_json_line_names_its_baseline() -> None:
    compared = Result.compared("x", "b", 50.0, "events/s", 100.0, baseline_name="raw-sqlite3")
    assert compared.as_json() == {"name": "x", "backend": "b", "value": 50.0,
                                  "unit": "events/s", "baseline": 100.0, "ratio": 0.5,
                                  "baseline_name": "raw-sqlite3"}
    assert "baseline_name" not in Result("y", "b", 1.0, "ms").as_json()


async def test_sqlite_suite_contenders_finish_their_work() -> None:
    # Each contender checks its own end state (nothing left unsettled, WAL on rheo_flow's
    # file) and raises otherwise; a rate comes back only when the work was done.
    for contender in (sqlite_suite.raw_append, sqlite_suite.rheo_append,
                      sqlite_suite.raw_consume, sqlite_suite.rheo_group,
                      sqlite_suite.rheo_fetch_ack):
        assert await contender(1_500) > 0


async def test_typed_suite_contenders_handle_every_event() -> None:
    # group_rate raises unless the handler saw every event and none was invalid.
    assert runner.load("typed") is typed_suite.run
    for model in (None, typed_suite.PlacedStruct, typed_suite.PlacedModel,
                  typed_suite.PlacedData):
        assert await typed_suite.group_rate(1_500, model) > 0


async def test_outbox_suite_contenders_write_what_they_time(tmp_path: Path) -> None:
    from rheo_flow import Rheo
    from rheo_flow.backends import SQLiteBackend

    path = str(tmp_path / "outbox.db")
    app = outbox_suite.App("sqlite", path)
    async with Rheo(SQLiteBackend(path)) as rheo:
        await rheo.create_stream("orders")
        await rheo.create_stream("wide", partitions=outbox_suite.PARTITIONS)
        conns = [await app.connect() for _ in range(outbox_suite.TASKS)]
        await app.run(conns[0], f"CREATE TABLE {app.table} (id int)")
        await app.run(conns[0], f"CREATE TABLE {app.floor} (id text PRIMARY KEY, data text)")
        assert await outbox_suite.transaction_cost(rheo, app, conns[0], 10, "append") > 0
        assert await outbox_suite.transaction_cost(rheo, app, conns[0], 10, None) > 0
        assert await outbox_suite.transaction_cost(rheo, app, conns[0], 10, "insert") > 0
        assert await outbox_suite.concurrent_appends(rheo, app, conns, 3, True) > 0
        assert await outbox_suite.concurrent_appends(rheo, app, conns, 2, False) > 0
        assert conns[0].execute(f"SELECT count(*) FROM {app.table}").fetchone() == (30,)
        assert conns[0].execute(f"SELECT count(*) FROM {app.floor}").fetchone() == (10,)
        assert await rheo.high_water("orders") == {0: 10}
        assert await rheo.high_water("wide") == dict.fromkeys(range(8), 5)
        for conn in conns:
            await app.close(conn)


async def test_scaling_workers_drain_the_backlog_together(tmp_path: Path) -> None:
    # run_workers raises unless every event was acked by the worker processes and the
    # group's lag reached zero; two processes share the backlog of one SQLite file.
    run = await scaling_suite.run_workers(f"sqlite:///{tmp_path}/scaling.db", 2, 600)
    assert run.rate > 0
    assert run.worker_cpu_us > 0


def test_plot_writes_one_png_per_chart(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from benchmarks import _plot

    results = [
        *(Result.compared(f"consume+ack, {n} worker processes", backend, 100.0 * n,
                          "events/s", 100.0, baseline_name="1-process")
          for backend in ("sqlite", "redis") for n in (1, 2, 4)),
        Result("append-to-handler p50, polling", "postgres", 3.0, "ms"),
        Result("append-to-handler p99, polling", "postgres", 9.0, "ms"),
        Result.compared("append batch 1000 vs raw insert", "sqlite", 5.0, "events/s", 10.0),
    ]
    assert set(_plot.charts(results)) == {
        "consume+ack, N worker processes (events/s)",
        "append-to-handler pN, polling (ms)",
        "events/s",
    }
    written = _plot.write_charts("synthetic", results, tmp_path / "charts", command="x")
    assert len(written) == 3
    assert sorted(p.name for p in (tmp_path / "charts").iterdir()) == sorted(
        p.name for p in written)
    assert all(p.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") for p in written)


def test_plot_reads_back_json_lines(tmp_path: Path) -> None:
    from benchmarks import _plot

    saved = [Result.compared("x, 2 workers", "b", 2.0, "events/s", 1.0, baseline_name="one"),
             Result("y", "b", 1.0, "ms")]
    lines = tmp_path / "results.json"
    lines.write_text("".join(f"{json.dumps(r.as_json())}\n" for r in saved) + "done\n")
    assert _plot.from_json_lines(lines) == saved


async def test_ordering_suite_compares_key_order_with_none(tmp_path: Path) -> None:
    from benchmarks import ordering as ordering_suite

    url = f"sqlite:///{tmp_path}/ordering.db"
    run = await scaling_suite.run_workers(url, 2, 400, keys=10, ordering="key")
    assert run.rate > 0
    results = await ordering_suite._backend_results("sqlite", url, 200, 1)
    assert [r.name for r in results] == [
        f"consume+ack, 4 workers, {k} keys, ordering=key" for k in ordering_suite.KEYS]
    assert all(r.baseline_name == "ordering=none" and r.ratio is not None for r in results)
