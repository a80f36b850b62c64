"""SQL of the PostgreSQL backend: versioned migrations, server-side functions, statements.

Everything is a template over one schema: ``{s}`` stands for the quoted schema
name (validated by :func:`quote_schema` before it is ever formatted in), so
stream, group and consumer names only ever travel as bind parameters.

Tables (migration 1):

* ``streams``, ``partitions`` — stream metadata; ``partitions`` holds the high
  and low water per partition and is the row an append locks;
* ``events`` — one row per event, keyed by (stream, partition, sequence), with a
  unique (stream, event id) for idempotent appends;
* ``groups``; ``cursors`` (per group and partition: the highest materialised
  sequence) and ``frontiers`` (the stored contiguous frontier). They are two
  tables so that a fetch moving a cursor and a settle moving a frontier never
  wait on one another's row lock;
* ``deliveries`` — a row per (group, partition, sequence) once fetch first
  leases it. ``state``: 0 available, 1 leased, 2 acked, 3 rejected;
  ``settled_by``: 1 ack, 2 nack, 3 reject.

Partial indexes keep fetch cost independent of the acked history and of the
backlog: ``deliveries_available`` holds only available rows, ``deliveries_leased``
only leased rows (with their deadline in the key, so expiry is checked inside
the index), ``deliveries_rejected`` only dead letters, all by sequence; fetch
scans them from the group's frontier on. Acked rows live in the primary key
alone. Events nobody fetched yet have no delivery row at all.

Lock order, followed by every function and statement so that none can deadlock:
``partitions`` → ``cursors`` → ``deliveries`` → ``frontiers``, rows of one table
in key order. Fetch takes deliveries and cursors with ``SKIP LOCKED`` (which never
waits), and blocks on one cursor only while it holds no lock at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Migration",
    "quote_schema",
    "render",
]

SCHEMA_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,47}")
"""A schema name (``fullmatch``): an identifier short enough to build the NOTIFY channel from."""

NOW_MS: Final = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
"""The database clock in epoch milliseconds (not the transaction start: leases need now)."""


def quote_schema(name: str) -> str:
    """The schema name as a quoted identifier; the caller has validated it."""
    if not SCHEMA_NAME.fullmatch(name):
        raise ValueError(f"invalid schema name {name!r}")
    return '"' + name + '"'


def render(sql: str, schema: str) -> str:
    """``sql`` with ``{s}`` replaced by the quoted schema (no other templating)."""
    return sql.replace("{s}", quote_schema(schema))


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema version: statements applied in one transaction, in order."""

    version: int
    description: str
    statements: tuple[str, ...]


_TABLES: Final = (
    """CREATE TABLE {s}.streams (
        id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name text NOT NULL UNIQUE,
        partitions integer NOT NULL CHECK (partitions > 0),
        created_at_ms bigint NOT NULL
    )""",
    """CREATE TABLE {s}.partitions (
        stream_id integer NOT NULL REFERENCES {s}.streams (id),
        part integer NOT NULL,
        high_water bigint NOT NULL DEFAULT 0,
        low_water bigint NOT NULL DEFAULT 1,
        PRIMARY KEY (stream_id, part)
    )""",
    """CREATE TABLE {s}.events (
        stream_id integer NOT NULL,
        part integer NOT NULL,
        seq bigint NOT NULL,
        appended_at_ms bigint NOT NULL,
        event_id text NOT NULL,
        type text NOT NULL,
        key text,
        data json NOT NULL,
        headers json,
        PRIMARY KEY (stream_id, part, seq)
    )""",
    "CREATE UNIQUE INDEX events_event_id ON {s}.events (stream_id, event_id)",
    """CREATE TABLE {s}.groups (
        id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        stream_id integer NOT NULL REFERENCES {s}.streams (id),
        name text NOT NULL,
        max_attempts integer NOT NULL CHECK (max_attempts > 0),
        created_at_ms bigint NOT NULL,
        UNIQUE (stream_id, name)
    )""",
    """CREATE TABLE {s}.cursors (
        group_id integer NOT NULL REFERENCES {s}.groups (id),
        part integer NOT NULL,
        cursor bigint NOT NULL,
        PRIMARY KEY (group_id, part)
    )""",
    """CREATE TABLE {s}.frontiers (
        group_id integer NOT NULL REFERENCES {s}.groups (id),
        part integer NOT NULL,
        frontier bigint NOT NULL,
        PRIMARY KEY (group_id, part)
    )""",
    """CREATE TABLE {s}.deliveries (
        group_id integer NOT NULL,
        part integer NOT NULL,
        seq bigint NOT NULL,
        deadline_ms bigint NOT NULL DEFAULT 0,
        available_at_ms bigint NOT NULL DEFAULT 0,
        rejected_at_ms bigint NOT NULL DEFAULT 0,
        attempt integer NOT NULL,
        state smallint NOT NULL CHECK (state BETWEEN 0 AND 3),
        settled_by smallint CHECK (settled_by BETWEEN 1 AND 3),
        lease_id uuid,
        consumer_id text,
        reason text NOT NULL DEFAULT '',
        PRIMARY KEY (group_id, part, seq)
    ) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02)""",
    "CREATE INDEX deliveries_available ON {s}.deliveries (group_id, part, seq) WHERE state = 0",
    """CREATE INDEX deliveries_leased ON {s}.deliveries (group_id, part, seq, deadline_ms)
        WHERE state = 1""",
    "CREATE INDEX deliveries_rejected ON {s}.deliveries (group_id, part, seq) WHERE state = 3",
)

# The body of advance_frontiers (migration 1), also inlined into settle: a
# settle is the hot caller, and a nested function call costs as much as the
# two statements.
_ADVANCE_STEPS: Final = """
    PERFORM 1 FROM {s}.frontiers f
        JOIN (SELECT DISTINCT g, p FROM unnest(p_groups, p_parts) AS u(g, p)) u
          ON f.group_id = u.g AND f.part = u.p
        ORDER BY f.group_id, f.part
        FOR UPDATE OF f;
    UPDATE {s}.frontiers f SET frontier = n.top
    FROM (
        SELECT f2.group_id, f2.part, LEAST(
            COALESCE((SELECT d.seq FROM {s}.deliveries d
                      WHERE d.group_id = f2.group_id AND d.part = f2.part
                        AND d.seq > f2.frontier AND d.state < 2
                      ORDER BY d.seq LIMIT 1), 9223372036854775807),
            (SELECT c.cursor + 1 FROM {s}.cursors c
             WHERE c.group_id = f2.group_id AND c.part = f2.part)) - 1 AS top
        FROM {s}.frontiers f2
        JOIN (SELECT DISTINCT g, p FROM unnest(p_groups, p_parts) AS u(g, p)) u
          ON f2.group_id = u.g AND f2.part = u.p
    ) n
    WHERE f.group_id = n.group_id AND f.part = n.part AND n.top > f.frontier;"""

# Moves the stored frontiers of (group, partition) pairs over the settled
# deliveries right after them. The row locks come first, in key order, in their
# own statement: the UPDATE then runs on a snapshot taken after every concurrent
# settle that held them has committed, so no acked delivery is ever missed.
# The walk reads the primary key from the frontier on and stops at the first
# pending delivery, so each settled row is passed once in its lifetime; rows
# (frontier, cursor] always exist, so the cursor bounds it.
_ADVANCE: Final = """
CREATE FUNCTION {s}.advance_frontiers(p_groups integer[], p_parts integer[])
RETURNS void LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $fn$
BEGIN""" + _ADVANCE_STEPS + """
END
$fn$"""

# Claims the cursors of partitions with unmaterialised events (shared by every
# version of fetch).
_CLAIM_CURSORS: Final = """\
    SELECT array_agg(k.part), array_agg(k.cursor), array_agg(LEAST(k.high, k.cursor + p_limit))
    INTO k_part, k_cur, k_top
    FROM (SELECT c.part, c.cursor, pt.high_water AS high FROM {s}.cursors c
          JOIN {s}.partitions pt ON pt.stream_id = v_stream AND pt.part = c.part
          WHERE c.group_id = p_group AND c.part = ANY (p_parts) AND c.cursor < pt.high_water
          FOR UPDATE OF c SKIP LOCKED) k;

    IF c_part IS NULL AND k_part IS NULL THEN
        -- Competing fetches hold every cursor with work: wait for ONE of them
        -- (chosen first, then locked alone) while holding no other lock, so
        -- waiting fetches never deadlock one another; then claim again from
        -- every cursor that is free by now (a fresh snapshot sees their moves).
        SELECT c.part INTO v_wait
        FROM {s}.cursors c
        JOIN {s}.partitions pt ON pt.stream_id = v_stream AND pt.part = c.part
        WHERE c.group_id = p_group AND c.part = ANY (p_parts) AND c.cursor < pt.high_water
        ORDER BY array_position(p_parts, c.part)
        LIMIT 1;
        IF FOUND THEN
            PERFORM 1 FROM {s}.cursors c WHERE c.group_id = p_group AND c.part = v_wait
            FOR UPDATE;
            SELECT array_agg(k.part), array_agg(k.cursor),
                   array_agg(LEAST(k.high, k.cursor + p_limit))
            INTO k_part, k_cur, k_top
            FROM (SELECT c.part, c.cursor, pt.high_water AS high FROM {s}.cursors c
                  JOIN {s}.partitions pt ON pt.stream_id = v_stream AND pt.part = c.part
                  WHERE c.group_id = p_group AND c.part = ANY (p_parts)
                    AND c.cursor < pt.high_water
                  FOR UPDATE OF c SKIP LOCKED) k;
        END IF;
    END IF;
"""

# One round trip claims up to p_limit deliveries. p_parts is already rotated:
# its order is the round-robin order of this call.
#  1. Eligible existing deliveries of each partition in sequence order, up to
#     p_limit of each kind (available and due, leased and expired), locked with
#     SKIP LOCKED so competing consumers never wait on one another. Both scans
#     start past the stored frontier: every delivery at or below it is settled,
#     so neither the acked history nor the stale index entries its updates left
#     behind (until vacuum) are ever walked. Expired ones at max_attempts are
#     dead-lettered instead of leased.
#  2. Cursors of partitions with unmaterialised events, SKIP LOCKED too; only when
#     that leaves the call empty-handed does it wait for one cursor.
#  3. One statement picks the round-robin winners (depth within its partition,
#     then rotation position), re-leases existing rows, inserts new ones, moves
#     the cursors, and returns the leases joined with their events.
_FETCH: Final = """
CREATE FUNCTION {s}.fetch(p_group integer, p_parts integer[], p_limit integer,
                          p_lease_ms bigint, p_consumer text)
RETURNS TABLE (o_part integer, o_seq bigint, o_attempt integer, o_lease uuid,
               o_deadline bigint, o_event_id text, o_type text, o_key text,
               o_data text, o_headers text, o_appended bigint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    v_stream integer;
    v_max integer;
    v_now bigint := """ + NOW_MS + """;
    c_part integer[];
    c_seq bigint[];
    c_att integer[];
    k_part integer[];
    k_cur bigint[];
    k_top bigint[];
    v_wait integer;
    v_doomed integer;
BEGIN
    SELECT g.stream_id, g.max_attempts INTO v_stream, v_max
    FROM {s}.groups g WHERE g.id = p_group;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'rheo_flow: no group with id %', p_group USING ERRCODE = 'RF001';
    END IF;

    SELECT array_agg(x.part), array_agg(x.seq), array_agg(x.attempt)
    INTO c_part, c_seq, c_att
    FROM unnest(p_parts) AS p(part)
    JOIN {s}.frontiers f ON f.group_id = p_group AND f.part = p.part
    CROSS JOIN LATERAL (
        SELECT a.* FROM (
            SELECT d.part, d.seq, d.attempt FROM {s}.deliveries d
            WHERE d.group_id = p_group AND d.part = p.part AND d.seq > f.frontier
              AND d.state = 0 AND d.available_at_ms <= v_now
            ORDER BY d.seq LIMIT p_limit FOR UPDATE SKIP LOCKED) a
        UNION ALL
        SELECT b.* FROM (
            SELECT d.part, d.seq, d.attempt FROM {s}.deliveries d
            WHERE d.group_id = p_group AND d.part = p.part AND d.seq > f.frontier
              AND d.state = 1 AND d.deadline_ms <= v_now
            ORDER BY d.seq LIMIT p_limit FOR UPDATE SKIP LOCKED) b
    ) x;

""" + _CLAIM_CURSORS + """
    IF c_part IS NOT NULL THEN
        UPDATE {s}.deliveries d
        SET state = 3, reason = 'max_attempts', settled_by = NULL, rejected_at_ms = v_now
        FROM unnest(c_part, c_seq, c_att) AS x(part, seq, attempt)
        WHERE x.attempt >= v_max
          AND d.group_id = p_group AND d.part = x.part AND d.seq = x.seq;
        GET DIAGNOSTICS v_doomed = ROW_COUNT;
        IF v_doomed > 0 THEN
            PERFORM {s}.advance_frontiers(array_agg(p_group), array_agg(x.part))
            FROM (SELECT DISTINCT x.part FROM unnest(c_part, c_att) AS x(part, attempt)
                  WHERE x.attempt >= v_max) x;
        END IF;
    END IF;

    RETURN QUERY
    WITH cand AS (
        SELECT x.part, x.seq, false AS fresh,
               row_number() OVER (PARTITION BY x.part ORDER BY x.seq) AS depth
        FROM unnest(c_part, c_seq, c_att) AS x(part, seq, attempt)
        WHERE x.attempt < v_max
    ), counted AS (
        SELECT cand.part, count(*) AS n FROM cand GROUP BY cand.part
    ), fresh AS (
        SELECT k.part, s.seq, true AS fresh, COALESCE(n.n, 0) + (s.seq - k.cur) AS depth
        FROM unnest(k_part, k_cur, k_top) AS k(part, cur, top)
        LEFT JOIN counted n ON n.part = k.part
        CROSS JOIN LATERAL generate_series(k.cur + 1, k.top) AS s(seq)
    ), chosen AS (
        SELECT a.part, a.seq, a.fresh, a.depth, array_position(p_parts, a.part) AS pos
        FROM (SELECT * FROM cand UNION ALL SELECT * FROM fresh) a
        ORDER BY a.depth, array_position(p_parts, a.part)
        LIMIT p_limit
    ), releases AS (
        UPDATE {s}.deliveries d
        SET state = 1, attempt = d.attempt + 1, lease_id = gen_random_uuid(),
            consumer_id = p_consumer, deadline_ms = v_now + p_lease_ms, settled_by = NULL
        FROM chosen c
        WHERE NOT c.fresh AND d.group_id = p_group AND d.part = c.part AND d.seq = c.seq
        RETURNING d.part, d.seq, d.attempt, d.lease_id
    ), created AS (
        INSERT INTO {s}.deliveries
            (group_id, part, seq, state, attempt, lease_id, consumer_id, deadline_ms)
        SELECT p_group, c.part, c.seq, 1, 1, gen_random_uuid(), p_consumer, v_now + p_lease_ms
        FROM chosen c WHERE c.fresh
        RETURNING part, seq, attempt, lease_id
    ), moved AS (
        UPDATE {s}.cursors cu SET cursor = m.top
        FROM (SELECT c.part, max(c.seq) AS top FROM chosen c WHERE c.fresh GROUP BY c.part) m
        WHERE cu.group_id = p_group AND cu.part = m.part
    )
    SELECT l.part, l.seq, l.attempt, l.lease_id, v_now + p_lease_ms,
           e.event_id, e.type, e.key, e.data::text, e.headers::text, e.appended_at_ms
    FROM (SELECT * FROM releases UNION ALL SELECT * FROM created) l
    JOIN chosen c ON c.part = l.part AND c.seq = l.seq
    JOIN {s}.events e ON e.stream_id = v_stream AND e.part = l.part AND e.seq = l.seq
    ORDER BY c.depth, c.pos;
END
$fn$"""

# Result codes of settle and renew for the leases that did not take effect:
# 1 repeated (the same settle already took effect with this lease), 2 stale
# (leased again), 3 receipt mismatch, 4 stale (settled by another operation;
# bad_by says which), 5 stale (replayed, reset or trimmed), 6 invalid (no such
# delivery), 7 failed (changed concurrently in an unexpected way).
_CLASSIFY_CODES: Final = """
    SELECT array_agg(u.idx ORDER BY u.idx),
           array_agg(CASE
               WHEN d.seq IS NULL THEN
                   CASE WHEN u.seq >= 1 AND u.seq <= pt.high_water THEN 5 ELSE 6 END
               WHEN d.lease_id IS DISTINCT FROM u.lease THEN 2
               WHEN d.attempt <> u.att THEN 3
               WHEN d.state = 1 THEN 7
               WHEN p_op <> 0 AND d.settled_by = p_op THEN 1
               ELSE 4 END::smallint ORDER BY u.idx),
           array_agg(d.settled_by ORDER BY u.idx)
    INTO bad_idx, bad_code, bad_by
    FROM unnest(p_groups, p_parts, p_seqs, p_leases, p_atts) WITH ORDINALITY
         AS u(g, part, seq, lease, att, idx)"""

# Migration 1's classification of the leftovers.
_CLASSIFY: Final = _CLASSIFY_CODES + """
    LEFT JOIN {s}.deliveries d ON d.group_id = u.g AND d.part = u.part AND d.seq = u.seq
    LEFT JOIN {s}.groups gr ON gr.id = u.g
    LEFT JOIN {s}.partitions pt ON pt.stream_id = gr.stream_id AND pt.part = u.part
    WHERE u.idx <> ALL (COALESCE(v_done, '{}'::bigint[]))"""

# Fenced settle of a batch (p_op: 1 ack, 2 nack, 3 reject). The UPDATE takes
# effect only where the delivery is still leased under this very lease (and
# receipt, carried as the attempt); a racing settle of the same lease waits on
# the row lock and then finds it settled. The leftovers are classified by a
# second statement, whose fresh snapshot sees what the racers committed.
_SETTLE: Final = """
CREATE FUNCTION {s}.settle(p_op smallint, p_groups integer[], p_parts integer[],
                           p_seqs bigint[], p_leases uuid[], p_atts integer[],
                           p_reason text, p_delay_ms bigint,
                           OUT bad_idx bigint[], OUT bad_code smallint[], OUT bad_by smallint[])
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    v_now bigint := """ + NOW_MS + """;
    v_done bigint[];
    v_tg integer[];
    v_tp integer[];
BEGIN
    WITH u AS (
        -- spent: a nack of this attempt dead-letters (only nack needs max_attempts).
        SELECT u.*, p_op = 2 AND u.att >= (SELECT gr.max_attempts FROM {s}.groups gr
                                            WHERE gr.id = u.g) AS spent
        FROM unnest(p_groups, p_parts, p_seqs, p_leases, p_atts) WITH ORDINALITY
            AS u(g, part, seq, lease, att, idx)
    ), hit AS (
        UPDATE {s}.deliveries d SET
            state = CASE WHEN p_op = 1 THEN 2 WHEN p_op = 3 OR u.spent THEN 3 ELSE 0 END,
            settled_by = p_op,
            reason = CASE WHEN p_op = 1 THEN '' WHEN p_op = 2 AND u.spent THEN 'max_attempts'
                          ELSE p_reason END,
            available_at_ms = CASE WHEN p_op = 2 THEN v_now + p_delay_ms
                                   ELSE d.available_at_ms END,
            rejected_at_ms = CASE WHEN p_op = 3 OR (p_op = 2 AND u.spent) THEN v_now
                                  ELSE d.rejected_at_ms END
        FROM u
        -- "state + 0": a plain "state = 1" would let the planner walk
        -- deliveries_leased (its predicate) per lease; the key finds each row.
        WHERE d.group_id = u.g AND d.part = u.part AND d.seq = u.seq
          AND d.state + 0 = 1 AND d.lease_id = u.lease AND d.attempt = u.att
        RETURNING u.idx, d.group_id, d.part, d.state
    )
    SELECT array_agg(hit.idx),
           array_agg(hit.group_id) FILTER (WHERE hit.state >= 2),
           array_agg(hit.part) FILTER (WHERE hit.state >= 2)
    INTO v_done, v_tg, v_tp
    FROM hit;

    IF v_tg IS NOT NULL THEN
        PERFORM {s}.advance_frontiers(v_tg, v_tp);
    END IF;
    IF COALESCE(cardinality(v_done), 0) < cardinality(p_seqs) THEN
""" + _CLASSIFY + """;
    END IF;
END
$fn$"""

_RENEW: Final = """
CREATE FUNCTION {s}.renew(p_groups integer[], p_parts integer[], p_seqs bigint[],
                          p_leases uuid[], p_atts integer[], p_lease_ms bigint,
                          OUT deadline_ms bigint,
                          OUT bad_idx bigint[], OUT bad_code smallint[], OUT bad_by smallint[])
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    p_op smallint := 0;
    v_done bigint[];
BEGIN
    deadline_ms := """ + NOW_MS + """ + p_lease_ms;
    WITH u AS (
        SELECT * FROM unnest(p_groups, p_parts, p_seqs, p_leases, p_atts) WITH ORDINALITY
            AS u(g, part, seq, lease, att, idx)
    ), hit AS (
        UPDATE {s}.deliveries d SET deadline_ms = renew.deadline_ms
        FROM u
        WHERE d.group_id = u.g AND d.part = u.part AND d.seq = u.seq
          AND d.state + 0 = 1 AND d.lease_id = u.lease AND d.attempt = u.att  -- see settle
        RETURNING u.idx
    )
    SELECT array_agg(hit.idx) INTO v_done FROM hit;
    IF COALESCE(cardinality(v_done), 0) < cardinality(p_seqs) THEN
""" + _CLASSIFY + """;
    END IF;
END
$fn$"""

# Migration 2: the same functions with plans that do not depend on table
# statistics. PL/pgSQL caches one generic plan per statement and session; a
# plan made while `deliveries` was small (a fresh schema, before autovacuum
# first analyzes it) joined the batch to the table by hashing every delivery
# of the group, so settles and re-leases slowed down as the table grew until
# the next ANALYZE. Now every row is found through its key one batch element
# at a time (LATERAL subqueries the planner cannot flatten, sequential and
# bitmap scans switched off inside the functions), and the rows a function
# has locked are updated by their physical address (`ctid = ANY(...)`, a TID
# scan): a locked row cannot move before the transaction ends.
_OPTIONS: Final = ("SET plan_cache_mode = force_generic_plan SET enable_seqscan = off "
                   "SET enable_bitmapscan = off")

# Pieces of fetch (migration 2): the cursors move to the new deliveries' top, and
# each leased row finds its event by key.
_MOVE_CURSORS: Final = """moved AS (
        UPDATE {s}.cursors cu SET cursor = m.top
        FROM (SELECT n.part, max(n.seq) AS top FROM unnest(n_part, n_seq) AS n(part, seq)
              GROUP BY n.part) m
        WHERE cu.group_id = p_group AND cu.part = m.part
    )"""


def _event_of(row: str) -> str:
    """A lateral lookup of the event of leased row ``row`` (a fixed alias, never input)."""
    return f"""CROSS JOIN LATERAL (
        SELECT e.event_id, e.type, e.key, e.data, e.headers, e.appended_at_ms
        FROM {{s}}.events e
        WHERE e.stream_id = v_stream AND e.part = {row}.part AND e.seq = {row}.seq
        OFFSET 0) e"""


# The fresh-only tail of fetch: version 2 looks each new delivery's event up
# by key; version 3 reads them by range (see _FETCH_V3).
_FRESH_V2: Final = """        RETURN QUERY
        WITH created AS (
            INSERT INTO {s}.deliveries
                (group_id, part, seq, state, attempt, lease_id, consumer_id, deadline_ms)
            SELECT p_group, n.part, n.seq, 1, 1,
                   (v_prefix || lpad(to_hex(n.ord), 8, '0'))::uuid, p_consumer,
                   v_now + p_lease_ms
            FROM unnest(n_part, n_seq) WITH ORDINALITY AS n(part, seq, ord)
            RETURNING part, seq, lease_id
        ), """ + _MOVE_CURSORS + """
        SELECT c.part, c.seq, 1, c.lease_id, v_now + p_lease_ms,
               e.event_id, e.type, e.key, e.data::text, e.headers::text, e.appended_at_ms
        FROM created c
        """ + _event_of("c") + """
        ORDER BY c.lease_id;
        RETURN;"""

_FETCH_V2: Final = """
CREATE OR REPLACE FUNCTION {s}.fetch(p_group integer, p_parts integer[], p_limit integer,
                                     p_lease_ms bigint, p_consumer text)
RETURNS TABLE (o_part integer, o_seq bigint, o_attempt integer, o_lease uuid,
               o_deadline bigint, o_event_id text, o_type text, o_key text,
               o_data text, o_headers text, o_appended bigint)
LANGUAGE plpgsql """ + _OPTIONS + """ AS $fn$
DECLARE
    v_stream integer;
    v_max integer;
    v_now bigint := """ + NOW_MS + """;
    c_part integer[];
    c_seq bigint[];
    c_att integer[];
    c_tid tid[];
    k_part integer[];
    k_cur bigint[];
    k_top bigint[];
    o_parts integer[];
    o_seqs bigint[];
    r_tid tid[];
    n_part integer[];
    n_seq bigint[];
    v_wait integer;
    v_doomed tid[];
    v_prefix text;
BEGIN
    -- A fetch need not wait for its commit to reach the disk: a crash can only
    -- undo leases whose acks had not committed yet (an ack commits durably, and
    -- with it every earlier write), and undone leases are delivered again, as
    -- after an expiry; their acks then fail as stale.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT g.stream_id, g.max_attempts INTO v_stream, v_max
    FROM {s}.groups g WHERE g.id = p_group;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'rheo_flow: no group with id %', p_group USING ERRCODE = 'RF001';
    END IF;

    SELECT array_agg(x.part), array_agg(x.seq), array_agg(x.attempt), array_agg(x.tid)
    INTO c_part, c_seq, c_att, c_tid
    FROM unnest(p_parts) AS p(part)
    JOIN {s}.frontiers f ON f.group_id = p_group AND f.part = p.part
    CROSS JOIN LATERAL (
        SELECT a.* FROM (
            SELECT d.part, d.seq, d.attempt, d.ctid AS tid FROM {s}.deliveries d
            WHERE d.group_id = p_group AND d.part = p.part AND d.seq > f.frontier
              AND d.state = 0 AND d.available_at_ms <= v_now
            ORDER BY d.seq LIMIT p_limit FOR UPDATE SKIP LOCKED) a
        UNION ALL
        SELECT b.* FROM (
            SELECT d.part, d.seq, d.attempt, d.ctid AS tid FROM {s}.deliveries d
            WHERE d.group_id = p_group AND d.part = p.part AND d.seq > f.frontier
              AND d.state = 1 AND d.deadline_ms <= v_now
            ORDER BY d.seq LIMIT p_limit FOR UPDATE SKIP LOCKED) b
    ) x;

""" + _CLAIM_CURSORS + """
    IF c_part IS NOT NULL THEN
        SELECT array_agg(x.tid) INTO v_doomed
        FROM unnest(c_tid, c_att) AS x(tid, attempt) WHERE x.attempt >= v_max;
        IF v_doomed IS NOT NULL THEN
            UPDATE {s}.deliveries d
            SET state = 3, reason = 'max_attempts', settled_by = NULL, rejected_at_ms = v_now
            WHERE d.ctid = ANY (v_doomed);
            PERFORM {s}.advance_frontiers(array_agg(p_group), array_agg(x.part))
            FROM (SELECT DISTINCT x.part FROM unnest(c_part, c_att) AS x(part, attempt)
                  WHERE x.attempt >= v_max) x;
        END IF;
    END IF;

    -- The round-robin winners, in delivery order: existing rows to lease again
    -- (by address) and fresh sequences to insert.
    WITH cand AS (
        SELECT x.part, x.seq, x.tid, row_number() OVER (PARTITION BY x.part ORDER BY x.seq)
               AS depth
        FROM unnest(c_part, c_seq, c_att, c_tid) AS x(part, seq, attempt, tid)
        WHERE x.attempt < v_max
    ), counted AS (
        SELECT cand.part, count(*) AS n FROM cand GROUP BY cand.part
    ), fresh AS (
        SELECT k.part, s.seq, NULL::tid AS tid, COALESCE(n.n, 0) + (s.seq - k.cur) AS depth
        FROM unnest(k_part, k_cur, k_top) AS k(part, cur, top)
        LEFT JOIN counted n ON n.part = k.part
        CROSS JOIN LATERAL generate_series(k.cur + 1, k.top) AS s(seq)
    ), chosen AS (
        SELECT a.part, a.seq, a.tid, a.depth, array_position(p_parts, a.part) AS pos
        FROM (SELECT * FROM cand UNION ALL SELECT * FROM fresh) a
        ORDER BY a.depth, array_position(p_parts, a.part)
        LIMIT p_limit
    )
    SELECT array_agg(c.part ORDER BY c.depth, c.pos), array_agg(c.seq ORDER BY c.depth, c.pos),
           array_agg(c.tid) FILTER (WHERE c.tid IS NOT NULL),
           array_agg(c.part ORDER BY c.depth, c.pos) FILTER (WHERE c.tid IS NULL),
           array_agg(c.seq ORDER BY c.depth, c.pos) FILTER (WHERE c.tid IS NULL)
    INTO o_parts, o_seqs, r_tid, n_part, n_seq
    FROM chosen c;

    IF o_parts IS NULL THEN
        RETURN;
    END IF;
    -- New leases are named by one random prefix per call and their position:
    -- unique, and far cheaper than a random UUID per row.
    v_prefix := left(replace(gen_random_uuid()::text, '-', ''), 24);

    IF r_tid IS NULL THEN
        -- Only new deliveries (the common case): no re-leases to merge, and the
        -- lease ids (prefix, then the position in n_part/n_seq, which are in the
        -- chosen order) sort in the chosen order.
""" + _FRESH_V2 + """
    END IF;

    RETURN QUERY
    WITH releases AS (
        UPDATE {s}.deliveries d
        SET state = 1, attempt = d.attempt + 1, lease_id = gen_random_uuid(),
            consumer_id = p_consumer, deadline_ms = v_now + p_lease_ms, settled_by = NULL
        WHERE d.ctid = ANY (r_tid)
        RETURNING d.part, d.seq, d.attempt, d.lease_id
    ), created AS (
        INSERT INTO {s}.deliveries
            (group_id, part, seq, state, attempt, lease_id, consumer_id, deadline_ms)
        SELECT p_group, n.part, n.seq, 1, 1, (v_prefix || lpad(to_hex(n.ord), 8, '0'))::uuid,
               p_consumer, v_now + p_lease_ms
        FROM unnest(n_part, n_seq) WITH ORDINALITY AS n(part, seq, ord)
        RETURNING part, seq, attempt, lease_id
    ), """ + _MOVE_CURSORS + """
    SELECT l.part, l.seq, l.attempt, l.lease_id, v_now + p_lease_ms,
           e.event_id, e.type, e.key, e.data::text, e.headers::text, e.appended_at_ms
    FROM (SELECT * FROM releases UNION ALL SELECT * FROM created) l
    JOIN unnest(o_parts, o_seqs) WITH ORDINALITY AS o(part, seq, ord)
      ON o.part = l.part AND o.seq = l.seq
    """ + _event_of("l") + """
    ORDER BY o.ord;
END
$fn$"""

# Each batch element looks its delivery up by key (see migration 2 above).
_CLASSIFY_V2: Final = _CLASSIFY_CODES + """
    LEFT JOIN LATERAL (
        SELECT d.seq, d.lease_id, d.attempt, d.state, d.settled_by FROM {s}.deliveries d
        WHERE d.group_id = u.g AND d.part = u.part AND d.seq = u.seq OFFSET 0) d ON true
    LEFT JOIN LATERAL (
        SELECT pt.high_water FROM {s}.groups gr
        JOIN {s}.partitions pt ON pt.stream_id = gr.stream_id AND pt.part = u.part
        WHERE gr.id = u.g OFFSET 0) pt ON true
    WHERE u.idx <> ALL (COALESCE(v_done, '{}'::bigint[]))"""

# The batch's deliveries still leased under these very leases, locked in key
# order (the batch arrives sorted). A racing settle of the same lease waits on
# the row lock and then no longer matches (the row is re-checked once the lock
# is granted).
_LOCK_LEASED: Final = """
    FROM unnest(p_groups, p_parts, p_seqs, p_leases, p_atts) WITH ORDINALITY
         AS u(g, part, seq, lease, att, idx)
    CROSS JOIN LATERAL (
        -- "state + 0": a plain "state = 1" would let the planner walk
        -- deliveries_leased (its predicate) per lease; the key finds each row.
        SELECT d.ctid AS tid FROM {s}.deliveries d
        WHERE d.group_id = u.g AND d.part = u.part AND d.seq = u.seq
          AND d.state + 0 = 1 AND d.lease_id = u.lease AND d.attempt = u.att
        FOR UPDATE) l"""

_SETTLE_V2: Final = """
CREATE OR REPLACE FUNCTION {s}.settle(p_op smallint, p_groups integer[], p_parts integer[],
                                      p_seqs bigint[], p_leases uuid[], p_atts integer[],
                                      p_reason text, p_delay_ms bigint,
                                      OUT bad_idx bigint[], OUT bad_code smallint[],
                                      OUT bad_by smallint[])
LANGUAGE plpgsql """ + _OPTIONS + """ AS $fn$
DECLARE
    v_now bigint := """ + NOW_MS + """;
    v_tids tid[];
    v_spent tid[];
    v_done bigint[];
    v_tg integer[];
    v_tp integer[];
BEGIN
    WITH hit AS (
        -- spent: a nack of this attempt dead-letters (only nack needs max_attempts).
        SELECT l.tid, u.idx, u.g, u.part,
               p_op = 3 OR p_op = 1 OR (p_op = 2 AND u.att >= (
                   SELECT gr.max_attempts FROM {s}.groups gr WHERE gr.id = u.g)) AS final
""" + _LOCK_LEASED + """
    )
    SELECT array_agg(hit.tid), array_agg(hit.tid) FILTER (WHERE hit.final AND p_op = 2),
           array_agg(hit.idx),
           array_agg(hit.g) FILTER (WHERE hit.final), array_agg(hit.part) FILTER (WHERE hit.final)
    INTO v_tids, v_spent, v_done, v_tg, v_tp
    FROM hit;

    IF v_tids IS NOT NULL THEN
        UPDATE {s}.deliveries d SET
            state = CASE WHEN p_op = 1 THEN 2 WHEN p_op = 3 THEN 3
                         WHEN d.ctid = ANY (v_spent) THEN 3 ELSE 0 END,
            settled_by = p_op,
            reason = CASE WHEN p_op = 1 THEN '' WHEN p_op = 3 THEN p_reason
                          WHEN d.ctid = ANY (v_spent) THEN 'max_attempts' ELSE p_reason END,
            available_at_ms = CASE WHEN p_op = 2 THEN v_now + p_delay_ms
                                   ELSE d.available_at_ms END,
            rejected_at_ms = CASE WHEN p_op = 3 OR (p_op = 2 AND d.ctid = ANY (v_spent))
                                  THEN v_now ELSE d.rejected_at_ms END
        WHERE d.ctid = ANY (v_tids);
    END IF;
    IF v_tg IS NOT NULL THEN""" + _ADVANCE_STEPS.replace("p_groups", "v_tg").replace(
        "p_parts", "v_tp") + """
    END IF;
    IF COALESCE(cardinality(v_done), 0) < cardinality(p_seqs) THEN
""" + _CLASSIFY_V2 + """;
    END IF;
END
$fn$"""

_RENEW_V2: Final = """
CREATE OR REPLACE FUNCTION {s}.renew(p_groups integer[], p_parts integer[], p_seqs bigint[],
                                     p_leases uuid[], p_atts integer[], p_lease_ms bigint,
                                     OUT deadline_ms bigint,
                                     OUT bad_idx bigint[], OUT bad_code smallint[],
                                     OUT bad_by smallint[])
LANGUAGE plpgsql """ + _OPTIONS + """ AS $fn$
DECLARE
    p_op smallint := 0;
    v_tids tid[];
    v_done bigint[];
BEGIN
    deadline_ms := """ + NOW_MS + """ + p_lease_ms;
    SELECT array_agg(l.tid), array_agg(u.idx) INTO v_tids, v_done
""" + _LOCK_LEASED + """;
    IF v_tids IS NOT NULL THEN
        UPDATE {s}.deliveries d SET deadline_ms = renew.deadline_ms WHERE d.ctid = ANY (v_tids);
    END IF;
    IF COALESCE(cardinality(v_done), 0) < cardinality(p_seqs) THEN
""" + _CLASSIFY_V2 + """;
    END IF;
END
$fn$"""

# Migration 3: fetch commits durably. Version 2's fetch switched its own
# transaction to asynchronous commit; a server crash right after a re-lease
# could then undo the re-lease while the superseded holder's ack, arriving
# after the restart, matched the restored row and took effect.
_ASYNC_COMMIT: Final = """\
    -- A fetch need not wait for its commit to reach the disk: a crash can only
    -- undo leases whose acks had not committed yet (an ack commits durably, and
    -- with it every earlier write), and undone leases are delivered again, as
    -- after an expiry; their acks then fail as stale.
    PERFORM set_config('synchronous_commit', 'off', true);
"""
# Both fetch paths of version 3 that lease only new deliveries end alike: the
# events of each partition's range (r.lo..r.hi) are read in one scan, one
# delivery is inserted per event, and the leases are returned in their order.
_LEASE_RANGES_V3: Final = """\
            CROSS JOIN LATERAL (
                SELECT e.seq, e.event_id, e.type, e.key, e.data, e.headers, e.appended_at_ms
                FROM {s}.events e
                WHERE e.stream_id = v_stream AND e.part = r.part AND e.seq BETWEEN r.lo AND r.hi
                OFFSET 0) e
        ), created AS (
            INSERT INTO {s}.deliveries
                (group_id, part, seq, state, attempt, lease_id, consumer_id, deadline_ms)
            SELECT p_group, k.part, k.seq, 1, 1,
                   (v_prefix || lpad(to_hex(k.ord), 8, '0'))::uuid, p_consumer,
                   v_now + p_lease_ms
            FROM picked k
        ), """
_RETURN_LEASED_V3: Final = """\
        SELECT k.part, k.seq, 1, (v_prefix || lpad(to_hex(k.ord), 8, '0'))::uuid,
               v_now + p_lease_ms, k.event_id, k.type, k.key, k.data::text, k.headers::text,
               k.appended_at_ms
        FROM picked k
        ORDER BY k.ord;
        RETURN;"""
_FRESH_V3: Final = """        RETURN QUERY
        WITH picked AS (
            -- Each partition's new deliveries are its next sequences, cur+1..top:
            -- one range scan of the events reads them, and (sequence - first,
            -- rotation position) is their place in the chosen order.
            SELECT r.part, e.seq, e.event_id, e.type, e.key, e.data, e.headers,
                   e.appended_at_ms,
                   row_number() OVER (ORDER BY e.seq - r.lo, r.pos) AS ord
            FROM (SELECT n.part, min(n.seq) AS lo, max(n.seq) AS hi,
                         array_position(p_parts, n.part) AS pos
                  FROM unnest(n_part, n_seq) AS n(part, seq) GROUP BY n.part) r
""" + _LEASE_RANGES_V3 + _MOVE_CURSORS + """
""" + _RETURN_LEASED_V3
# Nothing to lease again (the common case): one statement picks the new
# deliveries in round-robin order (their depth, sequence - cursor, then the
# rotation position), reads their events by range, inserts them and moves the
# cursors.
_ONLY_NEW_V3: Final = """    IF c_part IS NULL THEN
        IF k_part IS NULL THEN
            RETURN;
        END IF;
        v_prefix := left(replace(gen_random_uuid()::text, '-', ''), 24);
        RETURN QUERY
        WITH ch AS (
            SELECT k.part, s.seq, array_position(p_parts, k.part) AS pos
            FROM unnest(k_part, k_cur, k_top) AS k(part, cur, top)
            CROSS JOIN LATERAL generate_series(k.cur + 1, k.top) AS s(seq)
            ORDER BY s.seq - k.cur, array_position(p_parts, k.part)
            LIMIT p_limit
        ), r AS (
            SELECT ch.part, min(ch.seq) AS lo, max(ch.seq) AS hi, min(ch.pos) AS pos
            FROM ch GROUP BY ch.part
        ), picked AS (
            SELECT r.part, e.seq, e.event_id, e.type, e.key, e.data, e.headers,
                   e.appended_at_ms,
                   row_number() OVER (ORDER BY e.seq - r.lo, r.pos) AS ord
            FROM r
""" + _LEASE_RANGES_V3 + """moved AS (
            UPDATE {s}.cursors cu SET cursor = r.hi
            FROM r WHERE cu.group_id = p_group AND cu.part = r.part
        )
""" + _RETURN_LEASED_V3 + """
    END IF;
"""
_EXISTING_V2: Final = """    IF c_part IS NOT NULL THEN
        SELECT array_agg(x.tid) INTO v_doomed"""

_FETCH_V3: Final = (_FETCH_V2.replace(_ASYNC_COMMIT, "").replace(_FRESH_V2, _FRESH_V3)
                    .replace(_EXISTING_V2, _ONLY_NEW_V3 + _EXISTING_V2))

# Event ids are compared bytewise (the "C" collation): every append walks the
# unique (stream, event id) index once per event, and under a libc collation
# other than "C" each comparison on the way is a strcoll() call. Equality, and
# so idempotency, is the same under any deterministic collation; only the
# index (rebuilt here) and the order of ids change, and nothing orders by id.
_EVENT_ID_BYTEWISE: Final = 'ALTER TABLE {s}.events ALTER COLUMN event_id TYPE text COLLATE "C"'

_ADVANCE_V2: Final = """
CREATE OR REPLACE FUNCTION {s}.advance_frontiers(p_groups integer[], p_parts integer[])
RETURNS void LANGUAGE plpgsql """ + _OPTIONS + """ AS $fn$
BEGIN
""" + _ADVANCE_STEPS + """
END
$fn$"""

# Migration 4: every delivery keeps the last error a nack or reject recorded
# (NULL: none), and settle takes it as p_error (NULL keeps the recorded one).
# The old settle is dropped: an overload with the extra argument would make
# calls with eight arguments ambiguous. p_error defaults to NULL, so a process
# still running the previous release keeps settling across the upgrade.
_LAST_ERROR: Final = "ALTER TABLE {s}.deliveries ADD COLUMN last_error text"
_DROP_SETTLE_V2: Final = ("DROP FUNCTION {s}.settle(smallint, integer[], integer[], bigint[], "
                          "uuid[], integer[], text, bigint)")
_SETTLE_V4: Final = (
    _SETTLE_V2
    .replace("p_reason text, p_delay_ms bigint,\n",
             "p_reason text, p_delay_ms bigint, p_error text DEFAULT NULL,\n", 1)
    .replace("            settled_by = p_op,\n",
             "            settled_by = p_op,\n"
             "            last_error = COALESCE(p_error, d.last_error),\n", 1)
)

MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(1, "streams, events, groups, deliveries and the fetch/settle/renew functions",
              (*_TABLES, _ADVANCE, _FETCH, _SETTLE, _RENEW)),
    Migration(2, "fetch, settle and renew with plans that do not depend on table statistics",
              (_FETCH_V2, _SETTLE_V2, _RENEW_V2, _ADVANCE_V2)),
    Migration(3, "fetch commits durably (version 2's fetch committed asynchronously); "
                 "event ids compare bytewise",
              (_FETCH_V3, _EVENT_ID_BYTEWISE)),
    Migration(4, "deliveries keep the last error recorded by a nack or reject",
              (_LAST_ERROR, _DROP_SETTLE_V2, _SETTLE_V4)),
)

SCHEMA_VERSION: Final = MIGRATIONS[-1].version
"""The schema version this code needs; a database at a newer one is refused."""

VERSION_TABLE: Final = "rheo_schema_version"

BOOTSTRAP: Final = (
    "CREATE SCHEMA IF NOT EXISTS {s}",
    """CREATE TABLE IF NOT EXISTS {s}.""" + VERSION_TABLE + """ (
        version integer PRIMARY KEY,
        description text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now()
    )""",
)
"""Run under the advisory lock before migrations: where the version is recorded."""
