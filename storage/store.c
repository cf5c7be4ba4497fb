/*
 * storage/store.c - connection handling, migrations, builds, jobs and cells.
 * Records and blobs live in records.c; both share storage/store_int.h.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>

#include "storage/embedded.h"
#include "storage/store_int.h"

int64_t store_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void store_new_id(char prefix, char out[16])
{
    unsigned char r[6];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        /* getrandom cannot fail for 6 bytes once the pool is ready; fall
         * back to the clock rather than abort. */
        int64_t t = store_now_ms() ^ (int64_t)clock();
        memcpy(r, &t, sizeof r);
    }
    snprintf(out, 16, "%c%02x%02x%02x%02x%02x%02x", prefix, r[0], r[1], r[2], r[3], r[4], r[5]);
}

const char *store_errmsg(const struct store *s)
{
    return s && s->db ? sqlite3_errmsg(s->db) : "no database";
}

int store_rc(struct store *s, int src)
{
    (void)s;
    store_note_error(src);
    switch (src & 0xff) {
    case SQLITE_OK:
    case SQLITE_DONE:
    case SQLITE_ROW:
        return 0;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return -EBUSY;
    case SQLITE_CONSTRAINT:
        return -EEXIST;
    case SQLITE_NOMEM:
        return -ENOMEM;
    /* The disk is full, the data dir became read-only, or the device
     * failed: nothing wrong with the request, and it clears when the
     * operator makes room (docs/operations.md, "Disk full"). */
    case SQLITE_FULL:
    case SQLITE_READONLY:
    case SQLITE_IOERR:
    case SQLITE_CANTOPEN:
        return -ENOSPC;
    default:
        return -EIO;
    }
}

int store_errno(int e)
{
    switch (e) {
    case ENOSPC:
    case EDQUOT:
    case EROFS:
    case EIO:
        return -ENOSPC;
    default:
        return e > 0 ? -e : -EIO;
    }
}

uint64_t store_batch_losses(const struct store *s)
{
    return s->batch_losses;
}

int store_exec(struct store *s, const char *sql)
{
    return store_rc(s, sqlite3_exec(s->db, sql, NULL, NULL, NULL));
}

int store_prepare(struct store *s, const char *sql, sqlite3_stmt **st)
{
    return store_rc(s, sqlite3_prepare_v2(s->db, sql, -1, st, NULL));
}

int store_cached(struct store *s, int which, const char *sql, sqlite3_stmt **out)
{
    if (!s->cache[which]) {
        int rc = store_prepare(s, sql, &s->cache[which]);
        if (rc)
            return rc;
    }
    sqlite3_reset(s->cache[which]);
    sqlite3_clear_bindings(s->cache[which]);
    *out = s->cache[which];
    return 0;
}

int store_begin(struct store *s)
{
    return store_exec(s, "BEGIN IMMEDIATE");
}

void store_rollback(struct store *s)
{
    if (!sqlite3_get_autocommit(s->db))
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    store_events_rolled_back();
}

int store_commit(struct store *s)
{
    int rc = store_exec(s, "COMMIT");
    if (rc == 0)
        store_events_committed(); /* wakes event streams and long-polls */
    return rc;
}

/* Migrations are embedded files named NNN_*.sql, numbered from 1 without
 * gaps; the schema version is the highest number. */
static const struct embedded_file *migration(int n)
{
    char prefix[16];
    snprintf(prefix, sizeof prefix, "%03d_", n);
    for (const struct embedded_file *f = embedded_files; f->name; f++)
        if (strncmp(f->name, prefix, 4) == 0 && strstr(f->name, ".sql"))
            return f;
    return NULL;
}

int store_schema_version(void)
{
    int n = 0;
    while (migration(n + 1))
        n++;
    return n;
}

static int user_version(struct store *s, int *v)
{
    sqlite3_stmt *st = NULL;
    int rc = store_prepare(s, "PRAGMA user_version", &st);
    if (rc == 0 && sqlite3_step(st) == SQLITE_ROW)
        *v = sqlite3_column_int(st, 0);
    else if (rc == 0)
        rc = -EIO;
    sqlite3_finalize(st);
    return rc;
}

/*
 * Each migration runs in its own IMMEDIATE transaction together with the
 * user_version bump, so a crash mid-upgrade leaves the database at the last
 * complete version, never in between.
 */
static int migrate(struct store *s, char **err)
{
    int have = 0, want = store_schema_version();
    int rc = user_version(s, &have);
    if (rc)
        return rc;
    if (have > want) {
        if (err && asprintf(err,
                            "database schema version %d is newer than this capd supports (%d); "
                            "upgrade capd or restore a backup",
                            have, want) < 0)
            *err = NULL;
        return -EPROTO;
    }
    for (int v = have + 1; v <= want; v++) {
        const struct embedded_file *f = migration(v);
        char bump[64];
        snprintf(bump, sizeof bump, "PRAGMA user_version = %d", v);
        if ((rc = store_begin(s)) != 0)
            return rc;
        char *msg = NULL;
        if (sqlite3_exec(s->db, f->data, NULL, NULL, &msg) != SQLITE_OK ||
            sqlite3_exec(s->db, bump, NULL, NULL, &msg) != SQLITE_OK) {
            if (err && asprintf(err, "migration %s failed: %s", f->name, msg ? msg : "?") < 0)
                *err = NULL;
            sqlite3_free(msg);
            store_rollback(s);
            return -EIO;
        }
        if ((rc = store_commit(s)) != 0)
            return rc;
    }
    return 0;
}

static int conn_hook(void *arg, sqlite3 *db, const char *name, int pages);

/* Process-wide SQLite settings, before its first use. No memory
 * statistics: nothing reads them, and keeping them takes a global mutex
 * on every allocation (two per inserted record on the ingest path). */
static void sqlite_global_init(void)
{
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
}

int store_open(const char *data_dir, bool do_migrate, struct store **out, char **err)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, sqlite_global_init);
    int rc = -ENOMEM;
    char *path = NULL;
    struct store *s = calloc(1, sizeof *s);
    if (err)
        *err = NULL;
    if (!s || asprintf(&path, "%s/capd.db", data_dir) < 0) {
        path = NULL;
        goto out;
    }
    snprintf(s->data_dir, sizeof s->data_dir, "%s", data_dir);
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
    if (sqlite3_open_v2(path, &s->db, flags, NULL) != SQLITE_OK) {
        rc = -EIO;
        if (err && asprintf(err, "cannot open %s: %s", path, sqlite3_errmsg(s->db)) < 0)
            *err = NULL;
        goto out;
    }
    sqlite3_busy_timeout(s->db, 10000);
    sqlite3_extended_result_codes(s->db, 1);
    /* WAL lets HTTP readers run while the loop thread ingests; NORMAL sync
     * is durable across application crashes, which is what kill -9 tests. */
    /* 8 KiB pages (only effective on a new database) halve the page
     * writes of ingest; an 8 MiB cache holds a batch's pages (a loop
     * iteration's batch is ~1 MiB of rows, the 20,000-row cap ~12 MiB, past
     * which SQLite spills to the WAL early, which is still correct). A
     * bigger cache was slower, not faster: during a long ingest every page
     * it has not filled yet is fresh heap (malloc, page fault, zeroing),
     * while a full small cache recycles warm pages (1.5x records/s).
     * Checkpoints are not run inline by whichever connection commits
     * (conn_hook, store_checkpoint_in_background). */
    rc = store_exec(s, "PRAGMA page_size=8192; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                       "PRAGMA foreign_keys=ON; PRAGMA temp_store=MEMORY;"
                       "PRAGMA cache_size=-8192;");
    if (rc) {
        if (err && asprintf(err, "cannot configure %s: %s", path, sqlite3_errmsg(s->db)) < 0)
            *err = NULL;
        goto out;
    }
    sqlite3_wal_hook(s->db, conn_hook, NULL);
    store_events_attach(s);
    if (do_migrate) {
        char blobs[600];
        snprintf(blobs, sizeof blobs, "%s/blobs", data_dir);
        if (mkdir(blobs, 0750) != 0 && errno != EEXIST) {
            rc = -errno;
            if (err && asprintf(err, "cannot create %s: %s", blobs, strerror(errno)) < 0)
                *err = NULL;
            goto out;
        }
        rc = migrate(s, err);
        if (rc)
            goto out;
    } else {
        int v = 0;
        if ((rc = user_version(s, &v)) != 0)
            goto out;
        if (v != store_schema_version()) {
            rc = -EPROTO;
            if (err && asprintf(err, "database schema version %d, expected %d", v,
                                store_schema_version()) < 0)
                *err = NULL;
            goto out;
        }
    }
    *out = s;
    s = NULL;
    rc = 0;
out:
    free(path);
    store_close(s);
    return rc;
}

/* ---- checkpoints off the writer's thread ---- */

/* WAL pages after a commit that start a background checkpoint (8 KiB
 * pages: 8 MiB). Early, so that the WAL is copied while the loop does
 * other work and restarts between two bursts of ingest: a burst that
 * starts on a WAL already near a threshold is the one that pays for it. */
#define STORE_CHECKPOINT_PAGES 1024
/* WAL pages past which the writer finishes a checkpoint itself (256 MiB):
 * the bound on the WAL during one unbroken stream of commits. Only a
 * stream longer than that pays for a checkpoint on the loop thread
 * (copying, and two fsyncs that stall every cell's ingest meanwhile). */
#define STORE_CHECKPOINT_INLINE_PAGES 32768

struct store_ckpt {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool want, stop;
    sqlite3 *db; /* the checkpointer's own connection, used by its thread only */
};

/* The process's background checkpointer, when the daemon runs one: every
 * other connection of the process (HTTP threads, the event hub) hands its
 * checkpoints to it rather than running them inside a request. */
static pthread_mutex_t g_ckpt_mu = PTHREAD_MUTEX_INITIALIZER;
static struct store_ckpt *g_ckpt;

static void ckpt_wake(struct store_ckpt *c)
{
    pthread_mutex_lock(&c->mu);
    c->want = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/*
 * sqlite3_wal_hook of every connection but the writer's (which has
 * ckpt_hook): wakes the background checkpointer. A POST that happens to
 * follow a large ingest used to copy the whole WAL, fsyncs included,
 * before it could answer. Without a checkpointer (capd db, capd token),
 * the connection checkpoints itself as SQLite's autocheckpoint would.
 */
static int conn_hook(void *arg, sqlite3 *db, const char *name, int pages)
{
    (void)arg;
    if (pages < STORE_CHECKPOINT_PAGES)
        return SQLITE_OK;
    pthread_mutex_lock(&g_ckpt_mu);
    struct store_ckpt *c = g_ckpt;
    if (c)
        ckpt_wake(c);
    pthread_mutex_unlock(&g_ckpt_mu);
    if (!c)
        sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
    return SQLITE_OK;
}

static void *ckpt_main(void *arg)
{
    struct store_ckpt *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->want && !c->stop)
            pthread_cond_wait(&c->cv, &c->mu);
        if (c->stop)
            break;
        c->want = false;
        pthread_mutex_unlock(&c->mu);
        /* Passive: copies what no reader still needs and never waits;
         * the writer restarts the WAL once all of it was copied. */
        sqlite3_wal_checkpoint_v2(c->db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/*
 * sqlite3_wal_hook: runs on the committing thread after each commit. A
 * checkpoint running beside a stream of commits never copies the newest
 * ones, so the WAL could not restart and would grow as long as ingest
 * lasts; past STORE_CHECKPOINT_INLINE_PAGES the writer copies the rest
 * itself, between two of its commits (little is left by then), which lets
 * its next transaction restart the WAL. A passive checkpoint never waits:
 * when the thread is busy copying, the next commit tries again.
 */
static int ckpt_hook(void *arg, sqlite3 *db, const char *name, int pages)
{
    struct store_ckpt *c = arg;
    if (pages >= STORE_CHECKPOINT_INLINE_PAGES) {
        sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        return SQLITE_OK;
    }
    if (pages >= STORE_CHECKPOINT_PAGES)
        ckpt_wake(c);
    return SQLITE_OK;
}

int store_checkpoint_in_background(struct store *s)
{
    char path[600];
    struct store_ckpt *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    snprintf(path, sizeof path, "%s/capd.db", s->data_dir);
    if (sqlite3_open_v2(path, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK) {
        sqlite3_close(c->db);
        free(c);
        return -EIO;
    }
    sqlite3_busy_timeout(c->db, 10000);
    /* A connection learns that the database is in WAL mode when it first
     * reads it; until then sqlite3_wal_checkpoint_v2() succeeds and does
     * nothing at all (log and checkpointed frames -1). */
    if (sqlite3_exec(c->db, "SELECT count(*) FROM sqlite_master", NULL, NULL, NULL) != SQLITE_OK) {
        sqlite3_close(c->db);
        free(c);
        return -EIO;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (pthread_create(&c->thread, NULL, ckpt_main, c) != 0) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        sqlite3_close(c->db);
        free(c);
        return -EAGAIN;
    }
    /* Replaces the inline autocheckpoint (itself a WAL hook). */
    sqlite3_wal_hook(s->db, ckpt_hook, c);
    s->ckpt = c;
    pthread_mutex_lock(&g_ckpt_mu);
    g_ckpt = c;
    pthread_mutex_unlock(&g_ckpt_mu);
    return 0;
}

static void ckpt_stop(struct store *s)
{
    struct store_ckpt *c = s->ckpt;
    if (!c)
        return;
    pthread_mutex_lock(&g_ckpt_mu);
    if (g_ckpt == c)
        g_ckpt = NULL;
    pthread_mutex_unlock(&g_ckpt_mu);
    sqlite3_wal_hook(s->db, NULL, NULL);
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    sqlite3_close(c->db);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
    s->ckpt = NULL;
}

void store_close(struct store *s)
{
    if (!s)
        return;
    if (s->batch_open)
        store_flush(s);
    ckpt_stop(s);
    for (size_t i = 0; i < sizeof s->cache / sizeof s->cache[0]; i++)
        sqlite3_finalize(s->cache[i]);
    sqlite3_close_v2(s->db);
    free(s->zbuf);
    if (s->zctx)
        store_zfree(s);
    free(s);
}

int store_integrity_check(struct store *s)
{
    sqlite3_stmt *st = NULL;
    int rc = store_prepare(s, "PRAGMA integrity_check", &st);
    if (rc == 0) {
        rc = -EIO;
        if (sqlite3_step(st) == SQLITE_ROW &&
            strcmp((const char *)sqlite3_column_text(st, 0), "ok") == 0)
            rc = 0;
    }
    sqlite3_finalize(st);
    return rc;
}

/* ---- helpers shared by the readers ---- */

json_t *store_col_json(sqlite3_stmt *st, int col)
{
    const char *t = (const char *)sqlite3_column_text(st, col);
    json_t *j = t ? json_loads(t, JSON_DECODE_ANY, NULL) : NULL;
    return j ? j : json_null();
}

json_t *store_col_str(sqlite3_stmt *st, int col)
{
    const char *t = (const char *)sqlite3_column_text(st, col);
    return t ? json_string(t) : json_null();
}

json_t *store_col_int(sqlite3_stmt *st, int col)
{
    return sqlite3_column_type(st, col) == SQLITE_NULL
               ? json_null()
               : json_integer(sqlite3_column_int64(st, col));
}

/* Timestamps go out as RFC 3339 UTC strings with milliseconds. */
json_t *store_col_time(sqlite3_stmt *st, int col)
{
    if (sqlite3_column_type(st, col) == SQLITE_NULL)
        return json_null();
    int64_t ms = sqlite3_column_int64(st, col);
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    char buf[40];
    gmtime_r(&t, &tm);
    size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, sizeof buf - n, ".%03dZ", (int)(ms % 1000));
    return json_string(buf);
}

void store_bind_text(sqlite3_stmt *st, int i, const char *v)
{
    if (v)
        sqlite3_bind_text(st, i, v, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, i);
}

/* A page of a keyset-paginated list: {NAME: ARR, "next_cursor": PREFIX<last>
 * or null}. The cursor is opaque to clients; the prefix tells the lists'
 * cursors apart. */
json_t *store_page(const char *name, json_t *arr, bool more, char prefix, int64_t last)
{
    json_t *cursor = json_null();
    if (more) {
        char c[32];
        snprintf(c, sizeof c, "%c%lld", prefix, (long long)last);
        cursor = json_string(c);
    }
    return json_pack("{s:O,s:o}", name, arr, "next_cursor", cursor);
}

/* ---- builds ---- */

static json_t *build_row(sqlite3_stmt *st)
{
    json_t *b = json_pack("{s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:b}", "name", store_col_str(st, 0),
                          "python", store_col_str(st, 1), "env", store_col_json(st, 2),
                          "model_roots", store_col_json(st, 3), "description", store_col_str(st, 4),
                          "created_at", store_col_time(st, 5), "updated_at", store_col_time(st, 6),
                          "prefork", sqlite3_column_int(st, 7) != 0);
    /* Prefork's verification outcome (docs/prefork.md), for builds that opted in. */
    if (b && sqlite3_column_int(st, 7)) {
        json_object_set_new(b, "prefork_state", store_col_str(st, 8));
        json_object_set_new(b, "prefork_reason", store_col_str(st, 9));
        json_object_set_new(b, "prefork_checked_at", store_col_time(st, 10));
    }
    return b;
}

#define BUILD_COLS                                                                                 \
    "name, python, env_json, model_roots, description, created_at, updated_at, prefork, "          \
    "prefork_state, prefork_reason, prefork_checked_at"

int store_build_get(struct store *s, const char *name, json_t **out)
{
    sqlite3_stmt *st = NULL;
    int rc = store_prepare(s, "SELECT " BUILD_COLS " FROM builds WHERE name = ?", &st);
    if (rc)
        goto out;
    store_bind_text(st, 1, name);
    int src = sqlite3_step(st);
    if (src == SQLITE_ROW) {
        *out = build_row(st);
        rc = 0;
    } else {
        rc = src == SQLITE_DONE ? -ENOENT : store_rc(s, src);
    }
out:
    sqlite3_finalize(st);
    return rc;
}

int store_build_list(struct store *s, json_t **out)
{
    sqlite3_stmt *st = NULL;
    json_t *arr = json_array();
    int rc = store_prepare(s, "SELECT " BUILD_COLS " FROM builds ORDER BY name", &st);
    if (rc)
        goto out;
    int src;
    while ((src = sqlite3_step(st)) == SQLITE_ROW)
        json_array_append_new(arr, build_row(st));
    if ((rc = store_rc(s, src)) != 0)
        goto out;
    *out = json_pack("{s:O}", "builds", arr);
out:
    json_decref(arr);
    sqlite3_finalize(st);
    return rc;
}

int store_build_put(struct store *s, const char *name, json_t *b, bool replace, json_t **out)
{
    sqlite3_stmt *st = NULL;
    char *env = json_dumps(json_object_get(b, "env"), JSON_COMPACT | JSON_SORT_KEYS);
    char *roots = json_dumps(json_object_get(b, "model_roots"), JSON_COMPACT);
    int64_t now = store_now_ms();
    int rc =
        replace ? store_prepare(s,
                                "INSERT INTO builds(name, python, env_json, model_roots, "
                                "description, created_at, updated_at, prefork) "
                                "VALUES (?,?,?,?,?,?,?,?) "
                                "ON CONFLICT(name) DO UPDATE SET python=excluded.python, "
                                "env_json=excluded.env_json, model_roots=excluded.model_roots, "
                                "description=excluded.description, updated_at=excluded.updated_at, "
                                "prefork=excluded.prefork, prefork_state='unverified', "
                                "prefork_reason=NULL, prefork_checked_at=NULL",
                                &st)
                : store_prepare(s,
                                "INSERT INTO builds(name, python, env_json, model_roots, "
                                "description, created_at, updated_at, prefork) "
                                "VALUES (?,?,?,?,?,?,?,?)",
                                &st);
    if (rc)
        goto out;
    store_bind_text(st, 1, name);
    store_bind_text(st, 2, json_string_value(json_object_get(b, "python")));
    store_bind_text(st, 3, env ? env : "{}");
    store_bind_text(st, 4, roots ? roots : "[]");
    store_bind_text(st, 5, json_string_value(json_object_get(b, "description")));
    sqlite3_bind_int64(st, 6, now);
    sqlite3_bind_int64(st, 7, now);
    sqlite3_bind_int(st, 8, json_is_true(json_object_get(b, "prefork")));
    if ((rc = store_rc(s, sqlite3_step(st))) != 0)
        goto out;
    rc = store_build_get(s, name, out);
out:
    free(env);
    free(roots);
    sqlite3_finalize(st);
    return rc;
}

/* ---- jobs ---- */

#define JOB_COLS                                                                                   \
    "j.seq, j.id, j.project, j.commit_sha, j.branch, j.build, j.control_commit, j.state, "         \
    "j.request_json, j.options_json, j.labels_json, j.created_at, j.updated_at, j.finished_at, "   \
    "j.provenance_json"

static json_t *job_row(sqlite3_stmt *st)
{
    json_t *req = store_col_json(st, 8);
    json_t *j = json_pack("{s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:O,s:o,s:o,s:o,s:o,s:o}", "id",
                          store_col_str(st, 1), "project", store_col_str(st, 2), "commit",
                          store_col_str(st, 3), "branch", store_col_str(st, 4), "build",
                          store_col_str(st, 5), "control_commit", store_col_str(st, 6), "state",
                          store_col_str(st, 7), "matrix", json_object_get(req, "matrix"), "options",
                          store_col_json(st, 9), "labels", store_col_json(st, 10), "created_at",
                          store_col_time(st, 11), "updated_at", store_col_time(st, 12),
                          "finished_at", store_col_time(st, 13));
    json_t *prov = store_col_json(st, 14);
    if (!json_is_null(prov))
        json_object_set(j, "provenance", prov);
    json_decref(prov);
    json_decref(req);
    return j;
}

json_t *store_cell_row(sqlite3_stmt *st, int c0)
{
    return json_pack("{s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "id",
                     store_col_str(st, c0 + 0), "model", store_col_str(st, c0 + 1), "width",
                     store_col_str(st, c0 + 2), "pass", store_col_str(st, c0 + 3), "state",
                     store_col_str(st, c0 + 4), "attempts", store_col_int(st, c0 + 5), "exit_code",
                     store_col_int(st, c0 + 6), "signal", store_col_str(st, c0 + 7), "reason",
                     store_col_str(st, c0 + 8), "effective_width", store_col_str(st, c0 + 9),
                     "duration_ms", store_col_int(st, c0 + 10), "peak_rss_bytes",
                     store_col_int(st, c0 + 11), "started_at", store_col_time(st, c0 + 12),
                     "finished_at", store_col_time(st, c0 + 13), "host_missing",
                     store_col_str(st, c0 + 15), "memory_limit_bytes", store_col_int(st, c0 + 16),
                     "cpu_time_ms", store_col_int(st, c0 + 17));
}

/* Adds "cells" and "counts" (cells per state) to a job object. */
static int job_add_cells(struct store *s, int64_t job_seq, json_t *job)
{
    sqlite3_stmt *st = NULL;
    json_t *cells = json_array(), *counts = json_object();
    int rc = store_prepare(
        s, "SELECT " CELL_COLS " FROM cells c WHERE c.job_seq = ? ORDER BY c.ord", &st);
    if (rc)
        goto out;
    sqlite3_bind_int64(st, 1, job_seq);
    int src;
    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        json_t *c = store_cell_row(st, 0);
        const char *state = json_string_value(json_object_get(c, "state"));
        json_object_set_new(counts, state,
                            json_integer(json_integer_value(json_object_get(counts, state)) + 1));
        json_array_append_new(cells, c);
    }
    rc = store_rc(s, src);
    json_object_set(job, "cells", cells);
    json_object_set(job, "counts", counts);
out:
    json_decref(cells);
    json_decref(counts);
    sqlite3_finalize(st);
    return rc;
}

static int job_get_by(struct store *s, const char *where, const char *arg, int64_t iarg,
                      json_t **out)
{
    sqlite3_stmt *st = NULL;
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT " JOB_COLS " FROM jobs j WHERE %s", where);
    int rc = store_prepare(s, sql, &st);
    if (rc)
        goto out;
    if (arg)
        store_bind_text(st, 1, arg);
    else
        sqlite3_bind_int64(st, 1, iarg);
    int src = sqlite3_step(st);
    if (src != SQLITE_ROW) {
        rc = src == SQLITE_DONE ? -ENOENT : store_rc(s, src);
        goto out;
    }
    json_t *job = job_row(st);
    if ((rc = job_add_cells(s, sqlite3_column_int64(st, 0), job)) != 0) {
        json_decref(job);
        goto out;
    }
    *out = job;
out:
    sqlite3_finalize(st);
    return rc;
}

int store_job_get(struct store *s, const char *id, json_t **out)
{
    return job_get_by(s, "j.id = ?", id, 0, out);
}

static int insert_cells(struct store *s, int64_t job_seq, json_t *matrix)
{
    sqlite3_stmt *st = NULL;
    int rc = store_prepare(s,
                           "INSERT INTO cells(id, job_seq, ord, model, width, pass) "
                           "VALUES (?,?,?,?,?,?)",
                           &st);
    if (rc)
        return rc;
    size_t im, iw, ip;
    json_t *m, *w, *p;
    int ord = 0;
    /* Order matters: cells run in this order, so all widths and passes of a
     * model run together and a broken model shows up early. */
    json_array_foreach(json_object_get(matrix, "models"), im, m)
    {
        json_array_foreach(json_object_get(matrix, "widths"), iw, w)
        {
            json_array_foreach(json_object_get(matrix, "passes"), ip, p)
            {
                char id[16];
                store_new_id('c', id);
                sqlite3_reset(st);
                store_bind_text(st, 1, id);
                sqlite3_bind_int64(st, 2, job_seq);
                sqlite3_bind_int(st, 3, ord++);
                store_bind_text(st, 4, json_string_value(m));
                store_bind_text(st, 5, json_string_value(w));
                store_bind_text(st, 6, json_string_value(p));
                if ((rc = store_rc(s, sqlite3_step(st))) != 0)
                    goto out;
            }
        }
    }
out:
    sqlite3_finalize(st);
    return rc;
}

/* Queued+running jobs, all of them or only TOKEN_ID's. */
static int count_queued_jobs(struct store *s, const char *token_id, int64_t *n)
{
    sqlite3_stmt *st = NULL;
    int rc = store_prepare(s,
                           "SELECT count(*) FROM jobs WHERE state IN ('queued','running') AND "
                           "(?1 IS NULL OR token_id = ?1)",
                           &st);
    if (rc == 0) {
        store_bind_text(st, 1, token_id);
        if (sqlite3_step(st) == SQLITE_ROW)
            *n = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    return rc;
}

int store_job_create(struct store *s, const struct store_job_new *n, json_t **out, bool *existed)
{
    sqlite3_stmt *st = NULL;
    json_t *req = n->request;
    char *req_s = NULL, *opt_s = NULL, *lab_s = NULL, *prov_s = NULL;
    int rc = store_begin(s);
    *existed = false;
    if (rc)
        return rc;
    if (n->idem_key) {
        rc = store_prepare(s, "SELECT id, idem_hash FROM jobs WHERE idem_key = ?", &st);
        if (rc)
            goto out;
        store_bind_text(st, 1, n->idem_key);
        if (sqlite3_step(st) == SQLITE_ROW) {
            char id[16];
            snprintf(id, sizeof id, "%s", (const char *)sqlite3_column_text(st, 0));
            const char *h = (const char *)sqlite3_column_text(st, 1);
            bool same = h && n->body_hash && strcmp(h, n->body_hash) == 0;
            sqlite3_finalize(st);
            st = NULL;
            store_rollback(s);
            if (!same)
                return -EEXIST;
            *existed = true;
            return store_job_get(s, id, out);
        }
        sqlite3_finalize(st);
        st = NULL;
    }
    if (n->max_queued_jobs > 0) {
        int64_t q = 0;
        if ((rc = count_queued_jobs(s, NULL, &q)) != 0)
            goto out;
        if (q >= n->max_queued_jobs) {
            rc = -EAGAIN;
            goto out;
        }
    }
    /* Counted in the same IMMEDIATE transaction as the insert, so two
     * concurrent posts of one token cannot both pass the check. */
    if (n->token_id && n->max_queued_per_token > 0) {
        int64_t q = 0;
        if ((rc = count_queued_jobs(s, n->token_id, &q)) != 0)
            goto out;
        if (q >= n->max_queued_per_token) {
            rc = -EDQUOT;
            goto out;
        }
    }
    char id[16];
    store_new_id('j', id);
    req_s = json_dumps(req, JSON_COMPACT);
    opt_s = json_dumps(json_object_get(req, "options"), JSON_COMPACT);
    lab_s = json_dumps(json_object_get(req, "labels"), JSON_COMPACT);
    json_t *prov = json_object_get(req, "provenance");
    prov_s = prov ? json_dumps(prov, JSON_COMPACT) : NULL;
    int64_t now = store_now_ms();
    rc = store_prepare(s,
                       "INSERT INTO jobs(id, project, commit_sha, branch, build, control_commit, "
                       "request_json, options_json, labels_json, provenance_json, idem_key, "
                       "idem_hash, created_at, updated_at, token_id) "
                       "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                       &st);
    if (rc)
        goto out;
    store_bind_text(st, 1, id);
    store_bind_text(st, 2, json_string_value(json_object_get(req, "project")));
    store_bind_text(st, 3, json_string_value(json_object_get(req, "commit")));
    store_bind_text(st, 4, json_string_value(json_object_get(req, "branch")));
    store_bind_text(st, 5, json_string_value(json_object_get(req, "build")));
    store_bind_text(st, 6, json_string_value(json_object_get(req, "control_commit")));
    store_bind_text(st, 7, req_s);
    store_bind_text(st, 8, opt_s ? opt_s : "{}");
    store_bind_text(st, 9, lab_s ? lab_s : "{}");
    store_bind_text(st, 10, prov_s);
    store_bind_text(st, 11, n->idem_key);
    store_bind_text(st, 12, n->body_hash);
    sqlite3_bind_int64(st, 13, now);
    sqlite3_bind_int64(st, 14, now);
    store_bind_text(st, 15, n->token_id);
    if ((rc = store_rc(s, sqlite3_step(st))) != 0)
        goto out;
    int64_t seq = sqlite3_last_insert_rowid(s->db);
    if ((rc = insert_cells(s, seq, json_object_get(req, "matrix"))) != 0)
        goto out;
    if ((rc = store_commit(s)) != 0)
        goto out;
    rc = store_job_get(s, id, out);
out:
    if (rc)
        store_rollback(s);
    sqlite3_finalize(st);
    free(req_s);
    free(opt_s);
    free(lab_s);
    free(prov_s);
    return rc;
}

int store_job_list(struct store *s, const struct store_job_filter *f, json_t **out)
{
    sqlite3_stmt *st = NULL;
    json_t *arr = json_array();
    char sql[1024];
    int rc;
    /* Keyset pagination on the internal sequence: stable under inserts,
     * unlike OFFSET. NULL filters match everything. */
    snprintf(sql, sizeof sql,
             "SELECT " JOB_COLS " FROM jobs j WHERE (?1 IS NULL OR j.commit_sha = ?1) AND "
             "(?2 IS NULL OR j.branch = ?2) AND (?3 IS NULL OR j.build = ?3) AND "
             "(?4 IS NULL OR j.state = ?4) AND (?5 IS NULL OR j.project = ?5) AND "
             "(?6 = 0 OR j.seq < ?6) ORDER BY j.seq DESC LIMIT ?7");
    if ((rc = store_prepare(s, sql, &st)) != 0)
        goto out;
    store_bind_text(st, 1, f->commit);
    store_bind_text(st, 2, f->branch);
    store_bind_text(st, 3, f->build);
    store_bind_text(st, 4, f->state);
    store_bind_text(st, 5, f->project);
    sqlite3_bind_int64(st, 6, f->before_seq);
    sqlite3_bind_int(st, 7, f->limit + 1);
    int src, n = 0;
    int64_t last = 0;
    bool more = false;
    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        if (n == f->limit) {
            more = true;
            break;
        }
        json_t *job = job_row(st);
        last = sqlite3_column_int64(st, 0);
        if ((rc = job_add_cells(s, last, job)) != 0) {
            json_decref(job);
            goto out;
        }
        json_object_del(job, "cells");
        json_array_append_new(arr, job);
        n++;
    }
    if (!more && (rc = store_rc(s, src)) != 0)
        goto out;
    *out = store_page("jobs", arr, more, 's', last);
    rc = 0;
out:
    json_decref(arr);
    sqlite3_finalize(st);
    return rc;
}

/* Recomputes a job's state from its cells: running while any cell runs or
 * waits, done when none does, cancelled stays cancelled. */
int store_job_refresh_state(struct store *s, int64_t job_seq)
{
    static const char sql[] =
        "UPDATE jobs SET state = CASE "
        " WHEN state = 'cancelled' THEN 'cancelled'"
        " WHEN EXISTS (SELECT 1 FROM cells WHERE job_seq = ?1 AND state = 'running') THEN 'running'"
        " WHEN EXISTS (SELECT 1 FROM cells WHERE job_seq = ?1 AND state = 'queued') THEN"
        "   CASE WHEN EXISTS (SELECT 1 FROM cells WHERE job_seq = ?1 AND state <> 'queued')"
        "   THEN 'running' ELSE 'queued' END"
        " ELSE 'done' END,"
        " updated_at = ?2,"
        " finished_at = CASE WHEN finished_at IS NULL AND NOT EXISTS (SELECT 1 FROM cells WHERE"
        "   job_seq = ?1 AND state IN ('queued','running')) THEN ?2 ELSE finished_at END"
        " WHERE seq = ?1";
    sqlite3_stmt *st = NULL;
    int rc = store_cached(s, SC_JOB_REFRESH, sql, &st);
    if (rc)
        return rc;
    sqlite3_bind_int64(st, 1, job_seq);
    sqlite3_bind_int64(st, 2, store_now_ms());
    rc = store_rc(s, sqlite3_step(st));
    sqlite3_reset(st);
    return rc;
}

int store_job_cancel(struct store *s, const char *id)
{
    sqlite3_stmt *st = NULL;
    int rc = store_begin(s);
    if (rc)
        return rc;
    if ((rc = store_prepare(s, "SELECT seq, state FROM jobs WHERE id = ?", &st)) != 0)
        goto out;
    store_bind_text(st, 1, id);
    if (sqlite3_step(st) != SQLITE_ROW) {
        rc = -ENOENT;
        goto out;
    }
    int64_t seq = sqlite3_column_int64(st, 0);
    const char *state = (const char *)sqlite3_column_text(st, 1);
    if (strcmp(state, "done") == 0 || strcmp(state, "cancelled") == 0) {
        rc = -EALREADY;
        goto out;
    }
    sqlite3_finalize(st);
    st = NULL;
    char sql[256];
    int64_t now = store_now_ms();
    snprintf(sql, sizeof sql,
             "UPDATE cells SET state='cancelled', reason='job cancelled', finished_at=%lld "
             "WHERE job_seq=%lld AND state='queued';"
             "UPDATE jobs SET state='cancelled', updated_at=%lld WHERE seq=%lld;",
             (long long)now, (long long)seq, (long long)now, (long long)seq);
    if ((rc = store_exec(s, sql)) != 0)
        goto out;
    /* Sets finished_at when no cell of the job is left running. */
    if ((rc = store_job_refresh_state(s, seq)) != 0)
        goto out;
    rc = store_commit(s);
out:
    if (rc)
        store_rollback(s);
    sqlite3_finalize(st);
    return rc;
}

int store_job_running_cells(struct store *s, const char *job_id, int64_t **seqs, size_t *n)
{
    sqlite3_stmt *st = NULL;
    int64_t *v = NULL;
    size_t cnt = 0, cap = 0;
    int rc = store_prepare(s,
                           "SELECT c.seq FROM cells c JOIN jobs j ON j.seq = c.job_seq "
                           "WHERE j.id = ? AND c.state = 'running'",
                           &st);
    if (rc)
        return rc;
    store_bind_text(st, 1, job_id);
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (cnt == cap) {
            cap = cap ? cap * 2 : 8;
            int64_t *nv = realloc(v, cap * sizeof *v);
            if (!nv) {
                rc = -ENOMEM;
                break;
            }
            v = nv;
        }
        v[cnt++] = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    if (rc) {
        free(v);
        return rc;
    }
    *seqs = v;
    *n = cnt;
    return 0;
}

/* ---- scheduler side ---- */

void store_cell_run_clear(struct store_cell_run *r)
{
    json_decref(r->spec);
    json_decref(r->build);
    memset(r, 0, sizeof *r);
}

int store_cell_claim(struct store *s, struct store_cell_run *r)
{
    return store_cell_claim_filtered(s, false, r);
}

/* The first queued cell in claim order, read into R (spec and build
 * included); -ENOENT when there is none. Runs inside the caller's
 * transaction. */
static int claim_select(struct store *s, bool skip_gpu, struct store_cell_run *r)
{
    sqlite3_stmt *st = NULL;
    int rc =
        store_cached(s, SC_CELL_NEXT,
                     "SELECT c.seq, c.job_seq, c.id, j.id, c.model, c.width, c.pass, "
                     "j.options_json, b.python, b.env_json, b.model_roots, c.attempts, b.name, "
                     "b.prefork, b.prefork_state, b.updated_at "
                     "FROM cells c JOIN jobs j ON j.seq = c.job_seq "
                     "LEFT JOIN builds b ON b.name = j.build "
                     "WHERE c.state = 'queued' AND j.state IN ('queued','running') "
                     "AND (?1 = 0 OR coalesce(json_extract(j.options_json, '$.device'), "
                     "'cpu') <> 'gpu') "
                     "ORDER BY c.job_seq, c.ord LIMIT 1",
                     &st);
    if (rc)
        return rc;
    sqlite3_bind_int(st, 1, skip_gpu ? 1 : 0);
    int src = sqlite3_step(st);
    if (src != SQLITE_ROW) {
        rc = src == SQLITE_DONE ? -ENOENT : store_rc(s, src);
        sqlite3_reset(st);
        return rc;
    }
    r->cell_seq = sqlite3_column_int64(st, 0);
    r->job_seq = sqlite3_column_int64(st, 1);
    snprintf(r->cell_id, sizeof r->cell_id, "%s", (const char *)sqlite3_column_text(st, 2));
    snprintf(r->job_id, sizeof r->job_id, "%s", (const char *)sqlite3_column_text(st, 3));
    r->attempt = sqlite3_column_int(st, 11) + 1;
    r->spec =
        json_pack("{s:o,s:o,s:o,s:o}", "model", store_col_str(st, 4), "width", store_col_str(st, 5),
                  "pass", store_col_str(st, 6), "options", store_col_json(st, 7));
    r->build = json_pack("{s:o,s:o,s:o,s:o,s:b,s:o,s:I}", "name", store_col_str(st, 12), "python",
                         store_col_str(st, 8), "env", store_col_json(st, 9), "model_roots",
                         store_col_json(st, 10), "prefork", sqlite3_column_int(st, 13) != 0,
                         "prefork_state", store_col_str(st, 14), "rev",
                         (json_int_t)sqlite3_column_int64(st, 15));
    sqlite3_reset(st);
    return 0;
}

/* Marks the cell claim_select found running, opens its attempt and
 * recomputes its job's state. Runs inside the caller's transaction. */
static int claim_start(struct store *s, struct store_cell_run *r)
{
    sqlite3_stmt *st = NULL;
    int64_t now = store_now_ms();
    int rc = store_cached(s, SC_CELL_START,
                          "UPDATE cells SET state='running', attempts=?2, started_at=?3, "
                          "finished_at=NULL, exit_code=NULL, signal=NULL, reason=NULL "
                          "WHERE seq=?1",
                          &st);
    if (rc)
        return rc;
    sqlite3_bind_int64(st, 1, r->cell_seq);
    sqlite3_bind_int(st, 2, r->attempt);
    sqlite3_bind_int64(st, 3, now);
    rc = store_rc(s, sqlite3_step(st));
    sqlite3_reset(st);
    if (rc)
        return rc;
    if ((rc = store_cached(s, SC_ATTEMPT_INSERT,
                           "INSERT INTO attempts(cell_seq, n, started_at) VALUES (?,?,?)", &st)) !=
        0)
        return rc;
    sqlite3_bind_int64(st, 1, r->cell_seq);
    sqlite3_bind_int(st, 2, r->attempt);
    sqlite3_bind_int64(st, 3, now);
    rc = store_rc(s, sqlite3_step(st));
    sqlite3_reset(st);
    if (rc)
        return rc;
    r->attempt_id = sqlite3_last_insert_rowid(s->db);
    return store_job_refresh_state(s, r->job_seq);
}

int store_cell_claim_filtered(struct store *s, bool skip_gpu, struct store_cell_run *r)
{
    memset(r, 0, sizeof *r);
    int rc = store_flush(s);
    if (rc)
        return rc;
    if ((rc = store_begin(s)) != 0)
        return rc;
    if ((rc = claim_select(s, skip_gpu, r)) != 0 || (rc = claim_start(s, r)) != 0)
        goto out;
    rc = store_commit(s);
out:
    if (rc) {
        store_rollback(s);
        store_cell_run_clear(r);
    }
    return rc;
}

/* Stores an attempt's outcome (store_cell_finish) without the job's state:
 * runs inside the caller's transaction. */
static int finish_cell(struct store *s, const struct store_cell_run *r,
                       const struct store_outcome *o)
{
    sqlite3_stmt *st = NULL;
    int rc;
    /* A requeued (interrupted) attempt is discarded, never made visible:
     * the next attempt will produce the records again. */
    if (o->requeue) {
        char sql[160];
        snprintf(sql, sizeof sql,
                 "DELETE FROM records WHERE attempt_id=%lld;"
                 "UPDATE attempts SET state='discarded' WHERE id=%lld;",
                 (long long)r->attempt_id, (long long)r->attempt_id);
        if ((rc = store_exec(s, sql)) != 0)
            return rc;
    } else {
        if ((rc = store_cached(s, SC_ATTEMPT_COMMIT,
                               "UPDATE attempts SET state='committed', partial=? WHERE id=?",
                               &st)) != 0)
            return rc;
        sqlite3_bind_int(st, 1, o->partial);
        sqlite3_bind_int64(st, 2, r->attempt_id);
        rc = store_rc(s, sqlite3_step(st));
        sqlite3_reset(st);
        if (rc)
            return rc;
    }
    rc = store_cached(s, SC_CELL_FINISH,
                      "UPDATE cells SET state=?2, exit_code=?3, signal=?4, reason=?5, "
                      "effective_width=coalesce(?6, effective_width), duration_ms=?7, "
                      "peak_rss_bytes=?8, finished_at=?9, "
                      "committed_attempt=CASE WHEN ?10 THEN committed_attempt ELSE ?11 END, "
                      "host_missing=?12, memory_limit_bytes=?13, cpu_time_ms=?14 WHERE seq=?1",
                      &st);
    if (rc)
        return rc;
    sqlite3_bind_int64(st, 1, r->cell_seq);
    store_bind_text(st, 2, o->requeue ? "queued" : o->state);
    if (o->exit_code >= 0)
        sqlite3_bind_int(st, 3, o->exit_code);
    else
        sqlite3_bind_null(st, 3);
    store_bind_text(st, 4, o->signal);
    store_bind_text(st, 5, o->reason);
    store_bind_text(st, 6, o->effective_width);
    sqlite3_bind_int64(st, 7, o->duration_ms);
    sqlite3_bind_int64(st, 8, o->peak_rss_bytes);
    if (o->requeue)
        sqlite3_bind_null(st, 9);
    else
        sqlite3_bind_int64(st, 9, store_now_ms());
    sqlite3_bind_int(st, 10, o->requeue);
    sqlite3_bind_int64(st, 11, r->attempt_id);
    store_bind_text(st, 12, o->host_missing);
    if (o->memory_limit_bytes > 0)
        sqlite3_bind_int64(st, 13, o->memory_limit_bytes);
    else
        sqlite3_bind_null(st, 13);
    if (o->memory_limit_bytes > 0 || o->cpu_time_ms > 0)
        sqlite3_bind_int64(st, 14, o->cpu_time_ms);
    else
        sqlite3_bind_null(st, 14);
    rc = store_rc(s, sqlite3_step(st));
    sqlite3_reset(st);
    return rc;
}

int store_cell_finish(struct store *s, const struct store_cell_run *r,
                      const struct store_outcome *o)
{
    int rc = store_flush(s);
    if (rc)
        return rc;
    if ((rc = store_begin(s)) != 0)
        return rc;
    if ((rc = finish_cell(s, r, o)) != 0 || (rc = store_job_refresh_state(s, r->job_seq)) != 0)
        goto out;
    rc = store_commit(s);
out:
    if (rc)
        store_rollback(s);
    return rc;
}

/*
 * One transaction where the scheduler used to commit two per cell: the
 * statements, triggers and events are those of store_cell_finish followed
 * by store_cell_claim_filtered, in that order. The one refresh left out is
 * the finished cell's job when the next cell is of the same job: that job
 * still has a queued cell, so its state stays running either way and the
 * claim's refresh sets updated_at again.
 */
int store_cell_finish_claim(struct store *s, const struct store_cell_run *r,
                            const struct store_outcome *o, bool skip_gpu,
                            struct store_cell_run *next)
{
    memset(next, 0, sizeof *next);
    int rc = store_flush(s);
    if (rc)
        return rc;
    if ((rc = store_begin(s)) != 0)
        return rc;
    if ((rc = finish_cell(s, r, o)) != 0)
        goto out;
    rc = claim_select(s, skip_gpu, next);
    if (rc && rc != -ENOENT)
        goto out;
    bool claimed = rc == 0;
    if (!claimed || next->job_seq != r->job_seq)
        if ((rc = store_job_refresh_state(s, r->job_seq)) != 0)
            goto out;
    if (claimed && (rc = claim_start(s, next)) != 0)
        goto out;
    rc = store_commit(s);
out:
    if (rc) {
        store_rollback(s);
        store_cell_run_clear(next);
    }
    return rc;
}

int store_recover(struct store *s, int max_attempts, int *requeued, int *interrupted)
{
    char sql[1024];
    int rc = store_begin(s);
    *requeued = *interrupted = 0;
    if (rc)
        return rc;
    int64_t now = store_now_ms();
    /* Records of attempts that never finished are invisible (no cell names
     * them); deleting them here keeps a retried attempt from duplicating
     * anything. */
    if ((rc = store_exec(s, "DELETE FROM records WHERE attempt_id IN "
                            "(SELECT id FROM attempts WHERE state='open');"
                            "UPDATE attempts SET state='discarded' WHERE state='open';")) != 0)
        goto out;
    snprintf(sql, sizeof sql,
             "UPDATE cells SET state='interrupted', finished_at=%lld, "
             "reason='daemon stopped while the cell ran; attempts exhausted' "
             "WHERE state='running' AND attempts >= %d",
             (long long)now, max_attempts);
    if ((rc = store_exec(s, sql)) != 0)
        goto out;
    *interrupted = sqlite3_changes(s->db);
    snprintf(sql, sizeof sql,
             "UPDATE cells SET state='queued', reason='interrupted: daemon stopped while the "
             "cell ran; re-queued' WHERE state='running'");
    if ((rc = store_exec(s, sql)) != 0)
        goto out;
    *requeued = sqlite3_changes(s->db);
    snprintf(sql, sizeof sql,
             "UPDATE jobs SET state = CASE WHEN EXISTS (SELECT 1 FROM cells c WHERE "
             "c.job_seq = jobs.seq AND c.state='queued') THEN 'running' ELSE 'done' END, "
             "updated_at=%lld, finished_at=coalesce(finished_at, %lld) WHERE state='running' "
             "AND NOT EXISTS (SELECT 1 FROM cells c WHERE c.job_seq = jobs.seq AND "
             "c.state='running')",
             (long long)now, (long long)now);
    if ((rc = store_exec(s, sql)) != 0)
        goto out;
    rc = store_commit(s);
out:
    if (rc)
        store_rollback(s);
    return rc;
}

/* ---- branches and commits ---- */

int store_branch_put(struct store *s, const char *name, const char *control, json_t **out)
{
    sqlite3_stmt *st = NULL;
    int rc = store_prepare(s,
                           "INSERT INTO branches(name, control_commit, updated_at) VALUES (?,?,?) "
                           "ON CONFLICT(name) DO UPDATE SET control_commit=excluded.control_commit,"
                           " updated_at=excluded.updated_at",
                           &st);
    if (rc)
        return rc;
    store_bind_text(st, 1, name);
    store_bind_text(st, 2, control);
    sqlite3_bind_int64(st, 3, store_now_ms());
    rc = store_rc(s, sqlite3_step(st));
    sqlite3_finalize(st);
    return rc ? rc : store_branch_get(s, name, out);
}

int store_branch_get(struct store *s, const char *name, json_t **out)
{
    sqlite3_stmt *st = NULL;
    int rc =
        store_prepare(s, "SELECT name, control_commit, updated_at FROM branches WHERE name=?", &st);
    if (rc)
        return rc;
    store_bind_text(st, 1, name);
    int src = sqlite3_step(st);
    if (src == SQLITE_ROW)
        *out = json_pack("{s:o,s:o,s:o}", "name", store_col_str(st, 0), "control_commit",
                         store_col_str(st, 1), "updated_at", store_col_time(st, 2));
    rc = src == SQLITE_ROW ? 0 : src == SQLITE_DONE ? -ENOENT : store_rc(s, src);
    sqlite3_finalize(st);
    return rc;
}

/* "+state": the unary plus keeps SQLite off the jobs_state index, which
 * walks every finished job newest first until the commit matches (12.6 ms
 * at 10,000 jobs, growing with the table); jobs_commit finds the commit's
 * few jobs directly (0.01 ms). bench/bench_compare_scale.py found it. */
const char store_sql_job_for_commit_done[] =
    "SELECT id FROM jobs WHERE commit_sha = ? AND +state = 'done' ORDER BY seq DESC LIMIT 1";

int store_job_for_commit(struct store *s, const char *commit, bool finished_only, char id_out[16])
{
    sqlite3_stmt *st = NULL;
    int rc = store_prepare(
        s,
        finished_only ? store_sql_job_for_commit_done
                      : "SELECT id FROM jobs WHERE commit_sha = ? ORDER BY seq DESC LIMIT 1",
        &st);
    if (rc)
        return rc;
    store_bind_text(st, 1, commit);
    int src = sqlite3_step(st);
    if (src == SQLITE_ROW)
        snprintf(id_out, 16, "%s", (const char *)sqlite3_column_text(st, 0));
    rc = src == SQLITE_ROW ? 0 : src == SQLITE_DONE ? -ENOENT : store_rc(s, src);
    sqlite3_finalize(st);
    return rc;
}

int store_commit_jobs(struct store *s, const char *commit, json_t **out)
{
    struct store_job_filter f = {.commit = commit, .limit = 200};
    return store_job_list(s, &f, out);
}
