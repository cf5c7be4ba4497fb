/*
 * bench/bench_compare.c - throughput of the full-payload tensor comparison,
 * against numpy computing the same metrics on the same arrays.
 *
 * Build:  gcc -O2 -I. bench/bench_compare.c compare/[a-z]*.c -ljansson -lm
 * Run:    ./a.out [elements] [repetitions] [numpy-script]
 *
 * The arrays are written to a temporary file and bench_compare_numpy.py (run
 * with $CAPD_PYTHON, default /usr/bin/python3, single-threaded) computes the
 * metrics with numpy and prints them with its best time as JSON. Both sides
 * report best-of-N wall time; the metrics are cross-checked so the speed-up
 * is for the same answer.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "compare/cmp.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static double uniform(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * 0x1p-53;
}

/*
 * A control that looks like an activation (roughly normal, some exact zeros
 * as after a ReLU) and a head that differs by float32 rounding noise, with a
 * sprinkling of larger errors so the percentile and the violation count have
 * something to find.
 */
static void make_data(float *head, float *control, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double g = (uniform() + uniform() + uniform() + uniform() - 2.0) * 1.7;
        float c = (float)(i % 7 == 0 ? 0.0 : g);
        double noise = (uniform() - 0.5) * 4e-7 * fabs(g);
        if (i % 997 == 0)
            noise += (uniform() - 0.5) * 1e-3;
        control[i] = c;
        head[i] = (float)(c + noise);
    }
}

static const char *default_script(void)
{
    static char path[4096];
    const char *f = __FILE__;
    const char *slash = strrchr(f, '/');
    if (slash == NULL)
        return "bench_compare_numpy.py";
    snprintf(path, sizeof(path), "%.*s/bench_compare_numpy.py", (int)(slash - f), f);
    return path;
}

static int check(const char *name, double c, double np_v, double tol)
{
    double err = fabs(c - np_v) / fmax(fabs(np_v), 1e-300);
    bool ok = (isinf(c) && isinf(np_v) && (c > 0) == (np_v > 0)) || err <= tol;
    printf("  %-20s C %-24.17g numpy %-24.17g %s\n", name, c, np_v, ok ? "ok" : "MISMATCH");
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : (size_t)16 << 20;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    const char *script = argc > 3 ? argv[3] : default_script();
    const char *py = getenv("CAPD_PYTHON") ? getenv("CAPD_PYTHON") : "/usr/bin/python3";
    int rc = 1;

    float *head = malloc(n * sizeof(float)), *control = malloc(n * sizeof(float));
    if (head == NULL || control == NULL || reps < 1) {
        fprintf(stderr, "bench: bad arguments or out of memory\n");
        return 1;
    }
    make_data(head, control, n);

    struct cmp_tensor h = {.key = "bench.0.forward.output.0",
                           .dtype = "float32",
                           .ndim = 1,
                           .numel = (int64_t)n,
                           .hash = "head",
                           .capture = CMP_CAPTURE_FULL,
                           .payload = head,
                           .payload_len = n * sizeof(float)};
    h.shape[0] = (int64_t)n;
    struct cmp_tensor c = h;
    c.hash = "control";
    c.payload = control;
    struct cmp_tol tol = {.atol = 1e-5, .rtol = 1.3e-6};
    struct cmp_scratch *s = NULL;
    struct cmp_metrics m;
    if (cmp_scratch_new(&s) < 0)
        return 1;

    double best = INFINITY;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        int e = cmp_tensor_compare(&h, &c, &tol, s, &m);
        double t = now() - t0;
        if (e < 0) {
            fprintf(stderr, "bench: cmp_tensor_compare: %s\n", strerror(-e));
            return 1;
        }
        best = t < best ? t : best;
    }
    printf("C:     %zu float32 elements, best of %d: %.4f s = %.3g elements/s\n", n, reps, best,
           (double)n / best);

    /* the 16-bit decoders, C only (numpy has no bfloat16) */
    uint16_t *h16 = malloc(n * 2), *c16 = malloc(n * 2);
    if (h16 && c16) {
        static const char *const names[2] = {"float16", "bfloat16"};
        for (int k = 0; k < 2; k++) {
            for (size_t i = 0; i < n; i++) {
                if (k == 0) {
                    _Float16 a = (_Float16)head[i], b = (_Float16)control[i];
                    memcpy(&h16[i], &a, 2);
                    memcpy(&c16[i], &b, 2);
                } else {
                    uint32_t a, b;
                    memcpy(&a, &head[i], 4);
                    memcpy(&b, &control[i], 4);
                    h16[i] = (uint16_t)(a >> 16);
                    c16[i] = (uint16_t)(b >> 16);
                }
            }
            struct cmp_tensor h2 = h, c2 = c;
            h2.dtype = c2.dtype = names[k];
            h2.payload = h16;
            c2.payload = c16;
            h2.payload_len = c2.payload_len = n * 2;
            double b16 = INFINITY;
            for (int r = 0; r < reps; r++) {
                double t0 = now();
                struct cmp_metrics m2;
                if (cmp_tensor_compare(&h2, &c2, &tol, s, &m2) < 0)
                    return 1;
                double t = now() - t0;
                b16 = t < b16 ? t : b16;
            }
            printf("C:     %zu %s elements, best of %d: %.4f s = %.3g elements/s\n", n, names[k],
                   reps, b16, (double)n / b16);
        }
    }
    free(h16);
    free(c16);

    /* hand the same arrays to numpy */
    char tmpl[] = "/tmp/bench_compare_XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd < 0) {
        perror("mkstemp");
        return 1;
    }
    FILE *f = fdopen(fd, "wb");
    int64_t n64 = (int64_t)n;
    bool wrote = f && fwrite(&n64, sizeof(n64), 1, f) == 1 &&
                 fwrite(head, sizeof(float), n, f) == n &&
                 fwrite(control, sizeof(float), n, f) == n;
    if (f == NULL || fclose(f) != 0 || !wrote) {
        fprintf(stderr, "bench: writing %s failed\n", tmpl);
        unlink(tmpl);
        return 1;
    }
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s' %d", py, script, tmpl, reps);
    FILE *p = popen(cmd, "r");
    static char out[65536];
    size_t got = p ? fread(out, 1, sizeof(out) - 1, p) : 0;
    out[got] = '\0';
    int st = p ? pclose(p) : -1;
    unlink(tmpl);
    json_error_t jerr;
    json_t *np = json_loads(out, 0, &jerr);
    if (st != 0 || np == NULL) {
        fprintf(stderr, "bench: numpy run failed (%s): %s\n", cmd, out);
        return 1;
    }
    double np_best = json_number_value(json_object_get(np, "seconds"));
    printf("numpy: best of %d: %.4f s = %.3g elements/s (numpy %s, single thread)\n", reps, np_best,
           (double)n / np_best, json_string_value(json_object_get(np, "numpy")));
    printf("speed-up C/numpy: %.2fx\n", np_best / best);

    int bad = 0;
    bad += check("max_abs", m.max_abs, json_number_value(json_object_get(np, "max_abs")), 0);
    bad += check("mean_abs", m.mean_abs, json_number_value(json_object_get(np, "mean_abs")), 1e-9);
    bad += check("p99_abs", m.p99_abs, json_number_value(json_object_get(np, "p99_abs")), 0);
    bad += check("max_rel", m.max_rel, json_number_value(json_object_get(np, "max_rel")), 0);
    bad += check("mean_rel", m.mean_rel, json_number_value(json_object_get(np, "mean_rel")), 1e-9);
    bad += check("allclose_violations", (double)m.allclose_violations,
                 json_number_value(json_object_get(np, "allclose_violations")), 0);
    bad += check("cosine", m.cosine, json_number_value(json_object_get(np, "cosine")), 1e-12);
    bad += check("sqnr_db", m.sqnr_db, json_number_value(json_object_get(np, "sqnr_db")), 1e-9);
    bad += check("nl2", m.nl2, json_number_value(json_object_get(np, "nl2")), 1e-9);
    bad += check("nan_one_sided", (double)m.nan_one_sided,
                 json_number_value(json_object_get(np, "nan_one_sided")), 0);
    bad += check("inf_one_sided", (double)m.inf_one_sided,
                 json_number_value(json_object_get(np, "inf_one_sided")), 0);
    rc = bad ? 1 : 0;
    if (bad)
        printf("%d metrics disagree\n", bad);
    json_decref(np);
    cmp_scratch_free(s);
    free(head);
    free(control);
    return rc;
}
