"""The benchmark suites import and their loops do the work they claim (never their speed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # the benchmarks package's root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import metrics as metrics_suite
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
                      sqlite_suite.rheo_fetch_ack, sqlite_suite.rheo_backend_loop):
        assert await contender(1_500) > 0


async def test_backend_loop_acks_every_event_once(tmp_path: Path) -> None:
    from benchmarks._common import backend_loop_rate

    from rheo_flow import NewEvent, Rheo

    async with Rheo(f"sqlite:///{tmp_path}/loop.db") as rheo:
        await rheo.create_stream("s", partitions=3)
        await rheo.append("s", [NewEvent("t", {"n": i}) for i in range(250)])
        assert await backend_loop_rate(rheo, "s", "g", 250, limit=40) > 0
        assert await rheo.lag("s", "g") == {0: 0, 1: 0, 2: 0}
        assert sum((await rheo.frontier("s", "g")).values()) == 250
        # Asked for more than the stream holds (a new group reads all 255), the loop
        # stops instead of spinning.
        await rheo.append("s", [NewEvent("t", {"n": i}) for i in range(5)])
        with pytest.raises(RuntimeError, match="found nothing more after 255 acks"):
            await backend_loop_rate(rheo, "s", "g2", 260, limit=40)


async def test_metrics_suite_reports_and_consumes_while_scraping(tmp_path: Path) -> None:
    # report_times raises unless Rheo.lag_report and the composed default agree on a
    # store of every group kind; consume_rate raises unless the group settled everything.
    from rheo_flow import Rheo

    url = f"sqlite:///{tmp_path}/metrics.db"
    async with Rheo(url) as rheo:
        await metrics_suite.build(rheo, 3, 2)
        report, composed = await metrics_suite.report_times(rheo, 1, 1)
        assert report > 0
        assert composed > 0
        assert len((await rheo.lag_report()).groups) == 3 * len(metrics_suite.GROUPS)
        async with metrics_suite._exporter(url) as scrape:  # raises unless the store answers
            page = await scrape()
        assert page.count(b"\nrheo_store_lag{") == 3 * len(metrics_suite.GROUPS) * 8
        rate, scrapes = await metrics_suite.consume_rate(rheo, url, 300, True)
        assert rate > 0
        assert scrapes >= 1
        assert len(await rheo.backend.list_streams()) == 3  # the consumed stream is gone


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
        await app.create_tables(conns[0])
        assert await outbox_suite.transaction_cost(rheo, app, conns[0], 10, "append") > 0
        assert await outbox_suite.transaction_cost(rheo, app, conns[0], 10, None) > 0
        assert await outbox_suite.transaction_cost(rheo, app, conns[0], 10, "insert") > 0
        assert await outbox_suite.transaction_cost(rheo, app, conns[0], 10, "writes") > 0
        assert await outbox_suite.concurrent_appends(rheo, app, conns, 3, True) > 0
        assert await outbox_suite.concurrent_appends(rheo, app, conns, 2, False) > 0
        assert conns[0].execute(f"SELECT count(*) FROM {app.table}").fetchone() == (40,)
        assert conns[0].execute(f"SELECT count(*) FROM {app.floor}").fetchone() == (10,)
        # The writes by hand: ten events under gapless sequences, the high water moved.
        assert conns[0].execute(f"SELECT min(seq), max(seq), count(*) FROM {app.floor}_events"
                                ).fetchone() == (1, 10, 10)
        assert conns[0].execute(f"SELECT high_water FROM {app.floor}_partitions"
                                ).fetchone() == (10,)
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


def test_plot_keeps_values_orders_of_magnitude_apart_readable(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.image
    from benchmarks import _plot

    cpu = [Result("CPU per event, 1 worker: the worker", backend, value, "us")
           for backend, value in (("sqlite", 18.0), ("redis", 10.1), ("mongo", 7901.1))]
    chart = _plot._Chart(cpu)
    assert chart.unit == "µs"
    assert chart.spread > _plot.SPREAD  # drawn on a logarithmic axis
    written = _plot.write_charts("scaling", cpu, tmp_path, command="x")
    assert [p.name for p in written] == ["scaling-us.png"]
    height, width, _ = matplotlib.image.imread(written[0]).shape
    assert width <= 100 * _plot.WIDTH_IN
    assert height < width


def test_doc_charts_come_from_stored_results(tmp_path: Path) -> None:
    """The charts of docs/img/benchmarks are regenerated from the JSON lines kept in
    benchmarks/results/ (no benchmark run), at a width the docs show legibly."""
    pytest.importorskip("matplotlib")
    import matplotlib.image
    from benchmarks import _plot

    root = Path(__file__).resolve().parents[1]
    docs = root / "docs/img/benchmarks"
    for suite, stored in (("scaling", "scaling-2026-12-02.jsonl"),
                          ("sqlite", "sqlite-quick-2026-12-07.jsonl"),
                          ("pipeline", "pipeline-quick-2026-12-07.jsonl")):
        results = _plot.from_json_lines(root / "benchmarks/results" / stored)
        written = _plot.write_charts(suite, results, tmp_path / suite, command="x")
        assert written
        assert {p.name for p in written} <= {p.name for p in docs.iterdir()}
        for path in written:
            width = matplotlib.image.imread(docs / path.name).shape[1]
            assert width <= 100 * _plot.WIDTH_IN, path.name
