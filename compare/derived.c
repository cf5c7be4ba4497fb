/*
 * compare/derived.c - a size for every divergence on the `stats` basis.
 *
 * With the default capture (statistics only) there is no element to
 * subtract, and a diverged row used to carry no size at all: the dashboard
 * drew it on its top grid line and the reports said nothing. The two sides'
 * min, max, mean, std and L2 norm still bound the error from below, and a
 * lower bound is what a reviewer needs: "at least this far apart". Each
 * bound is exact arithmetic on the statistics (cmp.h states them), labelled
 * derived_from "stats" so nobody reads it as an elementwise measurement.
 */
#include <errno.h>
#include <math.h>

#include "compare/cmp_int.h"

/* A / B as a relative size: +inf when B is 0 and A is not, 0 for 0/0. */
static double rel(double a, double b)
{
    if (b > 0)
        return a / b;
    return a > 0 ? INFINITY : 0.0;
}

int cmp_stats_derive(const struct cmp_stats *h, const struct cmp_stats *c, int64_t numel_head,
                     int64_t numel_control, struct cmp_derived *out)
{
    if (!h->has_finite || !c->has_finite || numel_head != numel_control || h->nan != c->nan ||
        h->pinf != c->pinf || h->ninf != c->ninf)
        return -ENODATA;
    int64_t n = numel_control - c->nan - c->pinf - c->ninf;
    if (n <= 0)
        return -ENODATA;
    double sn = sqrt((double)n);
    out->n = n;
    out->abs_dmean = fabs(h->mean - c->mean);
    out->abs_dstd = fabs(h->std - c->std);
    out->abs_dmin = fabs(h->min - c->min);
    out->abs_dmax = fabs(h->max - c->max);
    /* ||d||^2 = ||d - mean(d)||^2 + n mean(d)^2, and ||d - mean(d)|| is at
     * least sqrt(n) |std_h - std_c| (the centred vectors' norms). */
    out->l2_lower = fmax(fabs(h->l2 - c->l2), sn * hypot(out->abs_dmean, out->abs_dstd));
    out->rms_lower = out->l2_lower / sn;
    /* The head's maximum sits at some position where the control is at most
     * its own maximum, and so on for the other three extremes. */
    out->max_abs_lower = fmax(fmax(out->abs_dmin, out->abs_dmax), out->rms_lower);
    out->control_rms = c->l2 / sn;
    out->control_max_abs = fmax(fabs(c->min), fabs(c->max));
    out->rel_l2_lower = rel(out->l2_lower, c->l2);
    out->max_rel_lower = rel(out->max_abs_lower, out->control_max_abs);
    return 0;
}

int cmp__derived_json(json_t *o, const struct cmp__rec *head, const struct cmp__rec *control)
{
    struct cmp_derived d;
    if (cmp_stats_derive(&head->stats, &control->stats, head->numel, control->numel, &d) != 0)
        return 0;
    json_t *j = json_object();
    if (j == NULL || json_object_set_new(o, "derived", j) ||
        json_object_set_new(o, "derived_from", json_string("stats")))
        return -ENOMEM;
    const struct cmp__real f[] = {
        {"abs_delta_mean", d.abs_dmean},
        {"abs_delta_std", d.abs_dstd},
        {"abs_delta_min", d.abs_dmin},
        {"abs_delta_max", d.abs_dmax},
        {"l2_lower", d.l2_lower},
        {"rms_lower", d.rms_lower},
        {"max_abs_lower", d.max_abs_lower},
        {"control_rms", d.control_rms},
        {"control_max_abs", d.control_max_abs},
        {"rel_l2_lower", d.rel_l2_lower},
        {"max_rel_lower", d.max_rel_lower},
    };
    int rc = json_object_set_new(j, "n", json_integer(d.n)) ? -ENOMEM : 0;
    return rc | cmp__set_reals(j, f, sizeof f / sizeof f[0]);
}
