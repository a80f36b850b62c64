"""Backend URLs: every secret form is masked in reprs, errors, logs and CLI output,
and a malformed host or port is InvalidArgument on every server backend."""

from __future__ import annotations

import logging
import re

import pytest
from typer.testing import CliRunner

from rheo_flow import BackendUnavailable, InvalidArgument, Rheo, RheoError
from rheo_flow._backends._urls import check_hosts, redact_url, scrub_secrets, url_secrets
from rheo_flow._cli._app import app
from rheo_flow.backends import MongoBackend, PostgresBackend, RedisBackend

SECRET = "S3CR3T"

# A server that refuses at once (port 1), per backend; MongoDB gives up selecting quickly.
UNREACHABLE = {
    "postgres": ("postgresql://app{userinfo}@127.0.0.1:1/db", ""),
    "redis": ("redis://{userinfo}@127.0.0.1:1/0", ""),
    "mongo": ("mongodb://app{userinfo}@127.0.0.1:1/db", "serverSelectionTimeoutMS=200"),
}

# How a secret can travel in a URL: the user-info password, and the query options
# that name one (libpq, redis-py, PyMongo and the usual spellings), as written or
# percent-encoded.
FORMS = {
    "userinfo": (f":{SECRET}", ""),
    "password": ("", f"password={SECRET}"),
    "password-encoded": ("", "password=S3%43R3T"),
    "pass": ("", f"pass={SECRET}"),
    "pwd": ("", f"pwd={SECRET}"),
    "secret": ("", f"secret={SECRET}"),
    "token": ("", f"token={SECRET}"),
    "sslpassword": ("", f"sslpassword={SECRET}"),
    "tls-key-password": ("", f"tlsCertificateKeyFilePassword={SECRET}"),
    "auth-mechanism-properties": ("", f"authMechanismProperties=AWS_SESSION_TOKEN:{SECRET}"),
    "mixed-case": ("", f"PassWord={SECRET}"),
}


def _url(backend: str, form: str) -> str:
    template, extra = UNREACHABLE[backend]
    userinfo, query = FORMS[form]
    if backend == "redis" and not userinfo:
        template = template.replace("{userinfo}@", "")
    url = template.format(userinfo=userinfo)
    options = "&".join(o for o in (extra, query) if o)
    return f"{url}?{options}" if options else url


def _messages(exc: BaseException) -> str:
    """An error's message and every error chained to it (what a traceback shows)."""
    texts = []
    current: BaseException | None = exc
    while current is not None:
        texts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return "\n".join(texts)


@pytest.mark.filterwarnings("ignore:Unknown option:UserWarning")  # PyMongo, naming no value
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("backend", UNREACHABLE)
async def test_no_secret_in_repr_open_errors_or_logs(
    backend: str, form: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = _url(backend, form)
    caplog.set_level(logging.DEBUG)
    said: list[str] = []
    try:
        rheo = Rheo(url)
    except InvalidArgument as exc:  # a driver that refuses the option up front
        said.append(_messages(exc))
    else:
        said += [repr(rheo.backend), str(rheo.backend)]
        with pytest.raises((BackendUnavailable, InvalidArgument)) as info:
            await rheo.open()
        said.append(_messages(info.value))
        await rheo.close()
    said.append(caplog.text)
    text = "\n".join(said)
    assert SECRET not in text
    assert "***" in text


@pytest.mark.parametrize(
    ("build", "url"),
    [
        (PostgresBackend.from_url, f"postgresql://u@127.0.0.1:1/db?password={SECRET}"),
        (RedisBackend.from_url, f"redis://127.0.0.1:1/0?password={SECRET}"),
        (MongoBackend.from_url, f"mongodb://u:p@127.0.0.1:1/db?token={SECRET}"),
    ],
    ids=["postgres", "redis", "mongo"],
)
def test_backend_reprs_never_show_a_query_secret(build: object, url: str) -> None:
    backend = build(url)  # type: ignore[operator]
    assert SECRET not in repr(backend)


async def test_postgres_migrate_error_hides_a_query_password() -> None:
    from rheo_flow._backends.postgres import migrate

    with pytest.raises(BackendUnavailable) as info:
        await migrate(f"postgresql://u@127.0.0.1:1/db?password={SECRET}")
    assert SECRET not in _messages(info.value)
    assert "password=***" in str(info.value)


CLI_COMMANDS = [["streams"], ["groups", "s"], ["lag", "s"], ["lag", "s", "g"],
                ["dead-letters", "s", "g"], ["tail", "s"], ["trim", "s", "--yes"],
                ["delete-stream", "s", "--yes"], ["migrate"]]


@pytest.mark.filterwarnings("ignore:Unknown option:UserWarning")
@pytest.mark.parametrize("command", CLI_COMMANDS, ids=lambda c: "-".join(c))
@pytest.mark.parametrize("form", ["userinfo", "password", "sslpassword", "token"])
@pytest.mark.parametrize("backend", UNREACHABLE)
def test_cli_errors_never_print_a_secret(backend: str, form: str, command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--url", _url(backend, form)])
    assert result.exit_code == 1, result.output
    assert SECRET not in result.output
    assert "***" in result.output


def test_cli_heading_masks_a_query_password(postgres_schema_url: str) -> None:
    """A reachable server (trust authentication ignores the password): the table title."""
    url = f"{postgres_schema_url}&password={SECRET}"
    result = CliRunner().invoke(app, ["migrate", "--url", url])
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output
    result = CliRunner().invoke(app, ["streams", "--url", url])
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output
    assert "password=***" in "".join(result.output.split())  # the title may wrap


# redact_url and friends ---------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("postgresql://u:pw@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u@h/db?password=pw&sslmode=require",
         "postgresql://u@h/db?password=***&sslmode=require"),
        ("postgresql://u@h/db?sslpassword=pw", "postgresql://u@h/db?sslpassword=***"),
        ("redis://h/0?password=pw&prefix=x", "redis://h/0?password=***&prefix=x"),
        ("mongodb://u:pw@h1:1,h2:2/db?authSource=admin&tlsCertificateKeyFilePassword=pw",
         "mongodb://u:***@h1:1,h2:2/db?authSource=admin&tlsCertificateKeyFilePassword=***"),
        ("mongodb://h/db?authMechanismProperties=AWS_SESSION_TOKEN:tok;w=1",
         "mongodb://h/db?authMechanismProperties=***;w=1"),
        ("postgresql://u@h/db?pass%77ord=pw", "postgresql://u@h/db?pass%77ord=***"),
        ("postgresql://u@h/db?password=pw#top", "postgresql://u@h/db?password=***#top"),
        ("postgresql://u:pw@[::1/db?token=t", "postgresql://u:***@[::1/db?token=***"),
        ("redis://h/0?password=", "redis://h/0?password="),
        ("sqlite:///events.db?synchronous=normal", "sqlite:///events.db?synchronous=normal"),
        ("memory://", "memory://"),
    ],
)
def test_redact_url(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted


def test_url_secrets_and_scrub_cover_encoded_forms() -> None:
    url = "postgresql://u:p%40ss@h/db?password=a+b&authSource=admin"
    assert set(url_secrets(url)) >= {"p%40ss", "p@ss", "a+b", "a b"}
    assert "admin" not in url_secrets(url)
    text = "driver said: p@ss, then a b and p%40ss"
    assert scrub_secrets(text, url) == "driver said: ***, then *** and ***"
    assert scrub_secrets(text, None) == text


# Malformed hosts and ports -----------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://u@127.0.0.1:abc/db", r"port 'abc' of '127\.0\.0\.1' must be a number"),
        ("postgresql://u@[::1/db", r"'\[::1' is not a valid bracketed IPv6 address"),
        ("postgresql://u@[::zz]:5432/db", "is not a valid bracketed IPv6 address"),
        ("postgresql://u@127.0.0.1:99999/db", "port '99999'"),
        ("postgresql://u@::1:5432/db", "write an IPv6 address in brackets"),
        ("mongodb://127.0.0.1:abc/db", "port 'abc'"),
        ("mongodb://[::1/db", "not a valid bracketed IPv6 address"),
        ("mongodb://h1:27017,h2:x/db", "port 'x' of 'h2'"),
        ("redis://127.0.0.1:abc/0", "port 'abc'"),
        ("redis://[::1/0", "not a valid bracketed IPv6 address"),
    ],
)
def test_malformed_hosts_are_invalid_arguments(url: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Rheo(url)


@pytest.mark.parametrize(
    ("build", "scheme"),
    [(lambda u: PostgresBackend(url=u), "postgresql"), (PostgresBackend.from_url, "postgresql"),
     (MongoBackend, "mongodb"), (MongoBackend.from_url, "mongodb")],
    ids=["postgres", "postgres-from-url", "mongo", "mongo-from-url"],
)
@pytest.mark.parametrize("host", ["127.0.0.1:port", "[::1"])
def test_backend_constructors_check_hosts(build: object, scheme: str, host: str) -> None:
    with pytest.raises(InvalidArgument, match=r"invalid (PostgreSQL|MongoDB) URL") as info:
        build(f"{scheme}://u:{SECRET}@{host}/db")  # type: ignore[operator]
    assert SECRET not in str(info.value)


@pytest.mark.parametrize(
    "url",
    ["postgresql://u@[::1]:5432/db", "postgresql://u@h1:5432,h2:5433/db",
     "postgresql:///db?host=/run/postgresql", "postgresql://u@h:/db", "mongodb://h1,h2:27017/db",
     "mongodb://[fe80::1%25eth0]:27017/db", "redis://localhost", "redis://[::1]:6379/0"],
)
def test_well_formed_hosts_pass(url: str) -> None:
    check_hosts(url, "X")


def test_secret_not_in_host_errors() -> None:
    with pytest.raises(RheoError) as info:
        Rheo(f"postgresql://u:{SECRET}@h:port/db?password={SECRET}")
    assert SECRET not in str(info.value)
    assert re.search(r"u:\*\*\*@h:port/db\?password=\*\*\*", str(info.value))
