-- capd schema, migration 6: reserved for the cell memory limits (daemon/,
-- developed on another branch), which replace this file with theirs when
-- both land. It changes nothing, so that 007 can be numbered without a gap
-- (migrations run in order, numbered from 1 without gaps).
SELECT 1;
