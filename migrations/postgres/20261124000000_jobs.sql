-- The job store on PostgreSQL, for several instances sharing one queue. The same tables as
-- migrations/sqlite (read that for what each column means), with two differences:
--   * `seq` is the result level's handle of a job (SQLite uses its implicit rowid);
--   * integers are BIGINT and reals DOUBLE PRECISION, so that one set of queries decodes the same
--     Rust types on both databases (jobs/store.rs runs them through sqlx's `any` driver).
-- JSON columns stay TEXT for the same reason.
CREATE TABLE jobs (
    id               TEXT PRIMARY KEY NOT NULL,
    seq              BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    owner            TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'canceled')),
    stage            TEXT,
    progress         DOUBLE PRECISION NOT NULL DEFAULT 0,
    params           TEXT NOT NULL,
    digest           TEXT NOT NULL,
    upload_sha256    TEXT,
    input            TEXT NOT NULL,
    input_kind       TEXT NOT NULL CHECK (input_kind IN ('npy', 'envi', 'href')),
    input_location   TEXT NOT NULL,
    error_code       TEXT,
    error_message    TEXT,
    results          TEXT,
    attempts         BIGINT NOT NULL DEFAULT 0,
    created_at       BIGINT NOT NULL,
    started_at       BIGINT,
    finished_at      BIGINT,
    content_digest   TEXT,
    -- The instance that holds the claim of a running job, and until when (Unix ms): see
    -- migrations/sqlite/20261124000001_leases.sql.
    lease_owner      TEXT,
    lease_expires_at BIGINT
);

CREATE INDEX jobs_queue ON jobs (status, created_at, id);
CREATE INDEX jobs_owner ON jobs (owner, id);
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
CREATE UNIQUE INDEX jobs_cache ON jobs (owner, digest) WHERE status IN ('queued', 'running', 'succeeded');
CREATE INDEX jobs_upload ON jobs (owner, upload_sha256) WHERE upload_sha256 IS NOT NULL;
CREATE INDEX jobs_leases ON jobs (lease_expires_at) WHERE status = 'running';

CREATE TABLE eigen_systems (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    digest          TEXT NOT NULL UNIQUE,
    job_id          TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    storage_key     TEXT NOT NULL,
    format_version  BIGINT NOT NULL,
    backend         TEXT NOT NULL,
    bytes           BIGINT NOT NULL,
    created_at      BIGINT NOT NULL
);

CREATE INDEX eigen_systems_job ON eigen_systems (job_id);
