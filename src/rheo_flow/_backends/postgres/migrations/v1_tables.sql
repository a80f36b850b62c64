-- Migration 1: the tables and their indexes (the layout is described in
-- rheo_flow/_backends/postgres/_migrations.py).

CREATE TABLE {s}.streams (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE,
    partitions integer NOT NULL CHECK (partitions > 0),
    created_at_ms bigint NOT NULL
);

CREATE TABLE {s}.partitions (
    stream_id integer NOT NULL REFERENCES {s}.streams (id),
    part integer NOT NULL,
    high_water bigint NOT NULL DEFAULT 0,
    low_water bigint NOT NULL DEFAULT 1,
    PRIMARY KEY (stream_id, part)
);

CREATE TABLE {s}.events (
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
);

CREATE UNIQUE INDEX events_event_id ON {s}.events (stream_id, event_id);

CREATE TABLE {s}.groups (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream_id integer NOT NULL REFERENCES {s}.streams (id),
    name text NOT NULL,
    max_attempts integer NOT NULL CHECK (max_attempts > 0),
    created_at_ms bigint NOT NULL,
    UNIQUE (stream_id, name)
);

CREATE TABLE {s}.cursors (
    group_id integer NOT NULL REFERENCES {s}.groups (id),
    part integer NOT NULL,
    cursor bigint NOT NULL,
    PRIMARY KEY (group_id, part)
);

CREATE TABLE {s}.frontiers (
    group_id integer NOT NULL REFERENCES {s}.groups (id),
    part integer NOT NULL,
    frontier bigint NOT NULL,
    PRIMARY KEY (group_id, part)
);

CREATE TABLE {s}.deliveries (
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
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

CREATE INDEX deliveries_available ON {s}.deliveries (group_id, part, seq) WHERE state = 0;

CREATE INDEX deliveries_leased ON {s}.deliveries (group_id, part, seq, deadline_ms)
    WHERE state = 1;

CREATE INDEX deliveries_rejected ON {s}.deliveries (group_id, part, seq) WHERE state = 3;
