"""numpy reference for bench/bench_compare.c.

Reads the arrays bench_compare wrote (int64 n, then n float32 head values,
then n float32 control values, little-endian), computes the same metrics the
C engine computes, the idiomatic numpy way, and prints them with the best
wall time of N repetitions as one JSON object.

Usage: /usr/bin/python3 bench/bench_compare_numpy.py FILE [REPETITIONS]
"""
import os

# Single thread, like the C side: pin BLAS (np.dot) before numpy loads it.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ATOL = 1e-5
RTOL = 1.3e-6
EPS = 2.220446049250313e-16


def metrics(head, control):
    a = head.astype(np.float64)
    b = control.astype(np.float64)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    inf_a, inf_b = np.isinf(a), np.isinf(b)
    nan_one = int(np.count_nonzero(nan_a != nan_b))
    inf_one = int(np.count_nonzero((inf_a | inf_b) & ~(nan_a | nan_b) & (a != b)))
    fin = np.isfinite(a) & np.isfinite(b)
    if not fin.all():
        a, b = a[fin], b[fin]
    d = a - b
    ad = np.abs(d)
    ab = np.abs(b)
    rel = ad / np.maximum(ab, EPS)
    dd = np.dot(d, d)
    bb = np.dot(b, b)
    return {
        "max_abs": float(ad.max()),
        "mean_abs": float(ad.mean()),
        "p99_abs": float(np.percentile(ad, 99)),
        "max_rel": float(rel.max()),
        "mean_rel": float(rel.mean()),
        "allclose_violations": int(np.count_nonzero(ad > ATOL + RTOL * ab)),
        "cosine": float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))),
        "sqnr_db": float(10.0 * np.log10(bb / dd)) if dd > 0 else float("inf"),
        "nl2": float(np.sqrt(dd / bb)),
        "nan_one_sided": nan_one,
        "inf_one_sided": inf_one,
    }


def main():
    path = sys.argv[1]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    with open(path, "rb") as f:
        n = int(np.frombuffer(f.read(8), dtype="<i8")[0])
        head = np.frombuffer(f.read(4 * n), dtype="<f4")
        control = np.frombuffer(f.read(4 * n), dtype="<f4")
    best = float("inf")
    result = None
    for _ in range(reps):
        t0 = time.perf_counter()
        result = metrics(head, control)
        best = min(best, time.perf_counter() - t0)
    result["seconds"] = best
    result["numpy"] = np.__version__
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
