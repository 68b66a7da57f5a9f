-- Batches (issue 32): several cubes submitted together, each a job of its own. With `statistics =
-- 'pooled'` one eigen system is computed from the statistics of all of them and every cube is projected
-- with it; with 'each' the jobs are independent.
--
-- A pooled member job runs twice: first in phase 'statistics' (its cube's moments are stored under
-- `batches/<id>/moments/`), then, once every member has its moments and the pooled system is stored
-- (`system_key`), in phase 'project'. Between the two the job is 'queued' but cannot be claimed.
CREATE TABLE batches (
    id             TEXT PRIMARY KEY NOT NULL,          -- UUID v7
    owner          TEXT NOT NULL,
    statistics     TEXT NOT NULL CHECK (statistics IN ('pooled', 'each')),
    params         TEXT NOT NULL,                      -- canonical JSON of the MnfParams given
    inputs         INTEGER NOT NULL,                   -- number of member jobs
    system_key     TEXT,                               -- pooled: the stored pooled eigen system, once computed
    error_code     TEXT,                               -- pooled: why no system can be computed
    error_message  TEXT,
    created_at     INTEGER NOT NULL
);

CREATE INDEX batches_owner ON batches (owner, id);

ALTER TABLE jobs ADD COLUMN batch_id TEXT;
ALTER TABLE jobs ADD COLUMN batch_position INTEGER;
-- 'statistics' or 'project' for a pooled member; NULL otherwise.
ALTER TABLE jobs ADD COLUMN batch_phase TEXT;
CREATE INDEX jobs_batch ON jobs (batch_id, batch_position) WHERE batch_id IS NOT NULL;
