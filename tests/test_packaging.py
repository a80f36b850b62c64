"""Packaging: the package installs and imports with no extras, and names the extra it lacks.

One virtualenv per session gets a plain ``pip install`` of the project (its
core dependencies only, no driver); every check then runs inside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DRIVERS = ("asyncpg", "redis", "pymongo", "motor", "textual")
TEST_TOOLS = ("pytest", "_pytest", "pytest_asyncio", "hypothesis")


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload,no-any-return]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory, ci: bool) -> Path:
    """The interpreter of a fresh virtualenv holding the project without any extra."""
    home = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=True, clear=True).create(home)
    python = home / "bin" / "python"
    install = _run([str(python), "-m", "pip", "install", "--quiet", str(ROOT)])
    if install.returncode != 0:
        message = f"pip could not install the project in a fresh venv:\n{install.stderr[-3000:]}"
        if ci:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return python


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
                if not name.startswith("rheo_flow.testing") or exc.extra != "test":
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
