"""The SQL text of the PostgreSQL backend, loaded from the package's ``.sql`` files.

Every statement and server-side function lives in a ``.sql`` file next to this
module: the statements in ``statements.sql`` (one per ``-- name:`` section), the
server-side functions in ``functions/``, the table changes of each schema
version in ``migrations/``. One templating rule covers them all:
``{s}`` stands for the quoted schema name (validated before it is ever put in),
so stream, group and consumer names only ever travel as bind parameters.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from importlib.resources import files
from typing import Final

__all__ = ["BIGINT_MAX", "INTEGER_MAX", "SCHEMA_NAME", "Statements", "load", "quote_schema",
           "render"]

BIGINT_MAX: Final = 2**63 - 1
"""The largest ``bigint`` (sequences); larger positions are clamped to it."""
INTEGER_MAX: Final = 2**31 - 1
"""The largest ``integer`` (partitions)."""

SCHEMA_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,47}")
"""A schema name (``fullmatch``): an identifier short enough to build the NOTIFY channel from."""

_SECTION: Final = re.compile(r"^-- name: ([a-z_]+)\n", re.MULTILINE)


def quote_schema(name: str) -> str:
    """The schema name as a quoted identifier; the caller has validated it."""
    if not SCHEMA_NAME.fullmatch(name):
        raise ValueError(f"invalid schema name {name!r}")
    return '"' + name + '"'


def render(sql: str, schema: str) -> str:
    """``sql`` with ``{s}`` replaced by the quoted schema (no other templating)."""
    return sql.replace("{s}", quote_schema(schema))


@functools.cache
def load(path: str) -> str:
    """The text of the package's SQL file at ``path`` (relative to this package)."""
    return files(__package__).joinpath(path).read_text(encoding="utf-8")


@functools.cache
def _sections() -> dict[str, str]:
    """The named statements of ``statements.sql``, without their comment lines."""
    parts = _SECTION.split(load("statements.sql"))
    return {
        name: "\n".join(line for line in body.strip().splitlines()
                        if not line.lstrip().startswith("--")).strip()
        for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


@dataclass(frozen=True, slots=True)
class Statements:
    """Every statement of ``statements.sql``, rendered once for one schema."""

    stream: str
    insert_stream: str
    insert_partitions: str
    partitions: str
    set_retention: str
    server_now: str
    list_streams: str
    describe_streams: str
    describe_groups: str
    append: str
    append_one: str
    mark_scheduled: str
    scheduled_counts: str
    database_identity: str
    stored_events: str
    query_events: str
    group: str
    groups_by_name: str
    insert_group: str
    start_cursors: str
    start_frontiers: str
    set_max_attempts: str
    list_groups: str
    set_group_pause: str
    fetch: str
    settle: str
    ack_fetch: str
    ack_ranges: str
    ack_ranges_fetch: str
    renew: str
    frontier: str
    stream_frontiers: str
    lag_report: str
    dead_letters: str
    redrive: str
    lock_cursors: str
    lock_frontiers: str
    replay_starts: str
    replay_deliveries: str
    lower_cursors: str
    lower_frontiers: str
    reset_positions: str
    reset_deliveries: str
    set_cursors: str
    set_frontiers: str
    lock_stream: str
    lock_stream_of_group: str
    stream_groups: str
    delete_deliveries: str
    delete_frontiers: str
    delete_cursors: str
    delete_groups: str
    delete_events: str
    delete_partitions: str
    delete_stream: str
    lock_partitions: str
    trim_events: str
    raise_low_water: str
    lock_trimmed_cursors: str
    trim_deliveries: str
    release_keys: str
    raise_cursors: str
    lock_trimmed_frontiers: str
    raise_frontiers: str
    advance_frontiers: str
    schema_version: str
    migration_lock: str
    table_exists: str
    has_named_codes: str
    record_version: str

    @classmethod
    def for_schema(cls, schema: str) -> Statements:
        """The statements with ``{s}`` rendered for ``schema``."""
        sections = _sections()
        names = [field.name for field in dataclasses.fields(cls)]
        if sorted(names) != sorted(sections):
            raise RuntimeError("statements.sql and Statements name different statements")
        return cls(**{name: render(sections[name], schema) for name in names})
