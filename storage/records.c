/*
 * storage/records.c - the ingest writer (records and payload blobs) and the
 * readers behind the records API.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "storage/layout.h"
#include "storage/store_int.h"
#include "util/fs.h"

/* An ingest transaction is committed after this many rows even if the
 * daemon loop has not called store_flush, so HTTP writers never wait on a
 * giant transaction. */
#define STORE_BATCH_ROWS 20000

#define cached store_cached

void store_zfree(struct store *s)
{
    ZSTD_freeCCtx(s->zctx);
    s->zctx = NULL;
}

int store_flush(struct store *s)
{
    if (!s->batch_open)
        return 0;
    s->batch_open = false;
    s->batch_rows = 0;
    int rc = store_commit(s);
    if (rc) {
        store_rollback(s);
        s->batch_losses++;
    }
    return rc;
}

/* A failed write inside the batch: SQLite may already have rolled the
 * transaction back by itself (SQLITE_FULL, SQLITE_IOERR), so the batch is
 * dropped on purpose and counted, never committed with a hole in it. */
static int batch_fail(struct store *s, int rc)
{
    if (s->batch_open) {
        store_rollback(s);
        s->batch_open = false;
        s->batch_rows = 0;
        s->batch_losses++;
    }
    return rc;
}

void store_blob_path(const struct store *s, const char *hash, char *out, size_t n)
{
    layout_blob(out, n, s->data_dir, hash);
}

/*
 * Payloads are content-addressed by SHA-256 of the raw bytes, computed
 * here and never trusted from the child: 's' and 64 hex digits. The key
 * must be collision-resistant, since a blob found under it is taken to be
 * these bytes without reading it; the runner's record hash (XXH3-128 or
 * BLAKE2b-128, "hash_alg") only says whether two tensors are equal and
 * never names a blob. Blobs stored under the earlier XXH3-128 names ('x'
 * and 32 hex digits) stay readable under those names. A blob is stored
 * once, as a file renamed into place, so it exists whole or not at all. Before paying for
 * compression the first 64 KiB are tried: float activations rarely
 * compress, and zstd over incompressible bytes would be the slowest step
 * of ingest. A blob that saves at least 1/8 there is compressed whole.
 */
static int put_blob(struct store *s, const void *data, size_t n, char hash[STORE_BLOB_NAME_MAX])
{
    unsigned char d[32];
    store_sha256(data, n, d);
    hash[0] = 's';
    for (int i = 0; i < 32; i++)
        snprintf(hash + 1 + 2 * i, 3, "%02x", d[i]);
    sqlite3_stmt *st;
    int rc = cached(s, SC_BLOB_EXISTS, "SELECT 1 FROM blobs WHERE hash = ?", &st);
    if (rc)
        return rc;
    sqlite3_bind_text(st, 1, hash, -1, SQLITE_STATIC);
    int src = sqlite3_step(st);
    sqlite3_reset(st);
    if (src == SQLITE_ROW)
        return 0;
    if (src != SQLITE_DONE)
        return store_rc(s, src);
    if (!s->zctx && !(s->zctx = ZSTD_createCCtx()))
        return -ENOMEM;
    size_t probe = n < 65536 ? n : 65536;
    size_t bound = ZSTD_compressBound(n);
    if (bound > s->zcap) {
        void *nb = realloc(s->zbuf, bound);
        if (!nb)
            return -ENOMEM;
        s->zbuf = nb;
        s->zcap = bound;
    }
    bool use_z = false;
    size_t zn = ZSTD_compressCCtx(s->zctx, s->zbuf, s->zcap, data, probe, 1);
    if (!ZSTD_isError(zn) && zn < probe - probe / 8) {
        zn = probe == n ? zn : ZSTD_compressCCtx(s->zctx, s->zbuf, s->zcap, data, n, 1);
        use_z = !ZSTD_isError(zn) && zn < n - n / 16;
    }
    char path[1200], tmp[1300];
    store_blob_path(s, hash, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    char *slash = strrchr(path, '/');
    *slash = 0;
    if (mkdir(path, 0750) != 0 && errno != EEXIST)
        return store_errno(errno);
    *slash = '/';
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (fd < 0)
        return store_errno(errno);
    /* A half-written file is removed at once: on a full disk it is
     * exactly the room the next write needs. */
    rc = util_tmp_finish(fd, util_write_all(fd, use_z ? s->zbuf : data, use_z ? zn : n), tmp, path);
    if (rc)
        return store_errno(-rc);
    if ((rc = cached(s, SC_BLOB_INSERT,
                     "INSERT OR IGNORE INTO blobs(hash, codec, raw_size, stored_size) "
                     "VALUES (?,?,?,?)",
                     &st)) != 0)
        return rc;
    sqlite3_bind_text(st, 1, hash, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, use_z ? "zstd" : "raw", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)n);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)(use_z ? zn : n));
    rc = store_rc(s, sqlite3_step(st));
    sqlite3_reset(st);
    return rc;
}

int store_record_add(struct store *s, int64_t attempt_id, int64_t seq, const char *kind,
                     const char *key, const char *hash_alg, const char *header, size_t header_len,
                     const void *payload, size_t nbytes)
{
    int rc;
    if (!s->batch_open) {
        if ((rc = store_begin(s)) != 0)
            return rc;
        s->batch_open = true;
    }
    char hash[STORE_BLOB_NAME_MAX] = "";
    if (nbytes > 0 && (rc = put_blob(s, payload, nbytes, hash)) != 0)
        return batch_fail(s, rc);
    sqlite3_stmt *st;
    if ((rc = cached(s, SC_RECORD_INSERT,
                     "INSERT INTO records(attempt_id, seq, kind, key, header, blob_hash, "
                     "hash_alg) VALUES (?,?,?,?,?,?,?)",
                     &st)) != 0)
        return batch_fail(s, rc);
    sqlite3_bind_int64(st, 1, attempt_id);
    sqlite3_bind_int64(st, 2, seq);
    sqlite3_bind_text(st, 3, kind, -1, SQLITE_STATIC);
    if (key)
        sqlite3_bind_text(st, 4, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, header, (int)header_len, SQLITE_STATIC);
    if (nbytes > 0)
        sqlite3_bind_text(st, 6, hash, -1, SQLITE_STATIC);
    if (hash_alg)
        sqlite3_bind_text(st, 7, hash_alg, -1, SQLITE_STATIC);
    rc = store_rc(s, sqlite3_step(st));
    sqlite3_reset(st);
    if (rc)
        return batch_fail(s, rc);
    if (++s->batch_rows >= STORE_BATCH_ROWS)
        return store_flush(s);
    return 0;
}

int store_blob_get(struct store *s, const char *hash, void **data, size_t *len)
{
    sqlite3_stmt *st = NULL;
    char *buf = NULL;
    void *raw = NULL;
    int rc = store_query(s, &st, "SELECT codec, raw_size, stored_size FROM blobs WHERE hash = ?",
                         "t", hash);
    if (rc || (rc = store_step(s, st)) != 0)
        goto out;
    bool z = strcmp((const char *)sqlite3_column_text(st, 0), "zstd") == 0;
    size_t rawn = (size_t)sqlite3_column_int64(st, 1);
    size_t stored = (size_t)sqlite3_column_int64(st, 2), got = 0;
    char path[1200];
    store_blob_path(s, hash, path, sizeof path);
    if ((rc = util_slurp(path, stored, &buf, &got)) != 0 || got != stored) {
        rc = rc == -ENOMEM ? rc : -EIO;
        goto out;
    }
    if (z) {
        if (!(raw = malloc(rawn ? rawn : 1))) {
            rc = -ENOMEM;
            goto out;
        }
        size_t dn = ZSTD_decompress(raw, rawn, buf, stored);
        if (ZSTD_isError(dn) || dn != rawn) {
            rc = -EIO;
            goto out;
        }
        *data = raw;
        raw = NULL;
    } else {
        *data = buf;
        buf = NULL;
    }
    *len = rawn;
out:
    free(buf);
    free(raw);
    sqlite3_finalize(st);
    return rc;
}

/* Resolves job and cell public ids to the cell's row and its visible
 * attempt (0 when none committed yet). */
static int find_cell(struct store *s, const char *job_id, const char *cell_id, int64_t *cell_seq,
                     int64_t *attempt)
{
    sqlite3_stmt *st = NULL;
    int rc = store_query(s, &st,
                         "SELECT c.seq, coalesce(c.committed_attempt, 0) FROM cells c "
                         "JOIN jobs j ON j.seq = c.job_seq WHERE j.id = ? AND c.id = ?",
                         "tt", job_id, cell_id);
    if (rc == 0 && (rc = store_step(s, st)) == 0) {
        *cell_seq = sqlite3_column_int64(st, 0);
        *attempt = sqlite3_column_int64(st, 1);
    }
    sqlite3_finalize(st);
    return rc;
}

/* The summary of a timing frame's header H: its phase, sample count,
 * median, mean, minimum and maximum (nanoseconds). */
static json_t *timing_summary(json_t *h)
{
    json_t *samples = json_object_get(h, "samples_ns");
    size_t n = json_array_size(samples);
    double *v = calloc(n ? n : 1, sizeof *v);
    double sum = 0, mn = 0, mx = 0;
    for (size_t i = 0; v && i < n; i++) {
        v[i] = (double)json_integer_value(json_array_get(samples, i));
        sum += v[i];
        mn = i == 0 || v[i] < mn ? v[i] : mn;
        mx = i == 0 || v[i] > mx ? v[i] : mx;
    }
    /* The median by insertion sort: timing arrays are small. */
    for (size_t i = 1; v && i < n; i++)
        for (size_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    double med = n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    json_t *summary = json_pack("{s:O,s:I,s:f,s:f,s:f,s:f}", "phase", json_object_get(h, "phase"),
                                "n", (json_int_t)n, "median_ns", med, "mean_ns", n ? sum / n : 0.0,
                                "min_ns", mn, "max_ns", mx);
    free(v);
    return summary;
}

/* What cell_count_row gathers: the records per kind and whether any is
 * partial. */
struct record_counts {
    json_t *counts;
    bool partial;
};

static int cell_count_row(sqlite3_stmt *st, void *arg)
{
    struct record_counts *c = arg;
    json_object_set_new(c->counts, (const char *)sqlite3_column_text(st, 0),
                        json_integer(sqlite3_column_int64(st, 1)));
    c->partial |= sqlite3_column_int(st, 2) != 0;
    return 0;
}

/* CELL's record_counts (per kind) and whether any record of ATTEMPT is
 * partial. */
static int cell_record_counts(struct store *s, int64_t attempt, json_t *cell)
{
    struct record_counts c = {json_object(), false};
    int rc = store_each(s,
                        "SELECT kind, count(*), max(partial) FROM records r JOIN attempts a "
                        "ON a.id = r.attempt_id WHERE r.attempt_id = ? GROUP BY kind",
                        cell_count_row, &c, "I", attempt);
    json_object_set_new(cell, "record_counts", c.counts);
    json_object_set_new(cell, "partial", json_boolean(c.partial));
    return rc;
}

/* One stored timing, memory or env frame's header, shown in CELL: the
 * timing summary, the memory header or the environment fingerprint. */
static int cell_frame_row(sqlite3_stmt *st, void *cell)
{
    json_t *h = store_col_json(st, 0);
    const char *k = json_string_value(json_object_get(h, "kind"));
    if (k && strcmp(k, "timing") == 0) {
        json_object_set_new(cell, "timing", timing_summary(h));
    } else if (k && strcmp(k, "memory") == 0) {
        json_object_del(h, "kind");
        json_object_set(cell, "memory", h);
    } else if (k && strcmp(k, "env") == 0) {
        json_t *fp = json_object_get(h, "fingerprint");
        json_object_set(cell, "fingerprint", fp ? fp : json_null());
    }
    json_decref(h);
    return 0;
}

/* One cell of a job with what its visible attempt recorded. */
int store_cell_get(struct store *s, const char *job_id, const char *cell_id, json_t **out)
{
    sqlite3_stmt *st = NULL;
    int64_t cell_seq, attempt;
    json_t *cell = NULL;
    int rc = find_cell(s, job_id, cell_id, &cell_seq, &attempt);
    if (rc)
        goto out;
    if ((rc = store_query(s, &st, "SELECT " CELL_COLS " FROM cells c WHERE c.seq = ?", "I",
                          cell_seq)) != 0)
        goto out;
    if (sqlite3_step(st) != SQLITE_ROW) {
        rc = -ENOENT;
        goto out;
    }
    cell = store_cell_row(st, 0);
    sqlite3_finalize(st);
    st = NULL;
    json_object_set_new(cell, "job", json_string(job_id));
    if ((rc = cell_record_counts(s, attempt, cell)) != 0 ||
        (rc = store_each(s,
                         "SELECT header FROM records WHERE attempt_id = ? AND kind IN "
                         "('timing','memory','env') ORDER BY seq",
                         cell_frame_row, cell, "I", attempt)) != 0)
        goto out;
    *out = cell;
    cell = NULL;
    rc = 0;
out:
    json_decref(cell);
    sqlite3_finalize(st);
    return rc;
}

/* A record of the list: its header, with its sequence and blob added. */
static int record_list_row(struct store *s, sqlite3_stmt *st, json_t **item, int64_t *cursor)
{
    json_t *h = store_col_json(st, 1);

    (void)s;
    *cursor = sqlite3_column_int64(st, 0);
    json_object_set_new(h, "record", json_integer(*cursor));
    if (sqlite3_column_type(st, 2) != SQLITE_NULL)
        json_object_set_new(h, "blob", store_col_str(st, 2));
    *item = h;
    return 0;
}

int store_records_list(struct store *s, const char *job_id, const char *cell_id, const char *kind,
                       int64_t after, int limit, json_t **out)
{
    sqlite3_stmt *st = NULL;
    int64_t cell_seq, attempt;
    int rc = find_cell(s, job_id, cell_id, &cell_seq, &attempt);
    if (rc)
        goto out;
    if ((rc = store_query(s, &st,
                          "SELECT seq, header, blob_hash FROM records WHERE attempt_id = ?1 "
                          "AND seq > ?2 AND (?3 IS NULL OR kind = ?3) ORDER BY seq LIMIT ?4",
                          "IIti", attempt, after, kind, limit + 1)) != 0)
        goto out;
    rc = store_page(s, st, limit, record_list_row, "records", 'r', out);
out:
    sqlite3_finalize(st);
    return rc;
}
