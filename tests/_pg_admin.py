"""One statement on a PostgreSQL server from a synchronous test (a CLI test, whose
commands run their own event loops)."""

from __future__ import annotations

import asyncio


def fetch_value(url: str, query: str, *args: object) -> object:
    """The first column of the first row of ``query``, on a connection of its own."""
    import asyncpg

    async def go() -> object:
        conn = await asyncpg.connect(url)
        try:
            return await conn.fetchval(query, *args)
        finally:
            await conn.close()

    return asyncio.run(go())


def schema_exists(url: str, schema: str) -> bool:
    """Whether the database at ``url`` holds a schema named ``schema``."""
    return bool(fetch_value(url, "SELECT count(*) FROM pg_namespace WHERE nspname = $1",
                            schema))
