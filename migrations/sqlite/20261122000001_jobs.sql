-- One row per job. Times are Unix milliseconds (UTC). Status moves
-- queued -> running -> succeeded | failed | canceled; a job left 'running' by a process that died is put
-- back to 'queued' at the next start.
CREATE TABLE jobs (
    id               TEXT PRIMARY KEY NOT NULL,       -- UUID v7 (time-ordered)
    owner            TEXT NOT NULL,                   -- API key name ('anonymous' without keys)
    status           TEXT NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'canceled')),
    stage            TEXT,
    progress         REAL NOT NULL DEFAULT 0,
    params           TEXT NOT NULL,                   -- canonical JSON of MnfParams
    digest           TEXT NOT NULL,                   -- hex SHA-256 of (cube content digest, params)
    upload_sha256    TEXT,                            -- hex SHA-256 of the request body as received
    input            TEXT NOT NULL,                   -- JSON {lines, samples, bands, data_type, interleave}
    input_kind       TEXT NOT NULL CHECK (input_kind IN ('npy', 'envi', 'href')),
    input_location   TEXT NOT NULL,                   -- storage prefix of the upload, or the local path of an href
    error_code       TEXT,
    error_message    TEXT,
    results          TEXT,                            -- JSON: product -> storage key
    attempts         INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER
);

CREATE INDEX jobs_queue ON jobs (status, created_at, id);
CREATE INDEX jobs_owner ON jobs (owner, id);
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
-- The cache: one live (queued, running or succeeded) job per owner and digest. Failed and canceled jobs
-- leave it, so the same request can be tried again.
CREATE UNIQUE INDEX jobs_cache ON jobs (owner, digest) WHERE status IN ('queued', 'running', 'succeeded');
CREATE INDEX jobs_upload ON jobs (owner, upload_sha256) WHERE upload_sha256 IS NOT NULL;
