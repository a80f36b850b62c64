"""The collections' indexes, the stored schema version and the collection prefix.

Six collections, named with the backend's prefix: ``streams``, ``partitions``,
``events``, ``groups``, ``deliveries`` and ``meta`` (the schema version). The
package docstring describes what each document holds.
"""

from __future__ import annotations

import re
from typing import Any, Final

from pymongo import ASCENDING, ReturnDocument
from pymongo import errors as mongo_errors

from ..._model._errors import BackendError, InvalidArgument

__all__ = [
    "ACTIVE_INDEX",
    "DEFAULT_PREFIX",
    "DUE_INDEX",
    "GROUP_DUE_INDEX",
    "KEYED_INDEX",
    "REJECTED_INDEX",
    "SCHEDULED_INDEX",
    "SCHEMA_VERSION",
    "check_prefix",
    "check_schema",
    "create_indexes",
]

SCHEMA_VERSION: Final = 2
"""Stored in the ``meta`` collection; bump it (with a migration) on any layout change.

2: group documents carry a work summary (``np``, ``w``, ``ws``; see ``_summary``).
A version 1 store needs no rewrite: a group without a summary is built by its next
fetch. Opening one records version 2, so that an older rheo-flow, whose appends do
not note the summary, refuses the store rather than hide events from fetches."""
DEFAULT_PREFIX: Final = "rheo_"
_PREFIX_PATTERN: Final = re.compile(r"^[A-Za-z0-9_.\-]{0,64}$")

ACTIVE_INDEX: Final = "active"
"""Available and leased deliveries (those carrying ``r``) by group, partition, sequence."""
DUE_INDEX: Final = "due"
"""Available and leased deliveries by group, partition and ready time ``r``: a partition's
due deliveries (``r <= now``) are an index range, without walking the held or delayed ones."""
GROUP_DUE_INDEX: Final = "group_due"
"""The same by group and ready time only: a group's due deliveries across its partitions,
soonest due first, in one index range."""
REJECTED_INDEX: Final = "rejected"
"""Dead letters by group, partition, sequence."""
SCHEDULED_INDEX: Final = "scheduled"
"""The events carrying a time to deliver at (``da``), by position."""
KEYED_INDEX: Final = "keyed"
"""The unsettled deliveries of key-ordered groups (only they store ``k``) by group, partition,
key, sequence: whether a key has an unsettled delivery is one probe, whatever the history."""


def check_prefix(prefix: object) -> None:
    """Refuse a collection prefix MongoDB would not take in a collection name."""
    if not isinstance(prefix, str) or not _PREFIX_PATTERN.match(prefix):
        raise InvalidArgument(
            "collection_prefix must be at most 64 characters from [A-Za-z0-9_.-], "
            f"got {prefix!r}"
        )


async def check_schema(meta: Any, where: str) -> None:
    """Record this version in a new store, raise an older store's to it (see
    :data:`SCHEMA_VERSION`); refuse a store written by a newer rheo-flow.

    ``where`` names the collections in the error (prefix and database).
    """
    doc = await meta.find_one_and_update(
        {"_id": "schema"},
        {"$setOnInsert": {"v": SCHEMA_VERSION}},
        upsert=True,
        return_document=ReturnDocument.AFTER,
    )
    version = doc.get("v", 0) if doc else SCHEMA_VERSION
    if version > SCHEMA_VERSION:
        raise BackendError(
            f"MongoDB collections {where} have schema version {version}, newer than this "
            f"rheo-flow supports ({SCHEMA_VERSION}): upgrade rheo-flow"
        )
    if version < SCHEMA_VERSION:  # nothing to rewrite: summaries are built as groups fetch
        await meta.update_one({"_id": "schema"}, {"$max": {"v": SCHEMA_VERSION}})


def _index_specs(
    events: Any, groups: Any, deliveries: Any
) -> list[tuple[Any, list[tuple[str, int]], dict[str, Any]]]:
    return [
        (events, [("st", ASCENDING), ("p", ASCENDING), ("n", ASCENDING)],
         {"name": "stream_partition_sequence", "unique": True}),
        (events, [("st", ASCENDING), ("id", ASCENDING)],
         {"name": "stream_event_id", "unique": True}),
        # Scheduled events by position (``_delay``): only those carry "da".
        (events, [("st", ASCENDING), ("p", ASCENDING), ("n", ASCENDING), ("da", ASCENDING)],
         {"name": SCHEDULED_INDEX, "partialFilterExpression": {"da": {"$exists": True}}}),
        (groups, [("s", ASCENDING), ("n", ASCENDING)],
         {"name": "stream_group", "unique": True}),
        (deliveries, [("g", ASCENDING), ("p", ASCENDING), ("s", ASCENDING)],
         {"name": "group_partition_sequence", "unique": True}),
        # Only available and leased deliveries carry "r" (when they become ready):
        # fetch walks these, never the acked ones.
        (deliveries,
         [("g", ASCENDING), ("p", ASCENDING), ("s", ASCENDING), ("r", ASCENDING)],
         {"name": ACTIVE_INDEX, "partialFilterExpression": {"r": {"$exists": True}}}),
        # Fetch reads what is due with the time as the index bound (see _claim): the
        # deliveries held by leases or delayed by nacks, ready later, are never walked.
        (deliveries, [("g", ASCENDING), ("p", ASCENDING), ("r", ASCENDING)],
         {"name": DUE_INDEX, "partialFilterExpression": {"r": {"$exists": True}}}),
        (deliveries, [("g", ASCENDING), ("r", ASCENDING)],
         {"name": GROUP_DUE_INDEX, "partialFilterExpression": {"r": {"$exists": True}}}),
        (deliveries,
         [("g", ASCENDING), ("st", ASCENDING), ("p", ASCENDING), ("s", ASCENDING)],
         {"name": REJECTED_INDEX, "partialFilterExpression": {"st": "rejected"}}),
        # Key-ordered groups: their unsettled deliveries by key (see _keys). Only those
        # carry "k" (a string); a comparison rather than $exists, so that a planner
        # reasoning only about comparisons sees the probes' equality on k imply it.
        (deliveries,
         [("g", ASCENDING), ("p", ASCENDING), ("k", ASCENDING), ("s", ASCENDING)],
         {"name": KEYED_INDEX, "partialFilterExpression": {"k": {"$gte": ""}}}),
    ]


async def create_indexes(events: Any, groups: Any, deliveries: Any) -> None:
    """Create every index (a no-op for those that exist with the same definition)."""
    for collection, keys, options in _index_specs(events, groups, deliveries):
        try:
            await collection.create_index(keys, **options)
        except mongo_errors.OperationFailure as exc:
            raise BackendError(
                f"cannot create index {options['name']!r} on {collection.name}: {exc} "
                "(an index of that name with another definition exists?)"
            ) from exc
