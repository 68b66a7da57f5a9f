-- Imported eigen systems (issue 32, "Reuse a system"): system files posted to /v1/systems, stored as
-- objects under systems/<id>/, owner-scoped like jobs, and named by a job's `statistics_from`.
-- Integers are BIGINT, as in the jobs table, so that one set of queries decodes the same on both.
CREATE TABLE systems (
    id          TEXT PRIMARY KEY NOT NULL,
    owner       TEXT NOT NULL,
    identity    TEXT NOT NULL,
    bands       BIGINT NOT NULL,
    bands_used  BIGINT NOT NULL,
    storage_key TEXT NOT NULL,
    bytes       BIGINT NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE INDEX systems_owner ON systems (owner, created_at);
