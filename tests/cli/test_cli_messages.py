"""``rheo-flow`` messages as a user meets them: unknown names, append's input, an empty tail.

Each test runs on SQLite and on PostgreSQL (a scratch schema, dropped afterwards),
through the CLI as a user runs it (typer's runner; a pseudo-terminal for the hint).
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from rheo_flow._cli._app import app

runner = CliRunner()
DEADLINE_S = 20.0


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store with stream ``orders`` (2 partitions) and its group ``billing``."""
    if request.param == "sqlite":
        target = f"sqlite:///{tmp_path / 'messages.db'}"
    else:
        target = request.getfixturevalue("postgres_schema_url")
    for args in (["migrate"], ["create-stream", "orders", "--partitions", "2"],
                 ["create-group", "orders", "billing"]):
        result = runner.invoke(app, [*args, "--url", target])
        assert result.exit_code == 0, result.output
    return target


def _fails(url: str, args: list[str], stdin: str | None = None) -> str:
    result = runner.invoke(app, [*args, "--url", url], input=stdin)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    return " ".join(result.output.split())


@pytest.mark.parametrize("args", [
    ["lag", "ordres"], ["groups", "ordres"], ["tail", "ordres"], ["dead-letters", "ordres", "g"],
    ["trim", "ordres", "--up-to", "1", "--yes"], ["top", "ordres"]], ids=lambda a: a[0])
def test_an_unknown_stream_suggests_the_close_name_and_the_command(url: str,
                                                                   args: list[str]) -> None:
    text = _fails(url, args)
    assert ("error: unknown stream 'ordres'; did you mean 'orders'? "
            "(to create it: rheo-flow create-stream ordres)") in text
    assert "create_stream()" not in text


def test_an_unknown_stream_without_a_close_name_names_only_the_command(url: str) -> None:
    text = _fails(url, ["lag", "zzz"])
    assert "error: unknown stream 'zzz' (to create it: rheo-flow create-stream zzz)" in text
    assert "did you mean" not in text


@pytest.mark.parametrize("args", [
    ["lag", "orders", "biling"], ["dead-letters", "orders", "biling"],
    ["tail", "orders", "--group", "biling"], ["pause", "orders", "biling"],
    ["redrive", "orders", "biling", "--yes"]], ids=lambda a: a[0])
def test_an_unknown_group_suggests_the_close_name_and_the_command(url: str,
                                                                  args: list[str]) -> None:
    text = _fails(url, args)
    assert ("error: unknown group 'biling' on stream 'orders'; did you mean 'billing'? "
            "(to create it: rheo-flow create-group orders biling)") in text


def test_append_to_an_unknown_stream_suggests_create(url: str) -> None:
    text = _fails(url, ["append", "order"], '{"type": "placed"}\n')
    assert "unknown stream 'order'; did you mean 'orders'?" in text
    assert "rerun with --create" in text
    result = runner.invoke(app, ["append", "newstream", "--create", "--url", url],
                           input='{"type": "placed"}\n')
    assert result.exit_code == 0, result.output


def test_the_library_message_stays_pythonic() -> None:
    from rheo_flow import UnknownStream

    assert str(UnknownStream("x")) == "unknown stream 'x': create it with create_stream() first"


@pytest.mark.parametrize(("stdin", "message"), [
    ('{"type": "a"}\n{"data": 1}\n', "line 2: an event needs a 'type': {\"data\": 1}"),
    ('{"type": "a"}\n\n{"type": "a", "extra": 5}\n',
     "line 3: unknown event fields: extra: {\"type\": \"a\", \"extra\": 5}"),
    ('{"type": "a"}\nnot json\n', "line 2: not JSON"),
    ('[1, 2]\n', "line 1: not a JSON object: [1, 2]"),
    ('{"type": "a", "partition": 7}\n', "line 1: partition"),
], ids=["no-type", "extra-field", "not-json", "not-object", "bad-partition"])
def test_append_names_the_faulty_line_and_appends_nothing(url: str, stdin: str,
                                                          message: str) -> None:
    assert message in _fails(url, ["append", "orders"], stdin)
    result = runner.invoke(app, ["tail", "orders", "--json", "--url", url])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""


def test_append_quotes_an_excerpt_of_a_long_line(url: str) -> None:
    line = orjson.dumps({"data": "x" * 500}).decode()
    text = _fails(url, ["append", "orders"], line + "\n")
    assert "line 1: an event needs a 'type': {\"data\":\"xxx" in text
    assert "x" * 100 not in text


@pytest.mark.parametrize("stdin", ["", "\n  \n"], ids=["empty", "blank"])
@pytest.mark.parametrize("json", [False, True], ids=["table", "json"])
def test_append_of_no_event_says_so_and_exits_0(url: str, stdin: str, json: bool) -> None:
    result = runner.invoke(app, ["append", "orders", "--url", url, *(["--json"] * json)],
                           input=stdin)
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert "nothing appended to orders: no event on stdin" in result.stderr


def test_append_of_no_event_to_an_unknown_stream_is_an_error(url: str) -> None:
    assert "unknown stream 'ordres'" in _fails(url, ["append", "ordres"], "")


def test_append_on_a_terminal_hints_what_to_type(url: str) -> None:
    controller, terminal = pty.openpty()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with subprocess.Popen([sys.executable, "-m", "rheo_flow", "append", "orders", "--json",
                           "--url", url], stdin=terminal, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env) as proc:
        os.close(terminal)
        try:
            assert proc.stderr is not None
            deadline = time.monotonic() + DEADLINE_S
            seen = b""
            while b"Ctrl-D" not in seen:
                assert time.monotonic() < deadline, f"no hint on stderr: {seen!r}"
                ready, _, _ = select.select([proc.stderr], [], [], 0.1)
                if ready:
                    seen += os.read(proc.stderr.fileno(), 4096)
            os.write(controller, b'{"type": "placed"}\n\x04')
            out, err = proc.communicate(timeout=DEADLINE_S)
        finally:
            os.close(controller)
    assert proc.returncode == 0, err
    assert b"type one JSON event per line" in seen
    assert orjson.loads(out.splitlines()[-1])["stream"] == "orders"


def test_tail_of_a_group_with_nothing_pending_says_so(url: str) -> None:
    result = runner.invoke(app, ["tail", "orders", "--group", "billing", "--url", url])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert "nothing pending: billing has settled every event of orders" in result.stderr
    result = runner.invoke(app, ["tail", "orders", "--url", url])
    assert result.exit_code == 0, result.output
    assert "orders has no events" in result.stderr


def test_tail_json_with_nothing_pending_prints_nothing(url: str) -> None:
    for args in (["--group", "billing"], []):
        result = runner.invoke(app, ["tail", "orders", "--json", *args, "--url", url])
        assert result.exit_code == 0, result.output
        assert result.output == ""


def test_tail_of_a_group_prints_its_pending_events_and_no_note(url: str) -> None:
    result = runner.invoke(app, ["append", "orders", "--url", url], input='{"type": "placed"}\n')
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["tail", "orders", "--group", "billing", "--url", url])
    assert result.exit_code == 0, result.output
    assert "placed" in result.stdout
    assert "nothing pending" not in result.output
