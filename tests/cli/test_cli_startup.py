"""What ``rheo-flow`` loads to run one command, and that its shortcuts change nothing.

A read-only command loads the facade and the one backend its URL names: not the
other commands' modules (demo, top, torture, worker), not the runtimes, not the
other backends' drivers, not pydantic (through typer's conversions), not
Textual, Hypothesis, DuckDB or OpenTelemetry (the facade loads it with the first
append, fetch or settle). On Redis it loads redis-py and what redis-py's own import
loads (redis-py 8 loads the OpenTelemetry SDK's metrics whenever the SDK is
installed), and nothing more: not ``sqlite3``. Speed itself is measured
in ``benchmarks/scale.py`` (the ``rheo-flow streams`` rows), not here.
"""

from __future__ import annotations

import ast
import asyncio
import io
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

import rheo_flow
from rheo_flow import Rheo
from rheo_flow._cli._app import app, app_for
from rheo_flow._cli._command import Command
from rheo_flow._cli._common import NUMERIC
from rheo_flow._cli._table import rich_table

runner = CliRunner()

HEAVY = (
    "textual", "hypothesis", "duckdb", "opentelemetry.sdk", "pydantic", "typer._adapters",
    "asyncpg", "redis", "pymongo", "motor", "tenacity", "rich.live", "rich.table",
    "rich.traceback", "rheo_flow.testing", "rheo_flow.pipeline", "rheo_flow._runtime",
    "rheo_flow._cli.demo._run", "rheo_flow._cli.demo._view", "rheo_flow._cli.top._view",
    "rheo_flow._cli.worker._run", "rheo_flow._cli.worker._supervisor",
    "rheo_flow._faults._runner", "rheo_flow._faults._catalog", "rheo_flow._faults._scenario",
    "rheo_flow._backends.postgres", "rheo_flow._backends.redis", "rheo_flow._backends.mongo",
    "opentelemetry", "rheo_flow._telemetry",
)
"""Modules (and their submodules) a read-only command on SQLite does not load."""

_RUN = """
import json, sys
from rheo_flow._cli._app import main
sys.argv = ["rheo-flow", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as exit:
    code = exit.code
sys.stdout.flush()
sys.stderr.write(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def _run(*args: str) -> tuple[str, int, set[str]]:
    """``rheo-flow ARGS`` in a fresh interpreter: its output, status and loaded modules."""
    done = subprocess.run([sys.executable, "-c", _RUN, json.dumps(args)], capture_output=True,
                          text=True, timeout=120, check=True)
    report = json.loads(done.stderr.splitlines()[-1])
    return done.stdout, report["code"], set(report["modules"])


def _heavy(modules: set[str], *, but: tuple[str, ...] = ()) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".")
                                            for h in HEAVY if h not in but))


def _loaded_by(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``code``."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, timeout=60, check=True)
    return set(json.loads(done.stdout))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite store of three streams, each with a group."""
    url = f"sqlite:///{tmp_path_factory.mktemp('startup') / 'store.db'}"
    asyncio.run(_fill(url))
    return url


async def _fill(url: str) -> None:
    """Three streams (1, 2 and 3 partitions), each with a group ``g``."""
    async with Rheo(url) as rheo:
        for i in range(3):
            await rheo.create_stream(f"s{i}", partitions=i + 1)
            await rheo.create_group(f"s{i}", "g")


@pytest.mark.parametrize("args", [
    ["streams"], ["streams", "--json"], ["groups", "s1"], ["lag", "s2"], ["lag", "s2", "g"],
    ["dead-letters", "s1", "g"], ["tail", "s0"],
])
def test_a_read_only_command_loads_only_what_it_needs(store: str, args: list[str]) -> None:
    _, code, modules = _run(*args, "--url", store)
    assert code in (0, None)
    assert "rheo_flow._backends.sqlite" in modules  # the command did run
    assert _heavy(modules) == []


@pytest.fixture(scope="module")
def redis_store(redis_url: str) -> Iterator[str]:
    """A Redis store (a prefix of its own) of three streams, each with a group."""
    from rheo_flow.backends import RedisBackend

    prefix = f"startup_{uuid.uuid4().hex[:8]}"
    url = f"{redis_url}{'&' if '?' in redis_url else '?'}prefix={prefix}"

    async def drop() -> None:
        backend = RedisBackend.from_url(url)
        try:
            await backend.drop_all()
        finally:
            await backend.close()

    asyncio.run(_fill(url))
    yield url
    asyncio.run(drop())


@pytest.mark.parametrize("args", [["streams"], ["streams", "--json"], ["groups", "s1"]])
def test_a_read_only_command_on_redis_loads_only_redis_py_beyond_what_it_needs(
        redis_store: str, args: list[str]) -> None:
    out, code, modules = _run(*args, "--url", redis_store)
    assert code in (0, None)
    assert "s1" in out
    assert "rheo_flow._backends.redis" in modules  # the command did run
    driver = _loaded_by("import redis.asyncio")
    assert _heavy(modules - driver, but=("redis", "rheo_flow._backends.redis")) == []
    assert "sqlite3" not in modules


def test_the_entry_point_runs_the_command_with_the_collector_on() -> None:
    # It loads the app with the cyclic collector paused and freezes what that built.
    code = ("import gc, sys\nfrom rheo_flow.__main__ import main\n"
            "sys.argv = ['rheo-flow', '--version']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(gc.isenabled(), gc.get_freeze_count() > 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.splitlines() == [f"rheo-flow {rheo_flow.__version__}", "True True"]


def test_streams_prints_the_table_rich_would(store: str) -> None:
    out, _, _ = _run("streams", "--url", store)
    rows = [[f"s{i}", str(i + 1), "0", "0", "-", "g"] for i in range(3)]
    console = Console(file=io.StringIO(), highlight=False, soft_wrap=True, width=100_000)
    console.print(rich_table(store, ("stream", "partitions", "events", "retained", "retention",
                                     "groups"),
                             NUMERIC, rows))
    assert out == console.file.getvalue()  # type: ignore[attr-defined]


def test_help_loads_no_command_module() -> None:
    out, code, modules = _run("--help")
    assert code == 0
    assert "streams" in out
    assert _heavy(modules) == []


def test_importing_the_package_loads_nothing_else() -> None:
    code = "import sys, rheo_flow; print(sorted(m for m in sys.modules if 'rheo_flow' in m))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.strip() == "['rheo_flow', 'rheo_flow._version']"


def test_every_exported_name_loads_from_the_module_the_type_checker_sees() -> None:
    # The names under TYPE_CHECKING in rheo_flow/__init__.py and the table the
    # package loads them from at run time say the same.
    tree = ast.parse(Path(rheo_flow.__file__).read_text())
    typed = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom)
                typed.update({alias.name: "." * imp.level + (imp.module or "")
                              for alias in imp.names})
    assert typed == rheo_flow._HOMES
    assert set(typed) | {"__version__"} == set(rheo_flow.__all__)
    for name in rheo_flow.__all__:
        assert getattr(rheo_flow, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = rheo_flow.Nope  # type: ignore[attr-defined]


_COMMANDS = ["streams", "groups", "lag", "dead-letters", "tail", "append", "trim",
             "delete-group", "migrate", "demo", "worker", "torture", "top"]
_ARGS = [["--help"], [], ["--no-such-option"], ["a", "b", "c", "d"]]


# Every command with every argument list, but `demo` with none (that runs the demo).
@pytest.mark.parametrize(("name", "args"), [
    (name, args) for name in _COMMANDS for args in _ARGS if args or name != "demo"])
def test_the_app_of_one_command_answers_as_the_whole_app(name: str, args: list[str]) -> None:
    whole = runner.invoke(app, [name, *args], env={"RHEO_URL": ""})
    alone = runner.invoke(app_for([name]), [name, *args], env={"RHEO_URL": ""})
    assert (alone.exit_code, alone.output) == (whole.exit_code, whole.output)


def test_the_whole_app_runs_for_anything_but_a_command() -> None:
    for first in ([], ["--help"], ["--version"], ["stream"], ["Streams"]):
        assert app_for(first) is app
    assert app_for(["streams"]) is not app


_checked = typer.Typer(add_completion=False)


def _show(count: int = typer.Option(3, min=1, max=10), ratio: float = typer.Option(
        0.5, min=0.1, max=2.0), name: str = "x", maybe: int | None = None,
          clamped: int = typer.Option(5, min=1, max=9, clamp=True)) -> None:
    typer.echo(repr((count, ratio, name, maybe, clamped)))


_checked.command("plain", cls=Command)(_show)
_checked.command("typer")(_show)


@pytest.mark.parametrize("args", [
    [], ["--count", "7"], ["--count", "007"], ["--count", "0"], ["--count", "11"],
    ["--count", "+5"], ["--count", " 5"], ["--count", "1_0"], ["--count", "5.0"],
    ["--count", "x"], ["--count", "99999999999999999999999"], ["--ratio", "2"],
    ["--ratio", "1.25"], ["--ratio", "0.05"], ["--ratio", "1e-1"], ["--ratio", "inf"],
    ["--ratio", "nan"], ["--ratio", ".5"], ["--name", ""], ["--name", "ünï [x]"],
    ["--maybe", "4"], ["--maybe", "-4"], ["--clamped", "12"], ["--clamped", "3"],
])
def test_plain_conversions_answer_as_typers_own(args: list[str]) -> None:
    ours = runner.invoke(_checked, ["plain", *args])
    theirs = runner.invoke(_checked, ["typer", *args])
    assert ours.exit_code == theirs.exit_code
    assert ours.output == theirs.output.replace("typer", "plain")
