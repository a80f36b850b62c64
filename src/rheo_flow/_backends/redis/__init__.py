"""The Redis Streams backend, on redis-py's asyncio client.

Layout (``P`` is the key prefix, ``s`` a stream, ``p`` a partition, ``g`` a group).
Every key of one partition shares the hash tag ``{P:s:p}``, so a Redis Cluster
can spread partitions over shards and each Lua script stays on one slot:

* ``{P:s:p}:x`` — the Redis stream of the partition. The entry id of the event
  with sequence ``n`` is ``n-0``; the entry holds ``meta`` (JSON ``[id, type,
  key, headers]``), ``data`` (JSON) and ``time`` (append time, server clock).
* ``{P:s:p}:m`` — high water ``hw``, low water ``lw``, last append time ``ts``.
* ``{P:s:p}:i`` — event id -> sequence (idempotent appends), on a Redis Cluster; on
  standalone Redis only for the ids that a release before the digest index stored and
  those whose digest another id holds.
* ``{P:s:p}:g:<g>`` — the group's frontier ``f``, cursor ``c`` and
  ``max_attempts``; the Redis consumer group ``<g>`` on ``:x`` has its last id at
  the cursor. Its PEL shows who holds the redeliveries (taken with ``XCLAIM``)
  and the deliveries of key-ordered groups; an unordered group's first
  deliveries never enter it (range leases, below).
* ``{P:s:p}:g:<g>:d`` — one delivery record per materialised sequence (state,
  attempt, lease id, who settled it); ``:z`` — available and leased deliveries
  by the time they become eligible; ``:r`` — dead letters by sequence. As in
  the reference backend, acked and rejected records stay (they answer a
  repeated settle) until replay, reset or trim removes them.
* ``{P:s:p}:g:<g>:b`` — blocks: the new deliveries of one fetch share one record
  ``first|last|deadline`` under the fetch's token (their lease ids are
  ``<token>:<seq>``, attempt 1) instead of a delivery record and a ``:z`` entry
  each; ``:y`` holds the blocks still to expire, by deadline. Past the frontier
  such a delivery is leased, behind it acked by its block lease: an ack that
  moves the frontier over it writes nothing more. It gets its own record when
  acked out of order, nacked, rejected or renewed, or when its block expires (a
  fetch then writes records for the entries still leased). Replay, reset and
  trim clip or drop the blocks they reach. In an unordered group a block is a
  *range lease*: the fetch script moves the cursor over the range and reads no
  entry (the client reads them with ``XRANGE`` in the same round trip), so
  they stay out of the PEL; a settle sends ``XACK`` only when ``XPENDING``
  finds some of its deliveries there (a redelivery, or a lease taken by a
  release that put every delivery in the PEL: such leases keep settling).
* Key-ordered groups (``ordering="key"``: field ``o`` = ``k`` of ``:g:<g>``, and
  the group record ends with ``|key``; older records have no such field and are
  unordered) lease their new deliveries in blocks too.
  ``{P:s:p}:g:<g>:k`` maps each key with an unsettled delivery to ``head|tail``:
  the one unsettled delivery of the key (leased, waiting for its nack delay or
  expired) and the last event of the key the cursor passed. A fetch reads past
  the cursor (``XREADGROUP`` of its quota, then ``XRANGE`` if it passed over
  some) and leases the events of free keys (and keyless ones); an event of a
  blocked key is linked behind its key's tail in ``:g:<g>:n`` (sequence -> the
  next passed-over sequence of the same key) and gets no record, no ``:z`` entry
  and no PEL entry, and is not leased by the block whose range it lies in: when
  that block expires, only its keyless entries and its keys' heads get records.
  Settling the head for good (ack, reject, dead letter; trim counts as settled)
  pops the next sequence of the list, which becomes the head with an ``A`` record
  due now (attempt 0), and wakes this client's waits on the stream; or it frees
  the key (its field is deleted): both hashes hold only live keys and waiting
  events, never the settled history. A re-driven dead letter takes its place in
  its key's list (a later head it displaces that its block leased gets its own
  record); a delivery that is not its key's head waits in ``:z`` at a score far
  in the future (*parked*) until it is. One fetch script reads at most its quota
  plus 1,000 events and says when it stopped there, and the client calls it
  again a few times. Groups of versions that gave every key-ordered delivery a
  record of its own read the same: a record always comes before a block.
* ``P:streams``, ``P:groups:<s>``, ``P:ids:<s>`` — stream and group records, and
  which partition owns an event id (streams with several partitions; on standalone
  Redis only as ``{P:s:p}:i`` is, above).
* Standalone Redis only: ``P:eid:<s>`` — the event-id index of the whole stream, the
  first 8 bytes of the SHA-1 of an id -> ``partition:seq`` (about 60 bytes an event,
  where the two hashes of full ids took about 180). An append is one ``append_many``
  script for every partition of the batch: an id found there is checked against the
  entry's id; one whose digest another id holds goes to the exact indexes above.
  Data of 512 KiB or more goes by a ``SET`` of its own, ``{P:s:p}:b:<token>``, in the
  append's ``MULTI`` (a script would copy it twice, blocking the server for several
  times a raw ``XADD`` of it); the entry's data is then NUL and the token, the token
  is listed in ``{P:s:p}:bs``, readers fill the data in with one ``MGET``, and trim and
  ``delete_stream`` delete the blob.
* Standalone Redis only (no hash tag: a Cluster has none of them), the summaries of
  a group's partitions: ``P:due:<s>:<g>`` scores each partition no later than when it
  may next have a due delivery (a nack's delay, a lease's or a block's deadline), and
  ``P:new:<s>:<g>`` holds the partitions that may have events past the group's
  cursor (an append adds its partition to every group's). A fetch that visits a
  partition writes its exact entries; a settle, renew, redrive, replay or reset that
  makes work due earlier says so in the same script; a trim marks its partitions due.
  They may claim work that is gone (a visit corrects them), never miss work.
* Redis Cluster only, the same summaries kept by the client in one slot per stream,
  ``{P:s:work}`` (``_work``, ``work.lua``): ``:v`` the stream's note version, ``:a``
  each partition's last append note, and per group ``:g:<g>`` (fold and resync state),
  ``:g:<g>:new``, ``:g:<g>:due`` and ``:g:<g>:nv`` (each partition's last note). Notes
  follow the operations that make work, so they may lag or be lost with their client:
  every few seconds a fetch visits every partition and writes them from what it found.

Every fetch, settle batch and renew tick is one round trip: one script per
partition, pipelined, with JSON requests and replies (orjson on this side); a
fetch's ``XRANGE`` reads ride in the same pipeline. On standalone Redis a fetch of a
stream of several partitions is one ``fetch_many.lua`` call instead, which visits only
the partitions the summaries name (every few seconds a backend has it rewrite them
from every partition first: data written without them is found that way). A
fetch whose partitions turn out uneven may take a second one to fill its limit.
On a Cluster an append to a multi-partition stream first records which partition owns
each event id, then runs one ``append`` script per partition (not atomic across
slots); on standalone Redis it is one ``append_many`` script. The layout is
cluster-ready; the wake-up assumes one server (or a primary with replicas): one
``XREAD`` over every partition of the stream (a Cluster reads each partition on a
connection of its own). Lease deadlines, nack delays and append times use the
Redis server's clock (``TIME`` inside the scripts). A fetch finds due work
through the ``:z`` sorted set rather than ``XAUTOCLAIM``, whose single idle
threshold cannot express per-fetch lease times or nack delays; expired
entries are taken over with ``XCLAIM`` so the PEL shows who holds a redelivery.

Modules: ``_backend`` (the class: construction and lifecycle), one mixin module per
group of operations (``_streams``, ``_events``, ``_groups``, ``_fetch``, ``_settle``,
``_dead_letters``, ``_wakeups``) on ``_core``'s shared state (through ``_work``, a
Cluster's summaries), ``_keys`` (key names),
``_scripts`` and ``lua/`` (the scripts), ``_codec`` (entries and replies), ``_errors``
(error classification) and ``_driver`` (the redis-py import).
"""

from __future__ import annotations

from ._backend import RedisBackend

__all__ = ["RedisBackend"]
