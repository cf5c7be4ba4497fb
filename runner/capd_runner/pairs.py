"""The paired verdict of a cell's pairs so far, for the round rule.

A paired head cell (docs/runner.md, "Paired timing") times
``options.timing_pairs`` pairs and, while the pairs so far give
``unknown`` (or cannot be tested yet), another round of half as many
(rounded up), up to ``options.max_timing_rounds`` rounds in all. This is the same decision as capd's
comparison (compare/perf.c and compare/student_t.c: a paired t test on the
per-pair log ratios of the processes' fastest samples, its 99% t interval for
an alarm, its 90% t interval for ``same`` (the equivalence test at
EQUIV_ALPHA), the spread 1.4826 MAD of the log ratios) at the comparison's
defaults (perf_threshold 0.05, alpha 0.01). Only the stopping rule uses it: the verdict a comparison
reports is capd's, at the comparison's own options, on all the pairs.
"""

import math

THRESHOLD = 0.05
ALPHA = 0.01
EQUIV_ALPHA = 0.05  # compare/cmp.h CMP_EQUIV_ALPHA
CF_EPS = 1e-15
CF_TINY = 1e-300


def median(v):
    s = sorted(v)
    n = len(s)
    if n == 0:
        return float("nan")
    if n % 2:
        return float(s[n // 2])
    return (s[n // 2 - 1] + s[n // 2]) / 2.0


def _beta_cf(a, b, x):
    f, c, d = 1.0, 1.0, 0.0
    for j in range(1, 501):
        m = j // 2
        if j % 2:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        else:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1 + num * d
        d = 1 / CF_TINY if abs(d) < CF_TINY else 1 / d
        c = 1 + num / c
        c = CF_TINY if abs(c) < CF_TINY else c
        f *= c * d
        if abs(c * d - 1) < CF_EPS:
            break
    return f


def _ibeta(a, b, x):
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1 - _ibeta(b, a, 1 - x)
    front = math.exp(a * math.log(x) + b * math.log1p(-x)
                     - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)))
    return front / (a * _beta_cf(a, b, x))


def t_p(t, df):
    """Two-sided p of Student's t at DF degrees of freedom."""
    if math.isinf(t):
        return 0.0
    return min(1.0, _ibeta(df / 2.0, 0.5, df / (df + t * t)))


def t_quantile(p, df):
    """The t whose two-sided p is P."""
    lo, hi = 0.0, 1.0
    while t_p(hi, df) > p and hi < 1e12:
        hi *= 2
    for _ in range(200):
        if hi - lo <= 1e-12 * hi:
            break
        mid = (lo + hi) / 2
        if t_p(mid, df) > p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def verdict(control, head, threshold=THRESHOLD, alpha=ALPHA):
    """The verdict of pairs (control[i], head[i]) of process observations."""
    n = len(control)
    logr = [math.log(h / c) if c > 0 and h > 0 else 0.0 for c, h in zip(control, head)]
    if n < 2:
        return "insufficient_data"
    mean = sum(logr) / n
    se = math.sqrt(sum((x - mean) ** 2 for x in logr) / (n - 1) / n)
    if se > 0:
        p = t_p(mean / se, n - 1)
    else:
        p = 1.0 if mean == 0 else 0.0
    half = t_quantile(0.01, n - 1) * se
    lo, hi = math.exp(mean - half), math.exp(mean + half)
    if p < alpha and lo > 1.0 + threshold:
        return "regression"
    if p < alpha and hi < 1.0 - threshold:
        return "improvement"
    eq = t_quantile(2 * EQUIV_ALPHA, n - 1) * se
    if math.exp(mean - eq) >= 1.0 - threshold and math.exp(mean + eq) <= 1.0 + threshold:
        return "same"
    if n >= 3:
        med = median(logr)
        if math.expm1(1.4826 * median([abs(x - med) for x in logr])) > threshold:
            return "unstable"
    return "unknown"


def round_size(timing_pairs, rnd):
    """Pairs of round RND (0 the first): a later round only has to settle
    what the first left open, so it takes half as many, at least 1."""
    return timing_pairs if rnd == 0 else max(1, (timing_pairs + 1) // 2)


def wants_more(control, head):
    """Whether another round may settle what these pairs leave open."""
    return verdict(control, head) in ("unknown", "insufficient_data")


def observations(done):
    """The pairs' observations, each process's fastest sample, as capd's
    comparison takes them (compare/perf_cell.c, "basis"): of the device-time
    samples when every process of both sides has them (a GPU cell), else of
    the own-time samples when every process of both sides has them; else of the
    wall-clock samples, or of the CPU-time samples where every process has
    those and none measured its run-queue delay (a runner from before own
    time)."""
    procs = [r for pair in done for r in pair]
    key = "samples_ns"
    if all("device_samples_ns" in r for r in procs):
        key = "device_samples_ns"
    elif all("own_samples_ns" in r for r in procs):
        key = "own_samples_ns"
    elif all("cpu_samples_ns" in r and "runqueue_ns" not in r for r in procs):
        key = "cpu_samples_ns"
    return [min(c[key]) for c, _ in done], [min(h[key]) for _, h in done]
