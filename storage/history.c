/*
 * storage/history.c - the series of a branch, written as its jobs finish.
 *
 * A finished job of a branch is queued in history_pending by a trigger
 * (schema/007_history.sql) in the very transaction that finishes it;
 * store_history_drain() turns each queued job into one point per cell
 * (outcome, perf observation, peak memory, a digest of the cell's tensor
 * hashes and the numerics drift against the previous commit) and then
 * re-analyses the series it touched: change points of perf and memory by
 * compare/changepoint.h, numerics and outcome changes as exact events,
 * all kept in the alerts table. Everything a history query returns is
 * therefore already computed; reading it never touches the records.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "compare/changepoint.h"
#include "compare/cmp.h"
#include "storage/store_int.h"
#include "util/clock.h"

/* One tensor record of a cell, for the first divergent key. */
struct tkey {
    char *key, *hash;
    bool other_alg; /* hashed by another algorithm than blake2b-128 (xxh3-128) */
    int64_t seq;
};

struct tkeys {
    struct tkey *v;
    size_t n, cap;
};

static void tkeys_free(struct tkeys *t)
{
    for (size_t i = 0; i < t->n; i++) {
        free(t->v[i].key);
        free(t->v[i].hash);
    }
    free(t->v);
    t->v = NULL;
    t->n = t->cap = 0;
}

static int tkey_row(sqlite3_stmt *st, void *ctx)
{
    struct tkeys *out = ctx;
    if (out->n == out->cap) {
        if (out->cap >= CMP_MAX_TENSORS)
            return -E2BIG;
        size_t cap = out->cap ? out->cap * 2 : 64;
        struct tkey *v = realloc(out->v, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        out->v = v;
        out->cap = cap;
    }
    const char *h = (const char *)sqlite3_column_text(st, 1);
    struct tkey *k = &out->v[out->n++];
    k->key = strdup((const char *)sqlite3_column_text(st, 0));
    k->hash = h ? strdup(h) : NULL;
    k->seq = sqlite3_column_int64(st, 2);
    const char *alg = (const char *)sqlite3_column_text(st, 3);
    k->other_alg = alg && strcmp(alg, CMP_HASH_ALG_DEFAULT) != 0;
    return !k->key || (h && !k->hash) ? -ENOMEM : 0;
}

/* The (key, hash, seq) of every tensor record of ATTEMPT, in key order. */
static int tkeys_load(struct store *s, int64_t attempt, struct tkeys *out)
{
    return store_each(
        s,
        "SELECT key, json_extract(header, '$.hash'), seq, hash_alg FROM records WHERE "
        "attempt_id = ? AND kind = 'tensor' AND key IS NOT NULL ORDER BY key",
        tkey_row, out, "I", attempt);
}

/*
 * The first key, in the head cell's capture order, whose tensor differs
 * from the previous commit's or exists on one side only (a key only the
 * previous commit has counts at its own position). NULL when none does.
 */
static char *first_divergent_key(const struct tkeys *prev, const struct tkeys *cur)
{
    size_t i = 0, j = 0;
    const char *best = NULL;
    int64_t best_seq = INT64_MAX;
    while (i < prev->n || j < cur->n) {
        int c = i == prev->n ? 1 : j == cur->n ? -1 : strcmp(prev->v[i].key, cur->v[j].key);
        const struct tkey *k = c < 0 ? &prev->v[i] : &cur->v[j];
        bool differs = c != 0 || !k->hash || !prev->v[i].hash || strcmp(prev->v[i].hash, k->hash);
        if (differs && k->seq < best_seq) {
            best_seq = k->seq;
            best = k->key;
        }
        i += c <= 0;
        j += c >= 0;
    }
    return best ? strdup(best) : NULL;
}

/* A digest of the cell's tensors: XXH3-128 of key and hash in key order,
 * and the algorithm of a hash that is not blake2b-128 (so the digests of
 * records before "hash_alg" stay what they were); "" when a tensor has no
 * hash or there is none (numerics unknown). */
static void tensor_digest(const struct tkeys *t, char out[33])
{
    out[0] = 0;
    if (t->n == 0)
        return;
    XXH3_state_t *x = XXH3_createState();
    if (!x)
        return;
    XXH3_128bits_reset(x);
    for (size_t i = 0; i < t->n; i++) {
        if (!t->v[i].hash) {
            XXH3_freeState(x);
            return;
        }
        XXH3_128bits_update(x, t->v[i].key, strlen(t->v[i].key) + 1);
        XXH3_128bits_update(x, t->v[i].hash, strlen(t->v[i].hash) + 1);
        if (t->v[i].other_alg)
            XXH3_128bits_update(x, "xxh3-128", sizeof "xxh3-128");
    }
    XXH128_hash_t h = XXH3_128bits_digest(x);
    XXH3_freeState(x);
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
}

struct samples {
    int64_t *v;
    size_t n;
};

/*
 * One timing process of the cell (a timing frame) as the comparison takes
 * it (docs/compare.md, "Performance"): its fastest sample, in device time
 * on a GPU, else in own time where the runner measured it, else wall time. A paired cell's control
 * build's processes ("reference": true) are the control's, not the
 * cell's: left out. Every process past CMP_MAX_TIMING_SAMPLES is counted,
 * not kept.
 */
static int sample_row(sqlite3_stmt *st, void *ctx)
{
    struct samples *sm = ctx;
    json_t *h = json_loads((const char *)sqlite3_column_text(st, 0), 0, NULL);
    json_t *a = json_object_get(h, "device_samples_ns"), *e;
    if (!json_is_array(a) || json_array_size(a) == 0)
        a = json_object_get(h, "own_samples_ns");
    if (!json_is_array(a) || json_array_size(a) == 0)
        a = json_object_get(h, "samples_ns");
    int64_t fastest = -1;
    size_t i;
    json_array_foreach(a, i, e)
    {
        if (json_is_integer(e) && json_integer_value(e) >= 0 &&
            (fastest < 0 || json_integer_value(e) < fastest))
            fastest = json_integer_value(e);
    }
    if (fastest >= 0 && !json_is_true(json_object_get(h, "reference"))) {
        if (sm->n < CMP_MAX_TIMING_SAMPLES)
            sm->v[sm->n] = fastest;
        sm->n++;
    }
    json_decref(h);
    return 0;
}

/* The perf observation of ATTEMPT: cmp_perf_observation (the median) over
 * its own timing processes' fastest samples; *n_out (how many processes)
 * 0 and *obs NaN when it has none or too many. */
static int perf_of(struct store *s, int64_t attempt, double *obs, int64_t *n_out)
{
    struct samples sm = {malloc(CMP_MAX_TIMING_SAMPLES * sizeof *sm.v), 0};
    *obs = NAN;
    *n_out = 0;
    if (!sm.v)
        return -ENOMEM;
    int rc = store_each(
        s, "SELECT header FROM records WHERE attempt_id = ? AND kind = 'timing' ORDER BY seq",
        sample_row, &sm, "I", attempt);
    /* Past the engine's limit the cell has no observation (not a cut one). */
    if (rc == 0 && sm.n && sm.n <= CMP_MAX_TIMING_SAMPLES &&
        cmp_perf_observation(sm.v, sm.n, obs) == 0)
        *n_out = (int64_t)sm.n;
    free(sm.v);
    return rc;
}

/* ---- numerics drift ---- */

struct pt {
    int64_t order_ms, order_seq, attempt;
    char commit[65], digest[33];
    bool found;
};

/* The point of SERIES at COMMIT (dir 0), or the one just before (dir -1)
 * or after (dir +1) the point REF in commit order. */
static int point_near(struct store *s, int64_t series, const struct pt *ref, const char *commit,
                      int dir, struct pt *out)
{
    static const char *const sql[] = {
        "SELECT commit_sha, order_ms, order_seq, attempt_id, coalesce(digest, '') FROM "
        "history_points WHERE series_id = ?1 AND (order_ms, order_seq) < (?2, ?3) "
        "ORDER BY order_ms DESC, order_seq DESC LIMIT 1",
        "SELECT commit_sha, order_ms, order_seq, attempt_id, coalesce(digest, '') FROM "
        "history_points WHERE series_id = ?1 AND commit_sha = ?4",
        "SELECT commit_sha, order_ms, order_seq, attempt_id, coalesce(digest, '') FROM "
        "history_points WHERE series_id = ?1 AND (order_ms, order_seq) > (?2, ?3) "
        "ORDER BY order_ms, order_seq LIMIT 1"};
    sqlite3_stmt *st = NULL;
    memset(out, 0, sizeof *out);
    int rc = store_query(s, &st, sql[dir + 1], "IIIt", series, ref ? ref->order_ms : 0,
                         ref ? ref->order_seq : 0, commit);
    if (rc == 0 && (rc = store_step(s, st)) == 0) {
        out->found = true;
        snprintf(out->commit, sizeof out->commit, "%s", sqlite3_column_text(st, 0));
        out->order_ms = sqlite3_column_int64(st, 1);
        out->order_seq = sqlite3_column_int64(st, 2);
        out->attempt = sqlite3_column_int64(st, 3);
        snprintf(out->digest, sizeof out->digest, "%s", sqlite3_column_text(st, 4));
    }
    sqlite3_finalize(st);
    return rc == -ENOENT ? 0 : rc;
}

/* Whether a key both cells have was hashed by different algorithms: then
 * unequal hashes prove nothing and the numerics are unknown. */
static bool algs_mixed(const struct tkeys *a, const struct tkeys *b)
{
    size_t i = 0, j = 0;
    while (i < a->n && j < b->n) {
        int c = strcmp(a->v[i].key, b->v[j].key);
        if (c == 0 && a->v[i].other_alg != b->v[j].other_alg)
            return true;
        i += c <= 0;
        j += c >= 0;
    }
    return false;
}

/* Sets the numerics of point P against the point before it. */
static int drift_update(struct store *s, int64_t series, const struct pt *p)
{
    struct pt prev;
    struct tkeys a = {0}, b = {0};
    char *key = NULL;
    const char *state = "unknown";
    int rc = point_near(s, series, p, NULL, -1, &prev);
    if (rc)
        return rc;
    if (!prev.found) {
        state = "first";
    } else if (p->digest[0] && prev.digest[0] && strcmp(p->digest, prev.digest) == 0) {
        state = "identical";
    } else if (p->digest[0] && prev.digest[0]) {
        if ((rc = tkeys_load(s, prev.attempt, &a)) != 0 || (rc = tkeys_load(s, p->attempt, &b)))
            goto out;
        if (!algs_mixed(&a, &b)) {
            state = "diverged";
            key = first_divergent_key(&a, &b);
        }
    }
    rc = store_run(s,
                   "UPDATE history_points SET numerics = ?, first_divergent_key = ? "
                   "WHERE series_id = ? AND commit_sha = ?",
                   "ttIt", state, key, series, p->commit);
out:
    free(key);
    tkeys_free(&a);
    tkeys_free(&b);
    return rc;
}

/* The point at COMMIT and the one after it (whose predecessor it now is). */
static int drift_around(struct store *s, int64_t series, const char *commit)
{
    struct pt p, next;
    int rc = point_near(s, series, NULL, commit, 0, &p);
    if (rc || !p.found)
        return rc;
    if ((rc = drift_update(s, series, &p)) != 0)
        return rc;
    if ((rc = point_near(s, series, &p, NULL, 1, &next)) != 0 || !next.found)
        return rc;
    return drift_update(s, series, &next);
}

/* ---- points ---- */

struct job_info {
    int64_t seq, created_at, commit_ms;
    char id[16], project[129], branch[256], commit[65], parent[65], commit_time[64];
    bool has_time;
};

static int job_info(struct store *s, int64_t seq, struct job_info *j)
{
    sqlite3_stmt *st = NULL;
    memset(j, 0, sizeof *j);
    /* -ENOENT when the job is gone, or not on a branch: nothing to add. */
    int rc = store_query(
        s, &st,
        "SELECT id, project, branch, commit_sha, created_at, "
        "json_extract(request_json, '$.commit_time'), "
        "CAST((julianday(json_extract(request_json, '$.commit_time')) - 2440587.5) * 86400000 "
        "AS INTEGER), coalesce(json_extract(request_json, '$.parents[0]'), '') "
        "FROM jobs WHERE seq = ? AND branch IS NOT NULL",
        "I", seq);
    if (rc == 0 && (rc = store_step(s, st)) == 0) {
        j->seq = seq;
        snprintf(j->id, sizeof j->id, "%s", sqlite3_column_text(st, 0));
        snprintf(j->project, sizeof j->project, "%s", sqlite3_column_text(st, 1));
        snprintf(j->branch, sizeof j->branch, "%s", sqlite3_column_text(st, 2));
        snprintf(j->commit, sizeof j->commit, "%s", sqlite3_column_text(st, 3));
        j->created_at = sqlite3_column_int64(st, 4);
        j->has_time = sqlite3_column_type(st, 6) != SQLITE_NULL;
        if (j->has_time)
            snprintf(j->commit_time, sizeof j->commit_time, "%s", sqlite3_column_text(st, 5));
        j->commit_ms = sqlite3_column_int64(st, 6);
        snprintf(j->parent, sizeof j->parent, "%s", sqlite3_column_text(st, 7));
    }
    sqlite3_finalize(st);
    return rc;
}

static int series_id(struct store *s, const struct job_info *j, const char *model,
                     const char *width, const char *pass, int64_t *id)
{
    sqlite3_stmt *st = NULL;
    int rc = store_query(s, &st,
                         "INSERT INTO history_series(project, branch, model, width, pass, "
                         "updated_at) VALUES (?,?,?,?,?,?) ON CONFLICT DO UPDATE SET "
                         "updated_at = excluded.updated_at RETURNING id",
                         "tttttI", j->project, j->branch, model, width, pass, util_wall_ms());
    if (rc == 0 && (rc = store_step(s, st)) == 0) {
        *id = sqlite3_column_int64(st, 0);
        rc = store_step(s, st);
    }
    sqlite3_finalize(st);
    return rc == -ENOENT ? 0 : rc;
}

/* Where the job goes in the series: its commit time, but never before its
 * first parent when that is a point of the series; else submission. */
static int order_of(struct store *s, int64_t series, const struct job_info *j, int64_t *ms)
{
    struct pt parent;
    *ms = j->has_time ? j->commit_ms : j->created_at;
    if (!j->has_time || !j->parent[0])
        return 0;
    int rc = point_near(s, series, NULL, j->parent, 0, &parent);
    if (rc == 0 && parent.found && parent.order_ms >= *ms)
        *ms = parent.order_ms + 1;
    return rc;
}

struct cell_info {
    char id[16], model[256], width[64], pass[64], state[32];
    int64_t attempt, peak_rss;
    bool has_rss;
};

static int point_put(struct store *s, int64_t series, const struct job_info *j,
                     const struct cell_info *c)
{
    struct tkeys t = {0};
    char digest[33];
    double perf;
    int64_t nperf, order;
    sqlite3_stmt *st = NULL;
    int rc = tkeys_load(s, c->attempt, &t);
    if (rc == 0)
        rc = perf_of(s, c->attempt, &perf, &nperf);
    if (rc == 0)
        rc = order_of(s, series, j, &order);
    if (rc)
        goto out;
    tensor_digest(&t, digest);
    /* perf_ns (?15) and peak_rss_bytes (?16) stay NULL where unknown. */
    if ((rc = store_query(
             s, &st,
             "INSERT OR REPLACE INTO history_points(series_id, commit_sha, order_ms, order_seq, "
             "ordered_by, commit_time, job_id, cell_id, attempt_id, outcome, perf_ns, "
             "perf_samples, peak_rss_bytes, digest, n_tensors, created_at) "
             "VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?15,?11,?16,nullif(?12, ''),?13,?14)",
             "ItIIttttItItII", series, j->commit, order, j->seq,
             j->has_time ? "commit" : "submission", j->has_time ? j->commit_time : NULL, j->id,
             c->id, c->attempt, c->state, nperf, digest, (int64_t)t.n, util_wall_ms())) != 0)
        goto out;
    if (nperf)
        sqlite3_bind_double(st, 15, perf);
    if (c->has_rss)
        sqlite3_bind_int64(st, 16, c->peak_rss);
    if ((rc = store_rc(s, sqlite3_step(st))) == 0)
        rc = drift_around(s, series, j->commit);
out:
    sqlite3_finalize(st);
    tkeys_free(&t);
    return rc;
}

struct ingest {
    struct store *s;
    const struct job_info *j;
};

static int cell_row(sqlite3_stmt *st, void *ctx)
{
    const struct ingest *in = ctx;
    struct cell_info c = {0};
    int64_t series = 0;
    snprintf(c.id, sizeof c.id, "%s", sqlite3_column_text(st, 0));
    snprintf(c.model, sizeof c.model, "%s", sqlite3_column_text(st, 1));
    snprintf(c.width, sizeof c.width, "%s", sqlite3_column_text(st, 2));
    snprintf(c.pass, sizeof c.pass, "%s", sqlite3_column_text(st, 3));
    snprintf(c.state, sizeof c.state, "%s", sqlite3_column_text(st, 4));
    c.attempt = sqlite3_column_int64(st, 5);
    c.has_rss = sqlite3_column_type(st, 6) != SQLITE_NULL;
    c.peak_rss = sqlite3_column_int64(st, 6);
    int rc = series_id(in->s, in->j, c.model, c.width, c.pass, &series);
    if (rc == 0)
        rc = point_put(in->s, series, in->j, &c);
    return rc ? rc : store__history_analyse(in->s, series);
}

/* Every eager cell of job J becomes a point; every series touched is
 * analysed. A series is one (model, width, pass) of eager cells: compiled
 * cells (mode aot_eager, inductor) are not in the history yet. */
static int ingest_job(struct store *s, const struct job_info *j)
{
    struct ingest in = {s, j};
    return store_each(s,
                      "SELECT id, model, width, pass, state, coalesce(committed_attempt, 0), "
                      "peak_rss_bytes FROM cells WHERE job_seq = ? AND mode = 'eager' ORDER BY "
                      "ord",
                      cell_row, &in, "I", j->seq);
}

/* Takes one queued job and makes its points, in one transaction. *took is
 * false when the queue is empty. */
static int drain_one(struct store *s, bool *took)
{
    sqlite3_stmt *st = NULL;
    int64_t seq = 0;
    *took = false;
    int rc = store_begin(s);
    if (rc)
        return rc;
    rc = store_query(s, &st, "SELECT job_seq FROM history_pending ORDER BY job_seq LIMIT 1", "");
    if (rc == 0 && (rc = store_step(s, st)) == 0)
        seq = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    if (rc)
        return store_end(s, rc == -ENOENT ? 0 : rc);
    struct job_info j;
    rc = job_info(s, seq, &j);
    if (rc == 0)
        rc = ingest_job(s, &j);
    if (rc == 0 || rc == -ENOENT)
        rc = store_run(s, "DELETE FROM history_pending WHERE job_seq = ?", "I", seq);
    *took = rc == 0;
    return store_end(s, rc);
}

int store_history_drain(struct store *s, int *jobs_out)
{
    int n = 0, rc = store_flush(s);
    for (bool took = true; rc == 0 && took && n < STORE_HISTORY_DRAIN_JOBS; n += took)
        rc = drain_one(s, &took);
    if (jobs_out)
        *jobs_out = n;
    return rc;
}
