-- The job cache (issue 5).
--
-- The decoded cube's content digest of each job (hex SHA-256, Cube::content_digest), so that the worker
-- can find the statistics and the device-resident cube of a job before reading its input. NULL for jobs
-- created before this migration: the worker then computes it from the cube.
ALTER TABLE jobs ADD COLUMN content_digest TEXT;

-- The statistics level: eigen systems computed by finished jobs, stored as objects (the eigen_file
-- format) and found again by their statistics key. A row lives as long as the job that computed it:
-- deleting or expiring the job deletes the row (and the job's results/<id>/ objects, where the file is).
CREATE TABLE eigen_systems (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,  -- the handle in the cache index (never reused)
    digest          TEXT NOT NULL UNIQUE,               -- hex statistics key
    job_id          TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    storage_key     TEXT NOT NULL,                      -- the object holding the eigen system
    format_version  INTEGER NOT NULL,                   -- eigen_file::FORMAT_VERSION of the object
    backend         TEXT NOT NULL,                      -- backend that computed it (also in the key)
    bytes           INTEGER NOT NULL,
    created_at      INTEGER NOT NULL
);

CREATE INDEX eigen_systems_job ON eigen_systems (job_id);
