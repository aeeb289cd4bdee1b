-- Runs shared between replicas (tether/store/postgres_runs.py; docs/background.md "Many
-- replicas"): a response in flight, its numbered events, and each replica's heartbeat.
CREATE TABLE runs (
    tenant     text        NOT NULL,
    id         text        NOT NULL,
    owner      text        NOT NULL,
    state      text        NOT NULL,
    response   bytea,
    next_seq   bigint      NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL,
    params     bytea,                 -- a queued background run's ResponseCreateParams (takeover)
    PRIMARY KEY (tenant, id)
);
CREATE INDEX runs_expires_at ON runs (expires_at);
CREATE INDEX runs_queued ON runs (expires_at) WHERE state = 'queued';

CREATE TABLE run_events (
    tenant text   NOT NULL,
    run_id text   NOT NULL,
    seq    bigint NOT NULL,
    event  bytea  NOT NULL,
    PRIMARY KEY (tenant, run_id, seq)
);

CREATE TABLE run_replicas (
    id      text        PRIMARY KEY,
    seen_at timestamptz NOT NULL
);
