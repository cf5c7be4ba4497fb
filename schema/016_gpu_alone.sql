-- capd schema, migration 16: a GPU cell that ran out of device memory
-- while it shared its device with other cells (daemon/host/devices.h) is
-- queued again, once, to hold a device alone: gpu_alone marks it, and the
-- scheduler then places it as it does a timing cell. A cell that ran
-- alone is never queued again for memory, so a second oom is its outcome.

ALTER TABLE cells ADD COLUMN gpu_alone INTEGER NOT NULL DEFAULT 0;
