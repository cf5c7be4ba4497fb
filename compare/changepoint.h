/*
 * compare/changepoint.h - change points along a series of observations
 * (one cell's perf or memory, commit after commit on a branch).
 *
 * This header is the module's whole story. The detector is Apache Otava's:
 * E-Divisive means (Matteson and James's energy statistic, alpha 1) finds
 * the candidate split of a window that best separates two distributions,
 * and a Student t-test (pooled variance, as Otava) between the neighbouring segments decides
 * whether it counts. It runs in two passes over the series:
 *
 *   1. split: windows of `window` points (50) advancing by half a window
 *      (or to the last change point found), each searched recursively at
 *      the weak level p <= max_pvalue * weak_factor (0.01);
 *   2. merge, bottom-up: while some change point has p > max_pvalue
 *      (0.001) against its neighbouring segments, the weakest is removed
 *      and its two neighbours are retested against the larger segments.
 *
 * There is no permutation test and no random number anywhere, so the same
 * series always gives the same change points. No segment is shorter than
 * min_segment (3) points: a single spike cannot become its own segment,
 * and it inflates the spread of the segment it falls in rather than
 * moving its mean much.
 *
 * Conventions as in compare/cmp.h: 0 or a negative errno with
 * out-parameters; -E2BIG past a named limit (CMP_CP_MAX_POINTS, or
 * MAX_OUT change points), never silent truncation. Pure computation: no
 * I/O, no clock, no global state, thread-safe.
 *
 * Typical use, from storage/history.c:
 *
 *     struct cmp_cp_options o;
 *     cmp_cp_options_init(&o);
 *     struct cmp_cp cps[CMP_CP_MAX_CHANGES];
 *     size_t n_cp;
 *     if (cmp_changepoints(values, n, &o, cps, CMP_CP_MAX_CHANGES, &n_cp) == 0)
 *         for (size_t i = 0; i < n_cp; i++)
 *             ... cps[i].index is the first point of the new level ...
 */
#ifndef CAPD_COMPARE_CHANGEPOINT_H
#define CAPD_COMPARE_CHANGEPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CMP_CP_MAX_POINTS  100000 /* points of one analysed series */
#define CMP_CP_MAX_WINDOW  1000   /* points of one E-Divisive window */
#define CMP_CP_MAX_CHANGES 1024   /* change points a caller usually makes room for */

enum cmp_cp_label {
    CMP_CP_REGRESSION,       /* significant, confirmed, worse */
    CMP_CP_IMPROVEMENT,      /* significant, confirmed, better */
    CMP_CP_SUSPICIOUS,       /* significant, but fewer than `confirm` points after it */
    CMP_CP_INSUFFICIENT_DATA /* a series shorter than 2 * min_segment: nothing can be said */
};

struct cmp_cp_options {
    size_t window;         /* 50 */
    double max_pvalue;     /* 0.001 */
    double weak_factor;    /* 10: the split pass keeps p <= max_pvalue * weak_factor */
    size_t min_segment;    /* 3 */
    size_t confirm;        /* 5: points of the new level before it is confirmed */
    double min_magnitude;  /* 0: smaller relative changes are merged away */
    bool higher_is_better; /* false: a rise is a regression (time, memory) */
};

/*
 * One change point. index is the first point of the new level (the first
 * bad commit when it is a regression); index - 1 is the last good one.
 * before/after are the segments between the neighbouring change points.
 * magnitude is after_mean / before_mean - 1, with a 99% interval from the
 * t interval of the difference of means divided by before_mean (NaN
 * when before_mean is 0).
 */
struct cmp_cp {
    size_t index, last_good;
    size_t before_n, after_n;
    double before_mean, after_mean, before_sd, after_sd;
    double magnitude, mag_lo, mag_hi;
    double p_value;
    enum cmp_cp_label label;
};

void cmp_cp_options_init(struct cmp_cp_options *o);

/*
 * Change points of x[0..n), in increasing index order, at most MAX_OUT of
 * them (-E2BIG when more survive, with *n_out set to how many did).
 * opt NULL means the defaults. -EINVAL on a non-finite value, a window
 * below 2 * min_segment or above CMP_CP_MAX_WINDOW, or a min_segment of
 * less than 2; -E2BIG past CMP_CP_MAX_POINTS; -ENOMEM. A series shorter
 * than 2 * min_segment has none (see cmp_cp_series_label).
 */
int cmp_changepoints(const double *x, size_t n, const struct cmp_cp_options *opt,
                     struct cmp_cp *out, size_t max_out, size_t *n_out);

/* CMP_CP_INSUFFICIENT_DATA when a series of N points is too short to
 * analyse with OPT (NULL: defaults), else CMP_CP_SUSPICIOUS as "analysable". */
enum cmp_cp_label cmp_cp_series_label(size_t n, const struct cmp_cp_options *opt);

const char *cmp_cp_label_name(enum cmp_cp_label l);

/*
 * The perf observation of one cell: the median of its timing samples in
 * nanoseconds. Every series point is made by this one function, so that
 * what a "perf observation" means can change (to a process-level median)
 * in one place. -EINVAL when n is 0, -ENOMEM.
 */
int cmp_perf_observation(const int64_t *samples_ns, size_t n, double *out);

/* Student's two-sample t-test (pooled variance) of x against y, exposed
 * for tests: the two-sided p-value; 1 when either has fewer than 2 points;
 * 0 or 1 when both spreads are 0 (means differ or not). */
double cmp_ttest_p(const double *x, size_t nx, const double *y, size_t ny);

#endif /* CAPD_COMPARE_CHANGEPOINT_H */
