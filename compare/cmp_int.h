/*
 * compare/cmp_int.h - what the files of compare/ share and nobody else sees.
 * Internal names carry the cmp__ prefix.
 */
#ifndef CAPD_COMPARE_CMP_INT_H
#define CAPD_COMPARE_CMP_INT_H

#include "compare/cmp.h"
#include "util/cellstate.h"

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

/* One stored record. Strings live in the cell's arena. */
struct cmp__rec {
    const char *key;
    const char *module;   /* NULL when neither given nor parseable */
    const char *hash;     /* NULL when unknown */
    const char *hash_alg; /* never NULL: CMP_HASH_ALG_DEFAULT when unnamed */
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
    const char *op;   /* ATen name of a per-op record (ops.c), else NULL */
    int64_t op_index; /* its occurrence within the module call */
};

/*
 * One timing process (cell_timing.c): its fastest sample in each clock (the
 * observation it contributes in the basis's clock: docs/compare.md,
 * "Performance"), the medians of its samples in each clock, and its totals
 * over them per iteration; NaN where the runner did not send that clock.
 */
struct cmp__tproc {
    double min_ns, cpu_min_ns, own_min_ns, device_min_ns;
    double median_ns;
    double cpu_median_ns;      /* of the timing thread's CPU-time samples */
    double device_median_ns;   /* of the device-time samples (a GPU cell) */
    double own_median_ns;      /* of the own-time samples */
    double runqueue_median_ns; /* of the timing thread's run-queue delay per sample */
    double proc_runqueue_ns;   /* every thread's run-queue delay, per iteration */
    double proc_cpu_ns;        /* the process's CPU time, per iteration */
    double steal_ns;           /* the host's steal time, per iteration */
    size_t n_samples;
    int64_t pair;   /* -1: not part of a pair */
    bool reference; /* the control's build, timed in this cell's job */
    bool measured;  /* the runner sent totals: it measures own time where it can */
};

/* A bump allocator for strings: chunks are never moved, so pointers stay valid. */
struct cmp__arena {
    struct cmp__chunk *head;
};

struct cmp_cell {
    char *model, *width, *pass, *mode;
    enum cell_state outcome; /* the cell's state (util/cellstate.h), when has_outcome */
    bool has_outcome;        /* false until cmp_cell_set_outcome: no state, not ok */
    char *effective_width, *device;
    char *host_missing; /* unsupported by its host's CPU: what it lacked */
    int64_t peak_rss, device_peak;
    int64_t compile_ns; /* a compiled cell's cold compile; -1: none */
    int64_t *timing;    /* every iteration sample, all processes */
    size_t n_timing, cap_timing;
    struct cmp__tproc *procs; /* one per timing process */
    size_t n_procs, cap_procs;
    struct cmp__rec *recs;
    size_t n_recs, cap_recs;
    const char **nondet_keys;
    size_t n_nondet, cap_nondet;
    struct cmp__arena arena;
    json_t *profile[2];       /* the profiled pair's frames: control, head (profile.c) */
    struct cmp_side *side;    /* the side that owns the cell */
    const struct cmp__fp *fp; /* its fingerprint, shared within the side; NULL if none */
};

/* The groups of the environment section, in the order they are listed. */
enum cmp__envgroup { G_BUILD, G_LIBS, G_THREADS, G_CPU, G_ENV, G_PYTHON, G_RUNNER, G_OTHER };

/* One field of a flattened fingerprint (environment.c). */
struct cmp__envf {
    char *name;  /* "torch.version", "build.GCC", "env.PYTHONPATH" */
    char *value; /* JSON text for a non-string; a secret's digest */
    unsigned group, order;
    bool secret;
};

/* A distinct fingerprint of a side, flattened into fields sorted by name. */
struct cmp__fp {
    char *canon; /* compact sorted JSON: the identity of the fingerprint */
    struct cmp__envf *f;
    size_t n, cap;
    size_t id; /* index in its side's table */
};

struct cmp_side {
    struct cmp_cell **cells;
    size_t n_cells, cap_cells;
    struct cmp__fp **fps; /* distinct fingerprints of its cells */
    size_t n_fps, cap_fps;
};

/* arena / names (cell.c) */
/* The cell's outcome's name; NULL when it was never set. */
const char *cmp__outcome_name(const struct cmp_cell *c);
/* Whether the cell's outcome was set and is ST. */
bool cmp__outcome_is(const struct cmp_cell *c, enum cell_state st);
const char *cmp__phase_name(enum cmp__phase p);
const char *cmp__role_name(enum cmp__role r);
size_t cmp__dtype_size(enum cmp_dtype dt);
/* Fills rec (strings pointing at t's, not copied) from a public tensor, and
 * the module it names (into t->module or t->key, NULL when none) where
 * module_out is not NULL: a cell copies it, a lone comparison needs none. */
int cmp__rec_from_tensor(const struct cmp_tensor *t, struct cmp__rec *rec, const char **module_out,
                         size_t *module_len_out);

/*
 * ops.c: per-op records (granularity op). A per-op key is
 * <module>.<call>.<phase>/op.<aten name>.<n>.<role>.<index>; the aten name
 * may hold dots (an overload), so the tail is read from the right.
 */
struct cmp__opkey {
    size_t module_len;
    int64_t call;
    const char *phase, *op, *role; /* pointers into the key */
    size_t phase_len, op_len, role_len;
    int64_t op_index;
};
bool cmp__op_key(const char *key, struct cmp__opkey *out);
enum cmp__phase cmp__phase_from(const char *s, size_t n);
enum cmp__role cmp__role_from(const char *s, size_t n);
/*
 * The first record of a cell, in execution order, whose output holds a NaN
 * or an Inf while every input of its module call (forward: role input;
 * backward: grad_output) was finite (docs/compare.md, "First non-finite").
 * *out is a new object, or NULL when every record is finite.
 */
int cmp__first_nonfinite(const struct cmp_cell *cell, json_t **out);
/* Orders records by module call and phase: module name, call index,
 * phase (ops.c). Both records need a module. */
int cmp__call_cmp(const struct cmp__rec *x, const struct cmp__rec *y);

/* A qsort comparator of record pointers (const struct cmp__rec **) in
 * execution order (seq): the order every sort of records ends on (ops.c). */
int cmp__rec_by_seq(const void *a, const void *b);
/* ... by key, then seq (engine_cell.c); by module call and phase, then seq
 * (ops.c: both records need a module). */
int cmp__rec_by_key(const void *a, const void *b);
int cmp__rec_by_group(const void *a, const void *b);

/* render_ops.c: the per-op report lines (kernel, first non-finite) and the
 * largest error amplification per cell; NULL when none. */
char *cmp__ops_block(const json_t *result, bool md);
/*
 * profile.c: which modules and operators explain a perf change, from the
 * head cell's profiled pair (docs/compare.md, "Which op got slower").
 * cmp__profile_json sets *OUT to the perf object's "profile" (NULL when
 * the cell has no profiled pair of both sides); cmp__profile_block renders
 * the explanations of the regression and improvement cells for the
 * reports (NULL when none has one).
 */
int cmp__profile_json(const struct cmp_cell *h, json_t **out);
char *cmp__profile_block(const json_t *result, bool md);
/* render_ops.c: "error introduced here: ..." or "error amplified 40x here: ...", the first
 * divergence's growth for the report beside it; malloc'd, NULL when none. */
char *cmp__growth_note(const json_t *cell);

/* metrics_pair.c: one record pair, and bit identity */
int cmp__rec_compare(const struct cmp__rec *head, const struct cmp__rec *control,
                     const struct cmp_tol *tol, struct cmp_scratch *scratch,
                     struct cmp_metrics *out);
bool cmp__recs_identical(const struct cmp__rec *a, const struct cmp__rec *b);
/* Both records hashed, by different algorithms (metrics_pair.c). */
bool cmp__hash_alg_mixed(const struct cmp__rec *a, const struct cmp__rec *b);

/* options.c */
struct cmp_tol cmp__tol_for(const struct cmp_options *opt, const char *key, enum cmp_dtype dt);

/* perf.c: median of a copy of v (v untouched); NaN when n == 0 */
double cmp__median_i64(const int64_t *v, size_t n, int64_t *tmp);
/* perf.c: the same median through a scratch copy it allocates and frees
 * (n > 0), for callers without one; -ENOMEM leaves out untouched. */
int cmp__median_ns(const int64_t *v, size_t n, double *out);

/* perf_cell.c: a matched cell pair's perf, and its JSON object */
int cmp__perf_cells(const struct cmp_cell *control, const struct cmp_cell *head, bool refused,
                    const struct cmp_options *opt, struct cmp_perf *out);
int cmp__perf_json(const struct cmp_perf *p, const struct cmp_options *opt, json_t **out);

/* select.c: the k-th smallest (0-based) of v[0..n), reordering v */
double cmp__select_d(double *v, size_t n, size_t k);
int64_t cmp__select_i64(int64_t *v, size_t n, size_t k);

/* environment.c: the premise fields and group names */
extern const char *const cmp__env_group_names[];
extern const char *const cmp__env_premise_fields[];
extern const size_t cmp__env_n_premise_fields;
/* A field of fp by name, or NULL. */
const struct cmp__envf *cmp__fp_field(const struct cmp__fp *fp, const char *name);

/*
 * envdiff.c: the "environment" section. The engine opens one per
 * comparison, names every matched cell pair, and asks for the section with
 * the cells of each side that took part (for the within-side check).
 * cmp__env_block() renders a result's section for the reports: NULL when
 * there is nothing to say (or no memory).
 */
struct cmp__env;
int cmp__env_new(struct cmp__env **out);
void cmp__env_free(struct cmp__env *env);
int cmp__env_pair(struct cmp__env *env, const struct cmp_cell *control,
                  const struct cmp_cell *head);
int cmp__env_result(const struct cmp__env *env, const struct cmp_cell *const *cc, size_t ncc,
                    const struct cmp_cell *const *hc, size_t nhc, json_t **out);
char *cmp__env_block(const json_t *environment, bool md);
void cmp__side_free_fingerprints(struct cmp_side *side);

/* Makes room in the array *ARR of *CAP elements of ELEM bytes for NEED
 * of them, doubling it (from 16) but never past MAX: -E2BIG when NEED is
 * more than MAX, -ENOMEM (the array unchanged) when memory runs out
 * (compare/cell.c). */
int cmp__grow(void **arr, size_t *cap, size_t need, size_t elem, size_t max);

/* json helpers (engine_json.c) */
int cmp__set_real(json_t *obj, const char *name, double v);
/* A named double of a result object, for cmp__set_reals. */
struct cmp__real {
    const char *name;
    double v;
};
/* cmp__set_real for each of the N reals of F, in order; their or-ed error. */
int cmp__set_reals(json_t *obj, const struct cmp__real *f, size_t n);
/* json_object_set_new as 0 or -ENOMEM: calls are or-ed into one error. */
int cmp__set(json_t *o, const char *k, json_t *v);
/* O when E (the or of cmp__set calls) is 0; otherwise O is released and
 * the result is NULL. */
json_t *cmp__obj_or_null(json_t *o, int e);

/* Adds "derived_from": "stats" and the "derived" object of
 * cmp_stats_derive() to a `stats` basis row O; nothing when underivable. */
int cmp__derived_json(json_t *o, const struct cmp__rec *head, const struct cmp__rec *control);

#endif
