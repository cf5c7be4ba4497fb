/*
 * storage/compare_load.c - feeds the comparison engine from storage: every
 * cell of a job with the records of its visible attempt.
 *
 * The engine borrows payloads, so the decompressed blobs are kept in a
 * store_payloads list that lives until the comparison is done.
 */
#include <errno.h>
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmp.h"
#include "storage/store_int.h"

struct store_payloads {
    void **p;
    size_t n, cap;
};

void store_payloads_free(struct store_payloads *pl)
{
    if (!pl)
        return;
    for (size_t i = 0; i < pl->n; i++)
        free(pl->p[i]);
    free(pl->p);
    free(pl);
}

static int keep(struct store_payloads *pl, void *p)
{
    if (pl->n == pl->cap) {
        size_t cap = pl->cap ? pl->cap * 2 : 64;
        void **np = realloc(pl->p, cap * sizeof *np);
        if (!np)
            return -ENOMEM;
        pl->p = np;
        pl->cap = cap;
    }
    pl->p[pl->n++] = p;
    return 0;
}

static double num(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : 0.0;
}

static int add_tensor(struct store *s, struct cmp_cell *cell, json_t *h, const char *blob,
                      const char *hash_alg, struct store_payloads *pl)
{
    struct cmp_tensor t;
    memset(&t, 0, sizeof t);
    t.key = json_string_value(json_object_get(h, "key"));
    t.seq = json_integer_value(json_object_get(h, "seq"));
    t.module = json_string_value(json_object_get(h, "module"));
    t.call = json_integer_value(json_object_get(h, "call"));
    t.phase = json_string_value(json_object_get(h, "phase"));
    t.role = json_string_value(json_object_get(h, "role"));
    if (!t.module)
        t.phase = t.role = NULL; /* let the engine parse all three from the key */
    t.dtype = json_string_value(json_object_get(h, "dtype"));
    json_t *shape = json_object_get(h, "shape");
    t.ndim = (int)json_array_size(shape);
    if (t.ndim > CMP_MAX_NDIM)
        return 0; /* the engine cannot hold it; it shows up as missing */
    for (int i = 0; i < t.ndim; i++)
        t.shape[i] = json_integer_value(json_array_get(shape, (size_t)i));
    t.numel = json_integer_value(json_object_get(h, "numel"));
    json_t *st = json_object_get(h, "stats");
    t.stats.has_finite = json_is_number(json_object_get(st, "min"));
    t.stats.min = num(st, "min");
    t.stats.max = num(st, "max");
    t.stats.mean = num(st, "mean");
    t.stats.std = num(st, "std");
    t.stats.l2 = num(st, "l2");
    t.stats.nan = json_integer_value(json_object_get(st, "nan"));
    t.stats.pinf = json_integer_value(json_object_get(st, "pinf"));
    t.stats.ninf = json_integer_value(json_object_get(st, "ninf"));
    t.stats.zeros = json_integer_value(json_object_get(st, "zeros"));
    t.hash = json_string_value(json_object_get(h, "hash"));
    t.hash_alg = hash_alg; /* the row's column: old rows say blake2b-128 (migration 009) */
    const char *cap = json_string_value(json_object_get(h, "capture"));
    t.capture = !cap || strcmp(cap, "stats") == 0 ? CMP_CAPTURE_NONE
                : strcmp(cap, "full") == 0        ? CMP_CAPTURE_FULL
                                                  : CMP_CAPTURE_SAMPLE;
    if (blob && t.capture != CMP_CAPTURE_NONE) {
        void *data = NULL;
        size_t len = 0;
        int rc = store_blob_get(s, blob, &data, &len);
        if (rc)
            return rc;
        if ((rc = keep(pl, data)) != 0) {
            free(data);
            return rc;
        }
        t.payload = data;
        t.payload_len = len;
    } else {
        t.capture = CMP_CAPTURE_NONE;
    }
    int rc = cmp_cell_add_tensor(cell, &t);
    /* A malformed record is the runner's problem, not the comparison's:
     * it is left out and shows up as a missing key. */
    return rc == -EINVAL ? 0 : rc;
}

/*
 * The device a cell ran on, as the engine compares it: "cpu", or the GPU's
 * model name from the runner's fingerprint (device.type, device.name;
 * docs/runner.md). A runner that reports the device as a plain string is
 * taken at its word. NULL when nothing says (never a mismatch).
 */
static const char *fingerprint_device(json_t *fp)
{
    json_t *d = json_object_get(fp, "device");
    if (json_is_string(d))
        return json_string_value(d);
    const char *type = json_string_value(json_object_get(d, "type"));
    if (type && strcmp(type, "cpu") == 0)
        return "cpu";
    const char *name = json_string_value(json_object_get(d, "name"));
    if (name)
        return name;
    return type ? type : json_string_value(json_object_get(fp, "device_name"));
}

/* The integers of the array A (N of them, the frame checked) into V. */
static void ints_of(json_t *a, size_t n, int64_t *v)
{
    for (size_t i = 0; i < n; i++)
        v[i] = json_integer_value(json_array_get(a, i));
}

/* A total of the frame: its value, or -1 when null or absent. */
static int64_t total_of(json_t *h, const char *name)
{
    json_t *v = json_object_get(h, name);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

/*
 * The same samples in the timing thread's CPU time, in the process's
 * own time and, on a GPU, in the device's time, and the totals over them (docs/protocol.md), where
 * the runner sent them. A frame with runqueue_ns (even null) is from a runner that measures own
 * time: its totals say so to the engine.
 */
static int add_timing_clocks(struct cmp_cell *cell, json_t *h, size_t n, int64_t *v)
{
    int rc = 0;
    json_t *cpu = json_object_get(h, "cpu_samples_ns"), *own = json_object_get(h, "own_samples_ns");
    if (json_array_size(cpu) == n) {
        ints_of(cpu, n, v);
        rc = cmp_cell_set_process_cpu(cell, v, n);
    }
    if (rc != -ENOMEM && json_array_size(own) == n) {
        ints_of(own, n, v);
        rc = cmp_cell_set_process_own(cell, v, n);
    }
    json_t *dev = json_object_get(h, "device_samples_ns");
    if (rc != -ENOMEM && json_array_size(dev) == n) {
        ints_of(dev, n, v);
        rc = cmp_cell_set_process_device(cell, v, n);
    }
    if (rc != -ENOMEM && json_object_get(h, "runqueue_ns")) {
        json_t *loops = json_object_get(h, "loops");
        int64_t l =
            json_is_integer(loops) && json_integer_value(loops) > 0 ? json_integer_value(loops) : 1;
        struct cmp_proc_totals t = {(int64_t)n * l, total_of(h, "runqueue_ns"),
                                    total_of(h, "cpu_ns"), total_of(h, "steal_ns")};
        rc = cmp_cell_set_process_totals(cell, &t);
    }
    return rc;
}

/*
 * One timing frame is one timing process (docs/protocol.md), so a frame is
 * added as one process: an old cell of a single frame is one observation.
 * A frame the head job took of the control's build (docs/compare.md,
 * "Perf") carries "reference": true and the "pair" it belongs to. A clock
 * the engine refuses leaves the process without it (judged on wall time).
 */
static int add_timing(struct cmp_cell *cell, json_t *h)
{
    json_t *a = json_object_get(h, "samples_ns"), *pair = json_object_get(h, "pair");
    size_t n = json_array_size(a);
    int64_t *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return -ENOMEM;
    ints_of(a, n, v);
    int rc = cmp_cell_add_timing_process(cell, v, n,
                                         json_is_integer(pair) ? json_integer_value(pair) : -1,
                                         json_is_true(json_object_get(h, "reference")));
    if (rc == 0 && n > 0)
        rc = add_timing_clocks(cell, h, n, v); /* each clock refused alone stays out */
    free(v);
    return rc == -EINVAL || rc == -E2BIG ? 0 : rc;
}

/* A compiled cell's compile time, from its runner's note "compile_s=<s>
 * ..." (docs/runner.md, "Compiled cells"); other notes say nothing here. */
static void add_compile_note(struct cmp_cell *cell, json_t *h)
{
    const char *m = json_string_value(json_object_get(h, "message"));
    if (!m || strncmp(m, "compile_s=", 10) != 0)
        return;
    char *end;
    double s = strtod(m + 10, &end);
    if (end != m + 10 && s >= 0 && s < 1e9)
        cmp_cell_set_compile(cell, (int64_t)(s * 1e9 + 0.5));
}

/* What the row callbacks of store_load_side need besides the row. */
struct load_ctx {
    struct store *s;
    const struct store_cell_filter *f;
    struct cmp_side *side;
    struct cmp_cell *cell; /* the cell whose records load_record adds */
    struct store_payloads *pl;
};

/* One record of a cell's visible attempt, added to the cell. */
static int load_record(sqlite3_stmt *st, void *arg)
{
    struct load_ctx *c = arg;
    const char *kind = (const char *)sqlite3_column_text(st, 0);
    const char *blob = (const char *)sqlite3_column_text(st, 2);
    json_t *h = store_col_json(st, 1);
    int rc = 0;
    if (strcmp(kind, "tensor") == 0) {
        rc = add_tensor(c->s, c->cell, h, blob, (const char *)sqlite3_column_text(st, 3), c->pl);
    } else if (strcmp(kind, "nondeterministic") == 0) {
        size_t i;
        json_t *k;
        json_array_foreach(json_object_get(h, "keys"), i, k)
        {
            if (json_is_string(k))
                cmp_cell_mark_nondeterministic(c->cell, json_string_value(k));
        }
    } else if (strcmp(kind, "timing") == 0) {
        rc = add_timing(c->cell, h);
    } else if (strcmp(kind, "note") == 0) {
        add_compile_note(c->cell, h);
    } else if (strcmp(kind, "profile") == 0) {
        int prc = cmp_cell_set_profile(c->cell, h); /* one the engine refuses stays out */
        rc = prc == -EINVAL ? 0 : prc;
    } else if (strcmp(kind, "memory") == 0) {
        json_t *dp = json_object_get(h, "device_peak_bytes");
        cmp_cell_set_memory(c->cell, json_integer_value(json_object_get(h, "peak_rss_bytes")),
                            json_is_integer(dp) ? json_integer_value(dp) : -1);
    } else if (strcmp(kind, "env") == 0) {
        json_t *fp = json_object_get(h, "fingerprint");
        cmp_cell_set_env(c->cell, json_string_value(json_object_get(h, "effective_width")),
                         fingerprint_device(fp));
        /* A fingerprint the engine cannot hold (too big, not an object)
         * leaves the cell without one: the comparison counts it under
         * pairs_without_fingerprint instead of failing. */
        if (json_is_object(fp)) {
            int frc = cmp_cell_set_fingerprint(c->cell, fp);
            rc = frc == -E2BIG || frc == -EINVAL ? 0 : frc;
        }
    }
    json_decref(h);
    return rc;
}

static bool pass_filter(const char *v, const char *filter)
{
    return !filter || !*filter || fnmatch(filter, v, 0) == 0;
}

/* One cell of the job, unless the filter leaves it out, with the records
 * of its visible attempt. */
static int load_cell(sqlite3_stmt *st, void *arg)
{
    struct load_ctx *c = arg;
    const char *model = (const char *)sqlite3_column_text(st, 0);
    const char *width = (const char *)sqlite3_column_text(st, 1);
    const char *pass = (const char *)sqlite3_column_text(st, 2);
    const struct store_cell_filter *f = c->f;
    if (f && (!pass_filter(model, f->model) || !pass_filter(width, f->width) ||
              !pass_filter(pass, f->pass)))
        return 0;
    const char *mode = (const char *)sqlite3_column_text(st, 7);
    int rc = cmp_side_add_cell_mode(c->side, model, width, pass, mode ? mode : "eager", &c->cell);
    if (rc)
        return rc;
    cmp_cell_set_outcome(c->cell, (const char *)sqlite3_column_text(st, 3));
    cmp_cell_set_env(c->cell, (const char *)sqlite3_column_text(st, 4), NULL);
    cmp_cell_set_host_missing(c->cell, (const char *)sqlite3_column_text(st, 6));
    int64_t attempt = sqlite3_column_int64(st, 5);
    if (attempt <= 0)
        return 0;
    return store_each(c->s,
                      "SELECT kind, header, blob_hash, hash_alg FROM records WHERE attempt_id = ? "
                      "AND kind IN ('env','tensor','nondeterministic','timing','memory','profile',"
                      "'note') "
                      "ORDER BY seq",
                      load_record, c, "I", attempt);
}

int store_load_side(struct store *s, const char *job_id, const struct store_cell_filter *f,
                    struct cmp_side *side, struct store_payloads **pl_io)
{
    if (!*pl_io && !(*pl_io = calloc(1, sizeof **pl_io)))
        return -ENOMEM;
    struct load_ctx c = {.s = s, .f = f, .side = side, .pl = *pl_io};
    return store_each(s,
                      "SELECT c.model, c.width, c.pass, c.state, c.effective_width, "
                      "coalesce(c.committed_attempt, 0), c.host_missing, c.mode FROM cells c JOIN "
                      "jobs j "
                      "ON j.seq = c.job_seq WHERE j.id = ? ORDER BY c.ord",
                      load_cell, &c, "t", job_id);
}

/* Appends V to the sorted list A unless it is there already. */
static int add_distinct(json_t *a, const char *v)
{
    size_t i, n = json_array_size(a);
    for (i = 0; i < n; i++) {
        int c = strcmp(json_string_value(json_array_get(a, i)), v);
        if (c == 0)
            return 0;
        if (c > 0)
            break;
    }
    if (n >= STORE_MAX_CELL_VALUES)
        return -E2BIG;
    return json_array_insert_new(a, i, json_string(v)) ? -ENOMEM : 0;
}

/* A cell's model, width and pass, each added to its list in the object O. */
static int cell_values_row(sqlite3_stmt *st, void *o)
{
    static const char *const dims[] = {"model", "width", "pass"};
    int rc = 0;
    for (int d = 0; d < 3 && rc == 0; d++)
        rc = add_distinct(json_object_get(o, dims[d]), (const char *)sqlite3_column_text(st, d));
    return rc;
}

int store_job_cell_values(struct store *s, const char *job_id, json_t **out)
{
    json_t *o = json_pack("{s:[],s:[],s:[]}", "model", "width", "pass");
    int rc = o ? 0 : -ENOMEM;
    if (!rc)
        rc = store_each(s,
                        "SELECT c.model, c.width, c.pass FROM cells c JOIN jobs j "
                        "ON j.seq = c.job_seq WHERE j.id = ?",
                        cell_values_row, o, "t", job_id);
    if (rc == 0) {
        *out = o;
        o = NULL;
    }
    json_decref(o);
    return rc;
}
