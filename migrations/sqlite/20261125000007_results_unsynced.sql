-- A succeeded job whose result files may not be on the disk yet. Results are written into the page
-- cache and the job is marked succeeded at once (an fsync of a 37 MB result takes ~30 ms on the H100
-- host's disk); the files are synced right after, in the background, and then this goes back to 0.
-- A job still marked at the next start (the machine stopped in between) has its results checked: a
-- result cut short is computed again from the job's input, or, without an input, the job fails with
-- `result_lost` instead of serving a short file (jobs::result_sync).
ALTER TABLE jobs ADD COLUMN results_unsynced INTEGER NOT NULL DEFAULT 0;
CREATE INDEX jobs_results_unsynced ON jobs (lease_owner) WHERE results_unsynced = 1;
