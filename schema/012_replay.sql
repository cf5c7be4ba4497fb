-- capd schema, migration 12: the replay step (daemon/replay/isolate.h)
-- looks, at every scheduler pass, for a replay's control job that has
-- finished and whose isolated pair it has not yet prepared (labels
-- replay_side "control", no replay_isolated). This partial index holds
-- those jobs alone, so the look costs nothing on a database of many jobs.

CREATE INDEX jobs_replay_pending ON jobs(seq)
    WHERE json_extract(labels_json, '$.replay_side') = 'control'
      AND json_extract(labels_json, '$.replay_isolated') IS NULL;
