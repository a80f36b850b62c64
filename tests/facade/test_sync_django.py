"""Django's own connection (``django.db.connection``) as ``connection=`` of the
synchronous client (docs/outbox.md, "Synchronous code"), on SQLite (Django's
``sqlite3`` backend) and PostgreSQL (its ``postgresql`` backend on psycopg 3), inside
``transaction.atomic()``. Django's settings are per process: each case runs a script
in a process of its own, which prints what it found; the test checks those lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytest.importorskip("django")

SRC = Path(__file__).resolve().parents[2] / "src"

_SCENARIO = textwrap.dedent('''
    import asyncio, json, sys
    import django
    from django.conf import settings

    settings.configure(DATABASES={"default": json.loads(sys.argv[1])})
    django.setup()
    from django.db import connection, transaction

    from rheo_flow import InvalidArgument, NewEvent, Rheo as AsyncRheo
    from rheo_flow.sync import Rheo

    table = sys.argv[3]
    events = Rheo.open(sys.argv[2])
    events.create_stream("orders")
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {table} (id int)")


    def order(n, fail=False):
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(f"INSERT INTO {table} VALUES (%s)", [n])
            [event] = events.append("orders", NewEvent("order.placed", {"n": n}, id=f"o{n}"),
                                    connection=connection)
            if fail:
                raise RuntimeError("undo")
        return event.sequence


    print("committed", order(1))
    try:
        order(2, fail=True)
    except RuntimeError:
        print("rolled back")
    print("next", order(3))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {table} ORDER BY id")
        print("rows", [r[0] for r in cursor.fetchall()])
    print("high", json.dumps(events.stream_info("orders").high_water))
    try:
        with transaction.atomic():
            asyncio.run(events.rheo.append("orders", NewEvent("x", {}), connection=connection))
    except InvalidArgument as exc:
        print("async", "rheo_flow.sync.Rheo" in str(exc))
    events.close()
''')


def _run(database: dict[str, str], url: str, table: str, cwd: Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SRC), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _SCENARIO, json.dumps(database), url, table],
                         cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


_EXPECTED = ["committed 1", "rolled back", "next 2", "rows [1, 3]",
             'high {"0": 2}', "async True"]
"""A committed order's event takes sequence 1; the rolled-back one leaves neither its row
nor a sequence (the next takes 2); the async client refuses Django's connection."""


def test_django_on_sqlite_commits_and_rolls_back_with_the_view(tmp_path: Path) -> None:
    path = tmp_path / "shop.db"
    lines = _run({"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)},
                 f"sqlite:///{path}", "orders", tmp_path)
    assert lines == _EXPECTED


def test_django_on_postgresql_commits_and_rolls_back_with_the_view(
        postgres_url: str, postgres_schema: str, postgres_schema_url: str,
        tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    parts = urlsplit(postgres_url)
    database = {"ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/"),
                "USER": parts.username or "", "PASSWORD": parts.password or "",
                "HOST": parts.hostname or "", "PORT": str(parts.port or 5432)}
    lines = _run(database, postgres_schema_url, f'"{postgres_schema}".orders', tmp_path)
    assert lines == _EXPECTED


def test_a_django_connection_to_another_vendor_is_refused(tmp_path: Path) -> None:
    script = textwrap.dedent('''
        import django
        from django.conf import settings
        settings.configure(DATABASES={"default": {"ENGINE": "django.db.backends.dummy"}})
        django.setup()
        from django.db import connection
        from rheo_flow import InvalidArgument, NewEvent
        from rheo_flow.sync import Rheo
        with Rheo("sqlite:///x.db") as events:
            events.create_stream("orders")
            try:
                events.append("orders", NewEvent("t", {}), connection=connection)
            except InvalidArgument as exc:
                print(exc)
    ''')
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "a Django connection to unknown is not supported" in out.stdout
