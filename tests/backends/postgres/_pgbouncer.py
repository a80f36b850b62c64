"""URLs through the PgBouncer test server (``RHEO_PGBOUNCER_URL``, see tests/conftest.py)."""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, urlsplit


def through_pgbouncer(pgbouncer: str, direct: str, schema: str | None = None) -> str:
    """``pgbouncer``'s URL on ``schema``, LISTENing over ``direct`` (the server itself)
    unless it names a ``listen_url`` already."""
    options = dict(parse_qsl(urlsplit(pgbouncer).query))
    extra = [] if schema is None else [f"schema={schema}"]
    if "listen_url" not in options:
        extra.append(f"listen_url={quote(direct, safe='')}")
    if not extra:
        return pgbouncer
    return f"{pgbouncer}{'&' if '?' in pgbouncer else '?'}{'&'.join(extra)}"
