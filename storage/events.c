/*
 * storage/events.c - the change feed (the events table, its replay window and
 * the process-wide "something was published" signal), the cheap versions
 * that ETags are made of, and the counts /metrics reports.
 *
 * Events are written by triggers (schema/003_events.sql) in the same
 * transaction as the change they describe. What this file adds is the
 * signal after the commit: an update hook notices an events row being
 * inserted on this connection, and store_commit() calls
 * store_events_committed(), which tells the one registered listener (the
 * HTTP front end's notifier) to read the new rows. The listener runs on the
 * committing thread, so it must only set a flag and wake someone.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "storage/store_int.h"

/* Set by the update hook when this thread's open transaction inserted an
 * event; a connection is only ever used by the thread that opened it, so a
 * thread-local flag is exactly per-connection-transaction. */
static _Thread_local bool ev_pending;

static pthread_mutex_t ev_mu = PTHREAD_MUTEX_INITIALIZER;
static void (*ev_listener)(void *ud);
static void *ev_listener_ud;

static void on_update(void *ud, int op, const char *dbname, const char *table, sqlite3_int64 id)
{
    (void)ud;
    (void)dbname;
    (void)id;
    if (op == SQLITE_INSERT && table[0] == 'e' && strcmp(table, "events") == 0)
        ev_pending = true;
}

void store_events_attach(struct store *s)
{
    sqlite3_update_hook(s->db, on_update, s);
}

void store_events_listen(void (*fn)(void *ud), void *ud)
{
    pthread_mutex_lock(&ev_mu);
    ev_listener = fn;
    ev_listener_ud = ud;
    pthread_mutex_unlock(&ev_mu);
}

void store_events_committed(void)
{
    if (!ev_pending)
        return;
    ev_pending = false;
    pthread_mutex_lock(&ev_mu);
    if (ev_listener)
        ev_listener(ev_listener_ud);
    pthread_mutex_unlock(&ev_mu);
}

void store_events_rolled_back(void)
{
    ev_pending = false;
}

/* The cached statements of this file share struct store's cache (finalized
 * by store_close). */
#define cached store_cached

int store_events_bounds(struct store *s, int64_t *oldest, int64_t *newest)
{
    sqlite3_stmt *st = NULL;
    /* The newest id comes from sqlite_sequence, the AUTOINCREMENT
     * high-water mark, so it is right even if the window were empty. */
    int rc = cached(s, SC_EVENTS_BOUNDS,
                    "SELECT coalesce((SELECT min(id) FROM events), 0), "
                    "coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0)",
                    &st);
    if (rc)
        return rc;
    if ((rc = store_step(s, st)) == 0) {
        *oldest = sqlite3_column_int64(st, 0);
        *newest = sqlite3_column_int64(st, 1);
    } else if (rc == -ENOENT) {
        rc = -EIO;
    }
    sqlite3_reset(st);
    return rc;
}

int store_events_read(struct store *s, int64_t after, int64_t upto,
                      const struct store_event_filter *f, int limit, store_event_cb fn, void *ud,
                      int *n_out)
{
    sqlite3_stmt *st = NULL;
    int n = 0;
    int rc =
        store_query_cached(s, SC_EVENTS_READ, &st,
                           "SELECT id, type, job_id, project, branch, data FROM events "
                           "WHERE id > ?1 AND (?2 = 0 OR id <= ?2) AND (?3 IS NULL OR job_id = ?3) "
                           "AND (?4 IS NULL OR project = ?4) AND (?5 IS NULL OR branch = ?5) "
                           "ORDER BY id LIMIT ?6",
                           "IIttti", after, upto, f ? f->job : NULL, f ? f->project : NULL,
                           f ? f->branch : NULL, limit);
    if (rc)
        return rc;
    int src;
    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        n++;
        rc = fn(ud, sqlite3_column_int64(st, 0), (const char *)sqlite3_column_text(st, 1),
                (const char *)sqlite3_column_text(st, 2), (const char *)sqlite3_column_text(st, 3),
                (const char *)sqlite3_column_text(st, 4), (const char *)sqlite3_column_text(st, 5));
        if (rc)
            break;
    }
    if (rc == 0 && src != SQLITE_ROW)
        rc = store_rc(s, src);
    sqlite3_reset(st);
    if (n_out)
        *n_out = n;
    return rc;
}

/* ---- versions ---- */

int store_job_version(struct store *s, const char *job_id, int64_t *version, bool *finished)
{
    sqlite3_stmt *st = NULL;
    /* A cancelled job still changes while its running cells are being
     * stopped; it has ended when none is left. */
    int rc = store_query_cached(
        s, SC_JOB_VERSION, &st,
        "SELECT j.version, j.state = 'done' OR (j.state = 'cancelled' AND NOT EXISTS "
        "(SELECT 1 FROM cells c WHERE c.job_seq = j.seq AND c.state IN "
        "('queued','running'))) FROM jobs j WHERE j.id = ?",
        "t", job_id);
    if (rc)
        return rc;
    if ((rc = store_step(s, st)) == 0) {
        *version = sqlite3_column_int64(st, 0);
        if (finished)
            *finished = sqlite3_column_int(st, 1) != 0;
    }
    sqlite3_reset(st);
    return rc;
}

int store_counter(struct store *s, const char *name, int64_t *value)
{
    sqlite3_stmt *st = NULL;
    int rc = store_query_cached(s, SC_COUNTER, &st, "SELECT value FROM counters WHERE name = ?",
                                "t", name);
    if (rc)
        return rc;
    if ((rc = store_step(s, st)) == 0)
        *value = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return rc;
}

/* ---- counts for /metrics ---- */

/* One (state, count) row of a group-by, set into the object INTO. */
static int count_row(sqlite3_stmt *st, void *into)
{
    json_object_set_new(into, (const char *)sqlite3_column_text(st, 0),
                        json_integer(sqlite3_column_int64(st, 1)));
    return 0;
}

static int count_by_state(struct store *s, const char *sql, json_t *into)
{
    return store_each(s, sql, count_row, into, "");
}

int store_state_counts(struct store *s, json_t **out)
{
    json_t *jobs = json_object(), *cells = json_object();
    /* Both group-bys are answered from the state indexes. */
    int rc = count_by_state(s, "SELECT state, count(*) FROM jobs GROUP BY state", jobs);
    if (rc == 0)
        rc = count_by_state(s, "SELECT state, count(*) FROM cells GROUP BY state", cells);
    if (rc == 0)
        *out = json_pack("{s:O,s:O}", "jobs", jobs, "cells", cells);
    json_decref(jobs);
    json_decref(cells);
    return rc;
}

/* ---- SQLite error counters ---- */

static uint64_t err_busy, err_constraint, err_nomem, err_io, err_other, err_conflict;

void store_note_error(int src)
{
    if (src == SQLITE_CONSTRAINT_UNIQUE || src == SQLITE_CONSTRAINT_PRIMARYKEY) {
        __atomic_add_fetch(&err_conflict, 1, __ATOMIC_RELAXED);
        return;
    }
    switch (src & 0xff) {
    case SQLITE_OK:
    case SQLITE_ROW:
    case SQLITE_DONE:
        return;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        __atomic_add_fetch(&err_busy, 1, __ATOMIC_RELAXED);
        return;
    case SQLITE_CONSTRAINT:
        __atomic_add_fetch(&err_constraint, 1, __ATOMIC_RELAXED);
        return;
    case SQLITE_NOMEM:
        __atomic_add_fetch(&err_nomem, 1, __ATOMIC_RELAXED);
        return;
    case SQLITE_IOERR:
    case SQLITE_CORRUPT:
    case SQLITE_FULL:
    case SQLITE_CANTOPEN:
    case SQLITE_NOTADB:
        __atomic_add_fetch(&err_io, 1, __ATOMIC_RELAXED);
        return;
    default:
        __atomic_add_fetch(&err_other, 1, __ATOMIC_RELAXED);
    }
}

void store_errors_get(struct store_errors *e)
{
    e->busy = __atomic_load_n(&err_busy, __ATOMIC_RELAXED);
    e->constraint = __atomic_load_n(&err_constraint, __ATOMIC_RELAXED);
    e->nomem = __atomic_load_n(&err_nomem, __ATOMIC_RELAXED);
    e->io = __atomic_load_n(&err_io, __ATOMIC_RELAXED);
    e->other = __atomic_load_n(&err_other, __ATOMIC_RELAXED);
    e->conflict = __atomic_load_n(&err_conflict, __ATOMIC_RELAXED);
}
