"""Mutation testing of the conformance kit on the server-side code: PL/pgSQL, SQL and Lua.

``mutation.py`` mutates the Python of the in-memory and SQLite backends with mutmut;
the lease rules of the PostgreSQL and Redis backends are written in PL/pgSQL
(``postgres/functions/*.sql``, ``postgres/statements.sql``, ``postgres/migrations/``)
and Lua (``redis/lua/*.lua``), and SQLite's statements in ``sqlite/*.sql``, which
mutmut never touches. This script mutates those files one line at a time
(``_server_mutator.py`` says which changes: comparisons, ``+ 1`` boundaries,
AND/OR, dropped conditions, NOT, LEAST/GREATEST, min/max, state constants, removed
statements, ASC/DESC) and runs the kit against each mutant::

    score = (killed + timeout) / (measured - invalid - equivalent)

How a mutant runs: ``src/`` is copied once per worker into
``mutants-server/w<N>-<pid>/src`` (git-ignored, removed at the end); the mutated
file is written there and ``pytest conformance -x -q -p no:cacheprovider -n 0`` runs with
``PYTHONPATH=<that copy>`` and ``RHEO_BACKENDS`` the backend of the file
(``postgres``, ``redis`` or ``sqlite``), then the file is restored. A small pytest
plugin (``_mutation_boot.py``, copied to ``mutants-server/boot`` and loaded with
``-p``) makes Hypothesis derandomized and without its database, checks that rheo_flow
is imported from the copy, leaves the stateful test out unless ``--with-stateful``,
and puts the cases that killed the most mutants so far first (``-x`` stops at the
first failure). The baseline run of each backend is traced: which PL/pgSQL
functions, statements and Lua scripts each case runs; a mutant then runs only the
cases that run its function, statement or script (``_kit_trace.py``; the whole kit
for the migrations, the schemas and ``common.lua``).
``CI=true`` turns a backend that cannot even open into a failure, not a skip.
Each conformance session installs the PostgreSQL functions from the copy's files
into its own schema (``rheo_conformance_<pid>``), and the Redis scripts are loaded
by their text's SHA-1, so a mutated file is what runs (``--check`` proves it with
one fatal mutant per backend).

Before it runs, each mutant is compiled where that is cheap: the PostgreSQL files
are installed into a scratch schema in a rolled-back transaction (a mutated
statement of statements.sql is also prepared), a Lua script is loaded with
SCRIPT LOAD. A mutant that does not compile is *invalid*: counted apart, not in
the score. A mutant whose kit run outlives ``--timeout`` is *timeout* (detected);
so is one whose PL/pgSQL query runs for more than 15 s (the backend is terminated)
or whose Lua script keeps Redis busy (the script is killed).

Redis runs against a private ``redis-server`` per worker (started here, on a free
port, ``--save ''``, 2 GiB of address space at most): a mutated script that
loops blocks its server, which is then killed and restarted, not a shared one.
``--redis-url`` uses an existing server instead (a logical database of it).
PostgreSQL runs against ``RHEO_POSTGRES_URL`` (default the local ``test``
database); stale conformance schemas of killed runs are dropped.

Usage::

    .venv/bin/python conformance/mutation_server.py --list [--files GLOB]
    .venv/bin/python conformance/mutation_server.py --check
    .venv/bin/python conformance/mutation_server.py --files 'postgres/functions/*' \\
        [--every K] [--limit N] [--max-children 2] [--with-stateful] [--markdown]
    .venv/bin/python conformance/mutation_server.py --report-only [--files GLOB]

Results accumulate in ``conformance/mutation-server-results.jsonl`` (tracked; one record
per mutant run, with hashes of the mutated file and of the kit and backends' Python): a run skips
mutants already measured against the same code (``--fresh`` measures again), so a
sample can be widened in steps and runs for different files add up. The summary
covers every selected file: mutants generated, measured (the sample), the verdicts,
the triage of ``conformance/mutation-server-equivalent.toml`` (same entry format as
``mutation-equivalent.toml``: ``file``, ``function`` (the PL/pgSQL function,
statements.sql section or Lua local function), ``original``, ``mutated``,
``reason``), the survivors by kind, and the projected time of the unmeasured
mutants; it is written to ``mutants-server/summary.json`` and ``summary.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import fnmatch
import hashlib
import json
import os
import queue
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import mutation as base  # noqa: E402
from _kit_trace import cases_for, load_trace  # noqa: E402
from _server_mutator import OPERATORS, ServerMutant, apply, mutants_of  # noqa: E402

ROOT = HERE.parent
OUT = ROOT / "mutants-server"
RESULTS = ROOT / "conformance" / "mutation-server-results.jsonl"
"""Every verdict, kept in git: a killed, timed-out or invalid one stands while its file is
unchanged, so a later session (or another checkout) measures only what is new."""
EQUIVALENTS = HERE / "mutation-server-equivalent.toml"
TARGETS: dict[str, str] = {
    "src/rheo_flow/_backends/postgres/functions/*.sql": "postgres",
    "src/rheo_flow/_backends/postgres/statements.sql": "postgres",
    "src/rheo_flow/_backends/postgres/migrations/*.sql": "postgres",
    "src/rheo_flow/_backends/redis/lua/*.lua": "redis",
    "src/rheo_flow/_backends/sqlite/statements.sql": "sqlite",
    "src/rheo_flow/_backends/sqlite/schema.sql": "sqlite",
}
"""The mutated files (globs, from the repository root) and the backend whose kit run
judges each."""
DETECTED = {"killed", "timeout"}
PG_URL = os.environ.get("RHEO_POSTGRES_URL") or "postgresql://postgres@127.0.0.1:5432/test"
PG_QUERY_LIMIT_S = 15
"""A PL/pgSQL query of a mutant running longer than this is terminated (a loop)."""
REDIS_BUSY_LIMIT_S = 3
"""A Lua script of a mutant keeping Redis busy longer than this is killed (a loop)."""
FATAL: dict[str, tuple[str, str, str]] = {
    # backend: (file, a substring of the line, its replacement): every fetch returns nothing
    # new / no settle matches its lease, so nearly every case fails.
    "postgres": ("src/rheo_flow/_backends/postgres/functions/fetch.sql",
                 "IF c_part IS NULL AND k_part IS NULL THEN", "IF TRUE THEN"),
    "redis": ("src/rheo_flow/_backends/redis/lua/fetch.lua",
              "if want > 0 and c < hw then", "if false then"),
    "sqlite": ("src/rheo_flow/_backends/sqlite/statements.sql",
               "AND lease_id = ?9 AND receipt = ?10", "AND lease_id <> ?9 AND receipt = ?10"),
}
"""One obviously fatal mutant per backend, for ``--check``."""

BOOT = Path(__file__).resolve().parent / "_mutation_boot.py"
"""The pytest plugin every kit run loads (copied to ``mutants-server/boot``)."""


@dataclass
class Result:
    key: str
    file: str
    line: int
    op: str
    function: str
    original: str
    mutated: str
    removed: list[str]
    added: list[str]
    status: str
    """killed, timeout, survived, invalid or error."""
    killer: str = ""
    """The failing test (killed), the compile error (invalid) or what hung (timeout)."""
    seconds: float = 0.0
    stateful: bool = False
    """Whether the stateful test was part of the verdict (run, or not needed: detected)."""
    file_hash: str = ""
    kit_hash: str = ""
    date: str = ""


def backend_of(path: str) -> str:
    for pattern, backend in TARGETS.items():
        if fnmatch.fnmatch(path, pattern):
            return backend
    raise ValueError(f"{path} is not a mutated file")


def target_files(globs: list[str] | None) -> list[str]:
    files = sorted({p.relative_to(ROOT).as_posix() for pattern in TARGETS
                    for p in ROOT.glob(pattern)})
    if not globs:
        return files
    return [f for f in files if any(fnmatch.fnmatch(f, g) or fnmatch.fnmatch(f, f"*{g}")
                                    for g in globs)]


def _hash(*paths: Path) -> str:
    """A digest of the files' paths (from the repository root, so that every checkout
    agrees) and contents."""
    h = hashlib.sha1()
    for p in paths:
        h.update(p.relative_to(ROOT).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


DETECTED = frozenset({"killed", "timeout", "invalid"})
"""Verdicts that stand while the mutated file is unchanged, whatever the kit's hash: the
kit only grows, so a mutant it caught (or one that never compiled) stays caught;
survivors are measured again whenever the kit changes (``--fresh`` measures all)."""


def current(r: Result | None, file_hash: str, kit: str,
            entries: Sequence[base.Entry] = ()) -> bool:
    """Whether ``r`` is a verdict on this version of the file under this kit. A
    survivor triaged as equivalent stays one under a later kit too: no case can
    kill a mutant that changes nothing the contract can observe."""
    if r is None or r.file_hash != file_hash:
        return False
    if r.kit_hash == kit or r.status in DETECTED:
        return True
    mutant = _as_mutant(r) if r.status == "survived" else None
    return mutant is not None and any(e.match(mutant) for e in entries)


def _as_mutant(r: Result) -> base.Mutant:
    return base.Mutant(name=r.key, file=r.file, function=r.function, status=r.status,
                       removed=r.removed, added=r.added)


def kit_hash() -> str:
    """The Python that judges a mutant: the kit, the conformance runner, the package."""
    files = [*sorted((ROOT / "src").rglob("*.py")), ROOT / "conformance" / "conftest.py",
             *sorted((ROOT / "conformance").glob("test_*.py"))]
    return _hash(*files)


def select(files: list[str], every: int, offset: int, limit: int | None
           ) -> dict[str, list[ServerMutant]]:
    """Every mutant of each file, and the sample to measure (every K-th, then the first N)."""
    chosen: dict[str, list[ServerMutant]] = {}
    for f in files:
        ms = mutants_of(f, (ROOT / f).read_text(encoding="utf-8"))
        chosen[f] = ms[offset::every]
    if limit is not None:
        flat = [m for ms in chosen.values() for m in ms][:limit]
        keep = {m.key for m in flat}
        chosen = {f: [m for m in ms if m.key in keep] for f, ms in chosen.items()}
    return chosen


def load_results() -> dict[str, Result]:
    """The latest record of each mutant key."""
    out: dict[str, Result] = {}
    if RESULTS.exists():
        for line in RESULTS.read_text(encoding="utf-8").splitlines():
            if line.strip():
                r = Result(**json.loads(line))
                out[r.key] = r
    return out


# --- Servers ------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _limit_memory() -> None:
    os.setsid()
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


class RedisServer:
    """A private redis-server for one worker (a looping mutant blocks only it)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or _free_port()  # a restart keeps the port
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir), "--busy-reply-threshold", "1000",
             "--logfile", str(self.dir / "redis.log")],
            preexec_fn=_limit_memory, stdout=subprocess.DEVNULL)
        for _ in range(100):
            if self.ping() == "ok":
                return
            time.sleep(0.05)
        raise SystemExit(f"private redis-server on port {self.port} did not start")

    def ping(self) -> str:
        """``ok``, ``busy`` (a script is running) or ``down``."""
        import redis

        try:
            redis.Redis(port=self.port, socket_timeout=2).ping()
            return "ok"
        except redis.exceptions.BusyLoadingError:
            return "busy"
        except redis.exceptions.ResponseError as exc:
            return "busy" if "BUSY" in str(exc) else "down"
        except Exception:
            return "down"

    def kill_script(self) -> None:
        import redis

        with contextlib.suppress(Exception):
            redis.Redis(port=self.port, socket_timeout=2).script_kill()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart_if_needed(self) -> None:
        if self.proc is None or self.proc.poll() is not None or self.ping() != "ok":
            self.stop()
            self.start()
        else:
            import redis

            redis.Redis(port=self.port).flushall()


class Postgres:
    """One worker's connection to the PostgreSQL server (compile checks, watchdog)."""

    def __init__(self, url: str, name: str) -> None:
        self.url = url
        self.name = name
        self.loop = asyncio.new_event_loop()
        self.conn: Any = None
        self.statement_ok: dict[str, bool] = {}

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def _conn(self) -> Any:
        import asyncpg

        if self.conn is None or self.conn.is_closed():
            self.conn = await asyncpg.connect(self.url)
        return self.conn

    def compile(self, src: Path, m: ServerMutant) -> str | None:
        """None when the copy's PostgreSQL files install (and the mutated statement
        prepares), else the error."""
        return self.run(self._compile(src, m))  # type: ignore[no-any-return]

    async def _compile(self, src: Path, m: ServerMutant) -> str | None:
        import asyncpg

        from rheo_flow._backends.postgres._migrations import BOOTSTRAP, FUNCTIONS, MIGRATIONS
        from rheo_flow._backends.postgres._sql import render

        pkg = src / "rheo_flow" / "_backends" / "postgres"
        schema = f"rheo_mutcheck_{self.name}"
        conn = await self._conn()
        tr = conn.transaction()
        await tr.start()
        try:
            for migration in (BOOTSTRAP, *MIGRATIONS, FUNCTIONS):
                folder = "functions" if migration is FUNCTIONS else "migrations"
                for name in migration.files:
                    text = (pkg / folder / f"{name}.sql").read_text(encoding="utf-8")
                    await conn.execute(render(text, schema))
            if m.file.endswith("postgres/statements.sql"):
                section, body = _pg_section((pkg / "statements.sql").read_text(), m.line)
                if section:
                    await conn.execute("SAVEPOINT rheo_check")
                    try:
                        await conn.prepare(render(body, schema))
                    except asyncpg.PostgresError as exc:
                        await conn.execute("ROLLBACK TO SAVEPOINT rheo_check")
                        if await self._original_prepares(section, m, schema):
                            return f"{type(exc).__name__}: {exc}".splitlines()[0]
            return None
        except asyncpg.PostgresError as exc:
            return f"{type(exc).__name__}: {exc}".splitlines()[0]
        finally:
            await tr.rollback()

    async def _original_prepares(self, section: str, m: ServerMutant, schema: str) -> bool:
        """Whether the unmutated statement prepares (some need a context the check has not)."""
        import asyncpg

        from rheo_flow._backends.postgres._sql import render

        if section not in self.statement_ok:
            _, body = _pg_section((ROOT / m.file).read_text(encoding="utf-8"), m.line)
            try:
                await self.conn.prepare(render(body, schema))
                self.statement_ok[section] = True
            except asyncpg.PostgresError:
                await self.conn.execute("ROLLBACK TO SAVEPOINT rheo_check")
                self.statement_ok[section] = False
        return self.statement_ok[section]

    def terminate(self, schema: str, older_than_s: float | None) -> int:
        """Terminate the server backends running queries of ``schema`` (only those
        running for more than ``older_than_s``, if given); how many."""
        async def go() -> int:
            conn = await self._conn()
            age = "" if older_than_s is None else \
                f"AND state = 'active' AND now() - query_start > interval '{older_than_s} s'"
            rows = await conn.fetch(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                f"WHERE pid <> pg_backend_pid() {age} AND position($1 in query) > 0",
                schema)
            return len(rows)
        return self.run(go())  # type: ignore[no-any-return]

    def drop_schema(self, schema: str) -> None:
        async def go() -> None:
            conn = await self._conn()
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        with contextlib.suppress(Exception):
            self.run(go())

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.run(self.conn.close())
        self.loop.close()


_SECTION = re.compile(r"^-- name: ([a-z_]+)\n", re.MULTILINE)


def _pg_section(text: str, line: int) -> tuple[str | None, str]:
    """The name and statement text (comment lines dropped) of the statements.sql
    section holding ``line``."""
    name, start = None, 0
    for m in _SECTION.finditer(text):
        if text.count("\n", 0, m.start()) + 1 > line:
            break
        name, start = m[1], m.end()
    if name is None:
        return None, ""
    nxt = _SECTION.search(text, start)
    body = text[start:nxt.start() if nxt else len(text)]
    return name, "\n".join(ln for ln in body.strip().splitlines()
                           if not ln.lstrip().startswith("--")).strip()


# --- Running ------------------------------------------------------------------------

@dataclass
class Worker:
    index: int
    dir: Path
    redis: RedisServer | None = None
    shared_redis_url: str | None = None
    pg: Postgres | None = None

    @property
    def redis_url(self) -> str | None:
        return self.redis.url if self.redis is not None else self.shared_redis_url

    @property
    def src(self) -> Path:
        return self.dir / "src"


@dataclass
class Runner:
    children: int
    with_stateful: bool
    timeout: float | None
    redis_url: str | None
    kills: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    workers: list[Worker] = field(default_factory=list)
    baseline: dict[str, float] = field(default_factory=dict)
    trace: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    """Per backend: case -> the server-side units it runs (``_kit_trace.py``)."""

    def setup(self, backends: set[str]) -> None:
        OUT.mkdir(exist_ok=True)
        boot = OUT / "boot"
        boot.mkdir(exist_ok=True)
        shutil.copyfile(BOOT, boot / "rheo_mutation_boot.py")
        for i in range(self.children):
            # One folder per process and child: runs for different files may go on
            # side by side.
            w = Worker(i, OUT / f"w{i}-{os.getpid()}")
            if w.src.exists():
                shutil.rmtree(w.src)
            shutil.copytree(ROOT / "src", w.src,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
            if "redis" in backends:
                if self.redis_url:
                    w.shared_redis_url = self.redis_url
                else:
                    w.redis = RedisServer(w.dir / "redis")
                    w.redis.start()
            if "postgres" in backends:
                w.pg = Postgres(PG_URL, f"w{i}_{os.getpid()}")
            self.workers.append(w)

    def close(self) -> None:
        for w in self.workers:
            if w.redis is not None:
                w.redis.stop()
            if w.pg is not None:
                w.pg.close()
            shutil.rmtree(w.dir, ignore_errors=True)

    def _env(self, w: Worker, backend: str, only_stateful: bool,
             select: list[str] | None = None, trace: Path | None = None) -> dict[str, str]:
        env = dict(os.environ)
        for name in ("RHEO_MATRIX_PATH", "PYTEST_ADDOPTS", "MUTANT_UNDER_TEST",
                     "RHEO_MUT_SELECT", "RHEO_MUT_TRACE"):
            env.pop(name, None)
        if select is not None:
            chosen = w.dir / "select.json"
            chosen.write_text(json.dumps(select), encoding="utf-8")
            env["RHEO_MUT_SELECT"] = str(chosen)
        if trace is not None:
            env["RHEO_MUT_TRACE"] = str(trace)
        order = w.dir / "order.json"
        with self.lock:
            order.write_text(json.dumps(self.kills), encoding="utf-8")
        env.update(
            PYTHONPATH=f"{OUT / 'boot'}{os.pathsep}{w.src}",
            RHEO_BACKENDS=backend, CI="true", RHEO_MUT_EXPECT=str(w.src),
            RHEO_MUT_ORDER=str(order), RHEO_MUT_STATEFUL="1" if self.with_stateful else "0",
            RHEO_MUT_ONLY="stateful" if only_stateful else "", PYTHONDONTWRITEBYTECODE="1",
            RHEO_POSTGRES_URL=PG_URL,
        )
        if w.redis_url:
            env["RHEO_REDIS_URL"] = w.redis_url
        return env

    def kit(self, w: Worker, backend: str, *, only_stateful: bool = False,
            timeout: float | None = None, select: list[str] | None = None,
            trace: Path | None = None) -> tuple[str, str, float]:
        """Run the kit in ``w``'s copy: (status, killer or reason, seconds)."""
        cmd = [sys.executable, "-m", "pytest", "conformance", "-x", "-q", "-p",
               "no:cacheprovider", "-n", "0", "-p", "rheo_mutation_boot"]
        log = w.dir / "kit.log"
        start = time.monotonic()
        limit = timeout or self.timeout or 600
        hung = ""
        with log.open("wb") as out:
            env = self._env(w, backend, only_stateful, select, trace)
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            schema = f"rheo_conformance_{proc.pid}"
            busy = 0
            while True:
                try:
                    proc.wait(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    pass
                elapsed = time.monotonic() - start
                if elapsed > limit:
                    hung = hung or f"kit run over {limit:.0f} s"
                    break
                if w.pg is not None and backend == "postgres" and int(elapsed) % 3 == 0 \
                        and w.pg.terminate(schema, PG_QUERY_LIMIT_S):
                    hung = f"a PL/pgSQL query ran over {PG_QUERY_LIMIT_S} s"
                if w.redis is not None and backend == "redis":
                    state = w.redis.ping()
                    busy = busy + 1 if state != "ok" else 0
                    if busy >= REDIS_BUSY_LIMIT_S:
                        hung = f"a Lua script kept Redis busy ({state}) over " \
                               f"{REDIS_BUSY_LIMIT_S} s"
                        w.redis.kill_script()
                        if w.redis.ping() != "ok":
                            w.redis.stop()
                        busy = 0
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        seconds = time.monotonic() - start
        if w.pg is not None and backend == "postgres":
            if proc.returncode != 0:
                w.pg.terminate(schema, None)
            w.pg.drop_schema(schema)
        if w.redis is not None and backend == "redis":
            w.redis.restart_if_needed()
        text = log.read_text(encoding="utf-8", errors="replace")
        if proc.returncode == 97 or "RHEO-MUTATION:" in text:
            raise SystemExit(text[text.find("RHEO-MUTATION:"):].splitlines()[0])
        if hung:
            return "timeout", hung, seconds
        if proc.returncode == 0:
            return "survived", "", seconds
        failed = re.findall(r"^(?:FAILED|ERROR) \S+::(test_\w+)", text, re.MULTILINE)
        if proc.returncode == 1 and failed:
            return "killed", failed[0], seconds
        tail = " | ".join(text.strip().splitlines()[-3:])
        return "error", f"pytest exit {proc.returncode}: {tail[:300]}", seconds

    def measure_baseline(self, backend: str) -> None:
        w = self.workers[0]
        trace = w.dir / f"trace-{backend}.json"
        status, why, seconds = self.kit(w, backend, timeout=900, trace=trace)
        if status != "survived":
            raise SystemExit(f"the unmutated kit does not pass on {backend}: {status} {why} "
                             f"(see {w.dir / 'kit.log'})")
        self.baseline[backend] = round(seconds, 1)
        if trace.exists():
            self.trace[backend] = load_trace(trace)
        print(f"baseline: the unmutated kit on {backend} passes in {seconds:.0f} s "
              f"(stateful test {'in' if self.with_stateful else 'out'})", file=sys.stderr)
        if self.with_stateful:
            return
        status, why, seconds = self.kit(w, backend, only_stateful=True, timeout=900)
        if status != "survived":
            raise SystemExit(f"the unmutated stateful test fails on {backend}: {why}")
        self.baseline[f"{backend} stateful"] = round(seconds, 1)

    def compile(self, w: Worker, backend: str, m: ServerMutant) -> str | None:
        if backend == "postgres" and w.pg is not None:
            return w.pg.compile(w.src, m)
        if backend == "redis":
            return _lua_compile(w, m)
        return None

    def one(self, w: Worker, m: ServerMutant, hashes: tuple[str, str],
            stateful_only: bool = False) -> Result:
        backend = backend_of(m.file)
        path = w.src / m.file.removeprefix("src/")
        original = path.read_text(encoding="utf-8")
        try:
            path.write_text(apply(original, m), encoding="utf-8")
            error = None if stateful_only else self.compile(w, backend, m)
            if error is not None:
                status, why, seconds = "invalid", error, 0.0
            else:
                select = None if stateful_only else cases_for(
                    m.file, m.function, self.trace.get(backend))
                status, why, seconds = self.kit(w, backend, only_stateful=stateful_only,
                                                select=select)
        finally:
            path.write_text(original, encoding="utf-8")
        if status == "killed":
            with self.lock:
                self.kills[why] = self.kills.get(why, 0) + 1
        return Result(
            key=m.key, file=m.file, line=m.line, op=m.op, function=m.function,
            original=m.original, mutated=m.mutated, removed=m.removed, added=m.added,
            status=status, killer=why, seconds=round(seconds, 1),
            stateful=self.with_stateful or stateful_only or status in DETECTED,
            file_hash=hashes[0], kit_hash=hashes[1],
            date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"))

    def run_all(self, todo: list[ServerMutant], hashes: dict[str, str], kit: str,
                stateful_only: bool = False) -> list[Result]:
        free: queue.Queue[Worker] = queue.Queue()
        for w in self.workers:
            free.put(w)
        results: list[Result] = []
        count = [0]

        def task(m: ServerMutant) -> Result:
            w = free.get()
            try:
                r = self.one(w, m, (hashes[m.file], kit), stateful_only)
            except Exception as exc:  # a server that went away: note it, go on
                r = Result(key=m.key, file=m.file, line=m.line, op=m.op, function=m.function,
                           original=m.original, mutated=m.mutated, removed=m.removed,
                           added=m.added, status="error",
                           killer=f"{type(exc).__name__}: {exc}"[:300])
                if w.redis is not None:
                    with contextlib.suppress(Exception):
                        w.redis.restart_if_needed()
            finally:
                free.put(w)
            with self.lock:
                count[0] += 1
                with RESULTS.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(asdict(r)) + "\n")
                print(f"[{count[0]}/{len(todo)}] {r.status:8} {r.seconds:5.1f}s  "
                      f"{m.key}  {r.killer[:70]}",
                      file=sys.stderr, flush=True)
            return r

        pool = ThreadPoolExecutor(max_workers=self.children)
        try:
            futures = [pool.submit(task, m) for m in todo]
            results = [f.result() for f in futures]
        except KeyboardInterrupt:
            print("interrupted: finishing the kit runs under way (results so far are kept)",
                  file=sys.stderr)
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown()
        return results


def _lua_compile(w: Worker, m: ServerMutant) -> str | None:
    import redis

    from rheo_flow._backends.redis._scripts import _NAMES, _PRELUDES

    lua = w.src / "rheo_flow" / "_backends" / "redis" / "lua"
    part = Path(m.file).stem
    users = [n for n in _NAMES if n == part or part in _PRELUDES.get(n, ("common",))]
    if not users or not w.redis_url:
        return None
    name = users[0]
    text = "".join((lua / f"{p}.lua").read_text(encoding="utf-8")
                   for p in (*_PRELUDES.get(name, ("common",)), name))
    try:
        redis.Redis.from_url(w.redis_url, socket_timeout=5).script_load(text)
    except redis.exceptions.ResponseError as exc:
        return str(exc).splitlines()[0][:200]
    return None


# --- Reporting ----------------------------------------------------------------------

COLUMNS = ["mutants", "measured", "invalid", "killed", "timeout", "survived", "error",
           "equivalent"]


_PENDING = "survivors_to_measure_again"


def summarise(files: list[str], generated: dict[str, list[ServerMutant]],
              results: dict[str, Result], entries: list[base.Entry], kit: str,
              meta: dict[str, Any]) -> dict[str, Any]:
    hashes = {f: _hash(ROOT / f) for f in files}
    measured: dict[str, list[Result]] = {f: [] for f in files}
    pending = 0
    for f in files:
        for m in generated[f]:
            r = results.get(m.key)
            if current(r, hashes[f], kit, entries):
                assert r is not None
                measured[f].append(r)
            elif r is not None and r.file_hash == hashes[f] and r.status == "survived":
                # Survived an earlier kit and not measured since: it counts as a
                # survivor until a run under this kit says otherwise.
                measured[f].append(r)
                pending += 1
    meta = {**meta, _PENDING: pending}
    as_mutants = {r.key: _as_mutant(r)
                  for rs in measured.values() for r in rs if r.status != "invalid"}
    base.apply_triage(list(as_mutants.values()), entries)
    per_file: dict[str, dict[str, Any]] = {}
    seconds: list[float] = []
    for f in files:
        c: dict[str, Any] = dict.fromkeys(COLUMNS, 0)
        c["mutants"] = len(generated[f])
        c["measured"] = len(measured[f])
        for r in measured[f]:
            c[r.status] = c.get(r.status, 0) + 1
            if r.status != "invalid":
                seconds.append(r.seconds)
                c["equivalent"] += as_mutants[r.key].equivalent is not None
        per_file[f.removeprefix("src/rheo_flow/")] = c
    totals: dict[str, Any] = {k: sum(c[k] for c in per_file.values()) for k in COLUMNS}
    for c in [*per_file.values(), totals]:
        judged = c["measured"] - c["invalid"] - c["equivalent"]
        c["score"] = (c["killed"] + c["timeout"]) / judged if judged > 0 else None
    survivors = []
    for r in (r for rs in measured.values() for r in rs):
        if r.status in ("survived", "error"):
            m = as_mutants[r.key]
            survivors.append(asdict(r) | {"equivalent": m.equivalent})
    survivors.sort(key=lambda s: (OPERATORS.index(s["op"]), s["file"], s["line"]))
    judged = [r for rs in measured.values() for r in rs if r.status != "invalid"]
    meta = meta | {"stateful_in_verdict": f"{sum(r.stateful for r in judged)} of {len(judged)}"}
    mean = sum(seconds) / len(seconds) if seconds else None
    left = totals["mutants"] - totals["measured"]
    children = meta.get("children") or 2
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        **meta,
        "mean_seconds_per_mutant": None if mean is None else round(mean, 1),
        "projected_minutes_for_the_rest": (None if mean is None
                                           else round(left * mean / children / 60)),
        "projected_minutes_for_all": (None if mean is None
                                      else round(totals["mutants"] * mean / children / 60)),
        "per_file": per_file,
        "totals": totals,
        "survivors": survivors,
        "invalid": [{"key": r.key, "line": r.line, "mutated": r.mutated.strip(),
                     "error": r.killer} for rs in measured.values() for r in rs
                    if r.status == "invalid"],
        "stale_equivalents": [{"entry": e.label(), "reason": e.reason}
                              for e in entries if e.matches == 0],
    }


def _diff(s: dict[str, Any]) -> list[str]:
    return ([f"- {ln.strip()}" for ln in s["removed"]]
            + [f"+ {ln.strip()}" for ln in s["added"]])


def to_text(s: dict[str, Any]) -> str:
    out = [f"Mutation testing of the conformance kit on server-side code, {s['date']}",
           f"stateful test: {s['stateful']}; in the verdict of {s['stateful_in_verdict']} "
           "measured mutants (detected ones need no more)",
           f"baseline (unmutated kit, one run): {s.get('baseline') or 'not measured this run'}",
           f"this run: {s.get('run_seconds')} s; mean per mutant "
           f"{s['mean_seconds_per_mutant']} s; projected for the unmeasured mutants "
           f"{s['projected_minutes_for_the_rest']} min, for all "
           f"{s['projected_minutes_for_all']} min ({s.get('children')} children)",
           f"survivors of an earlier kit, counted as survivors until measured again: "
           f"{s.get(_PENDING, 0)}"]
    width = max([len(f) for f in s["per_file"]] + [5]) + 2
    out.append("file".ljust(width) + "".join(c.rjust(11) for c in [*COLUMNS, "score"]))
    for name, c in [*s["per_file"].items(), ("total", s["totals"])]:
        out.append(name.ljust(width) + "".join(str(c.get(k, 0)).rjust(11) for k in COLUMNS)
                   + base._fmt_score(c["score"]).rjust(11))
    open_ = [m for m in s["survivors"] if m["equivalent"] is None]
    out.append(f"\nSurvivors not triaged as equivalent: {len(open_)}")
    op = None
    for m in open_:
        if m["op"] != op:
            op = m["op"]
            out.append(f"\n  [{op}]")
        out.append(f"  {m['file'].removeprefix('src/rheo_flow/_backends/')}:{m['line']}  "
                   f"{m['function']}  ({m['status']}{': ' + m['killer'] if m['killer'] else ''})")
        out.extend(f"      {ln}" for ln in _diff(m))
    eq = [m for m in s["survivors"] if m["equivalent"] is not None]
    out.append(f"\nEquivalent (from {EQUIVALENTS.name}): {len(eq)}")
    out.extend(f"  {m['file'].rsplit('/', 1)[-1]}:{m['line']}: {m['equivalent']}" for m in eq)
    if s["invalid"]:
        out.append(f"\nInvalid (do not compile, left out of the score): {len(s['invalid'])}")
        out.extend(f"  {i['key']}: {i['mutated'][:60]}  ({i['error'][:80]})"
                   for i in s["invalid"])
    if s["stale_equivalents"]:
        out.append(f"\nStale entries in {EQUIVALENTS.name} (match no surviving mutant):")
        out.extend(f"  {e['entry']}  ({e['reason']})" for e in s["stale_equivalents"])
    return "\n".join(out) + "\n"


def to_markdown(s: dict[str, Any]) -> str:
    t = s["totals"]
    out = [
        f"Measured {s['date']} by `conformance/mutation_server.py` (stateful test: "
        f"{s['stateful']}; mean {s['mean_seconds_per_mutant']} s per mutant, "
        f"{s.get('children')} children).",
        "",
        f"**Score: {base._fmt_score(t['score'])}** = (killed {t['killed']} + timeout "
        f"{t['timeout']}) / (measured {t['measured']} - invalid {t['invalid']} - "
        f"equivalent {t['equivalent']}), on {t['measured']} of {t['mutants']} mutants"
        + (f" ({s[_PENDING]} survivors of an earlier kit not yet measured again count as "
           "survivors)." if s.get(_PENDING) else "."),
        "",
        *base.score_table(s["per_file"], t, COLUMNS, code=True),
    ]
    open_ = [m for m in s["survivors"] if m["equivalent"] is None]
    out += ["", f"Survivors ({len(open_)}), by kind:", ""]
    op = None
    for m in open_:
        if m["op"] != op:
            op = m["op"]
            out += [f"- **{op}**"]
        out.append(f"  - `{m['file'].removeprefix('src/rheo_flow/_backends/')}:{m['line']}` "
                   f"({m['function']}): `{m['original'].strip()}` → "
                   f"`{m['mutated'].strip() or '(removed)'}`")
    return "\n".join(out) + "\n"


# --- Main ---------------------------------------------------------------------------

def _print_list(chosen: dict[str, list[ServerMutant]]) -> None:
    for _f, ms in chosen.items():
        for m in ms:
            print(f"{m.key:40} {m.function:22} {m.original.strip()[:60]}  ->  "
                  f"{m.mutated.strip()[:60] or '(removed)'}")
    counts = {f.removeprefix("src/rheo_flow/_backends/"): len(ms) for f, ms in chosen.items()}
    print(f"{sum(counts.values())} mutants: {counts}", file=sys.stderr)


def check(runner: Runner, backends: list[str]) -> int:
    """One fatal mutant per backend must be killed (the copy's file is what runs)."""
    failures = 0
    for backend in backends:
        path, old, new = FATAL[backend]
        text = (ROOT / path).read_text(encoding="utf-8")
        lines = text.split("\n")
        n = next(i for i, ln in enumerate(lines) if old in ln)
        m = ServerMutant(path, n + 1, "check", lines[n], lines[n].replace(old, new), "check",
                         removed=[lines[n]], added=[lines[n].replace(old, new)])
        runner.timeout = runner.timeout or 300
        r = runner.one(runner.workers[0], m, ("", ""))
        ok = r.status in DETECTED
        failures += not ok
        print(f"check {backend}: fatal mutant {path}:{n + 1} ({old!r} -> {new!r}): "
              f"{r.status} {r.killer} in {r.seconds:.0f} s  {'OK' if ok else 'NOT KILLED'}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--files", action="append", metavar="GLOB",
                        help="mutate only these files (glob on the path from the repository "
                        "root, or its tail, e.g. 'postgres/functions/*'); repeatable")
    parser.add_argument("--only", action="append", metavar="KEY",
                        help="measure only mutants whose key (as --list prints it, e.g. "
                        "'redrive.lua:23:drop-cond:*') matches this glob; repeatable")
    parser.add_argument("--every", type=int, default=1, metavar="K",
                        help="measure every K-th mutant of each file (a sample)")
    parser.add_argument("--offset", type=int, default=0, help="with --every: start here")
    parser.add_argument("--limit", type=int, metavar="N", help="measure at most N mutants")
    parser.add_argument("--max-children", type=int, default=2,
                        help="parallel kit runs (default 2)")
    parser.add_argument("--timeout", type=float,
                        help="seconds per kit run (default: 3 x the baseline + 30)")
    parser.add_argument("--with-stateful", action="store_true",
                        help="include the stateful Hypothesis test in the verdict (a second "
                        "pass runs it on the mutants the cases let survive)")
    parser.add_argument("--redis-url", help="run Redis mutants against this server (e.g. "
                        "redis://127.0.0.1:6379/11) instead of a private redis-server")
    parser.add_argument("--fresh", action="store_true",
                        help="measure again mutants already in results.jsonl")
    parser.add_argument("--list", action="store_true", help="print the mutants and stop")
    parser.add_argument("--check", action="store_true",
                        help="run one fatal mutant per backend of the selected files and "
                        "check that the kit kills it")
    parser.add_argument("--report-only", action="store_true",
                        help="summarise results.jsonl for the selected files")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)

    entries = base.load_entries(EQUIVALENTS)
    files = target_files(args.files)
    if not files:
        raise SystemExit(f"no mutated file matches {args.files}")
    chosen = select(files, max(args.every, 1), args.offset, args.limit)
    if args.only:
        chosen = {f: [m for m in ms if any(fnmatch.fnmatch(m.key, g) for g in args.only)]
                  for f, ms in chosen.items()}
    if args.list:
        _print_list(chosen)
        return 0
    backends = sorted({backend_of(f) for f in files})
    kit = kit_hash()
    meta: dict[str, Any] = {"children": args.max_children,
                            "stateful": "included" if args.with_stateful else
                            "excluded (--with-stateful includes it)",
                            "sample": {"every": args.every, "offset": args.offset,
                                       "limit": args.limit}}
    if args.check or not args.report_only:
        runner = Runner(args.max_children, args.with_stateful, args.timeout, args.redis_url)
        try:
            runner.setup(set(backends))
            if args.check:
                return check(runner, backends)
            results = load_results()
            hashes = {f: _hash(ROOT / f) for f in files}

            def done(m: ServerMutant) -> bool:
                r = results.get(m.key)
                return (not args.fresh and r is not None and r.status != "error"
                        and current(r, hashes[m.file], kit, entries)
                        and (r.stateful or not args.with_stateful or r.status == "invalid"))

            todo = [m for ms in chosen.values() for m in ms if not done(m)]
            todo_backends = sorted({backend_of(m.file) for m in todo})
            print(f"{len(todo)} mutants to measure ({sum(map(len, chosen.values()))} "
                  "selected)", file=sys.stderr)
            start = time.monotonic()
            for backend in todo_backends:
                runner.measure_baseline(backend)
            if runner.timeout is None and runner.baseline:
                runner.timeout = 3 * max(v for k, v in runner.baseline.items()
                                         if "stateful" not in k) + 30
            # Cases first (with the stateful test, if asked, in the same run): then a
            # mutant that was measured without the stateful test and survived gets only
            # the stateful test now.
            fresh = [m for m in todo if args.fresh
                     or not current(results.get(m.key), hashes[m.file], kit, entries)]
            upgrade = [m for m in todo if m not in fresh
                       and results[m.key].status == "survived"]
            rest = [m for m in todo if m not in fresh and m not in upgrade]
            runner.run_all(fresh + rest, hashes, kit)
            if upgrade:
                runner.run_all(upgrade, hashes, kit, stateful_only=True)
            meta["run_seconds"] = round(time.monotonic() - start, 1)
            meta["baseline"] = runner.baseline
        finally:
            runner.close()
    generated = {f: mutants_of(f, (ROOT / f).read_text(encoding="utf-8")) for f in files}
    summary = summarise(files, generated, load_results(), entries, kit, meta)
    OUT.mkdir(exist_ok=True)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (OUT / "summary.md").write_text(to_markdown(summary), encoding="utf-8")
    if args.json:
        print(json.dumps(summary, indent=2))
    elif args.markdown:
        print(to_markdown(summary), end="")
    else:
        print(to_text(summary), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
