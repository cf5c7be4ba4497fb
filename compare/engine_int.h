/*
 * compare/engine_int.h - what the engine's files share and nobody else sees:
 * the verdict classes of a record pair and of a cell, the counts of one
 * comparison, and the working state of one matched cell pair.
 *
 * The engine is five files: engine.c drives a comparison (options, cell
 * matching, the result), engine_cell.c judges one matched cell pair (record
 * merge, verdicts, first divergence, status), opalign.c pairs the per-op
 * records of a module call whose op keys differ by alignment and names an
 * inserted or removed op as an origin, amplify.c says where a
 * diverged cell's error grew, and engine_json.c writes every object of the
 * result (docs/compare.md is the contract for its names).
 */
#ifndef CAPD_COMPARE_ENGINE_INT_H
#define CAPD_COMPARE_ENGINE_INT_H

#include "compare/cmp_int.h"

/* The verdict of one record pair. */
enum cmp__tclass { CMP__T_IDENTICAL, CMP__T_WITHIN, CMP__T_DIVERGED, CMP__T_NONDET };

/* The status of one cell pair; CMP__C__COUNT sizes the counts. */
enum cmp__cstatus {
    CMP__C_IDENTICAL,
    CMP__C_WITHIN,
    CMP__C_DIVERGED,
    CMP__C_NONDET,
    CMP__C_INCOMPARABLE,
    CMP__C_NOT_RUN,
    CMP__C__COUNT
};

/*
 * The reference arbiter's judgement of one pair the tolerance rule diverged
 * (reference.c): judged when the reference and every value it needs were
 * there (why NULL), else why names what was missing and the tolerance
 * rule's verdict stands.
 */
struct cmp__refjudge {
    bool tried, judged, passed;
    const char *rule; /* cmp_reference_rule() of the option */
    const char *why;
    double err_head, err_control; /* RMS difference from the reference */
    double k, tol;
    int64_t n; /* positions the errors are over */
};

/* One matched record pair. */
struct cmp__row {
    const struct cmp__rec *h, *c;
    struct cmp_metrics m;
    enum cmp__tclass cls;
    struct cmp__refjudge ref;
};

/* What the result's "counts" object reports, summed over the cell pairs. */
struct cmp__counts {
    int64_t status[CMP__C__COUNT];
    int64_t cells, missing_cells, extra_cells;
    int64_t outcome_regressions, outcome_fixes;
    int64_t perf_regressions, perf_improvements, perf_unknown, perf_unstable, perf_same;
    int64_t device_mismatches; /* pairs refused for running on different devices */
    int64_t lost_coverage;     /* control ran, the head's host lacks the width */
};

/*
 * One matched cell pair while it is judged (engine_cell.c fills it stage by
 * stage; engine_json.c writes its object). Arrays are owned and freed by
 * engine_cell.c; rows, missing and extra are in execution order.
 */
/*
 * An entry of an index over a cell pair's rows: the row's head record and
 * its place in execution order. engine_cell.c sorts one by module call to
 * find where an error came in, amplify.c one by module call and phase;
 * both sort records that compare equal in execution order, through
 * cmp__rowix_then.
 */
struct cmp__rowix {
    const struct cmp__rec *h;
    size_t row;
};

/* C, the order of X's and Y's records, where it is not 0, else their
 * order of execution: the tail of a qsort comparator of cmp__rowix. */
static inline int cmp__rowix_then(int c, const struct cmp__rowix *x, const struct cmp__rowix *y)
{
    return c ? c : (x->row > y->row) - (x->row < y->row);
}

struct cmp__cellcmp {
    const struct cmp_cell *c, *h; /* control, head */
    const struct cmp_options *o;
    bool cross, cross_mode;           /* across widths, across modes (cmp_options) */
    const struct cmp__rec **sc, **sh; /* each side's records, by key */
    const char **mc, **mh;            /* each side's nondeterministic marks, sorted */
    struct cmp__row *rows;            /* keys on both sides */
    const struct cmp__rec **missing;  /* keys of the control only */
    const struct cmp__rec **extra;    /* keys of the head only */
    struct cmp__rowix *grp;           /* rows by module call */
    size_t nrows, nmiss, nextra;
    int64_t ncls[4]; /* rows per enum cmp__tclass */
    int64_t nmixed;  /* rows whose two hashes are of different algorithms */
    bool params_differed;
    const char *dev_check; /* "unknown", "same", "mismatch_allowed", "mismatch_refused" */
    bool dev_refused;
    const struct cmp__row *first_div, *first_intro;
    int64_t ops_realigned;         /* op calls paired across different keys (opalign.c) */
    int64_t ops_unaligned;         /* module calls too long to align, paired by key */
    const struct cmp__rec *origin; /* an op one side ran alone before first_div */
    bool origin_inserted;          /* origin is the head's (else the control's) */
    const char *origin_link;       /* "same_call" or "same_value" */
    const struct cmp__rec **sr;    /* the reference's records by key (reference.c) */
    size_t nsr;
    bool sr_owned;       /* sr is a copy (default-width), not sc */
    const char *ref_why; /* why no record has a reference, else NULL */
    int64_t ref_tried, ref_judged, ref_passed;
    enum cmp__cstatus st;
    const char *why; /* the incomparable or not_run reason, else NULL */
    const char *oc;  /* the outcome change: "regression", "fix", "changed", "none", "not_run" */
    struct cmp_perf perf;
};

/* engine_cell.c: compares one matched cell pair, appends its object to cells. */
/* The rows in head execution order, missing and extra in their own. */
void cmp__rows_in_order(struct cmp__cellcmp *k);

/*
 * opalign.c: per-op records of a module call whose op keys differ between
 * the sides, paired by alignment instead of by key (-ENOMEM); then the
 * inserted or removed op that the first divergence follows, if any, and
 * its "op_origin" object.
 */
int cmp__align_ops(struct cmp__cellcmp *k);
void cmp__op_origin(struct cmp__cellcmp *k);
int cmp__op_origin_json(const struct cmp__cellcmp *k, json_t *cj);

int cmp__compare_cell(const struct cmp_cell *c, const struct cmp_cell *h,
                      const struct cmp_options *o, bool cross, bool cross_mode,
                      struct cmp_scratch *s, json_t *cells, struct cmp__counts *cnt);

/*
 * reference.c: the reference arbiter. cmp__reference_prepare finds the
 * reference records of a cell pair (nothing when the option is none);
 * cmp__reference_judge judges one row the tolerance rule diverged, and
 * turns it within_tolerance when it passes; cmp__reference_json writes a
 * row's or a cell's "reference" object. -ENOMEM.
 */
int cmp__reference_prepare(struct cmp__cellcmp *k);
void cmp__reference_judge(struct cmp__cellcmp *k, struct cmp__row *w);
int cmp__reference_row_json(const struct cmp__row *w, json_t *o);
int cmp__reference_cell_json(const struct cmp__cellcmp *k, json_t *cj);
/* A key under the float64 reference's prefix (never compared as a record). */
bool cmp__reference_key(const char *key);

/* engine_json.c: the objects of the result. */
/* A judged cell pair's object; -ENOMEM. */
int cmp__cell_json(const struct cmp__cellcmp *k, json_t **out);
/* Fills res (verdict, mode, counts, thresholds) and moves cells, miss, extra
 * and envj into it (each pointer is NULL afterwards, also on failure). */
int cmp__result_json(json_t *res, const struct cmp__counts *cnt, const struct cmp_options *opt,
                     bool cross, bool cross_mode, json_t **cells, json_t **miss, json_t **extra,
                     json_t **envj);

/*
 * amplify.c: a diverged cell's "max_amplification" (the row whose relative
 * error grew most over its input's) and "first_divergence_growth"
 * (introduced, amplified or carried), both null for any other cell or when
 * no row has a known input error; set on cj. -ENOMEM.
 */
int cmp__amplify_json(const struct cmp__cellcmp *k, json_t *cj);

#endif
