-- Cubes by reference (s3:// and https:// hrefs, issue 32). The content digest of the objects a
-- referenced job read, by their references and versions (reference::Stored::memo_key: hrefs, sizes,
-- ETags or Last-Modified), written by the worker after its read. A later submit of the same objects
-- at the same versions then has the job digest of an upload of that cube, so that an owner's
-- repeated request finds its existing job. Owner-independent: it records what the bytes are.
CREATE TABLE reference_digests (
    reference       TEXT PRIMARY KEY,
    content_digest  TEXT NOT NULL,  -- hex Cube::content_digest
    carried_digest  TEXT,           -- hex CubeMeta::carried_digest (ENVI metadata carried to results)
    created_at      INTEGER NOT NULL
);
