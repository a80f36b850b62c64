"""``rheo-flow`` run as a user runs it (a process of its own): a mistyped store is an
error that creates nothing (``worker``, ``metrics`` and the read-only commands), a
missing stream names the command creating it, ``worker -u`` works, and a server
that cannot be reached is one short line (the driver's detail under ``--verbose``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from _pg_admin import schema_exists
from rheo_flow import NewEvent, Rheo

BRIEF = 200
"""The longest error line without ``--verbose``."""
DEADLINE_S = 60
"""How long one command may take before the test gives up on it (well past every
operation timeout: 10 s by default)."""

APP = '''
from rheo_flow import ACK, consumer


@consumer(stream="jobs", group="g", poll_ms=50)
async def jobs(event, context):
    return ACK
'''

READS = [["streams"], ["groups", "jobs"], ["lag", "jobs"], ["dead-letters", "jobs", "g"],
         ["tail", "jobs"]]
SERVICES = [["worker", "app:jobs"], ["metrics", "--port", "0", "--host", "127.0.0.1"]]


def _cli(tmp_path: Path, *args: str, deadline: float = DEADLINE_S
         ) -> subprocess.CompletedProcess[str]:
    """``python -m rheo_flow ARGS`` in ``tmp_path`` (where ``app.py`` is), ended after
    ``deadline`` seconds."""
    (tmp_path / "app.py").write_text(APP)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("RHEO_URL", None)
    return subprocess.run([sys.executable, "-m", "rheo_flow", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=deadline, check=False)


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single line a failed command printed on stderr (its stdout is empty)."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    assert len(lines[0]) < BRIEF, lines[0]
    assert lines[0].startswith("error"), lines[0]
    return lines[0]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port  # closed again: nothing listens there


@pytest.mark.parametrize("args", READS + SERVICES, ids=lambda a: a[0])
def test_a_missing_sqlite_file_is_never_created(tmp_path: Path, args: list[str]) -> None:
    db = tmp_path / "typo.db"
    line = _one_line(_cli(tmp_path, *args, "-u", f"sqlite:///{db}"))
    assert "does not exist" in line
    assert "rheo-flow migrate" in line
    assert "migrate=false" not in line  # the URL as the user typed it
    assert not db.exists()


@pytest.mark.parametrize("args", READS + SERVICES, ids=lambda a: a[0])
def test_a_mistyped_postgres_schema_is_never_created(
        tmp_path: Path, postgres_url: str, postgres_schema: str, postgres_schema_url: str,
        args: list[str]) -> None:
    line = _one_line(_cli(tmp_path, *args, "-u", postgres_schema_url))
    assert f"schema {postgres_schema!r} holds no rheo_flow tables" in line
    assert "rheo-flow migrate" in line
    assert not schema_exists(postgres_url, postgres_schema)


@pytest.fixture(params=["sqlite", "postgres"])
def migrated(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a store migrated and holding no stream."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'events.db'}"
    else:
        url = request.getfixturevalue("postgres_schema_url")
    assert _cli(tmp_path, "migrate", "-u", url).returncode == 0
    return url


def test_a_worker_of_a_missing_stream_names_the_command_creating_it(
        tmp_path: Path, migrated: str) -> None:
    line = _one_line(_cli(tmp_path, "worker", "app:jobs", "-u", migrated))
    assert line == ("error: unknown stream 'jobs' "
                    "(to create it: rheo-flow create-stream jobs)")


def test_a_worker_under_processes_exits_with_the_status_of_the_child_that_failed(
        tmp_path: Path, migrated: str) -> None:
    # The first child to fail stops the others with SIGTERM; a sibling still starting
    # dies of it (143), which says nothing of why the run ended.
    result = _cli(tmp_path, "worker", "app:jobs", "--processes", "2", "-u", migrated)
    assert result.returncode == 1, result.stderr
    assert "unknown stream 'jobs'" in result.stderr


def test_a_worker_under_processes_reports_a_missing_store_once(tmp_path: Path) -> None:
    db = tmp_path / "typo.db"
    line = _one_line(_cli(tmp_path, "worker", "app:jobs", "--processes", "2",
                          "-u", f"sqlite:///{db}"))
    assert "does not exist" in line
    assert not db.exists()


async def test_worker_takes_the_url_as_u(tmp_path: Path, migrated: str) -> None:
    async with Rheo(migrated) as rheo:
        await rheo.create_stream("jobs")
        await rheo.append("jobs", [NewEvent("job", {"n": n}) for n in range(3)])
    result = await asyncio.to_thread(_cli, tmp_path, "worker", "app:jobs", "-u", migrated,
                                     "--until-empty")
    assert result.returncode == 0, result.stderr
    async with Rheo(migrated) as rheo:
        assert await rheo.lag("jobs", "g") == {0: 0}  # the group was created and caught up


def _unreachable(kind: str, tmp_path: Path) -> tuple[str, str]:
    """A URL of ``kind`` nothing answers at, and what its error names."""
    port = _closed_port()
    if kind == "postgres":
        return f"postgresql://rheo:secret@127.0.0.1:{port}/test", "PostgreSQL"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'missing.db'}", "SQLite"
    if kind == "redis":
        return f"redis://:secret@127.0.0.1:{port}/0", "Redis"
    # A shorter server selection than the default 10 s: the message is the same.
    return (f"mongodb://rheo:secret@127.0.0.1:{port}/test?serverSelectionTimeoutMS=2000",
            "MongoDB")


@pytest.mark.parametrize("command", [["streams"], ["worker", "app:jobs"]],
                         ids=lambda a: a[0])
@pytest.mark.parametrize("kind", ["postgres", "sqlite", "redis", "mongo"])
def test_an_unreachable_store_is_one_line_and_verbose_shows_the_detail(
        tmp_path: Path, kind: str, command: list[str]) -> None:
    url, backend = _unreachable(kind, tmp_path)
    line = _one_line(_cli(tmp_path, *command, "-u", url))
    assert backend in line
    assert "127.0.0.1" in line or "missing.db" in line
    assert "secret" not in line
    verbose = _cli(tmp_path, *command, "-u", url, "--verbose")
    assert verbose.returncode == 1
    detail = verbose.stderr.strip().splitlines()
    assert len(detail) > 1, verbose.stderr  # the error's causes, in the driver's words
    assert "secret" not in verbose.stderr
    if kind == "mongo":
        assert "Topology Description" not in line
        assert "Topology Description" in verbose.stderr
    assert not (tmp_path / "missing.db").exists()


def test_rediss_against_a_plain_redis_fails_within_the_connect_timeout(
        tmp_path: Path, redis_url: str) -> None:
    from urllib.parse import urlsplit

    plain = urlsplit(redis_url)
    if plain.scheme != "redis":
        pytest.skip("the test server is not a plain redis:// one")
    # Within the operation timeout (10 s), which it used to outlast, retrying the
    # handshake: a connect over TLS is capped at TLS_CONNECT_TIMEOUT_MS, not retried.
    tls = redis_url.replace("redis://", "rediss://", 1)
    line = _one_line(_cli(tmp_path, "streams", "-u", tls, deadline=10))
    assert "Redis at rediss://" in line
    assert "TLS" in line
