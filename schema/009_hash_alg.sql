-- capd schema, migration 9: the algorithm of each tensor record's hash
-- ("hash_alg" in the tensor frame, docs/protocol.md).
--
-- Runners before the field hashed with BLAKE2b-128, so that is the default
-- and every row already stored says so; the native capture pipe now writes
-- "xxh3-128". The comparison engine never calls two records identical or
-- different by hash when their algorithms differ (docs/compare.md). Only
-- tensor records carry a hash: capd writes NULL for the other kinds, and
-- the value of an older non-tensor row is never read.
--
-- Payload blobs are not named by this hash: their key is SHA-256 of the
-- bytes (storage/records.c), collision-resistant whatever the runner sent.

ALTER TABLE records ADD COLUMN hash_alg TEXT DEFAULT 'blake2b-128'
    CHECK (hash_alg IS NULL OR hash_alg IN ('blake2b-128', 'xxh3-128'));
