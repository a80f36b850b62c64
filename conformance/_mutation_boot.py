"""The pytest plugin of mutation_server.py's kit runs (copied as ``rheo_mutation_boot``).

Loaded with ``-p rheo_mutation_boot`` in every kit run: Hypothesis derandomized and
without its database, a check that rheo_flow comes from the worker's copy, the
stateful test in or out, the cases that killed the most mutants first, and two
things for choosing cases:

* ``RHEO_MUT_TRACE=<file>``: record which server-side code each case runs (the
  SQL text every asyncpg and sqlite3 connection is given, the Redis scripts called,
  whether it makes a key-ordered group) and write it to ``<file>`` as JSON
  ``{"texts": [...], "cases": {case: [index]}}``.
* ``RHEO_MUT_SELECT=<file>``: run only the cases named in that JSON list.
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("rheo-mutation", database=None, derandomize=True)
settings.load_profile("rheo-mutation")

_expected = Path(os.environ["RHEO_MUT_EXPECT"]).resolve()
_origin = Path(importlib.util.find_spec("rheo_flow").origin).resolve()
if _expected not in _origin.parents:
    print(f"RHEO-MUTATION: rheo_flow would be imported from {_origin}, not from {_expected}",
          file=sys.__stderr__, flush=True)
    os._exit(97)

_TRACE = os.environ.get("RHEO_MUT_TRACE", "")
_current: list[str] = []
_texts: dict[str, int] = {}
_seen: dict[str, set[int]] = {}


def _note(text: str) -> None:
    if _current:
        index = _texts.setdefault(text, len(_texts))
        _seen.setdefault(_current[-1], set()).add(index)


def _trace_asyncpg() -> None:
    try:
        from asyncpg.connection import Connection
    except ImportError:
        return
    # Every statement asyncpg prepares goes through _get_statement; execute without
    # arguments sends its text as a simple query.
    for name in ("_get_statement", "execute"):
        original = getattr(Connection, name)

        def traced(self, query, *args, _original=original, **kwargs):
            _note("pg:" + query)
            return _original(self, query, *args, **kwargs)

        setattr(Connection, name, traced)


def _trace_redis() -> None:
    try:
        from rheo_flow._backends.redis._scripts import ScriptRunner
    except ImportError:
        return
    original = ScriptRunner.run

    async def run(self, calls, **kwargs):
        for call in calls:
            _note("lua:" + call[0])
        return await original(self, calls, **kwargs)

    ScriptRunner.run = run


def _trace_sqlite() -> None:
    # Connections made by sqlite3.connect get a factory whose execute methods, and
    # those of its cursors, note the statement first.
    import sqlite3

    def traced(cls):
        class Traced(cls):
            def execute(self, sql, *args):
                _note("sqlite:" + sql)
                return super().execute(sql, *args)

            def executemany(self, sql, *args):
                _note("sqlite:" + sql)
                return super().executemany(sql, *args)

            def executescript(self, sql):
                _note("sqlite:" + sql)
                return super().executescript(sql)

        return Traced

    TracedCursor = traced(sqlite3.Cursor)

    class TracedConnection(traced(sqlite3.Connection)):
        def cursor(self, factory=TracedCursor):
            return super().cursor(factory)

    connect = sqlite3.connect

    def traced_connect(*args, **kwargs):
        kwargs.setdefault("factory", TracedConnection)
        return connect(*args, **kwargs)

    sqlite3.connect = traced_connect


def _trace_ordering() -> None:
    # fetch_scan and release_keys run only for key-ordered groups, which only
    # Rheo.create_group(ordering="key") makes (a fetch creates unordered groups).
    from rheo_flow._rheo import Rheo

    original = Rheo.create_group

    async def create_group(self, *args, **kwargs):
        if kwargs.get("ordering") == "key":
            _note("group:key")
        return await original(self, *args, **kwargs)

    Rheo.create_group = create_group


if _TRACE:
    _trace_sqlite()
    _trace_asyncpg()
    _trace_redis()
    _trace_ordering()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _current.append(getattr(item, "originalname", item.name))
    try:
        yield
    finally:
        _current.pop()


def pytest_sessionfinish(session, exitstatus):
    if _TRACE:
        texts = sorted(_texts, key=_texts.__getitem__)
        Path(_TRACE).write_text(json.dumps(
            {"texts": texts, "cases": {k: sorted(v) for k, v in _seen.items()}}))


def pytest_collection_modifyitems(session, config, items):
    only = os.environ.get("RHEO_MUT_ONLY", "")
    stateful = os.environ.get("RHEO_MUT_STATEFUL") == "1"
    select = os.environ.get("RHEO_MUT_SELECT", "")
    chosen = set(json.loads(Path(select).read_text())) if select else None
    keep, drop = [], []
    for item in items:
        name = getattr(item, "originalname", item.name)
        is_stateful = item.name.startswith("test_stateful_model")
        if only == "stateful":
            (keep if is_stateful else drop).append(item)
        elif (not stateful) if is_stateful else (chosen is not None and name not in chosen):
            drop.append(item)
        else:
            keep.append(item)
    order = os.environ.get("RHEO_MUT_ORDER")
    if order and Path(order).exists():
        kills = json.loads(Path(order).read_text())
        keep.sort(key=lambda it: (it.name.startswith("test_stateful_model"),
                                  -kills.get(getattr(it, "originalname", it.name), 0)))
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
