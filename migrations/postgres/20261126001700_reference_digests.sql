-- The content digests of referenced objects: see migrations/sqlite/20261126001700_reference_digests.sql.
CREATE TABLE reference_digests (
    reference       TEXT PRIMARY KEY,
    content_digest  TEXT NOT NULL,
    carried_digest  TEXT,
    created_at      BIGINT NOT NULL
);
