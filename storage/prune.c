/*
 * storage/prune.c - retention (store_prune): which commits' jobs are kept
 * whole, the payload references dropped from the others and the blobs no
 * record names any more, their cell logs, and the orphan payload files a
 * crash or a concurrent backup left behind.
 *
 * A real run works in short write transactions, so the ingest writer never
 * waits long; a dry run writes temp tables only.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/layout.h"
#include "storage/store_int.h"
#include "util/fs.h"
#include "util/path.h"

/* A prune transaction is committed after this many detached records (the
 * ingest batch size) or this many jobs, so the ingest writer, which waits
 * at most its busy timeout for the write lock, never waits on a long one. */
#define PRUNE_TXN_RECORDS 20000
#define PRUNE_TXN_JOBS    64

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
    "FROM main.blobs AS b WHERE b.hash IN (SELECT hash FROM temp.prune_blobs) AND NOT EXISTS "     \
    "(SELECT 1 FROM main.records r WHERE r.blob_hash = b.hash)"

#define JOB_ATTEMPTS                                                                               \
    "SELECT a.id FROM main.attempts a JOIN main.cells c ON c.seq = a.cell_seq WHERE c.job_seq = "  \
    "?1"

static int temp_tables(struct store *s)
{
    return store_exec(s, "CREATE TEMP TABLE IF NOT EXISTS prune_keep(commit_sha TEXT PRIMARY KEY) "
                         "WITHOUT ROWID;"
                         "CREATE TEMP TABLE IF NOT EXISTS prune_jobs(seq INTEGER PRIMARY KEY);"
                         "CREATE TEMP TABLE IF NOT EXISTS prune_blobs(hash TEXT PRIMARY KEY) "
                         "WITHOUT ROWID;"
                         "CREATE TEMP TABLE IF NOT EXISTS prune_gone(hash TEXT PRIMARY KEY) "
                         "WITHOUT ROWID;"
                         "DELETE FROM temp.prune_keep; DELETE FROM temp.prune_jobs;"
                         "DELETE FROM temp.prune_blobs; DELETE FROM temp.prune_gone;");
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

/* temp.prune_keep: the commits the policy keeps with KEEP heads a branch;
 * and how many jobs there are, and how many of them it keeps. */
static int fill_keep(struct store *s, int keep, struct store_prune_report *r)
{
    int rc = store_exec(s, "DELETE FROM temp.prune_keep");
    if (rc == 0)
        rc = store_run(s, keep_sql, "i", keep);
    if (rc)
        return rc;
    return one_row(s,
                   "SELECT count(*), count(*) FILTER (WHERE commit_sha IN "
                   "(SELECT commit_sha FROM temp.prune_keep)) FROM main.jobs",
                   0, &r->jobs, &r->jobs_kept);
}

/* Keeps SQLite's message for the report before a rollback replaces it. */
static void note_error(struct store *s, int rc, struct store_prune_report *r)
{
    if (r->error[0])
        return;
    if (rc == -EIO || rc == -EBUSY || rc == -EEXIST || rc == -ENOMEM)
        snprintf(r->error, sizeof r->error, "%s", sqlite3_errmsg(s->db));
    else
        snprintf(r->error, sizeof r->error, "%s", strerror(-rc));
}

/* Opens DATA/SUB into *D (its path into TOP) and, unless DRY, takes its
 * lock into *LOCK without waiting: 0 when *D is open, 1 when there is
 * nothing to do now (no such directory, or a backup holds the lock: next
 * time), or a negative errno. */
static int open_swept_dir(struct store *s, const char *sub, bool dry, char top[PATH_MAX], DIR **d,
                          int *lock)
{
    layout_dir(top, PATH_MAX, s->data_dir, sub);
    if (!(*d = opendir(top)))
        return errno == ENOENT ? 1 : -errno;
    if (!dry && (*lock = store__dir_lock(s->data_dir, sub, LOCK_EX | LOCK_NB)) < 0) {
        int rc = *lock == -EAGAIN ? 1 : *lock;
        closedir(*d);
        return rc;
    }
    return 0;
}

/* Ends one batch's transaction: committed when RC is 0 (without waking
 * the change feed when DRY: nothing changed), else rolled back with the
 * error noted in R. RC or the commit's error. */
static int end_batch(struct store *s, int rc, bool dry, struct store_prune_report *r)
{
    if (rc == 0)
        rc = dry ? store_exec(s, "COMMIT") : store_commit(s);
    if (rc) {
        note_error(s, rc, r);
        store_rollback(s);
    }
    return rc;
}

/*
 * Blob files nothing names: the files of blobs whose rows a prune deleted
 * while a backup held the lock, and the leftovers of an ingest transaction
 * that never committed (the file is written before its row). Ingest writes
 * blob files only inside its write transaction, so under the write lock
 * every file without a row is such an orphan. One subdirectory per
 * transaction keeps the lock short. Counts only when DRY.
 */
static int sweep_orphans(struct store *s, bool dry, struct store_prune_report *r)
{
    char top[PATH_MAX];
    sqlite3_stmt *st = NULL;
    DIR *d;
    int lock = -1, rc = open_swept_dir(s, "blobs", dry, top, &d, &lock);
    if (rc)
        return rc > 0 ? 0 : rc;
    if ((rc = store_prepare(s, "SELECT 1 FROM main.blobs WHERE hash = ?", &st)) != 0)
        goto out;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        char sub[UTIL_PATH_MAX];
        if (e->d_name[0] == '.' || strlen(e->d_name) != 2 ||
            util_path_join(sub, top, e->d_name) != 0)
            continue;
        DIR *in = opendir(sub);
        if (!in)
            continue;
        if ((rc = store_begin(s)) != 0) {
            closedir(in);
            break;
        }
        struct dirent *f;
        while ((f = readdir(in)) != NULL) {
            if (f->d_name[0] == '.')
                continue;
            bool orphan = !store__is_blob_name(f->d_name);
            if (!orphan) {
                sqlite3_reset(st);
                sqlite3_bind_text(st, 1, f->d_name, -1, SQLITE_STATIC);
                int src = sqlite3_step(st);
                if (src != SQLITE_ROW && src != SQLITE_DONE) {
                    rc = store_rc(s, src);
                    break;
                }
                orphan = src == SQLITE_DONE;
            }
            if (!orphan)
                continue;
            char file[UTIL_PATH_MAX];
            struct stat sb;
            if (util_path_join(file, sub, f->d_name) != 0 || stat(file, &sb) != 0 ||
                !S_ISREG(sb.st_mode))
                continue;
            if (!dry && unlink(file) != 0)
                continue;
            r->orphans_deleted++;
            r->bytes_freed += (int64_t)sb.st_size;
        }
        closedir(in);
        sqlite3_reset(st);
        rc = end_batch(s, rc, false, r);
    }
out:
    if (rc)
        note_error(s, rc, r);
    sqlite3_finalize(st);
    store__dir_unlock(lock);
    closedir(d);
    return rc;
}

/* Removes DATA/logs/NAME/ (DIR is DATA/logs) and counts its cell logs
 * and bytes; only counts when DRY. */
static void remove_log_dir(const char *dir, const char *name, bool dry,
                           struct store_prune_report *r)
{
    char sub[UTIL_PATH_MAX];
    if (util_path_join(sub, dir, name) != 0)
        return;
    DIR *in = opendir(sub);
    struct dirent *f;
    while (in && (f = readdir(in)) != NULL) {
        char file[UTIL_PATH_MAX];
        struct stat sb;
        size_t n = strlen(f->d_name);
        if (f->d_name[0] == '.' && (n == 1 || (n == 2 && f->d_name[1] == '.')))
            continue;
        if (util_path_join(file, sub, f->d_name) != 0)
            continue;
        if (lstat(file, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        if (!dry && unlink(file) != 0)
            continue;
        if (n > 4 && strcmp(f->d_name + n - 4, ".log") == 0)
            r->logs_deleted++;
        r->log_bytes_freed += (int64_t)sb.st_size;
    }
    if (in)
        closedir(in);
    if (!dry)
        rmdir(sub);
}

/* Removes DATA/replays/NAME/ (DIR is DATA/replays), the folder of a
 * replay's recorded arguments (daemon/replay/isolate.h), and counts it and
 * its bytes; only counts when DRY. */
static void remove_replay_dir(const char *dir, const char *name, bool dry,
                              struct store_prune_report *r)
{
    char sub[UTIL_PATH_MAX];
    if (util_path_join(sub, dir, name) != 0)
        return;
    r->replay_bytes_freed += util_tree_bytes(sub);
    r->replays_deleted++;
    if (!dry)
        util_rm_tree(sub);
}

/*
 * What a job not kept whole has on disk beside its payloads, one folder
 * per job named by its id, going as a whole: DATA/logs/<job>/ (cell logs,
 * REMOVE remove_log_dir) and DATA/replays/<job>/ (a replay's recorded
 * arguments, remove_replay_dir). No row names them, so the database does
 * not change; but the kept set is recomputed under the write lock of each
 * batch and the files are removed while it is held, so a job posted
 * meanwhile that names an old commit as its control saves that commit's
 * folders, exactly as it saves its payloads. A job not kept has no cell
 * queued or running, so none of them is being written or read. A backup
 * holds DATA/logs shared while it copies; then nothing is deleted and the
 * next run does it. Counts only when DRY.
 */
static int prune_job_dirs(struct store *s, const char *sub,
                          void (*remove)(const char *, const char *, bool,
                                         struct store_prune_report *),
                          int keep, bool dry, const int *stop, struct store_prune_report *r)
{
    char top[PATH_MAX];
    sqlite3_stmt *st = NULL;
    DIR *d;
    bool more = true;
    int lock = -1, rc = open_swept_dir(s, sub, dry, top, &d, &lock);
    if (rc)
        return rc > 0 ? 0 : rc;
    while (rc == 0 && more) {
        int jobs = 0;
        if (stop && __atomic_load_n(stop, __ATOMIC_RELAXED)) {
            rc = -ECANCELED;
            break;
        }
        if ((rc = dry ? store_exec(s, "BEGIN") : store_begin(s)) != 0)
            break;
        more = false;
        if ((rc = fill_keep(s, keep, r)) == 0)
            rc = store_prepare(s,
                               "SELECT 1 FROM main.jobs WHERE id = ?1 AND commit_sha NOT IN "
                               "(SELECT commit_sha FROM temp.prune_keep)",
                               &st);
        struct dirent *e;
        while (rc == 0 && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.' || !store__is_id_name(e->d_name))
                continue;
            sqlite3_reset(st);
            sqlite3_bind_text(st, 1, e->d_name, -1, SQLITE_STATIC);
            int src = sqlite3_step(st);
            if (src == SQLITE_DONE)
                continue; /* kept, or not a job's directory */
            if (src != SQLITE_ROW) {
                rc = store_rc(s, src);
                break;
            }
            remove(top, e->d_name, dry, r);
            if (++jobs >= PRUNE_TXN_JOBS) {
                more = true;
                break;
            }
        }
        sqlite3_finalize(st);
        st = NULL;
        rc = end_batch(s, rc, dry, r);
    }
    store__dir_unlock(lock);
    closedir(d);
    return rc;
}

static int prune_logs(struct store *s, int keep, bool dry, const int *stop,
                      struct store_prune_report *r)
{
    int rc = prune_job_dirs(s, "logs", remove_log_dir, keep, dry, stop, r);
    return rc ? rc : prune_job_dirs(s, "replays", remove_replay_dir, keep, dry, stop, r);
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
                 "SELECT count(*), coalesce(sum(b.stored_size), 0) FROM main.blobs b WHERE "
                 "b.hash IN (SELECT hash FROM temp.prune_blobs) AND NOT EXISTS (SELECT 1 FROM "
                 "main.records r JOIN main.attempts a ON a.id = r.attempt_id JOIN main.cells c "
                 "ON c.seq = a.cell_seq WHERE r.blob_hash = b.hash AND c.job_seq NOT IN "
                 "(SELECT seq FROM temp.prune_jobs))",
                 0, &r->blobs_deleted, &r->bytes_freed);
out:
    if (rc)
        note_error(s, rc, r);
    store_exec(s, "COMMIT");
    store_rollback(s);
    if (rc == 0)
        rc = prune_logs(s, keep, true, NULL, r);
    return rc ? rc : sweep_orphans(s, true, r);
}

/* Drops the payload references of job SEQ's records and the rows of the
 * blobs nothing references any more, remembering their hashes in
 * temp.prune_gone for unlink_gone. Runs inside the caller's transaction. */
static int prune_job(struct store *s, int64_t seq, struct store_prune_report *r, int64_t *detached)
{
    int64_t nblobs = 0, nbytes = 0;
    int rc = store_exec(s, "DELETE FROM temp.prune_blobs");
    if (rc)
        return rc;
    if ((rc = store_run(s,
                        "INSERT OR IGNORE INTO temp.prune_blobs(hash) SELECT r.blob_hash FROM "
                        "main.records r WHERE r.attempt_id IN (" JOB_ATTEMPTS
                        ") AND r.blob_hash IS NOT NULL",
                        "I", seq)) != 0)
        return rc;
    if ((rc = store_run(s,
                        "UPDATE main.records SET blob_hash = NULL WHERE blob_hash IS NOT NULL "
                        "AND attempt_id IN (" JOB_ATTEMPTS ")",
                        "I", seq)) != 0)
        return rc;
    *detached = sqlite3_changes(s->db);
    /* Blobs are content-addressed and shared between jobs: after the
     * update, any record still naming one belongs to a job that keeps it. */
    if ((rc = one_row(s, "SELECT count(*), coalesce(sum(b.stored_size), 0) " UNREFERENCED, 0,
                      &nblobs, &nbytes)) != 0 ||
        (rc = store_exec(
             s, "INSERT OR IGNORE INTO temp.prune_gone(hash) SELECT b.hash " UNREFERENCED)) != 0 ||
        (rc = store_exec(s, "DELETE " UNREFERENCED)) != 0)
        return rc;
    r->jobs_pruned++;
    r->records_detached += *detached;
    r->blobs_deleted += nblobs;
    r->bytes_freed += nbytes;
    return 0;
}

/*
 * The files of the blob rows a committed batch deleted. Unlinking them
 * inside that batch would lose them if its commit then failed; after it,
 * under a new write lock, a file whose row is still absent cannot be in
 * use: ingest writes (or rewrites) a blob's file only inside its own write
 * transaction, and a row that came back names a file with the same
 * content. Under a backup's shared blob lock the files stay, as orphans
 * for the next sweep.
 */
static int unlink_gone(struct store *s, struct store_prune_report *r)
{
    sqlite3_stmt *st = NULL;
    int lock = store__dir_lock(s->data_dir, "blobs", LOCK_EX | LOCK_NB);
    int rc = store_begin(s);
    if (rc)
        goto out;
    if (lock >= 0) {
        if ((rc = store_prepare(s,
                                "SELECT g.hash FROM temp.prune_gone g WHERE NOT EXISTS "
                                "(SELECT 1 FROM main.blobs b WHERE b.hash = g.hash)",
                                &st)) != 0)
            goto out;
        while (sqlite3_step(st) == SQLITE_ROW) {
            char path[PATH_MAX];
            store_blob_path(s, (const char *)sqlite3_column_text(st, 0), path, sizeof path);
            unlink(path);
        }
        sqlite3_finalize(st);
        st = NULL;
    }
    rc = store_exec(s, "DELETE FROM temp.prune_gone");
out:
    sqlite3_finalize(st);
    rc = end_batch(s, rc, false, r);
    store__dir_unlock(lock);
    return rc;
}

/* One transaction of a real run: recomputes the kept set under the write
 * lock, then prunes candidate jobs after *LAST until the transaction is big
 * enough. *MORE is cleared when no candidate is left. */
static int prune_batch(struct store *s, int keep, int64_t *last, bool *more,
                       struct store_prune_report *r)
{
    sqlite3_stmt *st = NULL;
    int64_t records = 0, jobs = 0;
    struct store_prune_report before = *r;
    int rc = store_begin(s);
    if (rc)
        return rc;
    if ((rc = fill_keep(s, keep, r)) != 0)
        goto out;
    while (records < PRUNE_TXN_RECORDS && jobs < PRUNE_TXN_JOBS) {
        int64_t seq = 0, detached = 0;
        if ((rc = store_query(s, &st, CANDIDATES " LIMIT 1", "I", *last)) == 0 &&
            (rc = store_step(s, st)) == 0)
            seq = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        st = NULL;
        if (rc == -ENOENT) {
            rc = 0;
            *more = false;
            break;
        }
        if (rc || (rc = prune_job(s, seq, r, &detached)) != 0)
            goto out;
        *last = seq;
        records += detached;
        jobs++;
    }
out:
    if ((rc = end_batch(s, rc, false, r)) != 0) {
        /* Nothing of this batch happened (prune_gone is emptied by the
         * next run's temp_tables). */
        memcpy(before.error, r->error, sizeof before.error);
        before.jobs = r->jobs;
        before.jobs_kept = r->jobs_kept;
        *r = before;
        return rc;
    }
    return unlink_gone(s, r);
}

/*
 * The real run goes in short IMMEDIATE transactions. The kept set is
 * recomputed at the start of every one, under the write lock, so a job
 * posted meanwhile that names an old commit as its control saves that
 * commit before anything of it is touched. Then the cell logs of the jobs
 * not kept go (prune_logs), and orphan payload files are swept last.
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
    if (rc == 0)
        rc = prune_logs(s, o->keep_heads_per_branch, false, o->stop, r);
    if (rc == 0)
        rc = sweep_orphans(s, false, r);
    /* On failure the temp tables stay as they are: clearing them would
     * replace the error store_errmsg() reports. */
    if (rc == 0)
        store_exec(s, "DELETE FROM temp.prune_keep; DELETE FROM temp.prune_blobs");
    return rc;
}
