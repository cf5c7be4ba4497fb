-- capd schema, migration 5: widths this host cannot run (docs/widths.md).
--
-- A cell at a width whose arch or CPU features the host lacks ends
-- 'unsupported' before any child starts; host_missing names what the host
-- lacked ("avx512f, avx512bw", or "arch:ppc64le"). It is NULL for every
-- other cell, an 'unsupported' that the runner reported included (the
-- framework, not the host, could not honour the width), so comparisons
-- can tell "not run on this host" from a build that lost a width.
ALTER TABLE cells ADD COLUMN host_missing TEXT;
