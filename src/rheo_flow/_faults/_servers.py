"""Throwaway PostgreSQL and Redis servers that a fault scenario may SIGKILL and restart.

Each server lives in its own temporary directory on a free loopback port (never
5432 or 6379, so a shared server is never touched) and is owned by this process:

* :class:`PostgresServer` — ``initdb`` then ``postgres``, from
  ``/usr/lib/postgresql/*/bin`` (the newest) or ``RHEO_PG_BIN``; as root, both
  run as the ``postgres`` OS user through ``runuser`` (they refuse to run as
  root). ``fsync`` is on and the WAL writer waits 10 s, so a commit that did not
  wait for its WAL flush would be lost by a kill.
* :class:`RedisServer` — ``redis-server`` with the append-only file on and the
  chosen ``appendfsync`` (``always``: every write is on disk before its reply;
  ``everysec``: up to about a second of acknowledged writes can be lost).

``kill()`` sends SIGKILL to every process of the server at once (a crash),
``start()`` starts it again on the same port and data directory (recovery runs
on startup), ``restart()`` does both. Every server still running when the
interpreter exits is stopped and its directory removed.
"""

from __future__ import annotations

import atexit
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
import weakref
from pathlib import Path
from types import TracebackType
from typing import Final, Literal, Self

from .._model._errors import RheoError

__all__ = [
    "ClosedOnExit",
    "PostgresServer",
    "RedisServer",
    "ServerUnavailable",
    "ThrowawayServer",
    "free_port",
    "postgres_binaries",
    "running_servers",
]

_START_TIMEOUT_S: Final = 60.0
_RESERVED_PORTS: Final = frozenset({5432, 6379, 27017, 37017})
Fsync = Literal["always", "everysec", "no"]


class ServerUnavailable(RheoError):
    """A throwaway server cannot be run here (binaries or the OS user missing)."""


def free_port() -> int:
    """A free loopback TCP port, never one of the shared servers' ports."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in _RESERVED_PORTS:
            return port


def postgres_binaries() -> Path:
    """The directory holding ``initdb`` and ``postgres``: ``RHEO_PG_BIN``, else the newest
    ``/usr/lib/postgresql/*/bin``; raises :class:`ServerUnavailable` when there is none."""
    installed = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: [int(x) for x in Path(p).parent.name.split(".") if x.isdigit()],
        reverse=True,
    )
    for candidate in (os.environ.get("RHEO_PG_BIN", ""), *installed):
        if candidate and all((Path(candidate) / b).is_file() for b in ("initdb", "postgres")):
            return Path(candidate)
    raise ServerUnavailable("PostgreSQL server binaries (initdb, postgres) not found in "
                            "/usr/lib/postgresql/*/bin; set RHEO_PG_BIN to their directory")


_running: weakref.WeakSet[ThrowawayServer] = weakref.WeakSet()


def running_servers() -> list[ThrowawayServer]:
    """The throwaway servers of this process that are running now."""
    return [server for server in list(_running) if server.running]


@atexit.register
def _cleanup() -> None:
    for server in list(_running):
        server.close()


class ClosedOnExit:
    """``with`` support for what has ``start() -> Self`` and ``close()``: a start that
    fails closes what it had begun."""

    def start(self) -> Self:
        """Start (again) and return self."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop and clean up (idempotent)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class ThrowawayServer(ClosedOnExit):
    """A server process in a temporary directory: start, kill (SIGKILL), restart, close.

    Use it as a context manager (``with PostgresServer() as pg:``), or call
    :meth:`start` and :meth:`close`. :attr:`url` is the URL clients connect to.
    """

    name: str = "server"
    stop_signal: signal.Signals = signal.SIGTERM
    """What :meth:`stop` sends first (the server's quickest clean shutdown)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"rheo_faults_{self.name}_"))
        self.port = free_port()
        self.log = self.root / "server.log"
        self.kills = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._closed = False
        _running.add(self)

    @property
    def url(self) -> str:
        """The URL clients use to reach the server."""
        raise NotImplementedError

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _accepting(self) -> bool:
        """Whether the server answers clients now."""
        raise NotImplementedError

    def _group(self) -> int:
        """The process group holding every process of the server."""
        if self._process is None:
            raise RuntimeError(f"the {self.name} server is not running")
        return self._process.pid

    def start(self) -> Self:
        """Start the server (again) and wait until it accepts clients."""
        if self._closed:
            raise RuntimeError(f"the {self.name} server was closed")
        if self._process is None:
            with open(self.log, "ab") as log:
                self._process = subprocess.Popen(
                    self._command(), stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = _START_TIMEOUT_S) -> None:
        """Block until the server accepts clients; raise when it exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while not self._accepting():
            process = self._process
            if process is None or process.poll() is not None:
                raise RuntimeError(f"the {self.name} server exited: {self._log_tail()}")
            if time.monotonic() >= deadline:
                raise RuntimeError(f"the {self.name} server did not accept clients within "
                                   f"{timeout} s: {self._log_tail()}")
            time.sleep(0.05)  # polling the server against a deadline

    def kill(self) -> None:
        """SIGKILL every process of the server at once (a crash) and wait until they are gone."""
        process = self._process
        if process is None:
            return
        group = self._group()
        self._process = None
        self.kills += 1
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        process.wait(timeout=_START_TIMEOUT_S)
        # The restart must not find a process of the old instance still holding the
        # port or the data directory.
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"the killed {self.name} server's processes did not exit")
            time.sleep(0.02)  # waiting for the processes to be reaped, against a deadline

    def restart(self) -> Self:
        """:meth:`kill` then :meth:`start`: a crash and the recovery after it."""
        self.kill()
        return self.start()

    def stop(self) -> None:
        """Stop the server cleanly (:attr:`stop_signal`; SIGKILL if it does not exit in time)."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, self.stop_signal)
        try:
            process.wait(timeout=_START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def close(self) -> None:
        """Stop the server and remove its directory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            _running.discard(self)

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"{type(self).__name__}(port={self.port}, {state}, kills={self.kills})"


class PostgresServer(ThrowawayServer):
    """A throwaway PostgreSQL cluster (trust auth, user and database ``postgres``)."""

    name = "postgres"
    stop_signal = signal.SIGINT
    """Fast shutdown: clients still connected do not hold it up."""

    def __init__(self, *, max_connections: int = 100) -> None:
        bindir = postgres_binaries()
        prefix: list[str] = []
        owner: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise ServerUnavailable("running as root and there is no 'postgres' OS user "
                                        "to run initdb/postgres as") from None
            runuser = shutil.which("runuser")
            if runuser is None:
                raise ServerUnavailable("running as root without runuser to run "
                                        "initdb/postgres as postgres")
            prefix = [runuser, "-u", "postgres", "--"]
        super().__init__()
        if owner is not None:
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        self.bindir = bindir
        self.data = self.root / "data"
        self.max_connections = max_connections
        self._prefix = prefix
        try:
            subprocess.run(
                [*prefix, str(bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                 "-A", "trust", "--no-instructions", "--no-sync"],
                check=True, capture_output=True, timeout=_START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        """``postgresql://postgres@127.0.0.1:PORT/postgres``."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _command(self) -> list[str]:
        # A wal_writer_delay of 10 s keeps an asynchronous commit's WAL in the
        # server's memory long enough for a SIGKILL to undo it.
        return [*self._prefix, str(self.bindir / "postgres"), "-D", str(self.data),
                "-p", str(self.port), "-c", "listen_addresses=127.0.0.1",
                "-c", "unix_socket_directories=", "-c", "wal_writer_delay=10s",
                "-c", "fsync=on", "-c", f"max_connections={self.max_connections}"]

    def _group(self) -> int:
        # The postmaster writes its pid first thing; runuser may sit between us and it.
        with contextlib.suppress(OSError, ValueError, IndexError):
            postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
            return os.getpgid(postmaster)
        return super()._group()

    def _accepting(self) -> bool:
        result = subprocess.run(
            [str(self.bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port),
             "-U", "postgres", "-d", "postgres", "-t", "2"],
            capture_output=True, check=False)
        return result.returncode == 0


class RedisServer(ThrowawayServer):
    """A throwaway Redis with the append-only file on (``appendfsync`` as given)."""

    name = "redis"

    def __init__(self, *, appendfsync: Fsync = "always") -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServerUnavailable("redis-server not found on PATH")
        if appendfsync not in ("always", "everysec", "no"):
            raise ValueError(f"appendfsync must be always, everysec or no, got {appendfsync!r}")
        super().__init__()
        self.binary = binary
        self.appendfsync = appendfsync

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def _command(self) -> list[str]:
        return [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.root), "--appendonly", "yes",
                "--appendfsync", self.appendfsync, "--save", "", "--daemonize", "no",
                "--protected-mode", "no"]

    def _accepting(self) -> bool:
        # PING answers -LOADING while the append-only file is replayed.
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False
