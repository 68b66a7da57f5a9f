-- A succeeded job whose result files may not be on the disk yet: see
-- migrations/sqlite/20261125000007_results_unsynced.sql.
ALTER TABLE jobs ADD COLUMN results_unsynced BIGINT NOT NULL DEFAULT 0;
CREATE INDEX jobs_results_unsynced ON jobs (lease_owner) WHERE results_unsynced = 1;
