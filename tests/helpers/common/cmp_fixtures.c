/*
 * tests/helpers/common/cmp_fixtures.c - the test_compare suites' shared
 * fixtures (cmp_fixtures.h).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/helpers/common/cmp_fixtures.h"
#include "tests/helpers/common/cmp_records.h"

/*
 * Payloads are borrowed by the engine, so tests copy them into a static pool
 * that outlives every comparison of the test (Criterion runs each test in its
 * own process; the pool is reset per test for --no-fork runs).
 */
static unsigned char pool[16 << 20];
static size_t pool_used;

void reset_pool(void)
{
    pool_used = 0;
    crec_reset();
}

void *pool_keep(const void *p, size_t n)
{
    size_t at = (pool_used + 15) & ~(size_t)15;
    cr_assert(at + n <= sizeof(pool), "test pool exhausted");
    memcpy(pool + at, p, n);
    pool_used = at + n;
    return pool + at;
}

/* Runner-style statistics of double values, so statistics checks are realistic. */
struct cmp_stats stats_of(const double *v, size_t n)
{
    struct cmp_stats s = {0};
    double sum = 0, sq = 0;
    size_t nf = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(v[i])) {
            s.nan++;
            continue;
        }
        if (isinf(v[i])) {
            if (v[i] > 0)
                s.pinf++;
            else
                s.ninf++;
            continue;
        }
        if (v[i] == 0)
            s.zeros++;
        if (nf == 0 || v[i] < s.min)
            s.min = v[i];
        if (nf == 0 || v[i] > s.max)
            s.max = v[i];
        sum += v[i];
        sq += v[i] * v[i];
        nf++;
    }
    s.has_finite = nf > 0;
    if (nf) {
        s.mean = sum / (double)nf;
        s.l2 = sqrt(sq);
        s.std = sqrt(fmax(0, sq / (double)nf - s.mean * s.mean));
    }
    return s;
}

/* A 1-D float64 record with a full payload. */
struct cmp_tensor f64_tensor(const char *key, int64_t seq, const double *v, size_t n,
                             const char *hash)
{
    return crec_f64(key, seq, v, n, stats_of(v, n), hash, CMP_CAPTURE_FULL);
}

struct cmp_metrics tensor_metrics(const struct cmp_tensor *h, const struct cmp_tensor *c,
                                  const struct cmp_tol *tol)
{
    struct cmp_metrics m;
    int rc = cmp_tensor_compare(h, c, tol, NULL, &m);
    cr_assert_eq(rc, 0, "cmp_tensor_compare: %d", rc);
    return m;
}

long long ji(json_t *root, const char *path)
{
    json_t *v = jw_path(root, path);
    cr_assert(json_is_integer(v), "%s is not an integer", path);
    return json_integer_value(v);
}

/* n distinct timings around base, deterministic */
void fake_timings(int64_t *v, size_t n, double base, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        v[i] =
            (int64_t)(base * (1.0 + 0.01 * ((double)(seed >> 40) / 16777216.0 - 0.5))) + (int64_t)i;
    }
}

/* n process medians around base with a relative jitter of +-j/2, deterministic */
void fake_observations(double *v, size_t n, double base, double j, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = base * (1.0 + j * ((double)(seed >> 40) / 16777216.0 - 0.5));
    }
}

/* k timing processes of n samples each around base, one observation each */
void add_fake_processes(struct cmp_cell *cell, int k, double base, uint64_t seed)
{
    int64_t t[10];
    for (int i = 0; i < k; i++) {
        fake_timings(t, 10, base, seed * 1000 + (uint64_t)i);
        cr_assert_eq(cmp_cell_add_timing(cell, t, 10), 0);
    }
}

/*
 * The synthetic model: an MLP's forward records in execution order. Each has
 * four float64 values; a head can add deltas to element 1 of any record.
 */
const char *const mlp_keys[8] = {
    "model.0.forward.input.0", "fc1.0.forward.input.0",    "fc1.0.forward.output.0",
    "act.0.forward.input.0",   "act.0.forward.output.0",   "fc2.0.forward.input.0",
    "fc2.0.forward.output.0",  "model.0.forward.output.0",
};

void add_record(struct cmp_cell *cell, const char *key, int64_t seq, double delta, bool nondet)
{
    double v[4] = {(double)seq + 1, -(double)seq - 2, 0.5 * (double)seq, 3};
    char hash[64];
    v[1] += delta;
    snprintf(hash, sizeof(hash), delta == 0 ? "same-%s" : "diff-%s-%g", key, delta);
    struct cmp_tensor t = f64_tensor(key, seq, v, 4, hash);
    t.nondeterministic = nondet;
    cr_assert_eq(cmp_cell_add_tensor(cell, &t), 0);
}

/* delta NULL: the control's values */
struct cmp_cell *mlp_cell(struct cmp_side *s, const char *width, const double *delta,
                          const char *outcome)
{
    struct cmp_cell *c;
    cr_assert_eq(cmp_side_add_cell(s, "mlp", width, "forward", &c), 0);
    cr_assert_eq(cmp_cell_set_outcome(c, outcome), 0);
    for (int k = 0; k < 8; k++)
        add_record(c, mlp_keys[k], k, delta ? delta[k] : 0, false);
    return c;
}

json_t *run_compare(struct cmp_side *c, struct cmp_side *h, const struct cmp_options *o)
{
    json_t *r = NULL;
    cr_assert_eq(cmp_compare(c, h, o, &r), 0);
    cr_assert_not_null(r);
    /* every result must serialize (no raw Inf/NaN reached jansson) */
    char *txt = json_dumps(r, 0);
    cr_assert_not_null(txt);
    free(txt);
    return r;
}

struct duo duo_new(void)
{
    struct duo d = {0};
    cr_assert_eq(cmp_side_new(&d.c), 0);
    cr_assert_eq(cmp_side_new(&d.h), 0);
    return d;
}

/* One empty MODEL/avx2/PHASE cell with outcome ok on each side. */
struct duo duo_cells(const char *model, const char *phase)
{
    struct duo d = duo_new();
    cr_assert_eq(cmp_side_add_cell(d.c, model, "avx2", phase, &d.cc), 0);
    cr_assert_eq(cmp_side_add_cell(d.h, model, "avx2", phase, &d.hc), 0);
    cr_assert_eq(cmp_cell_set_outcome(d.cc, "ok"), 0);
    cr_assert_eq(cmp_cell_set_outcome(d.hc, "ok"), 0);
    return d;
}

/* The mlp cell at avx2 on each side: the head's records moved by DELTA
 * (NULL: none), its outcome HEAD_OUTCOME, the control's ok. */
struct duo duo_mlp(const double *delta, const char *head_outcome)
{
    struct duo d = duo_new();
    d.cc = mlp_cell(d.c, "avx2", NULL, "ok");
    d.hc = mlp_cell(d.h, "avx2", delta, head_outcome);
    return d;
}

/* KEY at SEQ on both sides, the head's moved by DELTA. */
void duo_record(struct duo *d, const char *key, int64_t seq, double delta)
{
    add_record(d->cc, key, seq, 0, false);
    add_record(d->hc, key, seq, delta, false);
}

/* duo_cells of mlp and PHASE with N records, KEYS[k] at seq k, the head's
 * moved by DELTAS[k]. */
struct duo duo_keys(const char *phase, const char *const *keys, const double *deltas, int n)
{
    struct duo d = duo_cells("mlp", phase);
    for (int k = 0; k < n; k++)
        duo_record(&d, keys[k], k, deltas[k]);
    return d;
}

json_t *duo_compare(struct duo *d, const struct cmp_options *o)
{
    return run_compare(d->c, d->h, o);
}

/* Frees both sides and R, the last result compared from them. */
void duo_free(struct duo *d, json_t *r)
{
    json_decref(r);
    cmp_side_free(d->c);
    cmp_side_free(d->h);
}

/* Compares D's sides with options O (NULL: the defaults) and checks the
 * result against the N wants at W; returns the result (owned). */
json_t *duo_expect_n(struct duo *d, const struct cmp_options *o, const struct jw_want *w, size_t n)
{
    json_t *r = duo_compare(d, o);
    jw_expect_n(r, w, n);
    return r;
}

/* duo_expect, then duo_free of D and the result: a test's last comparison. */
void duo_check_n(struct duo *d, const struct cmp_options *o, const struct jw_want *w, size_t n)
{
    duo_free(d, duo_expect_n(d, o, w, n));
}

/* The mlp duo (duo_mlp) with head DELTA, compared with the defaults, must
 * give the N wants at W. */
void mlp_check_n(const double *delta, const struct jw_want *w, size_t n)
{
    struct duo s = duo_mlp(delta, "ok");
    duo_check_n(&s, NULL, w, n);
}

/*
 * The mlp records with fc1's input nondeterministic and different, so fc1's
 * diverged output is the first divergence without having introduced it, and
 * act, whose input is within tolerance while its output diverges, introduced it.
 */
struct duo duo_unclean_inputs(void)
{
    static const double d[8] = {0, 0.3, 0.3, 1e-9, 0.4, 0.4, 0.4, 0.4};
    struct duo s = duo_cells("mlp", "forward");
    for (int k = 0; k < 8; k++) {
        add_record(s.cc, mlp_keys[k], k, 0, false);
        add_record(s.hc, mlp_keys[k], k, d[k], k == 1);
    }
    return s;
}

/* Options from TEXT applied over the defaults. */
struct cmp_options options_from(const char *text)
{
    struct cmp_options o;
    struct cmp_err err;
    cmp_options_init(&o);
    json_t *j = json_loads(text, 0, NULL);
    cr_assert_not_null(j, "test JSON: %s", text);
    cr_assert_eq(cmp_options_apply_json(&o, j, &err), 0, "%s", err.message);
    json_decref(j);
    return o;
}

/* The default options with the cross-width pair CONTROL against HEAD. */
void cross_width_options(struct cmp_options *o, const char *control, const char *head)
{
    cmp_options_init(o);
    snprintf(o->control_width, sizeof o->control_width, "%s", control);
    snprintf(o->head_width, sizeof o->head_width, "%s", head);
}

void expect_bad(const char *text, const char *field)
{
    struct cmp_options o, before;
    struct cmp_err err = {{0}, {0}};
    cmp_options_init(&o);
    o.alpha = 0.02;
    before = o;
    json_t *j = json_loads(text, 0, NULL);
    cr_assert_not_null(j, "test JSON: %s", text);
    cr_assert_eq(cmp_options_apply_json(&o, j, &err), -EINVAL, "%s accepted", text);
    cr_assert_str_eq(err.field, field, "%s: field %s", text, err.field);
    cr_assert_neq(err.message[0], '\0');
    cr_assert_eq(memcmp(&o, &before, sizeof(o)), 0, "options changed on error");
    json_decref(j);
}
