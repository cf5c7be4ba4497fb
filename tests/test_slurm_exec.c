/*
 * tests/test_slurm_exec.c - executor "slurm" against a real one-node Slurm
 * (tests/slurm/cluster.sh) and a real capd: every attempt is a task of an
 * sbatch array running capd-cell on the node, streaming back over HTTP. Cells of the
 * fake runner end ok (records equal, hash for hash, the same cell's on the
 * local executor), crashed (the records before the crash kept), timeout
 * and cancelled (the Slurm job gone); a width whose CPU features no node
 * has (the node is started without avx512bw) is unsupported with sbatch's
 * reason; a cell of Debian's torch gives the local executor's records bit
 * for bit; capd killed -9 mid-cell takes the same attempt and Slurm job
 * up again; a cell over its memory limit is oom; three cells are one job
 * array; the node dying (slurmd killed) or set DOWN requeues the cell; a
 * runner killed from outside is asked of Slurm before it counts; and
 * a poll that fails backs off. The cluster and capd are stopped in the
 * fini, failed or not; a host that cannot run Slurm skips with
 * cluster.sh's reason.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/testutil.h"

static char *root, *cdir;
static struct tu_capd capd;
static bool capd_up;

static void fini(void)
{
    if (capd_up)
        af_stop_own_capd(&capd);
    capd_up = false;
    if (cdir)
        tu_sh("%s/tests/slurm/cluster.sh down %s >/dev/null 2>&1", tu_bin("CAPD_SOURCE_DIR"), cdir);
    if (root)
        tu_sh("rm -rf %s", root);
    free(root);
    free(cdir);
    root = cdir = NULL;
}

TestSuite(slurm_exec, .fini = fini, .timeout = 600);

/* The cluster, then capd with executor slurm on it and the fake build.
 * The node never has avx512bw (CAPD_SLURM_FEATURES_HIDE), so width avx512
 * is one no node offers, whatever this host's CPU has. */
static void up(void)
{
    root = tu_tmpdir();
    cr_assert(asprintf(&cdir, "%s/c", root) > 0);
    int st = tu_sh("CAPD_SLURM_FEATURES_HIDE=avx512bw %s/tests/slurm/cluster.sh up %s "
                   ">%s/up.log 2>&1",
                   tu_bin("CAPD_SOURCE_DIR"), cdir, root);
    char log[600];
    snprintf(log, sizeof log, "%s/up.log", root);
    char *why = tu_slurp(log);
    if (st == 77)
        cr_skip_test("%s", why);
    cr_assert_eq(st, 0, "cluster.sh up exited %d:\n%s", st, why);
    free(why);
    char cfg[600], text[1400];
    snprintf(cfg, sizeof cfg, "%s/capd.json", root);
    snprintf(text, sizeof text,
             "{\"executor\": \"slurm\", \"slurm_conf\": \"%s/slurm.conf\", \"slurm_poll_ms\": 300, "
             "\"max_parallel\": 3, "
             "\"slurm_worker\": \"%s\", \"slurm_workdir\": \"%s\"}",
             cdir, tu_bin("CAPD_CELL_BIN"), root);
    af_put_file(cfg, text);
    const char *extra[] = {"--config", cfg, NULL};
    af_start_capd(&capd, NULL, extra);
    capd_up = true;
    cr_assert_eq(tu_fake_build(&capd, "fake", NULL), 201);
}

/* Waits (SECONDS at most) until capd's log has EVENT; fails the test else. */
static void wait_for_log_within(const char *event, int seconds)
{
    char *log = NULL;
    for (int i = 0; i < seconds * 10; i++) {
        free(log);
        log = tu_slurp(capd.errlog);
        if (strstr(log, event))
            break;
        usleep(100 * 1000);
    }
    size_t n = strlen(log);
    cr_assert(strstr(log, event), "capd logged %s: ...%s", event, n > 2000 ? log + n - 2000 : log);
    free(log);
}

static void wait_for_log(const char *event)
{
    wait_for_log_within(event, 30);
}

/* up(), and a job of one cell of MODEL (the JSON string) whose worker
 * runs on the node (its id, owned). */
static char *cell_running(const char *model)
{
    up();
    struct af_job job = {"t", "abcdef1", NULL, "fake", model, "\"avx2\"", "\"forward\"", NULL};
    char *id = af_submit_job(&capd, &job);
    wait_for_log("cell_remote_started");
    return id;
}

static char *slow_cell_running(void)
{
    return cell_running("\"fake:slow__4000\"");
}

/* The job's cell (owned) once the job ended, and its log in *LOG (owned). */
static json_t *ended_cell(const char *job, char **log)
{
    json_decref(af_wait_job(&capd, job, 240));
    char path[160];
    json_t *j = NULL;
    for (int i = 0; i < 100; i++) {
        json_decref(j);
        snprintf(path, sizeof path, "/v1/jobs/%s", job);
        j = tu_json(&capd, "GET", path, NULL, NULL);
        if (strcmp(tu_str(json_array_get(json_object_get(j, "cells"), 0), "state"), "running"))
            break;
        usleep(100 * 1000);
    }
    json_t *cell = json_incref(json_array_get(json_object_get(j, "cells"), 0));
    json_decref(j);
    snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s/log", job, tu_str(cell, "id"));
    struct tu_resp lr;
    cr_assert_eq(tu_http(&capd, "GET", path, NULL, 0, NULL, &lr), 0);
    *log = strdup(lr.body ? lr.body : "");
    tu_resp_free(&lr);
    return cell;
}

/* Fails the test unless the cell of JOB ends ok on attempt ATTEMPTS. */
static void expect_ok_on_attempt(const char *job, json_int_t attempts)
{
    char *log = NULL;
    json_t *cell = ended_cell(job, &log);
    cr_assert_str_eq(tu_str(cell, "state"), "ok", "%s\nlog: %s", af_dump(cell), log);
    cr_assert_eq(json_integer_value(json_object_get(cell, "attempts")), attempts, "%s",
                 af_dump(cell));
    json_decref(cell);
    free(log);
}

/* Fails the test unless capd has logged a requeue for a node's failure. */
static void expect_node_fail_requeue(void)
{
    char *clog = tu_slurp(capd.errlog);
    cr_assert(strstr(clog, "NODE_FAIL"), "capd requeued for the node's failure: %s", clog);
    free(clog);
}

/* One cell of MODEL (fake build, width WIDTH) with OPTIONS; ends in STATE. */
static json_t *run_cell(const char *model, const char *width, const char *options,
                        const char *state, char **job_out)
{
    struct af_job job = {"t", "abcdef1", NULL, "fake", NULL, NULL, "\"forward\"", options};
    char models[128], widths[64];
    snprintf(models, sizeof models, "\"%s\"", model);
    snprintf(widths, sizeof widths, "\"%s\"", width);
    job.models = models;
    job.widths = widths;
    char *id = af_submit_job(&capd, &job);
    char *log = NULL;
    json_t *cell = ended_cell(id, &log);
    cr_assert_str_eq(tu_str(cell, "state"), state, "%s at %s: %s\nlog: %s", model, width,
                     af_dump(cell), log);
    free(log);
    *job_out = id;
    return cell;
}

Test(slurm_exec, cells_end_through_slurm_as_they_do_locally)
{
    up();
    char *job = NULL;
    json_t *cell = run_cell("fake:ok__5", "avx2", NULL, "ok", &job);
    af_expect_local_records(&capd, job, tu_str(cell, "id"), "fake:ok__5",
                            "the records through Slurm");
    json_decref(cell);
    free(job);

    cell = run_cell("fake:segv", "avx2", NULL, "crashed", &job);
    json_t *t = af_cell_records(&capd, job, tu_str(cell, "id"), "tensor");
    cr_assert_eq(json_array_size(t), 2, "the records before the crash are kept");
    json_decref(t);
    json_decref(cell);
    free(job);

    json_decref(run_cell("fake:hang", "avx2", "{\"timeout_s\":2}", "timeout", &job));
    free(job);

    /* over the job's memory limit: capd-cell's watchdog kills the runner
     * on the node (sbatch asked --mem for it), the cell is oom */
    cell = run_cell("fake:memhog__512", "avx2", "{\"memory_max_bytes\":67108864}", "oom", &job);
    const char *reason = tu_str(cell, "reason");
    cr_assert(strstr(reason, "limit 67108864 bytes") && strstr(reason, "capd-cell's watchdog"),
              "%s", reason);
    json_int_t peak = json_integer_value(json_object_get(cell, "peak_rss_bytes"));
    cr_assert(peak > 32 << 20 && peak < 256 << 20, "stopped near its limit: %lld", (long long)peak);
    cr_assert_eq(json_integer_value(json_object_get(cell, "memory_limit_bytes")), 67108864);
    json_decref(cell);
    free(job);

    /* a width no node offers (up() hides avx512bw): sbatch refuses its
     * constraint, and capd's own CPU is not asked */
    cell = run_cell("fake:ok", "avx512", NULL, "unsupported", &job);
    cr_assert(strstr(tu_str(cell, "reason"), "sbatch"), "%s", af_dump(cell));
    json_decref(cell);
    free(job);
}

/* The cells one scheduler pass starts are one sbatch: an array whose
 * task i runs attempt i, each cell's log naming its task. */
Test(slurm_exec, a_batch_of_cells_is_one_job_array)
{
    up();
    struct af_job job = {
        "t",        "abcdef1",     NULL, "fake", "\"fake:ok__3\",\"fake:ok__4\",\"fake:ok__5\"",
        "\"avx2\"", "\"forward\"", NULL};
    char *id = af_submit_job(&capd, &job), path[160];
    json_decref(af_wait_job(&capd, id, 240));
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    json_t *j = tu_json(&capd, "GET", path, NULL, NULL);
    json_t *cells = json_object_get(j, "cells");
    cr_assert_eq(json_array_size(cells), 3, "%s", af_dump(j));
    unsigned array = 0, tasks = 0;
    for (size_t i = 0; i < 3; i++) {
        json_t *c = json_array_get(cells, i);
        cr_assert_str_eq(tu_str(c, "state"), "ok", "%s", af_dump(c));
        snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s/log", id, tu_str(c, "id"));
        struct tu_resp lr;
        cr_assert_eq(tu_http(&capd, "GET", path, NULL, 0, NULL, &lr), 0);
        const char *at = lr.body ? strstr(lr.body, "[capd: Slurm job ") : NULL;
        unsigned a = 0, t = 0;
        cr_assert(at && sscanf(at, "[capd: Slurm job %u_%u]", &a, &t) == 2, "log: %s", lr.body);
        tu_resp_free(&lr);
        cr_assert(i == 0 || a == array, "one array for the three cells: %u and %u", array, a);
        array = a;
        cr_assert_lt(t, 3);
        cr_assert_eq(tasks & (1u << t), 0, "task %u twice", t);
        tasks |= 1u << t;
    }
    json_decref(j);
    char *clog = tu_slurp(capd.errlog);
    cr_assert(strstr(clog, "slurm_array_submitted") && strstr(clog, "tasks=3 throttle=3"),
              "one sbatch of 3 tasks, throttled to max_parallel: %s", clog);
    free(clog);
    free(id);
}

Test(slurm_exec, cancel_scancels_the_job)
{
    up();
    struct af_job job = {"t",        "abcdef1",     NULL, "fake", "\"fake:hang\"",
                         "\"avx2\"", "\"forward\"", NULL};
    char *id = af_submit_job(&capd, &job);
    /* running on the node: the worker has fetched its spec */
    char path[160], *log = NULL;
    for (int i = 0; i < 300; i++) {
        snprintf(path, sizeof path, "/v1/jobs/%s", id);
        json_t *j = tu_json(&capd, "GET", path, NULL, NULL);
        const char *cid = tu_str(json_array_get(json_object_get(j, "cells"), 0), "id");
        snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s/log", id, cid);
        json_decref(j);
        struct tu_resp lr;
        cr_assert_eq(tu_http(&capd, "GET", path, NULL, 0, NULL, &lr), 0);
        bool started = lr.body && strstr(lr.body, "Slurm job");
        tu_resp_free(&lr);
        if (started && tu_sh("SLURM_CONF=%s/slurm.conf squeue -h -t R | grep -q capd-", cdir) == 0)
            break;
        usleep(100 * 1000);
    }
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
    long st = 0;
    json_decref(tu_json(&capd, "POST", path, "{}", &st));
    json_t *cell = ended_cell(id, &log);
    cr_assert_str_eq(tu_str(cell, "state"), "cancelled", "%s\nlog: %s", af_dump(cell), log);
    int left = 1;
    for (int i = 0; i < 100 && left; i++) {
        left = tu_sh("SLURM_CONF=%s/slurm.conf squeue -h | grep -q capd-", cdir) == 0;
        usleep(100 * 1000);
    }
    cr_assert(!left, "the Slurm job was cancelled");
    json_decref(cell);
    free(log);
    free(id);
}

Test(slurm_exec, a_torch_cell_through_slurm_is_bit_identical_to_local)
{
    up();
    long st = 0;
    json_decref(tu_jsonf(&capd, "POST", "/v1/builds", &st, "{\"name\":\"torch\",\"python\":\"%s\"}",
                         tu_python()));
    cr_assert_eq(st, 201);
    struct af_job job = {
        "t",       "abcdef1",     NULL,          "torch",
        "\"mlp\"", "\"default\"", "\"forward\"", "{\"iterations\":2,\"warmup\":1}"};
    char *id = af_submit_job(&capd, &job), *log = NULL;
    json_t *cell = ended_cell(id, &log);
    cr_assert_str_eq(tu_str(cell, "state"), "ok", "%s\nlog: %s", af_dump(cell), log);
    char *lines = af_record_lines(&capd, id, tu_str(cell, "id"));
    json_decref(cell);
    free(log);

    struct tu_capd local;
    af_start_capd(&local, NULL, NULL);
    json_decref(tu_jsonf(&local, "POST", "/v1/builds", &st,
                         "{\"name\":\"torch\",\"python\":\"%s\"}", tu_python()));
    char *lid = af_submit_job(&local, &job);
    json_t *lj = af_wait_job(&local, lid, 240);
    json_t *lcell = json_array_get(json_object_get(lj, "cells"), 0);
    cr_assert_str_eq(tu_str(lcell, "state"), "ok", "%s", af_dump(lcell));
    char *want = af_record_lines(&local, lid, tu_str(lcell, "id"));
    json_decref(lj);
    af_stop_own_capd(&local);
    cr_assert_gt(strlen(want), 0);
    cr_assert_str_eq(lines, want, "Debian torch's records, through Slurm and locally");
    free(lines);
    free(want);
    free(id);
    free(lid);
}

/* capd killed -9 while a Slurm job streams a cell, and started again on
 * the same port: it polls the job again and takes the attempt up again;
 * one attempt, one Slurm job, the cell ok. */
Test(slurm_exec, capd_killed_mid_cell_reattaches)
{
    char *id = slow_cell_running();
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/capd.json", root);
    af_restart_capd(&capd, cfg, true);
    expect_ok_on_attempt(id, 1);
    char *clog = tu_slurp(capd.errlog);
    cr_assert(strstr(clog, "cell_reattached") && strstr(clog, "slurm_job=1"), "%s", clog);
    free(clog);
    cr_assert_eq(tu_sh("SLURM_CONF=%s/slurm.conf scontrol -o show job 2 >/dev/null 2>&1", cdir) !=
                     0,
                 true, "no second Slurm job was submitted");
    free(id);
}

/* The node dies under a running cell: slurmd, its slurmstepd and the
 * worker killed -9. slurmctld marks the node DOWN once it stops answering
 * (SlurmdTimeout) and ends the job NODE_FAIL; capd requeues the cell,
 * whose second attempt runs once slurmd is back: ok, on attempt 2. */
Test(slurm_exec, slurmd_killed_mid_cell_requeues_the_cell)
{
    char *id = slow_cell_running();
    const char *src = tu_bin("CAPD_SOURCE_DIR");
    cr_assert_eq(tu_sh("%s/tests/slurm/cluster.sh crash-node %s", src, cdir), 0);
    /* slurmctld sees a silent node only by its pings: SlurmdTimeout (10 s)
     * after the last answer, on its ping cadence; 25 to 28 s on a quiet
     * 2-core host, more under CI's parallel tests (a 30 s wait failed) */
    wait_for_log_within("slurm_requeue", 120);
    expect_node_fail_requeue();
    cr_assert_eq(tu_sh("%s/tests/slurm/cluster.sh start-node %s", src, cdir), 0);
    expect_ok_on_attempt(id, 2);
    free(id);
}

/* The node fails under a running cell (set DOWN, as slurmctld does when a
 * node stops answering): Slurm ends the job NODE_FAIL (it never requeues
 * capd's jobs itself: --no-requeue), capd requeues the cell as a new
 * attempt, which runs once the node is back: ok, on attempt 2. */
Test(slurm_exec, a_node_failure_requeues_the_cell)
{
    char *id = slow_cell_running();
    cr_assert_eq(
        tu_sh("SLURM_CONF=%s/slurm.conf scontrol update NodeName=$(SLURM_CONF=%s/slurm.conf "
              "sinfo -h -o %%N) State=DOWN Reason=capd-test",
              cdir, cdir),
        0);
    wait_for_log("slurm_requeue");
    expect_node_fail_requeue();
    /* back to service; slurmd answering may have brought it back already
     * (ReturnToService=2), and then RESUME is refused */
    tu_sh("SLURM_CONF=%s/slurm.conf scontrol update NodeName=$(SLURM_CONF=%s/slurm.conf "
          "sinfo -h -o %%N) State=RESUME >/dev/null 2>&1",
          cdir, cdir);
    expect_ok_on_attempt(id, 2);
    free(id);
}

/* The runner alone killed by a SIGTERM its worker did not send (Slurm
 * signals a job's processes in no set order: the runner may die before the
 * worker hears of it): capd asks Slurm why before it decides; the job
 * ended of itself, so the runner's end stands, crashed naming SIGTERM. */
Test(slurm_exec, a_runner_killed_from_outside_is_asked_of_slurm)
{
    char *id = slow_cell_running();
    cr_assert_eq(tu_sh("n=0; for p in $(SLURM_CONF=%s/slurm.conf scontrol listpids 2>/dev/null | "
                       "awk 'NR > 1 {print $1}'); do "
                       "grep -q fake_runner /proc/$p/cmdline 2>/dev/null && "
                       "kill -TERM $p && n=$((n + 1)); done; [ $n -ge 1 ]",
                       cdir),
                 0, "the runner was found among the Slurm job's processes and signalled");
    wait_for_log("cell_stopped_from_outside");
    char *log = NULL;
    json_t *cell = ended_cell(id, &log);
    cr_assert_str_eq(tu_str(cell, "state"), "crashed", "%s\nlog: %s", af_dump(cell), log);
    cr_assert(strstr(tu_str(cell, "reason"), "SIGTERM"), "%s", af_dump(cell));
    char *clog = tu_slurp(capd.errlog);
    cr_assert(strstr(clog, "worker_signal=0 runner_signal=15"), "%s", clog);
    cr_assert_null(strstr(clog, "slurm_requeue"), "nothing requeued: %s", clog);
    free(clog);
    json_decref(cell);
    free(log);
    free(id);
}

/* The controller gone under a running cell: every squeue fails, and capd
 * polls less often each time (slurm_poll_ms 300 doubled: 600, then 1200). */
Test(slurm_exec, a_failing_poll_backs_off)
{
    char *id = cell_running("\"fake:hang\"");
    cr_assert_eq(tu_sh("kill -KILL $(cat %s/slurmctld.pid)", cdir), 0);
    /* squeue waits for the controller before it gives up (MessageTimeout) */
    wait_for_log_within("next_poll_ms=600", 120);
    wait_for_log_within("next_poll_ms=1200", 120);
    free(id);
}
