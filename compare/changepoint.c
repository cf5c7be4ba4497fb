/*
 * compare/changepoint.c - E-Divisive means with a t-test, split in
 * sliding windows and merged bottom-up (compare/changepoint.h says what and
 * why; docs/history.md says how to tune it).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compare/changepoint.h"
#include "compare/cmp_int.h"

void cmp_cp_options_init(struct cmp_cp_options *o)
{
    o->window = 50;
    o->max_pvalue = 0.001;
    o->weak_factor = 10.0;
    o->min_segment = 3;
    o->confirm = 5;
    o->min_magnitude = 0.0;
    o->higher_is_better = false;
}

const char *cmp_cp_label_name(enum cmp_cp_label l)
{
    switch (l) {
    case CMP_CP_REGRESSION:
        return "regression";
    case CMP_CP_IMPROVEMENT:
        return "improvement";
    case CMP_CP_SUSPICIOUS:
        return "suspicious";
    case CMP_CP_INSUFFICIENT_DATA:
        break;
    }
    return "insufficient_data";
}

enum cmp_cp_label cmp_cp_series_label(size_t n, const struct cmp_cp_options *opt)
{
    struct cmp_cp_options d;
    if (!opt) {
        cmp_cp_options_init(&d);
        opt = &d;
    }
    return n < 2 * opt->min_segment ? CMP_CP_INSUFFICIENT_DATA : CMP_CP_SUSPICIOUS;
}

int cmp_perf_observation(const int64_t *samples_ns, size_t n, double *out)
{
    if (!samples_ns || n == 0 || n > CMP_MAX_TIMING_SAMPLES)
        return -EINVAL;
    return cmp__median_ns(samples_ns, n, out);
}

/* Student's t: compare/student_t.c (cmp_t_p, cmp_t_quantile). */

struct moments {
    size_t n;
    double mean, var;
};

static struct moments moments_of(const double *x, size_t n)
{
    struct moments m = {n, 0, 0};
    for (size_t i = 0; i < n; i++)
        m.mean += x[i];
    m.mean = n ? m.mean / (double)n : NAN;
    for (size_t i = 0; i < n; i++)
        m.var += (x[i] - m.mean) * (x[i] - m.mean);
    m.var = n > 1 ? m.var / (double)(n - 1) : 0;
    return m;
}

/* Student's t statistic of y - x with the pooled variance (as Otava's
 * ttest_ind_from_stats), its degrees of freedom and standard error. Pooling
 * keeps a short segment whose few points happen to agree from looking
 * precise: its variance is weighed by its size. */
static double student(struct moments a, struct moments b, double *df, double *se)
{
    *df = (double)(a.n + b.n - 2);
    double pooled = ((double)(a.n - 1) * a.var + (double)(b.n - 1) * b.var) / *df;
    *se = sqrt(pooled * (1.0 / (double)a.n + 1.0 / (double)b.n));
    if (*se == 0)
        return b.mean == a.mean ? 0 : INFINITY;
    return (b.mean - a.mean) / *se;
}

double cmp_ttest_p(const double *x, size_t nx, const double *y, size_t ny)
{
    if (nx < 2 || ny < 2)
        return 1;
    double df, se;
    double t = student(moments_of(x, nx), moments_of(y, ny), &df, &se);
    return isfinite(t) ? cmp_t_p(t, df) : 0;
}

/* ------------------------------------------------------ E-Divisive */

/*
 * The best split of w[0..m) by the energy statistic with alpha 1:
 * q(tau) = tau(m-tau)/m * (2/(tau(m-tau)) C - 2/(tau(tau-1)) L
 * - 2/((m-tau)(m-tau-1)) R), where C sums |x - y| across the split and L,
 * R within each side. The three sums move by one row of distances per
 * step of tau, so every tau costs O(m) and the window O(m^2). Returns the
 * tau with both sides at least MIN long, or 0 when there is none.
 */
static size_t best_split(const double *w, size_t m, size_t min, double *q_out)
{
    if (m < 2 * min)
        return 0;
    double left = 0, right = 0, cross = 0;
    for (size_t j = 0; j < m; j++)
        for (size_t k = j + 1; k < m; k++)
            right += fabs(w[j] - w[k]);
    size_t best = 0;
    double best_q = -INFINITY;
    for (size_t tau = 1; tau + min <= m; tau++) {
        /* Move point tau-1 from the right side to the left. */
        size_t p = tau - 1;
        double to_left = 0, to_right = 0;
        for (size_t i = 0; i < p; i++)
            to_left += fabs(w[i] - w[p]);
        for (size_t j = p + 1; j < m; j++)
            to_right += fabs(w[p] - w[j]);
        left += to_left;
        right -= to_right;
        cross += to_right - to_left;
        if (tau < min)
            continue;
        double a = (double)tau, b = (double)(m - tau);
        double e = 2 * cross / (a * b) - (tau > 1 ? 2 * left / (a * (a - 1)) : 0) -
                   (m - tau > 1 ? 2 * right / (b * (b - 1)) : 0);
        double q = a * b / (double)m * e;
        if (q > best_q) {
            best_q = q;
            best = tau;
        }
    }
    *q_out = best_q;
    return best;
}

/* Sorted set of indexes, bounded by its capacity. */
struct idxset {
    size_t *v;
    size_t n, cap;
};

static int idx_add(struct idxset *s, size_t x)
{
    size_t i = 0;
    while (i < s->n && s->v[i] < x)
        i++;
    if (i < s->n && s->v[i] == x)
        return 0;
    if (s->n == s->cap)
        return -E2BIG;
    memmove(s->v + i + 1, s->v + i, (s->n - i) * sizeof *s->v);
    s->v[i] = x;
    s->n++;
    return 0;
}

static void idx_del(struct idxset *s, size_t i)
{
    memmove(s->v + i, s->v + i + 1, (s->n - i - 1) * sizeof *s->v);
    s->n--;
}

/*
 * The p-value of splitting x[lo..hi) at tau, adjusted for the choice of
 * tau: the split tested is the best of every position that leaves both
 * sides min long, and the smallest of that many t-test p-values is small
 * by selection alone. Multiplying by the number of candidates (Bonferroni)
 * is what keeps pure noise below 1% false change points at p <= 0.001
 * (tests/test_history_cp.c measures it; without it, 2 to 5%).
 */
static double split_p(const double *x, size_t lo, size_t tau, size_t hi, size_t min)
{
    if (tau - lo < min || hi - tau < min)
        return 1;
    double candidates = (double)(hi - lo - 2 * min + 1);
    double p = cmp_ttest_p(x + lo, tau - lo, x + tau, hi - tau) * candidates;
    return p < 1 ? p : 1;
}

/*
 * E-Divisive inside one window w[0..m): repeatedly split the segment (between
 * the change points found so far) whose best split scores highest, while
 * that split passes the t-test at P. Found indexes go to OUT shifted by BASE.
 */
static int edivisive(const double *w, size_t m, size_t min, double p, size_t base,
                     struct idxset *out)
{
    size_t cps[CMP_CP_MAX_WINDOW + 2];
    size_t ncps = 2;
    cps[0] = 0;
    cps[1] = m;
    for (;;) {
        size_t best_tau = 0, seg = 0;
        double best_q = -INFINITY;
        for (size_t s = 0; s + 1 < ncps; s++) {
            double q;
            size_t tau = best_split(w + cps[s], cps[s + 1] - cps[s], min, &q);
            if (tau && q > best_q) {
                best_q = q;
                best_tau = cps[s] + tau;
                seg = s;
            }
        }
        if (!best_tau || split_p(w, cps[seg], best_tau, cps[seg + 1], min) > p)
            return 0;
        memmove(cps + seg + 2, cps + seg + 1, (ncps - seg - 1) * sizeof *cps);
        cps[seg + 1] = best_tau;
        ncps++;
        int rc = idx_add(out, base + best_tau);
        if (rc)
            return rc;
    }
}

/* The split pass: windows of o->window points, each starting half a window
 * on or at the last change point found, whichever is further. */
static int split_pass(const double *x, size_t n, const struct cmp_cp_options *o, struct idxset *out)
{
    double p = o->max_pvalue * o->weak_factor;
    size_t step = o->window / 2;
    for (size_t start = 0; start < n;) {
        size_t end = start + o->window < n ? start + o->window : n;
        size_t before = out->n ? out->v[out->n - 1] : 0;
        int rc = edivisive(x + start, end - start, o->min_segment, p, start, out);
        if (rc)
            return rc;
        size_t last = out->n ? out->v[out->n - 1] : 0;
        size_t next = start + step;
        if (last != before && last > next)
            next = last;
        if (end == n)
            break;
        start = next;
    }
    return 0;
}

/* Statistics of the change point at s->v[i] against its neighbours. */
static void cp_stats(const double *x, size_t n, const struct idxset *s, size_t i,
                     const struct cmp_cp_options *o, struct cmp_cp *cp)
{
    size_t lo = i ? s->v[i - 1] : 0, tau = s->v[i], hi = i + 1 < s->n ? s->v[i + 1] : n;
    struct moments a = moments_of(x + lo, tau - lo), b = moments_of(x + tau, hi - tau);
    memset(cp, 0, sizeof *cp);
    cp->index = tau;
    cp->last_good = tau - 1;
    cp->before_n = a.n;
    cp->after_n = b.n;
    cp->before_mean = a.mean;
    cp->after_mean = b.mean;
    cp->before_sd = sqrt(a.var);
    cp->after_sd = sqrt(b.var);
    cp->p_value = split_p(x, lo, tau, hi, o->min_segment);
    double df = 1, se = 0;
    if (a.n >= 2 && b.n >= 2)
        student(a, b, &df, &se);
    double half = se > 0 ? cmp_t_quantile(0.01, df) * se : 0;
    double d = b.mean - a.mean;
    cp->magnitude = a.mean != 0 ? d / a.mean : NAN;
    cp->mag_lo = a.mean != 0 ? (d - half) / fabs(a.mean) : NAN;
    cp->mag_hi = a.mean != 0 ? (d + half) / fabs(a.mean) : NAN;
    bool worse = o->higher_is_better ? d < 0 : d > 0;
    cp->label = b.n < o->confirm ? CMP_CP_SUSPICIOUS
                : worse          ? CMP_CP_REGRESSION
                                 : CMP_CP_IMPROVEMENT;
}

static double abs_mag(const struct cmp_cp *c)
{
    return isnan(c->magnitude) ? INFINITY : fabs(c->magnitude);
}

/*
 * The merge pass, bottom-up: while the weakest change point fails the
 * strict level (or, once all pass, the smallest is below min_magnitude),
 * it goes, and its two neighbours are retested against the segments its
 * removal joined.
 */
static void merge_pass(const double *x, size_t n, const struct cmp_cp_options *o, struct idxset *s,
                       struct cmp_cp *st)
{
    for (size_t i = 0; i < s->n; i++)
        cp_stats(x, n, s, i, o, &st[i]);
    while (s->n) {
        size_t w = 0;
        for (size_t i = 1; i < s->n; i++)
            if (st[i].p_value > st[w].p_value)
                w = i;
        if (st[w].p_value <= o->max_pvalue) {
            w = 0;
            for (size_t i = 1; i < s->n; i++)
                if (abs_mag(&st[i]) < abs_mag(&st[w]))
                    w = i;
            if (abs_mag(&st[w]) > o->min_magnitude)
                return;
        }
        idx_del(s, w);
        memmove(st + w, st + w + 1, (s->n - w) * sizeof *st);
        if (w > 0)
            cp_stats(x, n, s, w - 1, o, &st[w - 1]);
        if (w < s->n)
            cp_stats(x, n, s, w, o, &st[w]);
    }
}

/* The residual sum of squares of x[lo..hi) about its mean. */
static double sse(const double *x, size_t lo, size_t hi)
{
    struct moments m = moments_of(x + lo, hi - lo);
    return m.var * (double)(hi - lo - 1);
}

/*
 * The energy statistic finds a change but is loose about where exactly:
 * a boundary point that is noisy moves its argmax by one. Each surviving
 * change point is therefore moved, within min_segment points and its
 * neighbours, to the split that fits two levels best (least squares, the
 * maximum-likelihood split of a shift in mean), and its statistics are
 * recomputed.
 */
static void refine(const double *x, size_t n, const struct cmp_cp_options *o, struct idxset *s,
                   struct cmp_cp *st)
{
    size_t min = o->min_segment;
    for (size_t i = 0; i < s->n; i++) {
        size_t lo = i ? s->v[i - 1] : 0, hi = i + 1 < s->n ? s->v[i + 1] : n, cp = s->v[i];
        size_t from = cp >= lo + 2 * min ? cp - min : lo + min;
        size_t to = cp + 2 * min <= hi ? cp + min : hi - min;
        size_t best = cp;
        double best_e = sse(x, lo, cp) + sse(x, cp, hi);
        for (size_t tau = from; tau <= to; tau++) {
            double e = sse(x, lo, tau) + sse(x, tau, hi);
            if (e < best_e) {
                best_e = e;
                best = tau;
            }
        }
        s->v[i] = best;
    }
    for (size_t i = 0; i < s->n; i++)
        cp_stats(x, n, s, i, o, &st[i]);
}

static int check_input(const double *x, size_t n, const struct cmp_cp_options *o)
{
    if (n > CMP_CP_MAX_POINTS)
        return -E2BIG;
    if (o->min_segment < 2 || o->window < 2 * o->min_segment || o->window > CMP_CP_MAX_WINDOW ||
        !(o->max_pvalue > 0) || !(o->weak_factor >= 1))
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return -EINVAL;
    return 0;
}

int cmp_changepoints(const double *x, size_t n, const struct cmp_cp_options *opt,
                     struct cmp_cp *out, size_t max_out, size_t *n_out)
{
    struct cmp_cp_options d;
    if (!opt) {
        cmp_cp_options_init(&d);
        opt = &d;
    }
    *n_out = 0;
    if (n && !x)
        return -EINVAL;
    int rc = check_input(x, n, opt);
    if (rc || n < 2 * opt->min_segment)
        return rc;
    /* At most one change point per min_segment points can exist. */
    size_t cap = n / opt->min_segment + 1;
    struct idxset s = {malloc(cap * sizeof(size_t)), 0, cap};
    struct cmp_cp *st = malloc(cap * sizeof *st);
    rc = -ENOMEM;
    if (!s.v || !st)
        goto out;
    if ((rc = split_pass(x, n, opt, &s)) != 0)
        goto out;
    merge_pass(x, n, opt, &s, st);
    refine(x, n, opt, &s, st);
    *n_out = s.n < max_out ? s.n : max_out;
    if (*n_out)
        memcpy(out, st, *n_out * sizeof *st);
    rc = s.n > max_out ? -E2BIG : 0;
out:
    free(s.v);
    free(st);
    return rc;
}
