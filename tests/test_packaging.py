"""Packaging: the package installs and imports with no extras, and names the extra it lacks.

One virtualenv per module gets a plain ``pip install`` of the project (its
core dependencies only, no driver); most checks run inside it. Two more hold
what a backend author installs: the ``testing`` extra (the conformance kit and
its pytest plugin, with no ``-p`` flag), and pytest without Hypothesis (the
plugin pytest loads at start-up must not break it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DRIVERS = ("asyncpg", "redis", "pymongo", "motor", "textual")
TEST_TOOLS = ("pytest", "_pytest", "pytest_asyncio", "hypothesis")


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload,no-any-return]


def _fresh_venv(tmp_path_factory: pytest.TempPathFactory, ci: bool, name: str,
                *requirements: str) -> Path:
    """The interpreter of a fresh virtualenv into which pip installed ``requirements``."""
    home = tmp_path_factory.mktemp(name)
    venv.EnvBuilder(with_pip=True, clear=True).create(home)
    python = home / "bin" / "python"
    install = _run([str(python), "-m", "pip", "install", "--quiet", *requirements])
    if install.returncode != 0:
        message = (f"pip could not install {' '.join(requirements)} in a fresh venv:\n"
                   f"{install.stderr[-3000:]}")
        if ci:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return python


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory, ci: bool) -> Path:
    """The interpreter of a fresh virtualenv holding the project without any extra."""
    return _fresh_venv(tmp_path_factory, ci, "bare-venv", str(ROOT))


@pytest.fixture(scope="module")
def testing_python(tmp_path_factory: pytest.TempPathFactory, ci: bool) -> Path:
    """A fresh virtualenv holding the project with the ``testing`` extra only."""
    return _fresh_venv(tmp_path_factory, ci, "testing-venv", f"{ROOT}[testing]")


@pytest.fixture(scope="module")
def pytest_only_python(tmp_path_factory: pytest.TempPathFactory, ci: bool) -> Path:
    """A fresh virtualenv holding the project and pytest, without Hypothesis."""
    return _fresh_venv(tmp_path_factory, ci, "pytest-only-venv", str(ROOT), "pytest")


def test_no_driver_is_installed(bare_python: Path) -> None:
    code = f"import importlib.util; print([m for m in {DRIVERS!r} if importlib.util.find_spec(m)])"
    out = _run([str(bare_python), "-c", code])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_every_public_module_imports_without_extras(bare_python: Path) -> None:
    # The conformance kit (rheo_flow.testing) may need the test tools, nothing else.
    code = textwrap.dedent("""
        import importlib, json, pkgutil, rheo_flow
        names = ["rheo_flow"] + [
            m.name for m in pkgutil.walk_packages(rheo_flow.__path__, "rheo_flow.",
                                                  onerror=lambda name: None)
            if not any(p.startswith("_") for p in m.name.split("."))
        ]
        imported, needs_tools = [], []
        for name in names:
            try:
                importlib.import_module(name)
            except rheo_flow.MissingExtra as exc:
                if not name.startswith("rheo_flow.testing") or exc.extra != "testing":
                    raise
                needs_tools.append(name)
            else:
                imported.append(name)
        import rheo_flow.backends as b
        for name in b.__all__:
            try:
                getattr(b, name)
            except rheo_flow.MissingExtra as exc:
                assert name in b._DRIVERS and exc.extra == b._DRIVERS[name][1], name
        print(json.dumps(imported))
    """)
    out = _run([str(bare_python), "-c", code])
    assert out.returncode == 0, out.stderr
    assert {"rheo_flow", "rheo_flow.backends"} <= set(json.loads(out.stdout))


@pytest.mark.parametrize(
    ("url", "extra", "driver"),
    [
        ("postgresql://app:s3cret@db.example/orders", "postgres", "asyncpg"),
        ("postgres://db.example/orders", "postgres", "asyncpg"),
        ("redis://:s3cret@cache.example:6379/0", "redis", "redis"),
        ("mongodb://app:s3cret@mongo.example/orders", "mongo", "pymongo"),
        ("mongodb+srv://cluster.example/orders", "mongo", "pymongo"),
    ],
)
def test_missing_extra_is_named(bare_python: Path, url: str, extra: str, driver: str) -> None:
    code = textwrap.dedent(f"""
        import json, sys, rheo_flow
        try:
            rheo_flow.Rheo({url!r})
        except rheo_flow.MissingExtra as exc:
            print(json.dumps({{"message": str(exc), "extra": exc.extra, "module": exc.module,
                              "import_error": isinstance(exc, ImportError)}}))
        else:
            sys.exit("no MissingExtra")
    """)
    out = _run([str(bare_python), "-c", code])
    assert out.returncode == 0, out.stderr + out.stdout
    report = json.loads(out.stdout)
    assert report["extra"] == extra
    assert report["module"] == driver
    assert report["import_error"]
    assert f"rheo-flow[{extra}]" in report["message"]
    assert "s3cret" not in report["message"]


def test_cli_and_sqlite_demo_work_without_extras(bare_python: Path) -> None:
    script = bare_python.parent / "rheo-flow"
    help_out = _run([str(script), "--help"])
    assert help_out.returncode == 0, help_out.stderr
    assert "demo" in help_out.stdout
    demo = _run([str(script), "demo", "--events", "60", "--partitions", "2", "--rate", "0",
                 "--quiet"], env={**os.environ, "COLUMNS": "120"})
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "✓ billing: all 60 events settled" in demo.stdout


def test_top_without_the_tui_extra_names_it(bare_python: Path, tmp_path: Path) -> None:
    script = bare_python.parent / "rheo-flow"
    out = _run([str(script), "top", "orders", "--url", "sqlite:///t.db"], cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "pip install 'rheo-flow[tui]'" in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_torture_on_sqlite_works_without_extras(bare_python: Path, tmp_path: Path) -> None:
    # The fault suite lives outside rheo_flow.testing, which needs the test tools.
    script = bare_python.parent / "rheo-flow"
    out = _run([str(script), "torture", "sqlite:///t.db", "--scenario", "kill-restart",
                "--workload", "group", "--events", "100", "--seconds", "40", "--json"],
               cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] is True
    assert report["acknowledged"] == 100


def test_importing_rheo_flow_imports_no_driver() -> None:
    # A fresh interpreter of the development venv, where every driver is installed.
    code = textwrap.dedent(f"""
        import sys, tempfile, asyncio
        import rheo_flow, rheo_flow.backends
        from rheo_flow import Rheo

        async def use():
            async with Rheo("memory://") as r:
                await r.create_stream("s")
            with tempfile.TemporaryDirectory() as tmp:
                async with Rheo(f"sqlite:///{{tmp}}/x.db") as r:
                    await r.create_stream("s")

        asyncio.run(use())
        print(sorted(m for m in sys.modules if m.split(".")[0] in {DRIVERS!r}))
    """)
    out = _run([sys.executable, "-c", code])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# A plugin run in a fresh venv sees pytest's defaults, whatever the outer run was told.
PYTEST_ENV = {k: v for k, v in os.environ.items()
              if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")}

THIRD_PARTY_TEST = """
import pytest
from rheo_flow.testing import BackendConformance, BackendHarness, memory_harness


class TestThirdPartyBackend(BackendConformance):
    @pytest.fixture
    def rheo_harness(self) -> BackendHarness:
        return memory_harness()
"""


def test_testing_extra_runs_the_kit_and_writes_the_matrix_without_p(
        testing_python: Path, tmp_path: Path) -> None:
    pytest_script = str(testing_python.parent / "pytest")
    found = _run([str(testing_python), "-m", "pip", "list", "--format=json"])
    assert found.returncode == 0, found.stderr
    installed = {p["name"].lower() for p in json.loads(found.stdout)}
    # Just what the kit needs: no asyncio plugin, linters or type checker.
    assert {"pytest", "hypothesis"} <= installed
    assert not installed & {"pytest-asyncio", "mypy", "ruff", "opentelemetry-sdk"}

    help_out = _run([pytest_script, "--help"], cwd=tmp_path, env=PYTEST_ENV)
    assert help_out.returncode == 0, help_out.stderr
    assert "--rheo-matrix=PATH" in help_out.stdout

    (tmp_path / "test_my_backend.py").write_text(THIRD_PARTY_TEST)
    quiet = ["-q", "-p", "no:cacheprovider", "test_my_backend.py"]
    plain = _run([pytest_script, *quiet], cwd=tmp_path, env=PYTEST_ENV)
    assert plain.returncode == 0, plain.stdout[-3000:] + plain.stderr
    assert not list(tmp_path.glob("*.md"))  # nothing is written unless asked

    run = _run([pytest_script, *quiet, "--rheo-matrix=out.md"], cwd=tmp_path, env=PYTEST_ENV)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    matrix = (tmp_path / "out.md").read_text()
    header = next(line for line in matrix.splitlines() if line.startswith("| case "))
    assert header.endswith("| memory |")
    assert "| `routing_golden_values` |" in matrix
    assert "| `stateful_model` |" in matrix

    # The old command line, -p rheo_flow.testing.plugin, still works beside the entry point.
    old = _run([pytest_script, *quiet, "-p", "rheo_flow.testing.plugin", "--rheo-matrix=old.md"],
               cwd=tmp_path, env=PYTEST_ENV)
    assert old.returncode == 0, old.stdout[-3000:] + old.stderr
    assert (tmp_path / "old.md").read_text() == matrix


def test_pytest_without_hypothesis_starts_and_names_the_testing_extra(
        pytest_only_python: Path, tmp_path: Path) -> None:
    pytest_script = str(pytest_only_python.parent / "pytest")
    (tmp_path / "test_plugin_loaded.py").write_text(textwrap.dedent("""
        import sys

        def test_plugin_is_loaded_and_light(request):
            assert request.config.pluginmanager.has_plugin("rheo_flow")
            assert "hypothesis" not in sys.modules
            assert "rheo_flow.testing" not in sys.modules
    """))
    run = _run([pytest_script, "-q", "-p", "no:cacheprovider", "test_plugin_loaded.py"],
               cwd=tmp_path, env=PYTEST_ENV)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout

    # Asking for the matrix there is a usage error that names the extra, not a traceback.
    matrix = _run([pytest_script, "-q", "-p", "no:cacheprovider", "--rheo-matrix=out.md",
                   "test_plugin_loaded.py"], cwd=tmp_path, env=PYTEST_ENV)
    assert matrix.returncode == 4, matrix.stdout + matrix.stderr
    assert "pip install 'rheo-flow[testing]'" in matrix.stderr
    assert not (tmp_path / "out.md").exists()

    code = textwrap.dedent("""
        import json, rheo_flow
        try:
            import rheo_flow.testing
        except rheo_flow.MissingExtra as exc:
            print(json.dumps({"message": str(exc), "extra": exc.extra, "module": exc.module}))
    """)
    out = _run([str(pytest_only_python), "-c", code])
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["extra"] == "testing"
    assert report["module"] == "hypothesis"
    assert "pip install 'rheo-flow[testing]'" in report["message"]


def test_wheel_declares_the_pytest_plugin_and_the_testing_extra(tmp_path: Path) -> None:
    build = _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                  "--wheel-dir", str(tmp_path), str(ROOT)])
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = tmp_path.glob("rheo_flow-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        entry_points = zf.read(f"{info}/entry_points.txt").decode()
        metadata = zf.read(f"{info}/METADATA").decode()
        assert "rheo_flow/_pytest_plugin.py" in zf.namelist()
    assert "[pytest11]\nrheo_flow = rheo_flow._pytest_plugin" in entry_points
    requires = [line.removeprefix("Requires-Dist: ") for line in metadata.splitlines()
                if line.startswith("Requires-Dist: ")]
    assert "Provides-Extra: testing" in metadata.splitlines()
    testing = sorted(r.split(";")[0].strip() for r in requires if "extra == 'testing'" in r)
    assert [r.split(">=")[0] for r in testing] == ["hypothesis", "pytest"]
    assert all(">=" in r for r in testing)
    # The repository's own test extra builds on it (hatchling writes it out expanded).
    test = {r.split(";")[0].strip() for r in requires if "extra == 'test'" in r}
    assert set(testing) < test
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    test_extra = declared["optional-dependencies"]["test"]
    assert "rheo-flow[testing]" in test_extra
    assert not [r for r in test_extra if r.startswith(("pytest>", "hypothesis"))]
