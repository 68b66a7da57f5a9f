-- An owner's jobs by the cube they were made from: a request that names its cube by X-Cube-Digest can
-- then be run on that cube while this instance still holds it on a device, without its body
-- (jobs::resident).
CREATE INDEX jobs_content ON jobs (owner, content_digest) WHERE content_digest IS NOT NULL;
