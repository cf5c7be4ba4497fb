-- capd schema, migration 17: a GPU cell that ended with a device error
-- (the runtime reporting the device itself failed) takes the device out
-- of the pool (daemon/host/devices.h) and is queued again, once, to run on
-- another device: gpu_moved marks it, so a second device error is its
-- outcome.

ALTER TABLE cells ADD COLUMN gpu_moved INTEGER NOT NULL DEFAULT 0;
