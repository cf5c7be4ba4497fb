-- capd schema, migration 15: the compiler bisection follow-ups
-- (daemon/replay/compiler.h). A finished job whose option compiler_bisect
-- is auto and that the step has not looked at (no label
-- compiler_bisect_auto) is found through this index. Jobs stored before
-- the option existed have no compiler_bisect in their options and are
-- never looked at.

CREATE INDEX jobs_compiler_bisect_auto ON jobs(seq)
    WHERE json_extract(labels_json, '$.compiler_bisect_auto') IS NULL
      AND json_extract(options_json, '$.compiler_bisect') = 'auto';
