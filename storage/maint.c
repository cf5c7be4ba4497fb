/*
 * storage/maint.c - database care: online backup, vacuum and retention.
 *
 * All three are safe while capd runs. A backup reads one consistent
 * snapshot (a WAL reader never blocks the ingest writer); retention works
 * in short write transactions so the ingest writer never waits long; a
 * vacuum holds the write lock for its whole run, which is why `capd db
 * vacuum` refuses while cells run unless forced.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/store_int.h"

/* A prune transaction is committed after this many detached records (the
 * ingest batch size) or this many jobs, so the ingest writer, which waits
 * at most its busy timeout for the write lock, never waits on a long one. */
#define PRUNE_TXN_RECORDS 20000
#define PRUNE_TXN_JOBS 64

/* How long a backup retries while the source is locked (only possible
 * during a checkpoint or a WAL reset, never for long). */
#define BACKUP_BUSY_MS 30000

/* Error messages name at most two strings. */
static void set_err(char **err, const char *fmt, const char *a, const char *b)
{
    if (err && asprintf(err, fmt, a, b) < 0)
        *err = NULL;
}

/* realpath() of a path whose last component may not exist yet. */
static int resolve_dest(const char *dest, char out[PATH_MAX])
{
    char *d1 = strdup(dest), *d2 = strdup(dest);
    char dir[PATH_MAX];
    int rc = -ENOMEM;
    if (!d1 || !d2)
        goto out;
    rc = -errno;
    if (!realpath(dirname(d1), dir))
        goto out;
    const char *base = basename(d2);
    rc = -ENAMETOOLONG;
    if ((size_t)snprintf(out, PATH_MAX, "%s/%s", dir, base) >= PATH_MAX)
        goto out;
    rc = 0;
out:
    free(d1);
    free(d2);
    return rc;
}

static void unlink_db(const char *path)
{
    static const char *const sfx[] = {"", "-journal", "-wal", "-shm"};
    char p[PATH_MAX + 16];
    for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++) {
        snprintf(p, sizeof p, "%s%s", path, sfx[i]);
        unlink(p);
    }
}

static int fsync_path(const char *path, int flags)
{
    int fd = open(path, flags | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

/*
 * The copy is taken with sqlite3_backup_step(-1): every page in one call,
 * inside one read transaction on the source. Stepping in chunks would let
 * the ingest writer's commits restart the copy over and over; one step
 * reads a single snapshot while writers carry on (WAL), so the copy is
 * exactly the database as of one commit. The copy is then turned into a
 * plain rollback-journal file (no -wal beside it to lose), checked,
 * fsync'd, and renamed over DEST, so DEST is either the old file or a
 * complete new copy.
 */
int store_backup(const char *data_dir, const char *dest, struct store_backup_info *info,
                 char **err)
{
    char src_path[PATH_MAX], src_real[PATH_MAX], dest_real[PATH_MAX], tmp[PATH_MAX + 16];
    sqlite3 *src = NULL, *dst = NULL;
    sqlite3_backup *b = NULL;
    sqlite3_stmt *st = NULL;
    bool tmp_made = false;
    int rc = -EIO, src_rc;
    if (err)
        *err = NULL;
    memset(info, 0, sizeof *info);
    if ((size_t)snprintf(src_path, sizeof src_path, "%s/capd.db", data_dir) >= sizeof src_path)
        return -ENAMETOOLONG;
    if (!realpath(src_path, src_real)) {
        rc = -errno;
        set_err(err, "no database at %s: %s", src_path, strerror(-rc));
        return rc;
    }
    if ((rc = resolve_dest(dest, dest_real)) != 0) {
        set_err(err, "cannot write a backup to %s: %s", dest, strerror(-rc));
        return rc;
    }
    /* Renaming the copy over the live database (or its WAL) would destroy
     * it; the same path after resolving links is refused. */
    size_t sl = strlen(src_real);
    if (strncmp(dest_real, src_real, sl) == 0 &&
        (dest_real[sl] == 0 || strcmp(dest_real + sl, "-wal") == 0 ||
         strcmp(dest_real + sl, "-shm") == 0 || strcmp(dest_real + sl, "-journal") == 0)) {
        set_err(err, "the backup destination %s is the live database %s", dest, src_real);
        return -EINVAL;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", dest_real);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        set_err(err, "cannot create a file next to %s: %s", dest, strerror(-rc));
        return rc;
    }
    close(fd);
    tmp_made = true;

    rc = -EIO;
    if (sqlite3_open_v2(src_path, &src, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK) {
        set_err(err, "cannot open %s: %s", src_path, src ? sqlite3_errmsg(src) : "out of memory");
        goto out;
    }
    sqlite3_busy_timeout(src, 10000);
    if (sqlite3_open_v2(tmp, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK) {
        set_err(err, "cannot open %s: %s", tmp, dst ? sqlite3_errmsg(dst) : "out of memory");
        goto out;
    }
    if (!(b = sqlite3_backup_init(dst, "main", src, "main"))) {
        set_err(err, "cannot start the backup: %s%s", sqlite3_errmsg(dst), "");
        goto out;
    }
    for (int waited = 0;; waited += 100) {
        src_rc = sqlite3_backup_step(b, -1);
        if ((src_rc != SQLITE_BUSY && src_rc != SQLITE_LOCKED) || waited >= BACKUP_BUSY_MS)
            break;
        sqlite3_sleep(100);
    }
    int fin_rc = sqlite3_backup_finish(b);
    b = NULL;
    if (src_rc == SQLITE_DONE)
        src_rc = fin_rc;
    if (src_rc != SQLITE_OK) {
        rc = store_rc(NULL, src_rc);
        set_err(err, "backup failed: %s%s", sqlite3_errstr(src_rc), "");
        goto out;
    }
    /* The copy carries the source's WAL flag in its header; a backup is
     * one self-contained file. */
    char *msg = NULL;
    if (sqlite3_exec(dst, "PRAGMA journal_mode=DELETE", NULL, NULL, &msg) != SQLITE_OK) {
        set_err(err, "cannot finish the copy: %s%s", msg ? msg : sqlite3_errmsg(dst), "");
        sqlite3_free(msg);
        goto out;
    }
    if (sqlite3_prepare_v2(dst, "PRAGMA quick_check", -1, &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW ||
        strcmp((const char *)sqlite3_column_text(st, 0), "ok") != 0) {
        set_err(err, "the copy fails its check: %s%s",
                st && sqlite3_column_text(st, 0) ? (const char *)sqlite3_column_text(st, 0)
                                                 : sqlite3_errmsg(dst),
                "");
        goto out;
    }
    sqlite3_finalize(st);
    st = NULL;
    if (sqlite3_prepare_v2(dst,
                           "SELECT (SELECT user_version FROM pragma_user_version), "
                           "(SELECT page_size FROM pragma_page_size), "
                           "(SELECT page_count FROM pragma_page_count)",
                           -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW) {
        info->schema_version = sqlite3_column_int(st, 0);
        info->bytes = sqlite3_column_int64(st, 1) * sqlite3_column_int64(st, 2);
        info->pages = sqlite3_column_int64(st, 2);
    }
    sqlite3_finalize(st);
    st = NULL;
    if (sqlite3_close(dst) != SQLITE_OK)
        goto out;
    dst = NULL;
    if ((rc = fsync_path(tmp, O_RDONLY)) != 0 || rename(tmp, dest_real) != 0) {
        rc = rc ? rc : -errno;
        set_err(err, "cannot put the copy in place at %s: %s", dest, strerror(-rc));
        goto out;
    }
    tmp_made = false;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", dest_real);
    fsync_path(dirname(dir), O_RDONLY | O_DIRECTORY);
    snprintf(info->path, sizeof info->path, "%s", dest_real);
    rc = 0;
out:
    sqlite3_finalize(st);
    if (b)
        sqlite3_backup_finish(b);
    sqlite3_close(dst);
    sqlite3_close(src);
    if (tmp_made)
        unlink_db(tmp);
    return rc;
}

int store_size(struct store *s, struct store_size *out)
{
    sqlite3_stmt *st = NULL;
    memset(out, 0, sizeof *out);
    int rc = store_prepare(s,
                           "SELECT (SELECT page_size FROM pragma_page_size), "
                           "(SELECT page_count FROM pragma_page_count), "
                           "(SELECT freelist_count FROM pragma_freelist_count)",
                           &st);
    if (rc)
        return rc;
    if (sqlite3_step(st) == SQLITE_ROW) {
        out->page_size = sqlite3_column_int64(st, 0);
        out->pages = sqlite3_column_int64(st, 1);
        out->free_pages = sqlite3_column_int64(st, 2);
    } else {
        rc = -EIO;
    }
    sqlite3_finalize(st);
    const char *db = sqlite3_db_filename(s->db, "main");
    struct stat sb;
    char wal[PATH_MAX + 8];
    if (db && *db) {
        if (stat(db, &sb) == 0)
            out->file_bytes = (int64_t)sb.st_size;
        snprintf(wal, sizeof wal, "%s-wal", db);
        if (stat(wal, &sb) == 0)
            out->wal_bytes = (int64_t)sb.st_size;
    }
    return rc;
}

int store_running_cells(struct store *s, int64_t *n)
{
    sqlite3_stmt *st = NULL;
    int rc = store_prepare(s, "SELECT count(*) FROM cells WHERE state = 'running'", &st);
    if (rc)
        return rc;
    rc = sqlite3_step(st) == SQLITE_ROW ? 0 : -EIO;
    *n = rc ? 0 : sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return rc;
}

/*
 * In WAL mode VACUUM writes the rebuilt database into the WAL; the file
 * only shrinks once a checkpoint copies it back and truncates. A reader
 * holding an old snapshot can keep the checkpoint from finishing: then
 * *checkpoint_busy is set and the space comes back at a later checkpoint.
 */
int store_vacuum(struct store *s, bool *checkpoint_busy)
{
    sqlite3_stmt *st = NULL;
    int rc = store_flush(s);
    *checkpoint_busy = false;
    if (rc)
        return rc;
    if ((rc = store_exec(s, "VACUUM")) != 0)
        return rc;
    if ((rc = store_prepare(s, "PRAGMA wal_checkpoint(TRUNCATE)", &st)) != 0)
        return rc;
    if (sqlite3_step(st) == SQLITE_ROW)
        *checkpoint_busy = sqlite3_column_int(st, 0) != 0;
    else
        rc = store_rc(s, sqlite3_errcode(s->db));
    sqlite3_finalize(st);
    return rc;
}

/* ---- retention ---- */

/*
 * The commits whose jobs are kept whole: every control (named by any job's
 * control_commit or a branch's), the newest KEEP commits of each
 * (project, branch) (jobs without a branch form one group per project),
 * and every commit with a job still queued or running. Comparisons find
 * jobs by commit, so keeping is decided per commit: all jobs of a kept
 * commit are kept, whichever branch they were posted on.
 */
static const char keep_sql[] =
    "INSERT OR IGNORE INTO temp.prune_keep(commit_sha) "
    "SELECT control_commit FROM main.jobs WHERE control_commit IS NOT NULL "
    "UNION SELECT control_commit FROM main.branches WHERE control_commit IS NOT NULL "
    "UNION SELECT j.commit_sha FROM main.jobs j WHERE j.state NOT IN ('done','cancelled') "
    "  OR EXISTS (SELECT 1 FROM main.cells c WHERE c.job_seq = j.seq "
    "             AND c.state IN ('queued','running')) "
    "UNION SELECT commit_sha FROM (SELECT commit_sha, row_number() OVER "
    "  (PARTITION BY project, branch ORDER BY last_seq DESC) AS rn FROM "
    "  (SELECT project, branch, commit_sha, max(seq) AS last_seq FROM main.jobs "
    "   GROUP BY project, branch, commit_sha)) WHERE rn <= ?1";

/* Jobs of commits not kept that still hold payload references. */
#define CANDIDATES                                                                                 \
    "SELECT j.seq FROM main.jobs j WHERE j.commit_sha NOT IN "                                     \
    "(SELECT commit_sha FROM temp.prune_keep) AND j.seq > ?1 AND EXISTS "                          \
    "(SELECT 1 FROM main.cells c JOIN main.attempts a ON a.cell_seq = c.seq JOIN main.records r "  \
    "ON r.attempt_id = a.id WHERE c.job_seq = j.seq AND r.blob_hash IS NOT NULL) ORDER BY j.seq"

/* Candidate blobs (of the job being pruned) that no record names. */
#define UNREFERENCED                                                                               \
    "FROM main.blobs b WHERE b.hash IN (SELECT hash FROM temp.prune_blobs) AND NOT EXISTS "        \
    "(SELECT 1 FROM main.records r WHERE r.blob_hash = b.hash)"

#define JOB_RECORDS                                                                                \
    "SELECT a.id FROM main.attempts a JOIN main.cells c ON c.seq = a.cell_seq WHERE c.job_seq = ?1"

static int temp_tables(struct store *s)
{
    return store_exec(s, "CREATE TEMP TABLE IF NOT EXISTS prune_keep(commit_sha TEXT PRIMARY KEY) "
                         "WITHOUT ROWID;"
                         "CREATE TEMP TABLE IF NOT EXISTS prune_jobs(seq INTEGER PRIMARY KEY);"
                         "CREATE TEMP TABLE IF NOT EXISTS prune_blobs(hash TEXT PRIMARY KEY) "
                         "WITHOUT ROWID;"
                         "DELETE FROM temp.prune_keep; DELETE FROM temp.prune_jobs;"
                         "DELETE FROM temp.prune_blobs;");
}

static int fill_keep(struct store *s, int keep, struct store_prune_report *r)
{
    sqlite3_stmt *st = NULL;
    int rc = store_exec(s, "DELETE FROM temp.prune_keep");
    if (rc == 0)
        rc = store_prepare(s, keep_sql, &st);
    if (rc)
        return rc;
    sqlite3_bind_int(st, 1, keep);
    rc = store_rc(s, sqlite3_step(st));
    sqlite3_finalize(st);
    st = NULL;
    if (rc)
        return rc;
    if ((rc = store_prepare(s,
                            "SELECT count(*), count(*) FILTER (WHERE commit_sha IN "
                            "(SELECT commit_sha FROM temp.prune_keep)) FROM main.jobs",
                            &st)) != 0)
        return rc;
    if (sqlite3_step(st) == SQLITE_ROW) {
        r->jobs = sqlite3_column_int64(st, 0);
        r->jobs_kept = sqlite3_column_int64(st, 1);
    } else {
        rc = -EIO;
    }
    sqlite3_finalize(st);
    return rc;
}

/* Runs a one-row query (binding ?1 to BIND when it has a parameter) and
 * reads its first one or two integer columns. */
static int one_row(struct store *s, const char *sql, int64_t bind, int64_t *a, int64_t *b)
{
    sqlite3_stmt *st = NULL;
    int rc = store_prepare(s, sql, &st);
    if (rc)
        return rc;
    if (sqlite3_bind_parameter_count(st) > 0)
        sqlite3_bind_int64(st, 1, bind);
    int src = sqlite3_step(st);
    if (src == SQLITE_ROW) {
        *a = sqlite3_column_int64(st, 0);
        if (b)
            *b = sqlite3_column_int64(st, 1);
    } else {
        rc = store_rc(s, src);
        rc = rc ? rc : -EIO;
    }
    sqlite3_finalize(st);
    return rc;
}

/*
 * A dry run computes the same answer without writing to the database:
 * every candidate job at once, then the blobs only they reference. It
 * writes temp tables only, which takes no lock on the database file.
 */
static int prune_dry(struct store *s, int keep, struct store_prune_report *r)
{
    sqlite3_stmt *st = NULL;
    int rc = store_exec(s, "BEGIN");
    if (rc)
        return rc;
    if ((rc = temp_tables(s)) != 0 || (rc = fill_keep(s, keep, r)) != 0)
        goto out;
    if ((rc = store_prepare(s, "INSERT INTO temp.prune_jobs(seq) " CANDIDATES, &st)) != 0)
        goto out;
    sqlite3_bind_int64(st, 1, 0);
    rc = store_rc(s, sqlite3_step(st));
    sqlite3_finalize(st);
    st = NULL;
    if (rc)
        goto out;
    if ((rc = store_exec(
             s, "INSERT OR IGNORE INTO temp.prune_blobs(hash) SELECT r.blob_hash FROM main.records "
                "r JOIN main.attempts a ON a.id = r.attempt_id JOIN main.cells c ON c.seq = "
                "a.cell_seq WHERE c.job_seq IN (SELECT seq FROM temp.prune_jobs) AND r.blob_hash "
                "IS NOT NULL")) != 0)
        goto out;
    if ((rc = one_row(s, "SELECT count(*) FROM temp.prune_jobs", 0, &r->jobs_pruned, NULL)) != 0)
        goto out;
    if ((rc = one_row(s,
                      "SELECT count(*) FROM main.records r JOIN main.attempts a ON a.id = "
                      "r.attempt_id JOIN main.cells c ON c.seq = a.cell_seq WHERE c.job_seq IN "
                      "(SELECT seq FROM temp.prune_jobs) AND r.blob_hash IS NOT NULL",
                      0, &r->records_detached, NULL)) != 0)
        goto out;
    /* A blob goes only when no record outside the pruned jobs names it. */
    rc = one_row(s,
                 "SELECT count(*), coalesce(sum(length(b.data)), 0) FROM main.blobs b WHERE "
                 "b.hash IN (SELECT hash FROM temp.prune_blobs) AND NOT EXISTS (SELECT 1 FROM "
                 "main.records r JOIN main.attempts a ON a.id = r.attempt_id JOIN main.cells c "
                 "ON c.seq = a.cell_seq WHERE r.blob_hash = b.hash AND c.job_seq NOT IN "
                 "(SELECT seq FROM temp.prune_jobs))",
                 0, &r->blobs_deleted, &r->bytes_freed);
out:
    store_exec(s, "COMMIT");
    store_rollback(s);
    return rc;
}

/* Drops the payload references of job SEQ's records and deletes the blobs
 * nothing references any more. Runs inside the caller's transaction. */
static int prune_job(struct store *s, int64_t seq, struct store_prune_report *r, int64_t *detached)
{
    sqlite3_stmt *st = NULL;
    int64_t nblobs = 0, nbytes = 0;
    int rc = store_exec(s, "DELETE FROM temp.prune_blobs");
    if (rc)
        return rc;
    if ((rc = store_prepare(s,
                            "INSERT OR IGNORE INTO temp.prune_blobs(hash) SELECT r.blob_hash FROM "
                            "main.records r WHERE r.attempt_id IN (" JOB_RECORDS
                            ") AND r.blob_hash IS NOT NULL",
                            &st)) != 0)
        return rc;
    sqlite3_bind_int64(st, 1, seq);
    rc = store_rc(s, sqlite3_step(st));
    sqlite3_finalize(st);
    st = NULL;
    if (rc)
        return rc;
    if ((rc = store_prepare(s,
                            "UPDATE main.records SET blob_hash = NULL WHERE blob_hash IS NOT NULL "
                            "AND attempt_id IN (" JOB_RECORDS ")",
                            &st)) != 0)
        return rc;
    sqlite3_bind_int64(st, 1, seq);
    rc = store_rc(s, sqlite3_step(st));
    sqlite3_finalize(st);
    st = NULL;
    if (rc)
        return rc;
    *detached = sqlite3_changes(s->db);
    /* Blobs are content-addressed and shared between jobs: after the
     * update, any record still naming one belongs to a job that keeps it
     * (the foreign key would refuse the delete otherwise). */
    if ((rc = one_row(s, "SELECT count(*), coalesce(sum(length(b.data)), 0) " UNREFERENCED, 0,
                      &nblobs, &nbytes)) != 0 ||
        (rc = store_exec(s, "DELETE " UNREFERENCED)) != 0)
        return rc;
    r->jobs_pruned++;
    r->records_detached += *detached;
    r->blobs_deleted += nblobs;
    r->bytes_freed += nbytes;
    return 0;
}

/* One transaction of a real run: recomputes the kept set under the write
 * lock, then prunes candidate jobs after *LAST until the transaction is big
 * enough. *MORE is cleared when no candidate is left. */
static int prune_batch(struct store *s, int keep, int64_t *last, bool *more,
                       struct store_prune_report *r)
{
    sqlite3_stmt *st = NULL;
    int64_t records = 0, jobs = 0;
    int rc = store_begin(s);
    if (rc)
        return rc;
    if ((rc = fill_keep(s, keep, r)) != 0)
        goto out;
    while (records < PRUNE_TXN_RECORDS && jobs < PRUNE_TXN_JOBS) {
        int64_t seq = 0, detached = 0;
        if ((rc = store_prepare(s, CANDIDATES " LIMIT 1", &st)) != 0)
            goto out;
        sqlite3_bind_int64(st, 1, *last);
        int src = sqlite3_step(st);
        if (src == SQLITE_ROW)
            seq = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        st = NULL;
        if (src == SQLITE_DONE) {
            *more = false;
            break;
        }
        if (src != SQLITE_ROW) {
            rc = store_rc(s, src);
            goto out;
        }
        if ((rc = prune_job(s, seq, r, &detached)) != 0)
            goto out;
        *last = seq;
        records += detached;
        jobs++;
    }
    rc = store_commit(s);
out:
    if (rc)
        store_rollback(s);
    return rc;
}

/*
 * The real run goes in short IMMEDIATE transactions. The kept set is
 * recomputed at the start of every one, under the write lock, so a job
 * posted meanwhile that names an old commit as its control saves that
 * commit before anything of it is touched.
 */
int store_prune(struct store *s, const struct store_prune_opts *o, struct store_prune_report *r)
{
    int64_t last = 0;
    bool more = true;
    int rc;
    memset(r, 0, sizeof *r);
    if (o->keep_heads_per_branch <= 0)
        return -EINVAL;
    if ((rc = store_flush(s)) != 0)
        return rc;
    if (o->dry_run)
        return prune_dry(s, o->keep_heads_per_branch, r);
    if ((rc = temp_tables(s)) != 0)
        return rc;
    while (rc == 0 && more) {
        if (o->stop && __atomic_load_n(o->stop, __ATOMIC_RELAXED))
            rc = -ECANCELED;
        else
            rc = prune_batch(s, o->keep_heads_per_branch, &last, &more, r);
    }
    store_exec(s, "DELETE FROM temp.prune_keep; DELETE FROM temp.prune_blobs");
    return rc;
}
