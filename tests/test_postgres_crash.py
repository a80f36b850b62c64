"""A PostgreSQL crash right after a re-lease: the new lease survives, the old one stays fenced.

The test runs its OWN server (initdb into a temporary directory, a free loopback
port) because it kills it with SIGKILL. The binaries come from
``/usr/lib/postgresql/*/bin`` (or ``RHEO_PG_BIN``); without them the test is
skipped, except under ``CI=true``, where it fails. initdb and postgres refuse to
run as root, so as root they run as the ``postgres`` OS user.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import asyncpg
import pytest

from rheo_flow import NewEvent, Rheo, SettleKind
from rheo_flow.backends import PostgresBackend

pytestmark = pytest.mark.slow

_START_TIMEOUT_S = 60.0


def _binaries(ci: bool) -> Path:
    """The directory holding initdb and postgres, or skip (fail under CI)."""
    installed = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: [int(x) for x in Path(p).parent.name.split(".") if x.isdigit()],
        reverse=True,
    )
    candidates = [os.environ.get("RHEO_PG_BIN", ""), *installed]
    for candidate in candidates:
        if candidate and all((Path(candidate) / b).is_file() for b in ("initdb", "postgres")):
            return Path(candidate)
    _unavailable("PostgreSQL server binaries (initdb, postgres) not found in "
                 "/usr/lib/postgresql/*/bin; set RHEO_PG_BIN to their directory", ci)


def _unavailable(message: str, ci: bool) -> NoReturn:
    """Skip the test, or fail it under ``CI=true`` (where everything it needs is installed)."""
    if ci:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _Server:
    """A throwaway PostgreSQL instance that can be killed and started again."""

    def __init__(self, bindir: Path, root: Path, ci: bool) -> None:
        self.bindir = bindir
        self.data = root / "data"
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.process: subprocess.Popen[bytes] | None = None
        self.log = root / "server.log"
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                _unavailable("running as root and there is no 'postgres' OS user to run "
                             "initdb/postgres as", ci)
            runuser = shutil.which("runuser")
            if runuser is None:
                _unavailable("running as root without runuser to run initdb/postgres as "
                             "postgres", ci)
            os.chown(root, user.pw_uid, user.pw_gid)
            self.prefix = [runuser, "-u", "postgres", "--"]

    def initdb(self) -> None:
        subprocess.run(
            [*self.prefix, str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
             "-A", "trust", "--no-instructions"],
            check=True, capture_output=True, timeout=_START_TIMEOUT_S,
        )

    def start(self) -> None:
        # A wal_writer_delay of 10 s keeps an asynchronous commit's WAL in the
        # server's memory for the whole test: were any lease change committed
        # without waiting for the disk, the SIGKILL below would undo it.
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [*self.prefix, str(self.bindir / "postgres"), "-D", str(self.data),
                 "-p", str(self.port), "-c", "listen_addresses=127.0.0.1",
                 "-c", "unix_socket_directories=", "-c", "wal_writer_delay=10s",
                 "-c", "fsync=on", "-c", "max_connections=20"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )

    async def ready(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _START_TIMEOUT_S
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"postgres exited: {self.log.read_text()[-2000:]}")
            try:
                conn = await asyncpg.connect(self.url, timeout=2)
            except (TimeoutError, OSError, asyncpg.PostgresError):
                if loop.time() >= deadline:
                    raise AssertionError(
                        f"postgres did not accept connections within {_START_TIMEOUT_S} s"
                    ) from None
                await asyncio.sleep(0.1)  # polling the server against a deadline
                continue
            await conn.close()
            return

    def kill(self) -> None:
        """SIGKILL the postmaster and every process of the instance at once (a crash)."""
        process = self.process
        if process is None:
            return
        self.process = None
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        group = os.getpgid(postmaster)
        os.killpg(group, signal.SIGKILL)
        process.wait(timeout=_START_TIMEOUT_S)
        # The restart checks that no process of the old instance is left.
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            assert time.monotonic() < deadline, "the killed server's processes did not exit"
            time.sleep(0.05)  # waiting for the processes to be reaped, against a deadline

    def stop(self) -> None:
        process = self.process
        if process is None:
            return
        self.process = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)  # smart shutdown of our own instance
        try:
            process.wait(timeout=_START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture
def server(ci: bool) -> Iterator[_Server]:
    bindir = _binaries(ci)
    root = Path(tempfile.mkdtemp(prefix="rheo_pg_crash_"))
    try:
        instance = _Server(bindir, root, ci)
        instance.initdb()
        instance.start()
        try:
            yield instance
        finally:
            instance.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_a_re_lease_survives_a_crash_and_the_old_lease_stays_fenced(
        server: _Server) -> None:
    await server.ready()
    url = f"{server.url}?schema=crash&listen=false"
    rheo = Rheo(PostgresBackend.from_url(url))
    try:
        await rheo.open()
        await rheo.create_stream("s")
        await rheo.create_group("s", "g")
        await rheo.append("s", [NewEvent("t", {"n": 1})])
        [old] = await rheo.fetch("s", "g", limit=1, lease_ms=200, consumer_id="first")
        # Wait (against a deadline) for the lease to expire on the server's clock:
        # the next fetch then leases the delivery again.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while True:
            again = await rheo.fetch("s", "g", limit=1, lease_ms=60_000, consumer_id="second")
            if again:
                break
            assert loop.time() < deadline, "the lease never expired"
            await asyncio.sleep(0.05)  # the server's clock decides the expiry
        server.kill()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(rheo.close(), 10)
    [new] = again
    assert new.attempt == 2
    assert new.lease_id != old.lease_id

    server.start()
    await server.ready()
    async with Rheo(PostgresBackend.from_url(url)) as revived:
        [stale] = await revived.ack([old])
        assert not stale.ok
        assert stale.kind is SettleKind.STALE_LEASE
        [taken] = await revived.ack([new])
        assert taken.ok
        assert not taken.repeated
        assert await revived.frontier("s", "g") == {0: 1}
