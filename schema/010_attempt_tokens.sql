-- capd schema, migration 10: the capability token of a remote attempt
-- (docs/scale.md, "Remote attempts"). capd mints one when it hands an
-- attempt to a worker that runs away from capd's host (capd-cell); the
-- worker presents it on every /v1/attempts/{id} request. Only SHA-256 of
-- the token is kept; the token is good for its attempt alone, while the
-- attempt is open and until expires_at (ms since the epoch).

-- A capd that restarts while such an attempt runs takes it up again
-- (store_remote_reattach): the attempt stays open, its worker keeps
-- uploading with the same token, and slurm_job (executor "slurm") is the
-- Slurm job to poll.

CREATE TABLE attempt_tokens (
    attempt_id  INTEGER PRIMARY KEY REFERENCES attempts(id) ON DELETE CASCADE,
    hash        TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    slurm_job   INTEGER
);
