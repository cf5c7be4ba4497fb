/*
 * bench/bench_cells.c - what capd costs around a cell, measured against a
 * bare reference in the same run (machines here are shared and noisy, so
 * only ratios and same-run differences are meaningful).
 *
 *   overhead  N cells of a runner that writes hello+env+end and exits,
 *             through capd (POST to the last cell finished), against the
 *             same N spawns by a bare posix_spawn/wait loop that drains
 *             fd 3. Reports capd's added milliseconds per cell.
 *   ingest    one cell streaming 100k stats-only tensor frames, and one
 *             streaming 2 GiB of 1 MiB payloads, through capd (parse,
 *             validate, store), against a reader that only drains the same
 *             runner's pipe. Reports records/s, MB/s and the ratio.
 *
 * Each figure is the median of --reps runs (default 3; --quick: 1), each
 * on a fresh capd, sandwiched between runs of its reference (see sandwich).
 *
 * usage: bench_cells [--cells N] [--records N] [--payload-mb MB] [--reps N] [--quick]
 * The paths of capd and the fake runner come from CAPD_BIN and
 * CAPD_HELPER_DIR (bench/run sets them).
 */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers/common/testutil.h"

extern char **environ;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Runs the fake runner directly N times with MODEL, draining fd 3 into a
 * buffer that is thrown away: the floor any supervisor has to pay. */
static double bare_loop(const char *dir, const char *model, int n, unsigned long long *bytes)
{
    char spec[512], envs[600];
    snprintf(spec, sizeof spec, "%s/bare-spec.json", dir);
    FILE *f = fopen(spec, "w");
    if (!f)
        return -1;
    fprintf(f,
            "{\"protocol\":1,\"job\":\"jbare\",\"cell\":\"cbare\",\"attempt\":1,\"model\":\"%s\","
            "\"width\":\"avx2\",\"pass\":\"forward\",\"device\":\"cpu\",\"frame_fd\":3,"
            "\"scratch\":\"%s\",\"model_roots\":[],\"options\":{\"iterations\":20,\"warmup\":3,"
            "\"threads\":1,\"timeout_s\":600,\"capture\":\"stats\",\"seed\":0,\"batch\":2,"
            "\"dtype\":\"float32\",\"sample_size\":256,\"max_payload_bytes\":8589934592}}",
            model, dir);
    fclose(f);
    snprintf(envs, sizeof envs, "CAPD_CELL_SPEC=%s", spec);
    char *env[] = {envs, "PATH=/usr/bin:/bin", NULL};
    char *fake = tu_helper("fake_runner");
    char *argv[] = {fake, "-m", "capd_runner", NULL};
    static char buf[1 << 20];
    *bytes = 0;
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) != 0)
            return -1;
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, p[1], 3);
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        pid_t pid;
        if (posix_spawn(&pid, fake, &fa, NULL, argv, env) != 0)
            return -1;
        posix_spawn_file_actions_destroy(&fa);
        close(p[1]);
        ssize_t r;
        while ((r = read(p[0], buf, sizeof buf)) > 0)
            *bytes += (unsigned long long)r;
        close(p[0]);
        int st;
        waitpid(pid, &st, 0);
    }
    double t = now_s() - t0;
    free(fake);
    return t;
}

/* Submits one job whose models are MODEL__0..MODEL__n-1 (x passes) and
 * returns the seconds from POST to the job being done. */
static double through_capd(struct tu_capd *c, const char *model, int nmodels, int npasses,
                           const char *commit)
{
    size_t cap = (size_t)nmodels * 64 + 512;
    char *body = malloc(cap);
    size_t o = (size_t)snprintf(body, cap,
                                "{\"project\":\"bench\",\"commit\":\"%s\",\"build\":\"fake\","
                                "\"matrix\":{\"models\":[",
                                commit);
    /* Model names must be unique in a matrix: fake:X__i runs behavior X
     * (the fake runner ignores an argument it does not use). */
    for (int i = 0; i < nmodels; i++) {
        if (nmodels == 1)
            o += (size_t)snprintf(body + o, cap - o, "\"%s\"", model);
        else
            o += (size_t)snprintf(body + o, cap - o, "%s\"%s__%d\"", i ? "," : "", model, i);
    }
    /* More than one model: two widths too, so 200 cells fit the per-axis
     * limit (50 models x 2 widths x 2 passes). */
    snprintf(body + o, cap - o, "],\"widths\":[%s],\"passes\":[%s]}}",
             nmodels > 1 ? "\"avx2\",\"default\"" : "\"avx2\"",
             npasses == 2 ? "\"forward\",\"backward\"" : "\"forward\"");
    double t0 = now_s();
    long st = 0;
    json_t *j = tu_json(c, "POST", "/v1/jobs", body, &st);
    free(body);
    if (st != 201) {
        fprintf(stderr, "bench: POST /v1/jobs: %ld %s\n", st, json_dumps(j, 0));
        exit(1);
    }
    char id[32];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(j, "id")));
    json_decref(j);
    json_t *done = tu_wait_job(c, id, 3600);
    double t = now_s() - t0;
    if (!done) {
        fprintf(stderr, "bench: job %s did not finish\n", id);
        exit(1);
    }
    json_t *cell;
    size_t i;
    json_array_foreach(json_object_get(done, "cells"), i, cell)
    {
        if (strcmp(json_string_value(json_object_get(cell, "state")), "ok") != 0) {
            fprintf(stderr, "bench: cell %s ended %s: %s\n",
                    json_string_value(json_object_get(cell, "model")),
                    json_string_value(json_object_get(cell, "state")),
                    json_string_value(json_object_get(cell, "reason")));
            exit(1);
        }
    }
    json_decref(done);
    return t;
}

/* capd on a new data dir, with the fake runner registered as build "fake". */
static int fresh_capd(struct tu_capd *c)
{
    const char *extra[] = {"--log-level", "warn", NULL};
    if (tu_capd_start(c, NULL, extra) != 0 || tu_fake_build(c, "fake", NULL) != 201) {
        fprintf(stderr, "bench: cannot start capd (CAPD_BIN=%s)\n", tu_bin("CAPD_BIN"));
        return -1;
    }
    return 0;
}

static int restart_capd(struct tu_capd *c)
{
    tu_capd_stop(c);
    tu_sh("rm -rf '%s'", c->dir);
    return fresh_capd(c);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct sandwich {
    double capd, ref, ratio, diff; /* medians over the repetitions */
    char list[128];                /* the per-run ratios, in run order */
};

#define MAX_REPS 9

/*
 * REPS runs of MODEL through capd, each on a fresh capd and data dir (a WAL
 * left by the run before would be checkpointed in the background during the
 * next one: the previous run's cost, not this one's), sandwiched between
 * runs of the bare reference (bare, capd, bare, ..., capd, bare): each capd
 * run is compared with the mean of the two reference runs around it, which
 * cancels a load that drifts, and the medians of the per-run figures are
 * kept. NMODELS > 1: the cells are MODEL__0.. (x NPASSES), BARE_N spawns.
 */
static struct sandwich sandwich(struct tu_capd *c, int reps, const char *model, int bare_n,
                                int nmodels, int npasses, unsigned long long *bytes)
{
    double capd[MAX_REPS], ref[MAX_REPS], ratio[MAX_REPS], diff[MAX_REPS];
    struct sandwich out;
    size_t o = 0;
    double before = bare_loop(c->dir, model, bare_n, bytes);
    for (int i = 0; i < reps; i++) {
        if (restart_capd(c) != 0)
            exit(1);
        char commit[16];
        snprintf(commit, sizeof commit, "%07d", 1000 + i);
        capd[i] = through_capd(c, model, nmodels, npasses, commit);
        double after = bare_loop(c->dir, model, bare_n, bytes);
        ref[i] = (before + after) / 2;
        ratio[i] = capd[i] / ref[i];
        diff[i] = capd[i] - ref[i];
        before = after;
        o += (size_t)snprintf(out.list + o, sizeof out.list - o, "%s%.2f", i ? "/" : "", ratio[i]);
    }
    out.capd = median(capd, reps);
    out.ref = median(ref, reps);
    out.ratio = median(ratio, reps);
    out.diff = median(diff, reps);
    return out;
}

int main(int argc, char **argv)
{
    int cells = 200, records = 100000, payload_mb = 2048, reps = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            cells = 50;
            records = 100000;
            payload_mb = 512;
            reps = 1;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1 || reps > MAX_REPS) {
                fprintf(stderr, "bench: --reps must be 1..%d\n", MAX_REPS);
                return 2;
            }
        } else if (!strcmp(argv[i], "--cells") && i + 1 < argc) {
            cells = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--records") && i + 1 < argc) {
            records = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--payload-mb") && i + 1 < argc) {
            payload_mb = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_cells [--cells N] [--records N] [--payload-mb MB] "
                            "[--reps N] [--quick]\n");
            return 2;
        }
    }
    cells = (cells + 3) / 4 * 4;
    struct tu_capd c;
    if (fresh_capd(&c) != 0)
        return 1;
    unsigned long long bytes = 0;

    /* Per-cell overhead. Warm both paths once so neither pays for cold
     * page cache alone. */
    bare_loop(c.dir, "fake:hello_end", 5, &bytes);
    through_capd(&c, "fake:hello_end", 1, 1, "0000000");
    struct sandwich o = sandwich(&c, reps, "fake:hello_end", cells, cells / 4, 2, &bytes);
    printf("overhead: %d cells: capd %.3f s, bare fork/exec/wait loop %.3f s\n", cells, o.capd,
           o.ref);
    printf("overhead: capd adds %.2f ms per cell (target <= 5 ms); ratio capd/bare %.2f\n",
           o.diff * 1000.0 / cells, o.ratio);

    /* Ingest of small records. */
    char model[64];
    snprintf(model, sizeof model, "fake:stream__%d", records);
    struct sandwich r = sandwich(&c, reps, model, 1, 1, 1, &bytes);
    printf("ingest records: %d stats-only tensor frames (%.1f MB of headers): capd %.3f s = "
           "%.0f records/s (target >= 200000); drain-only reader %.3f s = %.0f records/s; "
           "ratio %.2f\n",
           records, bytes / 1e6, r.capd, records / r.capd, r.ref, records / r.ref, 1.0 / r.ratio);

    /* Ingest of payload bytes. */
    snprintf(model, sizeof model, "fake:payload__%d", payload_mb);
    struct sandwich pl = sandwich(&c, reps, model, 1, 1, 1, &bytes);
    double mb = bytes / 1e6;
    printf("ingest payload: %.0f MB of 1 MiB full payloads: capd %.3f s = %.0f MB/s; "
           "drain-only reader %.3f s = %.0f MB/s; capd at %.0f%% of the raw pipe rate "
           "(target >= 25%%)\n",
           mb, pl.capd, mb / pl.capd, pl.ref, mb / pl.ref, 100.0 / pl.ratio);
    printf("repetitions: %d of each (reference, capd, reference, ...), medians; per-run "
           "ratios capd/reference: overhead %s, records %s, payload %s\n",
           reps, o.list, r.list, pl.list);
    tu_capd_stop(&c);
    tu_sh("rm -rf '%s'", c.dir);
    return 0;
}
