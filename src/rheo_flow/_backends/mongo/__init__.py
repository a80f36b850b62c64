"""The MongoDB backend, on PyMongo's async API (a host's Motor client works too).

Semantics are those of the in-memory reference backend, kept in five collections
(names carry a configurable prefix, ``rheo_`` by default), plus ``meta`` for the
schema version:

* ``streams`` — one document per stream (partition count, creation time);
* ``partitions`` — per stream partition: the high water (the sequence counter)
  and the low water;
* ``events`` — one document per event, its ``_id`` its position (stream,
  partition, sequence), unique on (stream, event id) too, so appends are
  idempotent on the id;
* ``groups`` — one document per group holding, per partition, the *cursor*
  (highest sequence whose delivery document exists), the stored contiguous
  *frontier* and an *epoch* bumped by every operation that moves the group
  back (replay, reset, redrive); and its *work summary*, the partitions that may
  have events past the cursor (``_summary``): appends note it, and a fetch reads
  the group without its per-partition entries, then visits only the partitions
  the summary names or that hold due deliveries;
* ``deliveries`` — materialised deliveries, their ``_id`` their position
  (group, partition, sequence). They are created lazily when fetch leases a
  sequence past the cursor, so an event nobody fetched costs no document.

Concurrency without locks. Every claim, settle and renew is a conditional
single-document update filtered on the state the caller read (the lease id, the
state, the attempt, the ready time), sent in one ``bulk_write``; a filter that
no longer matches means another consumer got there first, and only the updates
that matched count. New deliveries are claimed by inserting their documents:
the unique index lets exactly one claimant win each sequence. The frontier is
advanced with ``$max`` conditioned on the partition's epoch, so a concurrent
replay or reset is never undone by an advance computed from older state.

Key-ordered groups (``ordering="key"``, stored in the group document as ``o``)
keep their unsettled deliveries' keys, with a partial index of them by key:
fetch materialises new sequences in order and stores a delivery whose key has an
unsettled one *blocked*; settling a key's delivery for good releases the next
(see ``_keys`` and ``_claim_keyed``).

Appends allocate per-partition sequences in a multi-document transaction when
the server supports transactions, and optimistically (unique index, retry)
otherwise (see ``_append``). Change streams wake idle consumers on append when
the server offers them (probed at :meth:`MongoBackend.open`); otherwise
consumers poll.

The modules, by concern: ``_backend`` (the class), ``_core`` (state, lifecycle,
shared reads), ``_client`` (URLs, clients, the server's topology), ``_schema``
(indexes, schema version), ``_documents`` (document layout), ``_errors`` (error
classification), ``_streams``, ``_append``, ``_claim``, ``_claim_keyed``,
``_settle``, ``_frontier``, ``_progress``, ``_retention`` (the operations),
``_keys`` (key-ordered groups' keys), ``_summary`` (the groups' work summaries)
and ``_watcher`` (change streams).
"""

from __future__ import annotations

from ..._model._errors import MissingExtra

try:
    import bson  # noqa: F401
    import pymongo  # noqa: F401
except ImportError:  # pragma: no cover - exercised without the extra installed
    raise MissingExtra("MongoDB", "mongo", "pymongo") from None

from ._backend import MongoBackend

__all__ = ["MongoBackend"]
