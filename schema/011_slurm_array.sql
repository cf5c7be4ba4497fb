-- capd schema, migration 11: executor "slurm" submits the attempts a
-- scheduler pass starts as one job array (docs/scale.md); slurm_task is
-- the attempt's index in the array whose id is slurm_job (NULL: a job of
-- its own, as migration 10 stored them).

ALTER TABLE attempt_tokens ADD COLUMN slurm_task INTEGER;
