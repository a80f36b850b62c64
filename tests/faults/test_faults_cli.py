"""``rheo-flow torture``: a short run on SQLite, its JSON lines, and its refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from rheo_flow._cli._app import app

runner = CliRunner()


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_torture_is_a_command_with_help() -> None:
    result = runner.invoke(app, ["--help"])
    assert "torture" in result.output
    result = runner.invoke(app, ["torture", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    help_text = _plain(result.output)
    for option in ("--events", "--workers", "--seconds", "--scenario", "--json"):
        assert option in help_text
    assert "torture-<run id>-<scenario>-<workload>" in " ".join(help_text.split())


def test_torture_on_sqlite_prints_the_table_and_exits_zero(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    result = runner.invoke(app, ["torture", url, "--scenario", "kill-restart",
                                 "--scenario", "poison", "--workload", "group",
                                 "--events", "200", "--seconds", "60"])
    output = _plain(result.output)
    assert result.exit_code == 0, output
    rows = [line for line in output.splitlines() if line.startswith("│")]
    assert [row.split()[1] for row in rows] == ["kill-restart", "poison"]
    assert all(row.rstrip(" │").endswith("ok") for row in rows), output
    assert "kill -9 w0" in output


def test_torture_json_prints_one_object_per_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    result = runner.invoke(app, ["torture", url, "-s", "ambiguous-append", "-w", "pipeline",
                                 "--events", "200", "--seconds", "30", "--json"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    report = json.loads(lines[0])
    assert report["scenario"] == "ambiguous-append"
    assert report["workload"] == "pipeline"
    assert report["ok"] is True
    assert report["complete"] is True
    assert (report["lost"], report["unexpected"], report["stale_accepted"]) == (0, 0, 0)
    assert report["acknowledged"] == 200
    assert report["ambiguous_appends"] > 0


def test_torture_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    memory = runner.invoke(app, ["torture", "memory://"])
    assert memory.exit_code == 2
    assert "processes" in memory.output
    unknown = runner.invoke(app, ["torture", url, "--scenario", "nope"])
    assert unknown.exit_code == 2
    assert "unknown scenario" in unknown.output
    assert "kill-restart" in unknown.output
    short = runner.invoke(app, ["torture", url, "--seconds", "6"])
    assert short.exit_code == 2
    assert "--seconds" in short.output
    assert not (tmp_path / "t.db").exists()
