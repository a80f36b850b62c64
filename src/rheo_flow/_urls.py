"""Building a backend from a URL, and keeping secrets out of messages."""

from __future__ import annotations

import importlib
from urllib.parse import urlsplit, urlunsplit

from ._backend import Backend
from ._errors import InvalidArgument, MissingExtra

__all__ = ["backend_from_url", "redact_url"]

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
    "mongodb": ("MongoDB", "mongo", "pymongo", "rheo_flow._backends.mongo:MongoBackend.from_url"),
    "mongodb+srv": ("MongoDB", "mongo", "pymongo",
                    "rheo_flow._backends.mongo:MongoBackend.from_url"),
}


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe for logs and errors)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def require_driver(backend: str, extra: str, module: str) -> None:
    """Raise :class:`MissingExtra` naming the extra when a driver is not installed."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise MissingExtra(backend, extra, module) from None


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
