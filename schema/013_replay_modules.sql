-- capd schema, migration 13: automatic replay at every granularity. A job
-- at granularity module (the default) whose comparison finds a divergence
-- now replays the module call where it came in (daemon/replay/auto.h), so
-- the automatic replay looks at every job whose option replay is not off,
-- not only those at granularity op.
--
-- The jobs at another granularity stored before this migration are not
-- replayed by themselves: their label says so, which also keeps them out
-- of the index.

DROP INDEX jobs_replay_auto;

UPDATE jobs SET labels_json = json_set(coalesce(labels_json, '{}'), '$.replay_auto',
                                       'not looked at: older than automatic replay of modules')
    WHERE coalesce(json_extract(options_json, '$.granularity'), 'module') != 'op'
      AND json_extract(labels_json, '$.replay_auto') IS NULL
      AND json_extract(labels_json, '$.replay_of') IS NULL;

CREATE INDEX jobs_replay_auto ON jobs(seq)
    WHERE json_extract(labels_json, '$.replay_auto') IS NULL
      AND json_extract(labels_json, '$.replay_of') IS NULL
      AND coalesce(json_extract(options_json, '$.replay'), 'auto') != 'off';
