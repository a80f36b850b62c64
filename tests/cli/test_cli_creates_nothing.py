"""Commands of ``rheo-flow`` other than ``migrate`` never create a file or schema."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _pg_admin import fetch_value, schema_exists
from rheo_flow._cli._app import app

runner = CliRunner()

READS = [["streams"], ["groups", "s"], ["lag", "s"], ["dead-letters", "s", "g"], ["tail", "s"],
         ["top", "s"]]
CHANGES = [["delete-stream", "s", "--yes"], ["delete-group", "s", "g", "--yes"],
           ["trim", "s", "--up-to", "1", "--yes"], ["reset", "s", "g", "--to", "latest", "--yes"],
           ["replay", "s", "g", "--yes"], ["redrive", "s", "g", "--yes"]]
COMMANDS = READS + CHANGES


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
def test_sqlite_file_is_never_created(tmp_path: Path, args: list[str]) -> None:
    db = tmp_path / "typo.db"
    result = runner.invoke(app, [*args, "--url", f"sqlite:///{db}"])
    assert result.exit_code == 1, result.output
    assert "does not exist" in result.output
    assert "rheo-flow migrate" in result.output
    assert not db.exists()
    assert list(tmp_path.iterdir()) == []


def test_sqlite_append_creates_no_file(tmp_path: Path) -> None:
    db = tmp_path / "typo.db"
    result = runner.invoke(app, ["append", "s", "--create", "--url", f"sqlite:///{db}"],
                           input='{"type": "t"}\n')
    assert result.exit_code == 1, result.output
    assert not db.exists()


def test_unknown_stream_and_group_are_errors(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert runner.invoke(app, ["migrate", "--url", url]).exit_code == 0
    for args, message in ((["groups", "nope"], "unknown stream 'nope'"),
                          (["top", "nope"], "unknown stream 'nope'"),
                          (["tail", "nope"], "unknown stream 'nope'"),
                          (["dead-letters", "nope", "g"], "unknown stream 'nope'")):
        result = runner.invoke(app, [*args, "--url", url])
        assert result.exit_code == 1, result.output
        assert message in result.output


@pytest.fixture
def schemas(postgres_url: str) -> Iterator[list[str]]:
    """Unique schema names; any the test made are dropped afterwards."""
    names = [f"opcli_{uuid.uuid4().hex[:8]}_{i}" for i in range(2)]
    yield names
    for name in names:
        fetch_value(postgres_url, f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _with_schema(postgres_url: str, schema: str) -> str:
    return f"{postgres_url}{'&' if '?' in postgres_url else '?'}schema={schema}"


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
def test_postgres_schema_is_never_created(postgres_url: str, schemas: list[str],
                                          args: list[str]) -> None:
    result = runner.invoke(app, [*args, "--url", _with_schema(postgres_url, schemas[0])])
    assert result.exit_code == 1, result.output
    assert "holds no rheo_flow tables" in result.output
    assert not schema_exists(postgres_url, schemas[0])


def test_postgres_read_after_migrate_works(postgres_url: str, schemas: list[str]) -> None:
    url = _with_schema(postgres_url, schemas[0])
    assert runner.invoke(app, ["migrate", "--url", url]).exit_code == 0
    result = runner.invoke(app, ["streams", "--json", "--url", url])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""


def test_migrate_refuses_two_different_schemas(postgres_url: str, schemas: list[str]) -> None:
    url = _with_schema(postgres_url, schemas[0])
    result = runner.invoke(app, ["migrate", "--url", url, "--schema", schemas[1]])
    assert result.exit_code == 1, result.output
    assert "give one" in result.output
    assert not schema_exists(postgres_url, schemas[0])
    assert not schema_exists(postgres_url, schemas[1])
    # The same schema twice is no conflict; --schema alone picks the schema.
    result = runner.invoke(app, ["migrate", "--url", url, "--schema", schemas[0]])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["migrate", "--url", postgres_url, "--schema", schemas[1]])
    assert result.exit_code == 0, result.output
    assert schemas[1] in result.stdout
    assert schema_exists(postgres_url, schemas[1])


def test_existing_url_spelling() -> None:
    from rheo_flow._cli._common import existing

    assert existing("sqlite:///x.db") == "sqlite:///x.db?migrate=false"
    assert (existing("postgresql://u:p%40ss@h/db?schema=a&migrate=true&x=%2F")
            == "postgresql://u:p%40ss@h/db?schema=a&x=%2F&migrate=false")
    assert existing("redis://h:6379/0") == "redis://h:6379/0"
