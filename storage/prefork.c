/*
 * storage/prefork.c - what the scheduler and the prefork zygotes keep and
 * ask (docs/prefork.md): a build's prefork verification outcome, and
 * whether the next queued cell is numerics-only.
 */
#include <errno.h>
#include <string.h>

#include "storage/options.h"
#include "storage/store_int.h"
#include "util/clock.h"

/* Only the revision that was verified is updated: a build replaced in the
 * meantime starts over as 'unverified'. */
int store_build_prefork_set(struct store *s, const char *name, int64_t rev, const char *state,
                            const char *reason)
{
    int rc = store_begin_flushed(s);
    if (rc)
        return rc;
    rc = store_run(s,
                   "UPDATE builds SET prefork_state=?1, prefork_reason=?2, "
                   "prefork_checked_at=?3 WHERE name=?4 AND updated_at=?5 AND prefork=1",
                   "ttItI", state, reason, util_wall_ms(), name, rev);
    return store_end(s, rc);
}

/* The first queued cell in the scheduler's order (store_cell_claim_filtered's),
 * whatever its device: numerics-only when its job's options.iterations is
 * 0 and it is not a GPU cell; untimed when iterations is 0 on any device. */
int store_next_cell_numerics(struct store *s, bool *numerics, bool *untimed)
{
    sqlite3_stmt *st = NULL;
    bool un = false;
    *numerics = false;
    int rc = store_cached(
        s, SC_CELL_NEXT_NUMERICS,
        "SELECT coalesce(json_extract(j.options_json, "
        "'$.iterations'), " CAPD_OPTION_DEFAULT_iterations ") = 0, "
        "coalesce(json_extract(j.options_json, '$.device'), '" CAPD_OPTION_DEFAULT_device
        "') <> 'gpu' "
        "FROM cells c JOIN jobs j ON j.seq = c.job_seq "
        "WHERE c.state = 'queued' AND j.state IN ('queued','running') "
        "ORDER BY c.job_seq, c.ord LIMIT 1",
        &st);
    if (rc)
        return rc;
    int src = sqlite3_step(st);
    if (src == SQLITE_ROW) {
        un = sqlite3_column_int(st, 0) != 0;
        *numerics = un && sqlite3_column_int(st, 1) != 0;
    } else if (src != SQLITE_DONE) {
        rc = store_rc(s, src);
    }
    sqlite3_reset(st);
    if (untimed)
        *untimed = un;
    return rc;
}
