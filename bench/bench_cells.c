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
 * usage: bench_cells [--cells N] [--records N] [--payload-mb MB] [--quick]
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

int main(int argc, char **argv)
{
    int cells = 200, records = 100000, payload_mb = 2048;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            cells = 50;
            records = 100000;
            payload_mb = 512;
        } else if (!strcmp(argv[i], "--cells") && i + 1 < argc) {
            cells = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--records") && i + 1 < argc) {
            records = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--payload-mb") && i + 1 < argc) {
            payload_mb = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_cells [--cells N] [--records N] [--payload-mb MB] "
                            "[--quick]\n");
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
    double bare = bare_loop(c.dir, "fake:hello_end", cells, &bytes);
    double capd = through_capd(&c, "fake:hello_end", cells / 4, 2, "1111111");
    printf("overhead: %d cells: capd %.3f s, bare fork/exec/wait loop %.3f s\n", cells, capd, bare);
    printf("overhead: capd adds %.2f ms per cell (target <= 5 ms); ratio capd/bare %.2f\n",
           (capd - bare) * 1000.0 / cells, capd / bare);

    /* Each measurement starts on a fresh capd and data dir: a WAL left by
     * the one before would be checkpointed in the background during the
     * next (copy and fsync beside its ingest), which is the one before's
     * cost, not the next one's. */
    if (restart_capd(&c) != 0)
        return 1;

    /* Ingest of small records. */
    char model[64];
    snprintf(model, sizeof model, "fake:stream__%d", records);
    double rb = bare_loop(c.dir, model, 1, &bytes);
    double rc = through_capd(&c, model, 1, 1, "2222222");
    printf("ingest records: %d stats-only tensor frames (%.1f MB of headers): capd %.3f s = "
           "%.0f records/s (target >= 200000); drain-only reader %.3f s = %.0f records/s; "
           "ratio %.2f\n",
           records, bytes / 1e6, rc, records / rc, rb, records / rb, rb / rc);

    if (restart_capd(&c) != 0)
        return 1;

    /* Ingest of payload bytes. */
    snprintf(model, sizeof model, "fake:payload__%d", payload_mb);
    double pb = bare_loop(c.dir, model, 1, &bytes);
    double pc = through_capd(&c, model, 1, 1, "3333333");
    double mb = bytes / 1e6;
    printf("ingest payload: %.0f MB of 1 MiB full payloads: capd %.3f s = %.0f MB/s; "
           "drain-only reader %.3f s = %.0f MB/s; capd at %.0f%% of the raw pipe rate "
           "(target >= 25%%)\n",
           mb, pc, mb / pc, pb, mb / pb, 100.0 * pb / pc);
    tu_capd_stop(&c);
    tu_sh("rm -rf '%s'", c.dir);
    return 0;
}
