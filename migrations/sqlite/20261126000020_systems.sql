-- Imported eigen systems (issue 32, "Reuse a system"): system files posted to /v1/systems, stored as
-- objects under systems/<id>/, owner-scoped like jobs, and named by a job's `statistics_from`.
CREATE TABLE systems (
    id          TEXT PRIMARY KEY NOT NULL,
    owner       TEXT NOT NULL,
    identity    TEXT NOT NULL,      -- SystemFile::identity (hex SHA-256 of what a projection uses)
    bands       INTEGER NOT NULL,   -- the input's band count B
    bands_used  INTEGER NOT NULL,   -- u: the most components a projection with it keeps
    storage_key TEXT NOT NULL,      -- the object holding the system file (JSON)
    bytes       INTEGER NOT NULL,
    created_at  INTEGER NOT NULL
);

CREATE INDEX systems_owner ON systems (owner, created_at);
