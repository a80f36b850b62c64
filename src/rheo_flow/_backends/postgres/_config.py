"""The PostgreSQL backend's options: their checks, and a URL split into them.

A ``postgresql://`` URL carries the backend's own options in its query string
(:data:`URL_OPTIONS`); :func:`split_url` takes them out and leaves the rest of
the URL for asyncpg.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..._model._errors import InvalidArgument
from .._guard import check_timeout_ms
from .._urls import check_hosts, redact_url, url_flag
from ._sql import SCHEMA_NAME

__all__ = ["DEFAULT_SCHEMA", "POOLERS", "URL_OPTIONS", "channel", "check_listen_url",
           "check_pooler", "check_schema", "check_size", "split_url"]

DEFAULT_SCHEMA: Final = "rheo_flow"
"""The schema used when neither the URL nor the constructor names one."""

URL_OPTIONS: Final = ("schema", "pool_min_size", "pool_max_size", "listen", "migrate",
                      "timeout_ms", "pooler", "listen_url")
"""The query options a URL gives the backend; every other one is passed on to asyncpg."""


def check_schema(schema: object) -> str:
    """A validated schema name (it is formatted into statements, quoted)."""
    if not isinstance(schema, str) or not SCHEMA_NAME.fullmatch(schema):
        raise InvalidArgument(
            f"invalid PostgreSQL schema name {schema!r}: use 1-48 characters of "
            "A-Z a-z 0-9 _ starting with a letter or underscore"
        )
    return schema


POOLERS: Final = ("none", "transaction")
"""What stands between the backend and PostgreSQL: nothing (``"none"``, the default), or a
proxy pooling server connections per transaction (``"transaction"``: PgBouncer's
``pool_mode = transaction``, and the like)."""


def check_pooler(pooler: object) -> str | None:
    """``"transaction"``, or None for a direct connection (``None`` or ``"none"``)."""
    if pooler is None or pooler == "none":
        return None
    if pooler == "transaction":
        return "transaction"
    raise InvalidArgument(
        f"pooler must be one of {', '.join(POOLERS)}, got {redact_url(str(pooler))!r}"
    )


def check_listen_url(url: object) -> str | None:
    """The asyncpg URL of ``listen_url`` (a ``postgresql://`` URL of the server itself, for
    LISTEN), without the backend's own options it may carry; or None."""
    if url is None:
        return None
    if not isinstance(url, str) or url.split("://", 1)[0].lower() not in (
        "postgresql", "postgres"
    ):
        raise InvalidArgument(
            f"listen_url must be a postgresql:// URL, got {redact_url(str(url))!r}"
        )
    return split_url(url)[0]


def check_size(name: str, value: object, minimum: int) -> int:
    """A validated pool size: an integer of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgument(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def channel(schema: str) -> str:
    """The ``NOTIFY`` channel of the appends to ``schema``'s streams."""
    return f"rheo_flow.{schema}"


def split_url(url: str) -> tuple[str, dict[str, Any]]:
    """A ``postgresql://`` / ``postgres://`` URL as (the URL for asyncpg, the backend's options)."""
    if not isinstance(url, str) or url.split("://", 1)[0].lower() not in (
        "postgresql", "postgres"
    ):
        raise InvalidArgument(
            f"not a PostgreSQL URL: {redact_url(str(url))!r} (expected postgresql://...)"
        )
    check_hosts(url, "PostgreSQL")
    parts = urlsplit(url)
    options: dict[str, Any] = {}
    passed: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key not in URL_OPTIONS:
            passed.append((key, value))
        elif key in ("pool_min_size", "pool_max_size"):
            if not value.isdigit():
                raise InvalidArgument(f"URL option {key} must be an integer, got {value!r}")
            options[key] = int(value)
        elif key in ("listen", "migrate"):
            options[key] = url_flag(key, value)
        elif key == "timeout_ms":
            options[key] = check_timeout_ms(value)
        else:
            options[key] = value
    return urlunsplit(parts._replace(query=urlencode(passed))), options
