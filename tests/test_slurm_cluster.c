/*
 * tests/test_slurm_cluster.c - daemon/slurm/slurm.h against a real one-node
 * Slurm (tests/slurm/cluster.sh: munged, slurmctld, slurmd under the
 * test's temp dir), through the real sbatch, squeue, scontrol and scancel:
 * an array that completes, a task that exits 3, a task cancelled while it
 * runs, a constraint no node has, and a query of many jobs that is one
 * squeue (plus one scontrol once they have left squeue). Each test starts
 * its own cluster and stops it in the fini, failed or not; a host that
 * cannot run Slurm (not root, no slurm-wlm) skips with the script's
 * reason. TIMEOUT is left to test_slurm's table: Slurm's shortest time
 * limit is a minute.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/slurm/slurm.h"
#include "tests/helpers/common/testutil.h"

static char *root; /* the test's temp dir */
static char *dir;  /* the cluster's, root/c */
static char conf[4096];

static void cluster_fini(void)
{
    if (!root)
        return;
    if (dir)
        tu_sh("%s/tests/slurm/cluster.sh down %s >/dev/null 2>&1", tu_bin("CAPD_SOURCE_DIR"), dir);
    tu_sh("rm -rf %s", root);
    free(root);
    free(dir);
    root = dir = NULL;
}

TestSuite(slurm_cluster, .fini = cluster_fini);

/* Starts the cluster, or skips the test with cluster.sh's reason. */
static struct slurm_ctx cluster_up(void)
{
    root = tu_tmpdir();
    cr_assert_not_null(root);
    cr_assert(asprintf(&dir, "%s/c", root) > 0);
    int st = tu_sh("%s/tests/slurm/cluster.sh up %s >%s/up.log 2>&1", tu_bin("CAPD_SOURCE_DIR"),
                   dir, root);
    char log[4200];
    snprintf(log, sizeof(log), "%s/up.log", root);
    char *why = tu_slurp(log);
    if (st == 77)
        cr_skip_test("%s", why);
    cr_assert_eq(st, 0, "cluster.sh up exited %d:\n%s", st, why);
    free(why);
    snprintf(conf, sizeof(conf), "%s/slurm.conf", dir);
    /* cluster.sh's env file names the same file. */
    char envf[4200];
    snprintf(envf, sizeof(envf), "%s/env", dir);
    char *env = tu_slurp(envf);
    cr_assert(strncmp(env, "SLURM_CONF=", 11) == 0 && strstr(env, conf), "env: %s", env);
    free(env);
    return (struct slurm_ctx){.slurm_conf = conf, .timeout_ms = 30000, .out_max = 1 << 20};
}

/* A script under the cluster dir running BODY with /bin/sh. */
static char *script(const char *name, const char *body)
{
    char *p = NULL;
    cr_assert(asprintf(&p, "%s/%s.sh", dir, name) > 0);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fprintf(f, "#!/bin/sh\n%s\n", body);
    fclose(f);
    chmod(p, 0755);
    return p;
}

static uint32_t submit(struct slurm_ctx *ctx, const char *path, int array_last)
{
    char out[4200];
    snprintf(out, sizeof(out), "%s/out-%%A_%%a.txt", dir);
    struct slurm_submit s = {.job_name = "capd-test",
                             .script = path,
                             .array_last = array_last,
                             .output = out,
                             .workdir = dir};
    uint32_t id = 0;
    char *err = NULL;
    cr_assert_eq(slurm_submit(ctx, &s, &id, &err), 0, "%s", err);
    cr_assert_gt(id, 0);
    return id;
}

/* Polls W until every row has left the running states (a wait with a
 * bound, not a timing: the bound only stops a stuck cluster). */
static void wait_done(struct slurm_ctx *ctx, struct slurm_job_state *w, size_t n)
{
    double until = tu_now_s() + 60;
    for (;;) {
        char *err = NULL;
        cr_assert_eq(slurm_query(ctx, w, n, &err), 0, "%s", err);
        size_t done = 0;
        for (size_t i = 0; i < n; i++) {
            struct slurm_mapped m;
            slurm_state_map(w[i].state, w[i].reason, w[i].exit_code, w[i].signal, &m);
            if (w[i].known && m.verdict != SLURM_V_RUNNING)
                done++;
        }
        if (done == n)
            return;
        cr_assert_lt(tu_now_s(), until, "jobs not finished in 60 s (first: %s %s)", w[0].state,
                     w[0].reason);
        usleep(200 * 1000);
    }
}

Test(slurm_cluster, array_completes_and_queries_are_one_call)
{
    struct slurm_ctx ctx = cluster_up();
    char *body = NULL;
    cr_assert(asprintf(&body, "echo task $SLURM_ARRAY_TASK_ID > %s/t$SLURM_ARRAY_TASK_ID", dir) >
              0);
    char *p = script("array", body);
    uint32_t id = submit(&ctx, p, 1);
    struct slurm_job_state w[2] = {{.job_id = id, .task_id = 0}, {.job_id = id, .task_id = 1}};
    unsigned long before = atomic_load(&ctx.spawns);
    char *err = NULL;
    cr_assert_eq(slurm_query(&ctx, w, 2, &err), 0, "%s", err);
    unsigned long one = atomic_load(&ctx.spawns) - before;
    /* Listed by squeue (pending or running): one call; already gone from
     * it: one squeue and one scontrol. Never one per job. */
    cr_assert(one == 1 || (one == 2 &&
                           (!strcmp(w[0].state, "COMPLETED") || !strcmp(w[1].state, "COMPLETED"))),
              "%lu spawns for one query", one);
    wait_done(&ctx, w, 2);
    before = atomic_load(&ctx.spawns);
    cr_assert_eq(slurm_query(&ctx, w, 2, &err), 0, "%s", err);
    cr_assert_eq(atomic_load(&ctx.spawns) - before, 2, "finished jobs: squeue, then scontrol");
    for (int i = 0; i < 2; i++) {
        cr_assert(w[i].known && w[i].exit_known && w[i].job_id == id && w[i].task_id == i);
        cr_assert_str_eq(w[i].state, "COMPLETED");
        cr_assert_eq(w[i].exit_code, 0);
        struct slurm_mapped m;
        slurm_state_map(w[i].state, w[i].reason, w[i].exit_code, w[i].signal, &m);
        cr_assert_eq(m.verdict, SLURM_V_ENDED);
        char f[4200], want[32];
        snprintf(f, sizeof(f), "%s/t%d", dir, i);
        snprintf(want, sizeof(want), "task %d\n", i);
        char *got = tu_slurp(f);
        cr_assert_str_eq(got, want);
        free(got);
    }
    free(body);
    free(p);
}

Test(slurm_cluster, exit_3_is_failed_with_3)
{
    struct slurm_ctx ctx = cluster_up();
    char *p = script("exit3", "exit 3");
    struct slurm_job_state w[1] = {{.job_id = submit(&ctx, p, -1), .task_id = -1}};
    wait_done(&ctx, w, 1);
    cr_assert_str_eq(w[0].state, "FAILED");
    struct slurm_mapped m;
    slurm_state_map(w[0].state, w[0].reason, w[0].exit_code, w[0].signal, &m);
    cr_assert_eq(m.verdict, SLURM_V_FAILED);
    cr_assert_eq(m.exit_code, 3);
    cr_assert_str_eq(m.reason, "slurm: the worker exited 3");
    free(p);
}

Test(slurm_cluster, cancelled_while_running)
{
    struct slurm_ctx ctx = cluster_up();
    char *body = NULL;
    cr_assert(asprintf(&body, "touch %s/started; sleep 120", dir) > 0);
    char *p = script("long", body);
    struct slurm_job_state w[2] = {{.job_id = submit(&ctx, p, 0), .task_id = 0}};
    char started[4200];
    snprintf(started, sizeof(started), "%s/started", dir);
    double until = tu_now_s() + 60;
    char *err = NULL;
    for (;;) {
        cr_assert_eq(slurm_query(&ctx, w, 1, &err), 0, "%s", err);
        if (!strcmp(w[0].state, "RUNNING") && access(started, F_OK) == 0)
            break;
        cr_assert_lt(tu_now_s(), until, "not running in 60 s: %s %s", w[0].state, w[0].reason);
        usleep(200 * 1000);
    }
    uint32_t ids[1] = {w[0].job_id};
    cr_assert_eq(slurm_cancel(&ctx, ids, NULL, 1, &err), 0, "%s", err);
    wait_done(&ctx, w, 1);
    cr_assert_str_eq(w[0].state, "CANCELLED");
    struct slurm_mapped m;
    slurm_state_map(w[0].state, w[0].reason, w[0].exit_code, w[0].signal, &m);
    cr_assert_eq(m.verdict, SLURM_V_CANCELLED, "%s", m.reason);
    free(body);
    free(p);
}

/* Slurm 22.05 refuses a constraint no node offers at submission
 * ("Invalid feature specification"), so the job never exists:
 * slurm_submit says -ENOTSUP, which the executor makes unsupported. */
Test(slurm_cluster, constraint_no_node_has_is_unsupported)
{
    struct slurm_ctx ctx = cluster_up();
    char *p = script("nofeature", "exit 0");
    struct slurm_submit s = {.script = p, .array_last = -1, .constraint = "capd_no_such_isa"};
    uint32_t id = 0;
    char *err = NULL;
    cr_assert_eq(slurm_submit(&ctx, &s, &id, &err), -ENOTSUP, "%s", err ? err : "accepted");
    cr_assert(strstr(err, "no Slurm node has the features 'capd_no_such_isa'"), "%s", err);
    cr_assert(strstr(err, "Invalid feature specification"), "%s", err);
    free(err);
    free(p);
}
