/*
 * compare/cmp_int.h - what the files of compare/ share and nobody else sees.
 * Internal names carry the cmp__ prefix.
 */
#ifndef CAPD_COMPARE_CMP_INT_H
#define CAPD_COMPARE_CMP_INT_H

#include "compare/cmp.h"

enum cmp__phase { CMP__PH_FORWARD, CMP__PH_BACKWARD, CMP__PH_INIT, CMP__PH_OTHER };
enum cmp__role {
    CMP__ROLE_INPUT,
    CMP__ROLE_OUTPUT,
    CMP__ROLE_GRAD_INPUT,
    CMP__ROLE_GRAD_OUTPUT,
    CMP__ROLE_PARAM_GRAD,
    CMP__ROLE_PARAM,
    CMP__ROLE_OTHER
};

enum cmp__outcome {
    CMP__OUT_UNSET,
    CMP__OUT_OK,
    CMP__OUT_FAILED,
    CMP__OUT_CRASHED,
    CMP__OUT_TIMEOUT,
    CMP__OUT_CANCELLED,
    CMP__OUT_UNSUPPORTED,
    CMP__OUT_PROTOCOL_ERROR,
    CMP__OUT_INTERRUPTED,
    CMP__OUT_QUEUED,
    CMP__OUT_RUNNING
};

/* One stored record. Strings live in the cell's arena. */
struct cmp__rec {
    const char *key;
    const char *module; /* NULL when neither given nor parseable */
    const char *hash;   /* NULL when unknown */
    const char *dtype_name;
    int64_t seq, call, numel;
    int64_t shape[CMP_MAX_NDIM];
    int ndim;
    enum cmp_dtype dtype;
    enum cmp__phase phase;
    enum cmp__role role;
    struct cmp_stats stats;
    enum cmp_capture capture;
    const void *payload; /* borrowed */
    size_t payload_len;
    bool nondet;
};

/* A bump allocator for strings: chunks are never moved, so pointers stay valid. */
struct cmp__arena {
    struct cmp__chunk *head;
};

struct cmp_cell {
    char *model, *width, *pass;
    enum cmp__outcome outcome;
    char *effective_width, *device;
    char *host_missing; /* unsupported by its host's CPU: what it lacked */
    int64_t peak_rss, device_peak;
    int64_t *timing;
    size_t n_timing, cap_timing;
    struct cmp__rec *recs;
    size_t n_recs, cap_recs;
    const char **nondet_keys;
    size_t n_nondet, cap_nondet;
    struct cmp__arena arena;
};

struct cmp_side {
    struct cmp_cell **cells;
    size_t n_cells, cap_cells;
};

/* arena / names (cell.c) */
const char *cmp__outcome_name(enum cmp__outcome o);
const char *cmp__phase_name(enum cmp__phase p);
const char *cmp__role_name(enum cmp__role r);
size_t cmp__dtype_size(enum cmp_dtype dt);
/* Fills rec (strings pointing at t's, not copied) from a public tensor. */
int cmp__rec_from_tensor(const struct cmp_tensor *t, struct cmp__rec *rec, const char **module_out,
                         size_t *module_len_out);

/* metrics.c */
int cmp__rec_compare(const struct cmp__rec *head, const struct cmp__rec *control,
                     const struct cmp_tol *tol, struct cmp_scratch *scratch,
                     struct cmp_metrics *out);
bool cmp__recs_identical(const struct cmp__rec *a, const struct cmp__rec *b);

/* options.c */
struct cmp_tol cmp__tol_for(const struct cmp_options *opt, const char *key, enum cmp_dtype dt);

/* perf.c: median of a copy of v (v untouched); NaN when n == 0 */
double cmp__median_i64(const int64_t *v, size_t n, int64_t *tmp);

/* select.c: the k-th smallest (0-based) of v[0..n), reordering v */
double cmp__select_d(double *v, size_t n, size_t k);
int64_t cmp__select_i64(int64_t *v, size_t n, size_t k);

/* json helpers (engine.c) */
int cmp__set_real(json_t *obj, const char *name, double v);

#endif
