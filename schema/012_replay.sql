-- capd schema, migration 12: the replay steps (daemon/replay/) look at
-- every scheduler pass for what they have still to do, through these
-- partial indexes, which hold those jobs alone, so the look costs nothing
-- on a database of many jobs.
--
-- jobs_replay_pending: a replay's finished control job whose isolated
-- pair is not yet prepared (labels replay_side "control", no
-- replay_isolated; daemon/replay/isolate.h).
-- jobs_replay_auto: a job at granularity op the automatic replay has not
-- looked at (no label replay_auto; daemon/replay/auto.h). The jobs stored
-- before this migration are not replayed by themselves: their label says
-- so.

CREATE INDEX jobs_replay_pending ON jobs(seq)
    WHERE json_extract(labels_json, '$.replay_side') = 'control'
      AND json_extract(labels_json, '$.replay_isolated') IS NULL;

UPDATE jobs SET labels_json = json_set(coalesce(labels_json, '{}'), '$.replay_auto',
                                       'not looked at: older than automatic replay')
    WHERE json_extract(options_json, '$.granularity') = 'op'
      AND json_extract(labels_json, '$.replay_of') IS NULL;

CREATE INDEX jobs_replay_auto ON jobs(seq)
    WHERE json_extract(options_json, '$.granularity') = 'op'
      AND json_extract(labels_json, '$.replay_auto') IS NULL
      AND json_extract(labels_json, '$.replay_of') IS NULL;
