/*
 * compare/student_t.c - Student's t distribution, for the paired perf test
 * (compare/perf.c) and the change-point test (compare/changepoint.c): the
 * two-sided p of a t statistic and the t of a given
 * two-sided p, both from the regularized incomplete beta function,
 * P(|T| >= t) = I_{df/(df+t^2)}(df/2, 1/2), evaluated by its continued
 * fraction (modified Lentz); tested against the closed forms at 1 and 2
 * degrees of freedom to 1e-12 and against the printed tables.
 */
#include <math.h>

#include "compare/cmp.h"

#define CF_EPS       1e-15
#define CF_TINY      1e-300
#define CF_MAX_TERMS 500

/* 1 + d1/(1 + d2/(1 + ...)) of I_x(a, b), with d_{2m+1} = -(a+m)(a+b+m)x /
 * ((a+2m)(a+2m+1)) and d_{2m} = m(b-m)x / ((a+2m-1)(a+2m)). */
static double beta_cf(double a, double b, double x)
{
    double f = 1, c = 1, d = 0;
    for (int j = 1; j <= CF_MAX_TERMS; j++) {
        int m = j / 2;
        double num = j % 2 ? -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
                           : m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m));
        d = 1 + num * d;
        d = fabs(d) < CF_TINY ? 1 / CF_TINY : 1 / d;
        c = 1 + num / c;
        c = fabs(c) < CF_TINY ? CF_TINY : c;
        f *= c * d;
        if (fabs(c * d - 1) < CF_EPS)
            break;
    }
    return f;
}

/* I_x(a, b); the fraction converges fast below the mean (a+1)/(a+b+2), and
 * I_x(a, b) = 1 - I_{1-x}(b, a) covers the rest. */
static double ibeta(double a, double b, double x)
{
    if (x <= 0)
        return 0;
    if (x >= 1)
        return 1;
    if (x > (a + 1) / (a + b + 2))
        return 1 - ibeta(b, a, 1 - x);
    double front = exp(a * log(x) + b * log1p(-x) - (lgamma(a) + lgamma(b) - lgamma(a + b)));
    return front / (a * beta_cf(a, b, x));
}

double cmp_t_p(double t, double df)
{
    if (isnan(t) || !(df > 0))
        return NAN;
    if (isinf(t))
        return 0;
    double p = ibeta(df / 2, 0.5, df / (df + t * t));
    return p > 1 ? 1 : p;
}

double cmp_t_quantile(double p, double df)
{
    if (!(p > 0 && p < 1) || !(df > 0))
        return NAN;
    double lo = 0, hi = 1;
    while (cmp_t_p(hi, df) > p && hi < 1e12)
        hi *= 2;
    for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; i++) {
        double mid = (lo + hi) / 2;
        if (cmp_t_p(mid, df) > p)
            lo = mid;
        else
            hi = mid;
    }
    return (lo + hi) / 2;
}
