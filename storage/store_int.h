/* storage/store_int.h - what the files of storage/ share; not for others. */
#ifndef CAPD_STORE_INT_H
#define CAPD_STORE_INT_H

#include <sqlite3.h>

#include "storage/store.h"

enum {
    SC_RECORD_INSERT,
    SC_BLOB_EXISTS,
    SC_BLOB_INSERT,
    SC_JOB_VERSION,
    SC_COUNTER,
    SC_EVENTS_BOUNDS,
    SC_EVENTS_READ,
    SC_JOB_REFRESH,
    SC_CELL_NEXT,
    SC_CELL_NEXT_NUMERICS,
    SC_CELL_START,
    SC_ATTEMPT_INSERT,
    SC_ATTEMPT_COMMIT,
    SC_CELL_FINISH,
    SC_COUNT
};

struct store {
    sqlite3 *db;
    char data_dir[512];
    bool batch_open;       /* an ingest transaction is open */
    unsigned batch_rows;   /* rows written in it */
    uint64_t batch_losses; /* ingest transactions rolled back (store_batch_losses) */
    sqlite3_stmt *cache[SC_COUNT];
    struct store_ckpt *ckpt; /* store_checkpoint_in_background */
    void *zctx;              /* ZSTD_CCtx, created on first payload */
    void *zbuf;
    size_t zcap;
};

int store_rc(struct store *s, int sqlite_rc);
/* An errno of a failed file write as a store error: -ENOSPC when it means
 * storage is unavailable (full, read-only, I/O error). */
int store_errno(int e);
int store_exec(struct store *s, const char *sql);
int store_prepare(struct store *s, const char *sql, sqlite3_stmt **st);
/* The connection's prepared statement number WHICH (SC_*), prepared from SQL
 * on first use, reset and unbound. Not finalized by the caller: reset it
 * once done so it holds no read snapshot. */
int store_cached(struct store *s, int which, const char *sql, sqlite3_stmt **out);
int store_begin(struct store *s);
/* Commits the open ingest batch (store_flush), then store_begin: how the
 * daemon loop, which owns that batch, opens a transaction of its own. */
int store_begin_flushed(struct store *s);
int store_commit(struct store *s);
void store_rollback(struct store *s);
void store_zfree(struct store *s);
/* The payload file of blob HASH in this store's data dir (storage/layout.h
 * owns the layout; backup.c names a backup directory's with layout_blob). */
void store_blob_path(const struct store *s, const char *hash, char *out, size_t n);
int store_job_refresh_state(struct store *s, int64_t job_seq);
/* Re-analyses one history series (storage/history_alerts.c). */
int store__history_analyse(struct store *s, int64_t series);

/* WAL checkpoints (storage/checkpoint.c): attach installs the hook every
 * new connection starts with; stop ends the background checkpointer that
 * store_checkpoint_in_background started on S, if any. */
void store__checkpoint_attach(struct store *s);
void store__checkpoint_stop(struct store *s);

/* The files beside the database (storage/maint.c), for backup.c and
 * prune.c. dir_lock opens DATA_DIR/SUB and flock(2)s it HOW (LOCK_SH,
 * LOCK_EX, | LOCK_NB): the fd that holds the lock, -EAGAIN when LOCK_NB
 * finds it held, -errno otherwise; dir_unlock(fd) releases it (a negative
 * fd is ignored). is_blob_name: 'x' and 32 hex digits; is_id_name: a job or
 * cell id as it may appear in a path under DATA/logs. */
int store__dir_lock(const char *data_dir, const char *sub, int how);
void store__dir_unlock(int fd);
bool store__is_blob_name(const char *name);
bool store__is_id_name(const char *name);

/* The change feed's hooks (storage/events.c): attach registers the update
 * hook on a new connection; committed/rolled_back run at the end of every
 * explicit transaction; note_error counts SQLite failures for /metrics. */
void store_events_attach(struct store *s);
void store_events_committed(void);
void store_events_rolled_back(void);
void store_note_error(int sqlite_rc);

json_t *store_col_json(sqlite3_stmt *st, int col);
json_t *store_col_str(sqlite3_stmt *st, int col);
json_t *store_col_int(sqlite3_stmt *st, int col);
json_t *store_col_time(sqlite3_stmt *st, int col);
json_t *store_cell_row(sqlite3_stmt *st, int c0);
/* One statement run to completion, its parameters ?1, ?2, ... bound from
 * the arguments after TYPES, a letter each: 'i' an int, 'I' an int64_t,
 * 't' a string (NULL binds NULL). store_run prepares and finalizes SQL,
 * store_run_cached uses (and resets) the cached statement WHICH (SC_*).
 * 0 or a store error; sqlite3_changes() tells what it changed. */
int store_run(struct store *s, const char *sql, const char *types, ...);
int store_run_cached(struct store *s, int which, const char *sql, const char *types, ...);
/* SQL prepared into *ST with its parameters bound as for store_run; the
 * caller finalizes *ST (a failed prepare leaves it NULL). 0 or a store
 * error. */
int store_query(struct store *s, sqlite3_stmt **st, const char *sql, const char *types, ...);
/* The same with the cached statement WHICH (SC_*): the caller resets *ST. */
int store_query_cached(struct store *s, int which, sqlite3_stmt **st, const char *sql,
                       const char *types, ...);
/* Steps ST to its next row: 0 on a row, -ENOENT when there is none, else
 * a store error. */
int store_step(struct store *s, sqlite3_stmt *st);
/* The text of column 0 of ST's first row into OUT[16], after the prepare or
 * query that returned RC; finalizes ST; -ENOENT when there is no row. */
int store_first_id(struct store *s, sqlite3_stmt *st, int rc, char out[16]);
/* Hands every row of SQL (parameters as for store_run) to ROW with CTX
 * until ROW returns non-zero, which is then the result; otherwise 0 or a
 * store error once the rows end. */
typedef int (*store_each_fn)(sqlite3_stmt *st, void *ctx);
int store_each(struct store *s, const char *sql, store_each_fn row, void *ctx, const char *types,
               ...);
/* Ends the transaction store_begin opened: commits it when RC is 0, rolls
 * it back when RC is not or the commit fails. RC, or the commit's error. */
int store_end(struct store *s, int rc);
/* The first row of SQL (parameters as for store_run) as ROW makes it, into
 * *OUT; -ENOENT when there is none. */
int store_get_row(struct store *s, const char *sql, json_t *(*row)(sqlite3_stmt *st), json_t **out,
                  const char *types, ...);
/* A whole list: {NAME: [every row of SQL, each made an element by ROW]}. */
int store_list_all(struct store *s, const char *sql, json_t *(*row)(sqlite3_stmt *st),
                   const char *name, json_t **out);
/* One row of a list as its element in *ITEM, and its keyset cursor in
 * *CURSOR; 0 or a negative errno. */
typedef int (*store_row_fn)(struct store *s, sqlite3_stmt *st, json_t **item, int64_t *cursor);
/* A keyset-paginated list from ST, which asks for LIMIT + 1 rows (>= 1;
 * the extra one says there are more): ROW turns each of the first LIMIT
 * into an element; *OUT is {NAME: [...], "next_cursor": PREFIX<cursor of
 * the last> or null}. ST stays the caller's to finalize. */
int store_page(struct store *s, sqlite3_stmt *st, int limit, store_row_fn row, const char *name,
               char prefix, json_t **out);
void store_bind_text(sqlite3_stmt *st, int i, const char *v);

#define CELL_COLS                                                                                  \
    "c.id, c.model, c.width, c.pass, c.state, c.attempts, c.exit_code, c.signal, c.reason, "       \
    "c.effective_width, c.duration_ms, c.peak_rss_bytes, c.started_at, c.finished_at, c.seq, "     \
    "c.host_missing, c.memory_limit_bytes, c.cpu_time_ms, c.mode"

#endif
