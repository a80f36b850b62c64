"""Connecting: the URL or host client a backend uses, the client it builds, what the server offers.

A backend is built from a ``mongodb://`` URL (it then owns an ``AsyncMongoClient``)
or around a host's PyMongo ``AsyncMongoClient`` or Motor ``AsyncIOMotorClient``.
The two client libraries agree on most calls; :func:`resolve` covers the ones
where they do not.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from pymongo import errors as mongo_errors

from ..._model._errors import BackendUnavailable, InvalidArgument
from .._guard import masked_cause
from .._urls import check_hosts, redact_url
from ._errors import AUTH_CODES

__all__ = [
    "DEFAULT_DATABASE",
    "check_client",
    "check_url",
    "database_name",
    "greet",
    "make_client",
    "resolve",
    "split_url_options",
    "supports_transactions",
]

DEFAULT_DATABASE: Final = "rheo"
URL_OPTIONS: Final = ("collection_prefix", "timeout_ms")
"""Query options of a backend URL that are rheo-flow's, not PyMongo's."""
_DATABASE_PATTERN: Final = re.compile(r"^[A-Za-z0-9_\-]{1,63}$")
_CLIENT_TIMEOUTS: Final = ("serverSelectionTimeoutMS", "connectTimeoutMS", "socketTimeoutMS")


async def resolve(value: Any) -> Any:
    """Await ``value`` when it is awaitable.

    PyMongo's async API and Motor agree on most calls but not on all: e.g.
    ``watch``, ``start_session`` and ``start_transaction`` are coroutines in one
    and plain calls in the other. Calls made through this helper work with both.
    """
    if inspect.isawaitable(value):
        return await value
    return value


def check_url(url: object) -> None:
    """Refuse anything but a ``mongodb://`` or ``mongodb+srv://`` URL naming a host."""
    if not isinstance(url, str) or not url.lower().startswith(("mongodb://", "mongodb+srv://")):
        raise InvalidArgument(
            f"not a MongoDB URL: {redact_url(str(url))!r} "
            "(expected mongodb://host/database or mongodb+srv://...)"
        )
    if not url.lower().startswith("mongodb+srv://"):
        check_hosts(url, "MongoDB")
    if not urlsplit(url).netloc.rsplit("@", 1)[-1]:
        raise InvalidArgument(f"MongoDB URL {redact_url(url)!r} names no host")


def check_client(client: object) -> None:
    """Refuse a host client that is not a PyMongo or Motor client."""
    if not callable(getattr(client, "get_database", None)):
        raise InvalidArgument(
            "client must be a pymongo AsyncMongoClient or a motor AsyncIOMotorClient, "
            f"got {type(client).__name__}"
        )


def database_name(database: object, url: str | None) -> str | None:
    """The database named by ``database``, else by the URL's path (``None``: the client's).

    A URL without a path names ``rheo``; with a host client and no ``database``
    the client's default database is used (known once the backend binds).
    """
    if database is None and url is not None:
        database = urlsplit(url).path.lstrip("/") or DEFAULT_DATABASE
    if database is not None and (
        not isinstance(database, str) or not _DATABASE_PATTERN.match(database)
    ):
        raise InvalidArgument(
            f"MongoDB database name must be 1-63 characters from [A-Za-z0-9_-], "
            f"got {database!r}"
        )
    return database


def split_url_options(url: object) -> tuple[str, dict[str, str]]:
    """A backend URL as the URL to give PyMongo and rheo-flow's own options (:data:`URL_OPTIONS`).

    PyMongo's options pass through as written (no decoding and re-encoding).
    """
    if not isinstance(url, str):
        raise InvalidArgument(f"not a MongoDB URL: {url!r}")
    if not url.lower().startswith("mongodb+srv://"):
        check_hosts(url, "MongoDB")
    parts = urlsplit(url)
    ours: dict[str, str] = {}
    theirs: list[str] = []
    for item in parts.query.split("&") if parts.query else []:
        parsed = parse_qsl(item, keep_blank_values=True)
        if parsed and parsed[0][0] in URL_OPTIONS:
            ours[parsed[0][0]] = parsed[0][1]
        else:
            theirs.append(item)
    return urlunsplit(parts._replace(query="&".join(theirs))), ours


def make_client(url: str, timeout_ms: int, scrub: Callable[[str], str]) -> Any:
    """An ``AsyncMongoClient`` for ``url``; ``timeout_ms`` is each timeout the URL leaves unset."""
    from pymongo import AsyncMongoClient

    lowered = url.lower()
    options: dict[str, Any] = {
        option: timeout_ms for option in _CLIENT_TIMEOUTS if option.lower() not in lowered
    }
    try:
        return AsyncMongoClient(url, **options)
    except (mongo_errors.ConfigurationError, ValueError) as exc:
        raise InvalidArgument(
            f"invalid MongoDB URL {redact_url(url)!r}: {scrub(str(exc))}"
        ) from None


async def greet(db: Any, where: str, scrub: Callable[[str], str]) -> dict[str, Any]:
    """The server's ``hello``; an unreachable server or refused credentials are unavailable."""
    # PyMongo's messages may quote the URL: the causes kept are masked copies.
    try:
        hello: dict[str, Any] = await db.command("hello")
    except (mongo_errors.ConnectionFailure, mongo_errors.ConfigurationError) as exc:
        raise BackendUnavailable(
            f"cannot reach MongoDB at {where}: {scrub(_first_error(exc))}"
        ) from masked_cause(exc, scrub)
    except mongo_errors.OperationFailure as exc:
        if exc.code in AUTH_CODES:
            raise BackendUnavailable(
                f"MongoDB at {where} refused the credentials: {scrub(str(exc))}"
            ) from masked_cause(exc, scrub)
        raise
    return hello


_TIMEOUTS_NOTE: Final = re.compile(r" \(configured timeouts: [^)]*\)")


def _first_error(exc: BaseException) -> str:
    """PyMongo's message without its topology description and timeout settings (the
    cause keeps them): what the first server said, in one short line."""
    text = str(exc).split(", Timeout: ", 1)[0]
    return _TIMEOUTS_NOTE.sub("", text).strip() or type(exc).__name__


def supports_transactions(hello: dict[str, Any]) -> bool:
    """Whether the server answering ``hello`` runs multi-document transactions.

    Replica set members and ``mongos`` routers with logical sessions do; a
    standalone server does not.
    """
    replicated = bool(hello.get("setName")) or hello.get("msg") == "isdbgrid"
    return replicated and hello.get("logicalSessionTimeoutMinutes") is not None
