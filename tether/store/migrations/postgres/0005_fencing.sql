-- Fencing tokens (docs/background.md "Many replicas"): a run's ownership epoch, raised when
-- another replica takes the run over or ends it for an owner that stopped heartbeating; the
-- run's writes and its response's store write carry the writer's epoch, and a stale one is
-- refused in the same statement.
ALTER TABLE runs ADD COLUMN epoch bigint NOT NULL DEFAULT 0;
ALTER TABLE responses ADD COLUMN epoch bigint NOT NULL DEFAULT 0;
