/*
 * tests/helpers/common/cmp_fixtures.h - what the test_compare suites
 * (metrics, stats, engine, environment, options) build their inputs with:
 * a pool of payloads, runner-style statistics, float64 records, fake
 * timing processes, and the synthetic mlp "duo" (a control and a head side
 * with one cell each) with the checks that compare it. Each call fails the
 * running test when the engine refuses what it was handed.
 */
#ifndef CAPD_TESTS_CMP_FIXTURES_H
#define CAPD_TESTS_CMP_FIXTURES_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compare/cmp.h"
#include "tests/helpers/common/json_want.h"

/*
 * Payloads are borrowed by the engine, so tests copy them into a static pool
 * that outlives every comparison of the test (Criterion runs each test in its
 * own process; the pool is reset per test for --no-fork runs: each suite's
 * .init is reset_pool).
 */
void reset_pool(void);
/* N bytes at P copied into the pool, 16-byte aligned. */
void *pool_keep(const void *p, size_t n);

/* Runner-style statistics of double values, so statistics checks are realistic. */
struct cmp_stats stats_of(const double *v, size_t n);
/* A 1-D float64 record with a full payload. */
struct cmp_tensor f64_tensor(const char *key, int64_t seq, const double *v, size_t n,
                             const char *hash);
/* The metrics of record H against C (cmp_tensor_compare, which must succeed). */
struct cmp_metrics tensor_metrics(const struct cmp_tensor *h, const struct cmp_tensor *c,
                                  const struct cmp_tol *tol);
/* The integer at PATH in ROOT; fails the test where there is none. */
long long ji(json_t *root, const char *path);

/* n distinct timings around base, deterministic */
void fake_timings(int64_t *v, size_t n, double base, uint64_t seed);
/* n process medians around base with a relative jitter of +-j/2, deterministic */
void fake_observations(double *v, size_t n, double base, double j, uint64_t seed);
/* k timing processes of n samples each around base, one observation each */
void add_fake_processes(struct cmp_cell *cell, int k, double base, uint64_t seed);

/*
 * The synthetic model: an MLP's forward records in execution order. Each has
 * four float64 values; a head can add deltas to element 1 of any record.
 */
extern const char *const mlp_keys[8];
/* KEY at SEQ with element 1 moved by DELTA (its hash says so). */
void add_record(struct cmp_cell *cell, const char *key, int64_t seq, double delta, bool nondet);
/* The mlp cell at WIDTH of side S, ended OUTCOME; DELTA NULL: the control's values. */
struct cmp_cell *mlp_cell(struct cmp_side *s, const char *width, const double *delta,
                          const char *outcome);
/* C against H with options O (NULL: the defaults); the result serializes. */
json_t *run_compare(struct cmp_side *c, struct cmp_side *h, const struct cmp_options *o);

/* The two sides of one engine test and, where it made them, a cell on each. */
struct duo {
    struct cmp_side *c, *h;
    struct cmp_cell *cc, *hc;
};
/* Two empty sides. */
struct duo duo_new(void);
/* One empty MODEL/avx2/PHASE cell with outcome ok on each side. */
struct duo duo_cells(const char *model, const char *phase);
/* The mlp cell at avx2 on each side: the head's records moved by DELTA
 * (NULL: none), its outcome HEAD_OUTCOME, the control's ok. */
struct duo duo_mlp(const double *delta, const char *head_outcome);
/* KEY at SEQ on both sides, the head's moved by DELTA. */
void duo_record(struct duo *d, const char *key, int64_t seq, double delta);
/* duo_cells of mlp and PHASE with N records, KEYS[k] at seq k, the head's
 * moved by DELTAS[k]. */
struct duo duo_keys(const char *phase, const char *const *keys, const double *deltas, int n);
/* run_compare of D's sides. */
json_t *duo_compare(struct duo *d, const struct cmp_options *o);
/* Frees both sides and R, the last result compared from them. */
void duo_free(struct duo *d, json_t *r);
/* Compares D's sides with options O (NULL: the defaults) and checks the
 * result against the N wants at W; returns the result (owned). */
json_t *duo_expect_n(struct duo *d, const struct cmp_options *o, const struct jw_want *w, size_t n);
#define duo_expect(d, o, w) duo_expect_n((d), (o), (w), sizeof(w) / sizeof((w)[0]))
/* duo_expect, then duo_free of D and the result: a test's last comparison. */
void duo_check_n(struct duo *d, const struct cmp_options *o, const struct jw_want *w, size_t n);
#define duo_check(d, o, w) duo_check_n((d), (o), (w), sizeof(w) / sizeof((w)[0]))
/* The mlp duo (duo_mlp) with head DELTA, compared with the defaults, must
 * give the N wants at W. */
void mlp_check_n(const double *delta, const struct jw_want *w, size_t n);
#define mlp_check(delta, w) mlp_check_n((delta), (w), sizeof(w) / sizeof((w)[0]))
/*
 * The mlp records with fc1's input nondeterministic and different, so fc1's
 * diverged output is the first divergence without having introduced it, and
 * act, whose input is within tolerance while its output diverges, introduced it.
 */
struct duo duo_unclean_inputs(void);

/* Options from TEXT applied over the defaults. */
struct cmp_options options_from(const char *text);
/* The default options with the cross-width pair CONTROL against HEAD. */
void cross_width_options(struct cmp_options *o, const char *control, const char *head);
/* TEXT applied over the defaults must be refused naming FIELD, and leave
 * the options as they were. */
void expect_bad(const char *text, const char *field);

#endif
