"""Building a backend from a URL, and keeping secrets out of messages."""

from __future__ import annotations

import importlib
import ipaddress
import re
from typing import Final
from urllib.parse import quote, quote_plus, unquote, unquote_plus

from .._backend import Backend
from .._model._errors import BackendUnavailable, InvalidArgument, MissingExtra

__all__ = [
    "backend_from_url",
    "redact_url",
    "scrub_secrets",
    "split_url_option",
    "url_flag",
    "url_secrets",
]

# scheme -> (backend name, extra, driver module, "module:factory")
_SCHEMES: dict[str, tuple[str, str | None, str | None, str]] = {
    "memory": ("memory", None, None, "rheo_flow._backends.memory:MemoryBackend.from_url"),
    "sqlite": ("SQLite", None, None, "rheo_flow._backends.sqlite:SQLiteBackend.from_url"),
    "postgresql": ("PostgreSQL", "postgres", "asyncpg",
                   "rheo_flow._backends.postgres:PostgresBackend.from_url"),
    "postgres": ("PostgreSQL", "postgres", "asyncpg",
                 "rheo_flow._backends.postgres:PostgresBackend.from_url"),
    "redis": ("Redis", "redis", "redis", "rheo_flow._backends.redis:RedisBackend.from_url"),
    "rediss": ("Redis", "redis", "redis", "rheo_flow._backends.redis:RedisBackend.from_url"),
    "redis+cluster": ("Redis", "redis", "redis",
                      "rheo_flow._backends.redis:RedisBackend.from_url"),
    "rediss+cluster": ("Redis", "redis", "redis",
                       "rheo_flow._backends.redis:RedisBackend.from_url"),
    "mongodb": ("MongoDB", "mongo", "pymongo", "rheo_flow._backends.mongo:MongoBackend.from_url"),
    "mongodb+srv": ("MongoDB", "mongo", "pymongo",
                    "rheo_flow._backends.mongo:MongoBackend.from_url"),
}


_SECRET_KEYS: Final = ("pass", "pwd", "secret", "token", "credential", "apikey", "api_key",
                       "authmechanismproperties")
"""Query options whose value is a secret when their name contains one of these:
libpq ``password``/``sslpassword``, redis-py ``password``, PyMongo
``tlsCertificateKeyFilePassword`` and ``authMechanismProperties`` (it can carry
``AWS_SESSION_TOKEN``), and the usual ``pass``, ``pwd``, ``secret``, ``token`` spellings."""
_MASK: Final = "***"


def _split(url: str) -> tuple[str, str, str, str, str]:
    """(``scheme://``, userinfo, hosts, path, ``?query#fragment``) without validating anything.

    Hand-split rather than ``urlsplit``: a URL with a broken port or IPv6 host
    must still be redacted, and a MongoDB URL may name several hosts.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "", "", "", "", url
    end = len(rest)
    for mark in "/?#":
        found = rest.find(mark)
        if found != -1:
            end = min(end, found)
    netloc, tail = rest[:end], rest[end:]
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        userinfo, hosts = "", netloc
    path, query = tail, ""
    cut = min((i for i in (tail.find("?"), tail.find("#")) if i != -1), default=-1)
    if cut != -1:
        path, query = tail[:cut], tail[cut:]
    return scheme + sep, userinfo + at, hosts, path, query


def _is_secret(key: str) -> bool:
    name = unquote_plus(key).lower()
    return any(part in name for part in _SECRET_KEYS)


def url_flag(name: str, value: str) -> bool:
    """A boolean URL option (``true``/``false``, ``1``/``0``, ``on``/``off``, ``yes``/``no``)."""
    lowered = value.lower()
    if lowered in ("1", "true", "on", "yes"):
        return True
    if lowered in ("0", "false", "off", "no"):
        return False
    raise InvalidArgument(f"URL option {name} must be true or false, got {value!r}")


def url_secrets(url: str) -> list[str]:
    """Every secret a URL carries (as written and decoded), longest first."""
    if not isinstance(url, str):
        return []
    _, userinfo, _, _, query = _split(url)
    found: set[str] = set()
    _, colon, password = userinfo.removesuffix("@").partition(":")
    if colon and password:
        found.add(password)
    nested: list[str] = []
    for item in re.split(r"[&;]", query.removeprefix("?").split("#", 1)[0]):
        key, eq, value = item.partition("=")
        if eq and value and _is_secret(key):
            found.add(value)
        elif eq and "://" in unquote_plus(value):
            nested.extend(url_secrets(unquote_plus(value)))
    for value in list(found):
        found.update({unquote(value), unquote_plus(value), quote(unquote_plus(value), safe=""),
                      quote_plus(unquote_plus(value))})
    found.update(nested)
    return sorted((v for v in found if v), key=len, reverse=True)


def redact_url(url: str) -> str:
    """The URL with every secret replaced by ``***`` (safe for logs, errors and reprs).

    Masks the password of ``user:password@``, the value of every query option
    naming a password, passphrase, secret, token or credential, and the secrets of
    a URL given as an option's value (PostgreSQL's ``listen_url``).
    """
    if not isinstance(url, str):
        return "<not a url>"
    scheme, userinfo, hosts, path, query = _split(url)
    user, colon, password = userinfo.removesuffix("@").partition(":")
    if colon and password:
        userinfo = f"{user}:{_MASK}@"
    if query:
        query = re.sub(r"(?<=[?&;])([^&;=#]+)=([^&;#]*)", _redact_option, query)
    return f"{scheme}{userinfo}{hosts}{path}{query}"


def _redact_option(match: re.Match[str]) -> str:
    """One ``key=value`` of a query, its value masked when secret or redacted when a URL."""
    key, value = match[1], match[2]
    if value and _is_secret(key):
        return f"{key}={_MASK}"
    decoded = unquote_plus(value)
    if "://" not in decoded:
        return match[0]
    redacted = redact_url(decoded)
    if redacted == decoded:
        return match[0]
    return f"{key}={redacted if '://' in value else quote(redacted, safe='*')}"


def scrub_secrets(text: str, url: str | None) -> str:
    """``text`` with every secret of ``url`` replaced by ``***`` (for driver messages)."""
    if url:
        for secret in url_secrets(url):
            text = text.replace(secret, _MASK)
    return text


def unreachable(backend: str, url: str, exc: BaseException) -> BackendUnavailable:
    """The error for a server that could not be reached, with every secret of ``url`` masked."""
    return BackendUnavailable(
        f"cannot connect to {backend} at {redact_url(url)}: "
        f"{scrub_secrets(f'{type(exc).__name__}: {exc}', url)}"
    )


def check_hosts(url: str, backend: str) -> None:
    """Refuse a URL whose host list has a broken IPv6 literal or a port that is not 0-65535.

    Drivers raise a bare ``ValueError`` for these, some only when connecting.
    """
    _, _, hosts, _, _ = _split(url)
    for host in hosts.split(","):
        name, port = host, ""
        if host.startswith("["):
            inside, bracket, after = host[1:].partition("]")
            try:
                ipaddress.IPv6Address(inside.split("%", 1)[0])
            except ValueError:
                bracket = ""
            if not bracket or (after and not after.startswith(":")):
                raise InvalidArgument(
                    f"invalid {backend} URL {redact_url(url)!r}: "
                    f"{host!r} is not a valid bracketed IPv6 address"
                )
            port = after[1:]
        elif "]" in host or host.count(":") > 1:
            raise InvalidArgument(
                f"invalid {backend} URL {redact_url(url)!r}: {host!r} is not a valid host "
                "(write an IPv6 address in brackets: [::1]:5432)"
            )
        else:
            name, _, port = host.partition(":")
        if port and not (port.isascii() and port.isdigit() and int(port) <= 65535):
            raise InvalidArgument(
                f"invalid {backend} URL {redact_url(url)!r}: port {port!r} of {name!r} "
                "must be a number in 0..65535"
            )


def require_driver(backend: str, extra: str, module: str) -> None:
    """Raise :class:`MissingExtra` naming the extra when a driver is not installed."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise MissingExtra(backend, extra, module) from None


def split_url_option(url: str, name: str) -> tuple[str, str | None]:
    """``url`` without the query option ``name`` (one the backend does not read), and
    that option's value (``None`` when absent; the last one when repeated)."""
    base, mark, query = url.partition("?")
    if not mark:
        return url, None
    value: str | None = None
    kept = []
    for item in query.split("&"):
        key, _, found = item.partition("=")
        if key == name:
            value = found
        else:
            kept.append(item)
    return (f"{base}?{'&'.join(kept)}" if kept else base), value


def backend_from_url(url: str) -> Backend:
    """Build (but do not open) the backend a URL names."""
    if not isinstance(url, str) or "://" not in url:
        raise InvalidArgument(
            f"not a backend URL: {redact_url(str(url))!r} "
            "(expected memory://, sqlite:///path.db, postgresql://..., redis://..., mongodb://...)"
        )
    scheme = url.split("://", 1)[0].lower()
    entry = _SCHEMES.get(scheme)
    if entry is None:
        raise InvalidArgument(
            f"unknown backend scheme {scheme!r} in {redact_url(url)!r}; "
            f"known: {', '.join(sorted(_SCHEMES))}"
        )
    name, extra, driver, target = entry
    if scheme not in ("memory", "sqlite", "mongodb+srv"):
        check_hosts(url, name)
    if extra is not None and driver is not None:
        require_driver(name, extra, driver)
    module_name, attr = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise InvalidArgument(f"the {name} backend is not available in this version") from None
        raise
    obj: object = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    backend = obj(url)  # type: ignore[operator]
    if not isinstance(backend, Backend):
        raise TypeError(f"{target} did not build a Backend")
    return backend
