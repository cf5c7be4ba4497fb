"""The paired verdict of a cell's pairs so far, for the round rule.

A paired head cell (docs/runner.md, "Paired timing") times
``options.timing_pairs`` pairs a round and, while the pairs so far give
``unknown``, another round, up to ``options.max_timing_rounds``. This is
the same decision as capd's comparison (compare/perf.c: Wilcoxon
signed-rank on the per-pair log ratios of the process medians, a 99%
percentile bootstrap over the pairs, the spread 1.4826 MAD of the log
ratios) at the comparison's defaults (perf_threshold 0.05, alpha 0.01,
2000 resamples). Only the stopping rule uses it: the verdict a comparison
reports is capd's, at the comparison's own options, on all the pairs.
"""

import math
import random

THRESHOLD = 0.05
ALPHA = 0.01
RESAMPLES = 2000
EXACT_MAX = 60


def median(v):
    s = sorted(v)
    n = len(s)
    if n == 0:
        return float("nan")
    if n % 2:
        return float(s[n // 2])
    return (s[n // 2 - 1] + s[n // 2]) / 2.0


def _exact_p(n, w):
    top = n * (n + 1) // 2
    c = [0] * (top + 1)
    c[0] = 1
    for r in range(1, n + 1):
        for k in range(top, r - 1, -1):
            c[k] += c[k - r]
    lo = sum(c[k] for k in range(top + 1) if k <= w)
    hi = sum(c[k] for k in range(top + 1) if k >= w)
    return min(1.0, 2.0 * min(lo, hi) / float(2 ** n))


def signed_rank_p(d):
    """Two-sided p of the Wilcoxon signed-rank test of d (zeros dropped);
    (p, number of non-zero differences)."""
    v = sorted((abs(x), x > 0) for x in d if x != 0)
    m = len(v)
    w = tie = 0.0
    i = 0
    while i < m:
        j = i
        while j + 1 < m and v[j + 1][0] == v[i][0]:
            j += 1
        rank = (i + j) / 2.0 + 1.0
        t = float(j - i + 1)
        tie += t * t * t - t
        w += sum(rank for k in range(i, j + 1) if v[k][1])
        i = j + 1
    if m == 0:
        return 1.0, 0
    if m <= EXACT_MAX and tie == 0:
        return _exact_p(m, w), m
    mean = m * (m + 1) / 4.0
    var = m * (m + 1) * (2 * m + 1) / 24.0 - tie / 48.0
    if var <= 0:
        return 1.0, m
    z = (abs(w - mean) - 0.5) / math.sqrt(var)
    return (min(1.0, math.erfc(z / math.sqrt(2.0))) if z > 0 else 1.0), m


def _percentile(s, q):
    h = q * (len(s) - 1)
    k = int(h)
    t = h - k
    if k + 1 >= len(s) or t == 0:
        return s[k]
    return s[k] + (s[k + 1] - s[k]) * t


def verdict(control, head, threshold=THRESHOLD, alpha=ALPHA, resamples=RESAMPLES):
    """The verdict of pairs (control[i], head[i]) of process medians."""
    n = len(control)
    logr = [math.log(h / c) if c > 0 and h > 0 else 0.0 for c, h in zip(control, head)]
    p, m = signed_rank_p(logr)
    if n == 0 or min(1.0, 2.0 / 2.0 ** min(m, 1000)) >= alpha:
        return "insufficient_data"
    if n >= 3:
        med = median(logr)
        if math.expm1(1.4826 * median([abs(x - med) for x in logr])) > threshold:
            return "unstable"
    rng = random.Random(0)
    ratios = sorted(math.exp(median([logr[rng.randrange(n)] for _ in range(n)]))
                    for _ in range(resamples))
    lo, hi = _percentile(ratios, 0.005), _percentile(ratios, 0.995)
    if p < alpha and lo > 1.0 + threshold:
        return "regression"
    if p < alpha and hi < 1.0 - threshold:
        return "improvement"
    if lo >= 1.0 - threshold and hi <= 1.0 + threshold:
        return "same"
    return "unknown"


def wants_more(control, head):
    """Whether another round may settle what these pairs leave open."""
    return verdict(control, head) in ("unknown", "insufficient_data")
