/*
 * storage/gpu.c - what the scheduler asks before it places a GPU cell
 * (daemon/host/devices.h): which GPU cell is next in the queue, whether
 * it must hold its device alone, and how much device memory earlier runs
 * of the same cell needed.
 */
#include <errno.h>
#include <string.h>

#include "storage/options.h"
#include "storage/store_int.h"

/* The largest device_peak_bytes a committed cell of the same build,
 * model, width, pass and mode recorded (its memory frame), into *PEAK; -1
 * when none did. */
static int recorded_peak(struct store *s, const char *build, const char *model, const char *width,
                         const char *pass, const char *mode, int64_t *peak)
{
    sqlite3_stmt *st = NULL;
    *peak = -1;
    int rc = store_query(s, &st,
                         "SELECT max(CAST(json_extract(r.header, '$.device_peak_bytes') AS "
                         "INTEGER)) FROM cells c JOIN jobs j ON j.seq = c.job_seq "
                         "JOIN attempts a ON a.cell_seq = c.seq AND a.n = c.committed_attempt "
                         "JOIN records r ON r.attempt_id = a.id AND r.kind = 'memory' "
                         "WHERE j.build = ?1 AND c.model = ?2 AND c.width = ?3 AND c.pass = ?4 "
                         "AND c.mode IS ?5",
                         "ttttt", build, model, width, pass, mode);
    if (rc == 0 && (rc = store_step(s, st)) == 0 && sqlite3_column_type(st, 0) != SQLITE_NULL)
        *peak = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return rc == -ENOENT ? 0 : rc;
}

/* The GPU facts of the cell whose seq is SEQ. */
static int facts_of(struct store *s, int64_t seq, struct store_gpu_cell *out)
{
    sqlite3_stmt *st = NULL;
    memset(out, 0, sizeof *out);
    out->peak_bytes = -1;
    int rc = store_query(
        s, &st,
        "SELECT j.build, c.model, c.width, c.pass, c.mode, "
        "coalesce(json_extract(j.options_json, '$.iterations'), " CAPD_OPTION_DEFAULT_iterations
        ") > 0 "
        "OR c.gpu_alone FROM cells c JOIN jobs j ON j.seq = c.job_seq WHERE c.seq = ?1",
        "I", seq);
    if (rc == 0 && (rc = store_step(s, st)) == 0) {
        out->cell_seq = seq;
        out->alone = sqlite3_column_int(st, 5) != 0;
        rc = recorded_peak(
            s, (const char *)sqlite3_column_text(st, 0), (const char *)sqlite3_column_text(st, 1),
            (const char *)sqlite3_column_text(st, 2), (const char *)sqlite3_column_text(st, 3),
            (const char *)sqlite3_column_text(st, 4), &out->peak_bytes);
    }
    sqlite3_finalize(st);
    return rc;
}

int store_next_gpu_cell(struct store *s, struct store_gpu_cell *out)
{
    sqlite3_stmt *st = NULL;
    int64_t seq = 0;
    memset(out, 0, sizeof *out);
    out->peak_bytes = -1;
    int rc = store_query(
        s, &st,
        "SELECT c.seq FROM cells c JOIN jobs j ON j.seq = c.job_seq "
        "WHERE c.state = 'queued' AND j.state IN ('queued','running') "
        "AND coalesce(json_extract(j.options_json, '$.device'), '" CAPD_OPTION_DEFAULT_device
        "') = 'gpu' "
        "ORDER BY c.job_seq, c.ord LIMIT 1",
        "");
    if (rc == 0 && (rc = store_step(s, st)) == 0)
        seq = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    if (rc == -ENOENT)
        return 0;
    return rc ? rc : facts_of(s, seq, out);
}

int store_gpu_cell_of(struct store *s, const struct store_cell_run *run, struct store_gpu_cell *out)
{
    return facts_of(s, run->cell_seq, out);
}
