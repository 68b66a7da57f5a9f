-- Claims are leases (cluster issue): the instance that runs a job holds it until lease_expires_at and
-- extends it while the job runs; a job whose lease ran out (its instance died) is claimed again.
ALTER TABLE jobs ADD COLUMN lease_owner TEXT;
ALTER TABLE jobs ADD COLUMN lease_expires_at INTEGER;
