/*
 * storage/store.c - the connection: opening and closing it, the migrations,
 * the statement cache and transactions, the mapping of SQLite's result codes
 * to the module's errors, and the column helpers the readers share.
 *
 * What a connection stores lives beside it: builds.c, jobs.c (jobs,
 * branches, commits), cells.c (the scheduler's claims and outcomes),
 * records.c (records and payload blobs), and checkpoint.c moves the WAL
 * checkpoints of a connection off its thread. They share store_int.h.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>

#include "storage/embedded.h"
#include "storage/layout.h"
#include "storage/store_int.h"
#include "util/clock.h"
#include "util/err.h"

void store_new_id(char prefix, char out[16])
{
    unsigned char r[6];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        /* getrandom cannot fail for 6 bytes once the pool is ready; fall
         * back to the clock rather than abort. */
        int64_t t = util_wall_ms() ^ (int64_t)clock();
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

int store_begin_flushed(struct store *s)
{
    int rc = store_flush(s);
    return rc ? rc : store_begin(s);
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

/* Whether the database holds no row whose foreign key names a row that is
 * not there (PRAGMA foreign_key_check answers none). */
static bool foreign_keys_hold(struct store *s)
{
    sqlite3_stmt *st = NULL;
    bool ok =
        store_prepare(s, "PRAGMA foreign_key_check", &st) == 0 && sqlite3_step(st) == SQLITE_DONE;
    sqlite3_finalize(st);
    return ok;
}

/* Migration V from F inside its transaction: its statements, the foreign
 * keys checked, the user_version bump; 0 or -EIO with *ERR. */
static int migrate_one(struct store *s, const struct embedded_file *f, int v, char **err)
{
    char bump[64], *msg = NULL;
    snprintf(bump, sizeof bump, "PRAGMA user_version = %d", v);
    if (sqlite3_exec(s->db, f->data, NULL, NULL, &msg) != SQLITE_OK ||
        sqlite3_exec(s->db, bump, NULL, NULL, &msg) != SQLITE_OK) {
        util_errf(err, -EIO, "migration %s failed: %s", f->name, msg ? msg : "?");
        sqlite3_free(msg);
        return -EIO;
    }
    if (!foreign_keys_hold(s))
        return util_errf(err, -EIO,
                         "migration %s failed: it leaves rows whose foreign keys name no row",
                         f->name);
    return 0;
}

/*
 * Each migration runs in its own IMMEDIATE transaction together with the
 * user_version bump, so a crash mid-upgrade leaves the database at the last
 * complete version, never in between. Foreign keys are off meanwhile (a
 * pragma a transaction cannot change) and checked before each commit: a
 * migration may rebuild a table others reference (SQLite's documented way
 * of changing a constraint) without the drop cascading into their rows.
 */
static int migrate(struct store *s, char **err)
{
    int have = 0, want = store_schema_version();
    int rc = user_version(s, &have);
    if (rc)
        return rc;
    if (have > want)
        return util_errf(err, -EPROTO,
                         "database schema version %d is newer than this capd supports (%d); "
                         "upgrade capd or restore a backup",
                         have, want);
    if (have < want && (rc = store_exec(s, "PRAGMA foreign_keys=OFF")) != 0)
        return rc;
    for (int v = have + 1; v <= want && !rc; v++) {
        if ((rc = store_begin(s)) != 0)
            break;
        rc = migrate_one(s, migration(v), v, err);
        if (rc)
            store_rollback(s);
        else
            rc = store_commit(s);
    }
    if (have < want) {
        int on = store_exec(s, "PRAGMA foreign_keys=ON");
        rc = rc ? rc : on;
    }
    return rc;
}

/* Process-wide SQLite settings, before its first use. No memory
 * statistics: nothing reads them, and keeping them takes a global mutex
 * on every allocation (two per inserted record on the ingest path). */
static void sqlite_global_init(void)
{
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
}

/*
 * The per-connection settings. WAL lets HTTP readers run while the loop
 * thread ingests; NORMAL sync is durable across application crashes, which
 * is what kill -9 tests. 8 KiB pages (only effective on a new database)
 * halve the page writes of ingest; an 8 MiB cache holds a batch's pages (a
 * loop iteration's batch is ~1 MiB of rows, the 20,000-row cap ~12 MiB,
 * past which SQLite spills to the WAL early, which is still correct). A
 * bigger cache is slower, not faster: during a long ingest every page it
 * has not filled yet is fresh heap (malloc, page fault, zeroing), while a
 * full small cache recycles warm pages (1.5x records/s). Checkpoints are
 * not run inline by whichever connection commits (storage/checkpoint.c).
 */
static int configure(struct store *s, const char *path, char **err)
{
    sqlite3_busy_timeout(s->db, 10000);
    sqlite3_extended_result_codes(s->db, 1);
    int rc =
        store_exec(s, "PRAGMA page_size=8192; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                      "PRAGMA foreign_keys=ON; PRAGMA temp_store=MEMORY;"
                      "PRAGMA cache_size=-8192;");
    if (rc)
        return util_errf(err, rc, "cannot configure %s: %s", path, sqlite3_errmsg(s->db));
    store__checkpoint_attach(s);
    store_events_attach(s);
    return 0;
}

/* With DO_MIGRATE, creates DATA/blobs and runs the pending migrations;
 * without it, checks that the schema is the one this binary writes. */
static int open_schema(struct store *s, const char *data_dir, bool do_migrate, char **err)
{
    int rc;
    if (do_migrate) {
        char blobs[600];
        layout_dir(blobs, sizeof blobs, data_dir, "blobs");
        if (mkdir(blobs, 0750) != 0 && errno != EEXIST) {
            rc = -errno;
            return util_errf(err, rc, "cannot create %s: %s", blobs, strerror(errno));
        }
        return migrate(s, err);
    }
    int v = 0;
    if ((rc = user_version(s, &v)) != 0)
        return rc;
    if (v != store_schema_version())
        return util_errf(err, -EPROTO, "database schema version %d, expected %d", v,
                         store_schema_version());
    return 0;
}

int store_open(const char *data_dir, bool do_migrate, struct store **out, char **err)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, sqlite_global_init);
    int rc = -ENOMEM;
    char path[LAYOUT_PATH_MAX];
    struct store *s = calloc(1, sizeof *s);
    if (err)
        *err = NULL;
    if (!s)
        goto out;
    if (strlen(data_dir) >= sizeof s->data_dir ||
        layout_dir(path, sizeof path, data_dir, "capd.db") != 0) {
        rc = util_errf(err, -ENAMETOOLONG, "data dir path too long (%zu bytes, at most %zu)",
                       strlen(data_dir), sizeof s->data_dir - 1);
        goto out;
    }
    snprintf(s->data_dir, sizeof s->data_dir, "%s", data_dir);
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
    if (sqlite3_open_v2(path, &s->db, flags, NULL) != SQLITE_OK) {
        rc = util_errf(err, -EIO, "cannot open %s: %s", path, sqlite3_errmsg(s->db));
        goto out;
    }
    if ((rc = configure(s, path, err)) != 0 ||
        (rc = open_schema(s, data_dir, do_migrate, err)) != 0)
        goto out;
    *out = s;
    s = NULL;
    rc = 0;
out:
    store_close(s);
    return rc;
}

void store_close(struct store *s)
{
    if (!s)
        return;
    if (s->batch_open)
        store_flush(s);
    store__checkpoint_stop(s);
    for (size_t i = 0; i < sizeof s->cache / sizeof s->cache[0]; i++)
        sqlite3_finalize(s->cache[i]);
    sqlite3_close_v2(s->db);
    free(s->zbuf);
    if (s->zctx)
        store_zfree(s);
    free(s);
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
    char buf[UTIL_TIME_TEXT_MAX];

    util_time_text(sqlite3_column_int64(st, col), buf);
    return json_string(buf);
}

void store_bind_text(sqlite3_stmt *st, int i, const char *v)
{
    if (v)
        sqlite3_bind_text(st, i, v, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, i);
}

/* Binds ?1, ?2, ... of ST from AP, one argument a letter of TYPES: 'i' an
 * int, 'I' an int64_t, 't' a string (NULL binds NULL). */
static void bind_va(sqlite3_stmt *st, const char *types, va_list ap)
{
    for (int i = 0; types[i]; i++) {
        if (types[i] == 'i')
            sqlite3_bind_int(st, i + 1, va_arg(ap, int));
        else if (types[i] == 'I')
            sqlite3_bind_int64(st, i + 1, va_arg(ap, int64_t));
        else
            store_bind_text(st, i + 1, va_arg(ap, const char *));
    }
}

/* SQL into *ST with its parameters bound from AP: prepared when WHICH is
 * -1, else the cached statement WHICH. */
static int query_va(struct store *s, int which, sqlite3_stmt **st, const char *sql,
                    const char *types, va_list ap)
{
    int rc = which < 0 ? store_prepare(s, sql, st) : store_cached(s, which, sql, st);

    if (rc == 0)
        bind_va(*st, types, ap);
    return rc;
}

/* SQL run once to completion: prepared and finalized when WHICH is -1,
 * else the cached statement WHICH, reset. */
static int run_va(struct store *s, int which, const char *sql, const char *types, va_list ap)
{
    sqlite3_stmt *st = NULL;
    int rc = query_va(s, which, &st, sql, types, ap);

    if (rc)
        return rc;
    rc = store_rc(s, sqlite3_step(st));
    if (which < 0)
        sqlite3_finalize(st);
    else
        sqlite3_reset(st);
    return rc;
}

int store_run(struct store *s, const char *sql, const char *types, ...)
{
    va_list ap;
    int rc;

    va_start(ap, types);
    rc = run_va(s, -1, sql, types, ap);
    va_end(ap);
    return rc;
}

int store_run_cached(struct store *s, int which, const char *sql, const char *types, ...)
{
    va_list ap;
    int rc;

    va_start(ap, types);
    rc = run_va(s, which, sql, types, ap);
    va_end(ap);
    return rc;
}

int store_query(struct store *s, sqlite3_stmt **st, const char *sql, const char *types, ...)
{
    va_list ap;
    int rc;

    va_start(ap, types);
    rc = query_va(s, -1, st, sql, types, ap);
    va_end(ap);
    return rc;
}

int store_query_cached(struct store *s, int which, sqlite3_stmt **st, const char *sql,
                       const char *types, ...)
{
    va_list ap;
    int rc;

    va_start(ap, types);
    rc = query_va(s, which, st, sql, types, ap);
    va_end(ap);
    return rc;
}

int store_step(struct store *s, sqlite3_stmt *st)
{
    int src = sqlite3_step(st);
    return src == SQLITE_ROW ? 0 : src == SQLITE_DONE ? -ENOENT : store_rc(s, src);
}

/* The rows of SQL, each handed to ROW until it returns non-zero. */
int store_each(struct store *s, const char *sql, store_each_fn row, void *ctx, const char *types,
               ...)
{
    sqlite3_stmt *st = NULL;
    va_list ap;
    int src, rc;

    va_start(ap, types);
    rc = query_va(s, -1, &st, sql, types, ap);
    va_end(ap);
    if (rc)
        return rc;
    while ((src = sqlite3_step(st)) == SQLITE_ROW)
        if ((rc = row(st, ctx)) != 0)
            break;
    if (src != SQLITE_ROW)
        rc = store_rc(s, src);
    sqlite3_finalize(st);
    return rc;
}

int store_end(struct store *s, int rc)
{
    if (rc == 0 && (rc = store_commit(s)) == 0)
        return 0;
    store_rollback(s);
    return rc;
}

int store_get_row(struct store *s, const char *sql, json_t *(*row)(sqlite3_stmt *st), json_t **out,
                  const char *types, ...)
{
    sqlite3_stmt *st = NULL;
    va_list ap;
    int rc;

    va_start(ap, types);
    rc = query_va(s, -1, &st, sql, types, ap);
    va_end(ap);
    if (rc == 0 && (rc = store_step(s, st)) == 0)
        *out = row(st);
    sqlite3_finalize(st);
    return rc;
}

/* {NAME: [every row of SQL, each made an element by ROW]}. */
int store_list_all(struct store *s, const char *sql, json_t *(*row)(sqlite3_stmt *st),
                   const char *name, json_t **out)
{
    sqlite3_stmt *st = NULL;
    json_t *arr = json_array();
    int src, rc = store_prepare(s, sql, &st);

    if (rc)
        goto out;
    while ((src = sqlite3_step(st)) == SQLITE_ROW)
        json_array_append_new(arr, row(st));
    if ((rc = store_rc(s, src)) != 0)
        goto out;
    *out = json_pack("{s:O}", name, arr);
out:
    json_decref(arr);
    sqlite3_finalize(st);
    return rc;
}

/* A page of a keyset-paginated list: {NAME: [...], "next_cursor":
 * PREFIX<last> or null}. The cursor is opaque to clients; the prefix tells
 * the lists' cursors apart. */
int store_page(struct store *s, sqlite3_stmt *st, int limit, store_row_fn row, const char *name,
               char prefix, json_t **out)
{
    json_t *arr = json_array(), *cursor;
    int64_t last = 0;
    int n = 0, src, rc = 0;
    bool more = false;

    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        json_t *item = NULL;
        if (n == limit) {
            more = true;
            break;
        }
        if ((rc = row(s, st, &item, &last)) != 0)
            goto out;
        json_array_append_new(arr, item);
        n++;
    }
    if (!more && (rc = store_rc(s, src)) != 0)
        goto out;
    cursor = json_null();
    if (more) {
        char c[32];
        snprintf(c, sizeof c, "%c%lld", prefix, (long long)last);
        cursor = json_string(c);
    }
    *out = json_pack("{s:O,s:o}", name, arr, "next_cursor", cursor);
out:
    json_decref(arr);
    return rc;
}
