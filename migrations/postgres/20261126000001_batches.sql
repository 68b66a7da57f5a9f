-- Batches: see migrations/sqlite/20261126000001_batches.sql.
CREATE TABLE batches (
    id             TEXT PRIMARY KEY NOT NULL,
    owner          TEXT NOT NULL,
    statistics     TEXT NOT NULL CHECK (statistics IN ('pooled', 'each')),
    params         TEXT NOT NULL,
    inputs         BIGINT NOT NULL,
    system_key     TEXT,
    error_code     TEXT,
    error_message  TEXT,
    created_at     BIGINT NOT NULL
);

CREATE INDEX batches_owner ON batches (owner, id);

ALTER TABLE jobs ADD COLUMN batch_id TEXT;
ALTER TABLE jobs ADD COLUMN batch_position BIGINT;
ALTER TABLE jobs ADD COLUMN batch_phase TEXT;
CREATE INDEX jobs_batch ON jobs (batch_id, batch_position) WHERE batch_id IS NOT NULL;
