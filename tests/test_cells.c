/*
 * tests/test_cells.c - the supervisor and scheduler against a misbehaving
 * child: tests/helpers/fake_runner, registered as a build's "interpreter"
 * and steered by the model name (fake:<behavior>, fake:<behavior>__<arg>).
 *
 * Each case checks the cell's outcome and details, the records kept, and
 * that the daemon still serves requests with no leaked fds or zombies.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/testutil.h"

struct env {
    struct tu_capd c;
    char config[512];
};

static int warm_fds(struct env *e);
static json_t *run_ok(struct env *e, const char *model, char **job);

static void start(struct env *e, const char *config_json)
{
    char *dir = tu_tmpdir();
    cr_assert_not_null(dir);
    const char *extra[3] = {NULL, NULL, NULL};
    if (config_json) {
        snprintf(e->config, sizeof e->config, "%s/capd.json", dir);
        af_put_file(e->config, config_json);
        extra[0] = "--config";
        extra[1] = e->config;
    }
    cr_assert_eq(tu_capd_start(&e->c, dir, extra), 0, "capd starts");
    free(dir);
    cr_assert_eq(tu_fake_build(&e->c, "fake", NULL), 201);
}

static json_int_t count(json_t *cell, const char *kind)
{
    return json_integer_value(json_object_get(json_object_get(cell, "record_counts"), kind));
}

/* The daemon is still healthy, holds no extra fds and no zombies. */
static void check_clean(struct env *e, int fds_before)
{
    long st = 0;
    json_t *h = tu_json(&e->c, "GET", "/healthz", NULL, &st);
    cr_assert_eq(st, 200, "daemon still serves");
    json_decref(h);
    usleep(200 * 1000);
    cr_assert_eq(tu_count_zombies(e->c.pid), 0, "no zombie children");
    if (fds_before >= 0) {
        int now = warm_fds(e);
        cr_assert_leq(now, fds_before + 2, "no leaked fds: %d before, %d after", fds_before, now);
    }
}

/* A process is gone when it no longer exists or is a zombie nobody reaped
 * yet (this sandbox's init may not reap orphans promptly). */
static bool gone(int pid)
{
    char p[64], buf[512];
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return true;
    snprintf(p, sizeof p, "/proc/%d/stat", pid);
    FILE *f = fopen(p, "r");
    if (!f)
        return true;
    bool z = false;
    if (fgets(buf, sizeof buf, f)) {
        char *rp = strrchr(buf, ')');
        z = rp && (rp[2] == 'Z' || rp[2] == 'X');
    }
    fclose(f);
    return z;
}

/* Spreads requests over every HTTP worker so each has opened its SQLite
 * connection before fds are counted. */
static int warm_fds(struct env *e)
{
    for (int i = 0; i < 200; i++)
        json_decref(tu_json(&e->c, "GET", "/v1/builds", NULL, NULL));
    /* Server-side sockets of the requests just made close a moment after
     * the client's: take the lowest of a few counts. */
    int best = -1;
    for (int i = 0; i < 6; i++) {
        usleep(100 * 1000);
        int n = tu_count_fds(e->c.pid);
        best = best < 0 || n < best ? n : best;
    }
    return best;
}

/* Polls job ID (100 tries, EVERY_MS apart) until its first cell runs. */
static void wait_first_running(struct env *e, const char *id, int every_ms)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    for (int i = 0; i < 100; i++) {
        json_t *j = tu_json(&e->c, "GET", path, NULL, NULL);
        bool running =
            strcmp(tu_str(json_array_get(json_object_get(j, "cells"), 0), "state"), "running") == 0;
        json_decref(j);
        if (running)
            break;
        usleep(every_ms * 1000);
    }
}

/* kill -9 of E's capd, then a fresh start on the same data dir with
 * EXTRA flags (may be NULL), which must succeed. */
static void kill9_restart(struct env *e, const char *const *extra)
{
    tu_capd_kill9(&e->c);
    char dir[256];
    snprintf(dir, sizeof dir, "%s", e->c.dir);
    cr_assert_eq(tu_capd_start(&e->c, dir, extra), 0, "capd restarts on the same data dir");
}

/* GET the log of CELL of JOB into R, which must answer 200. */
static void get_log(struct env *e, const char *job, json_t *cell, struct tu_resp *r)
{
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s/log", job, tu_str(cell, "id"));
    tu_http(&e->c, "GET", path, NULL, 0, NULL, r);
    cr_assert_eq(r->status, 200);
}

/* Runs fake:echo_env on E, which must end ok; returns the cell (owned),
 * its job in *JOB (owned) and its note records' reply in *NOTES (owned),
 * whose first message is what the cell saw. */
static json_t *echo_env(struct env *e, char **job, json_t **notes)
{
    json_t *cell = run_ok(e, "fake:echo_env", job);
    char path[200];
    snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s/records?kind=note", *job, tu_str(cell, "id"));
    *notes = tu_json(&e->c, "GET", path, NULL, NULL);
    return cell;
}

static void stop(struct env *e)
{
    cr_assert_eq(tu_capd_stop(&e->c), 0, "capd exits 0 on SIGTERM");
}

/* check_clean (FDS_BEFORE as there), then stop. */
static void stop_clean(struct env *e, int fds_before)
{
    check_clean(e, fds_before);
    stop(e);
}

/* Runs one cell of MODEL on E, which must end ok; returns it (owned) and
 * its job in *JOB (owned) unless JOB is NULL. */
static json_t *run_ok(struct env *e, const char *model, char **job)
{
    json_t *cell = af_run_cell(&e->c, model, NULL, job);
    cr_assert_str_eq(tu_str(cell, "state"), "ok", "%s: %s", model, tu_str(cell, "reason"));
    return cell;
}

Test(cells, ok_stores_every_frame)
{
    struct env e;
    start(&e, NULL);
    int fds = warm_fds(&e);
    char *job;
    json_t *cell = af_run_cell(&e.c, "fake:ok", NULL, &job);
    cr_assert_str_eq(tu_str(cell, "state"), "ok", "reason: %s", tu_str(cell, "reason"));
    cr_assert_eq(count(cell, "tensor"), 3);
    cr_assert_eq(count(cell, "hello"), 1);
    cr_assert_eq(count(cell, "end"), 1);
    cr_assert_eq(json_is_false(json_object_get(cell, "partial")), 1);
    cr_assert_str_eq(tu_str(cell, "effective_width"), "avx2");
    cr_assert_gt(json_integer_value(json_object_get(cell, "peak_rss_bytes")), 0,
                 "peak RSS from wait4");
    json_t *timing = json_object_get(cell, "timing");
    cr_assert_eq(json_integer_value(json_object_get(timing, "n")), 20, "20 samples by default");
    /* The log endpoint serves text. */
    struct tu_resp r;
    get_log(&e, job, cell, &r);
    cr_assert(strstr(r.headers, "text/plain") != NULL);
    tu_resp_free(&r);
    json_decref(cell);
    free(job);
    stop_clean(&e, fds);
}

Test(cells, segv_is_crashed_and_keeps_partial_records)
{
    struct env e;
    start(&e, NULL);
    int fds = warm_fds(&e);
    json_t *cell = af_run_cell(&e.c, "fake:segv", NULL, NULL);
    cr_assert_str_eq(tu_str(cell, "state"), "crashed");
    cr_assert_str_eq(tu_str(cell, "signal"), "SIGSEGV");
    cr_assert_eq(count(cell, "tensor"), 2, "the frames streamed before the crash are kept");
    cr_assert(json_is_true(json_object_get(cell, "partial")));
    json_decref(cell);
    stop_clean(&e, fds);
}

Test(cells, abort_is_crashed)
{
    struct env e;
    start(&e, NULL);
    json_t *cell = af_run_cell(&e.c, "fake:abort", NULL, NULL);
    cr_assert_str_eq(tu_str(cell, "state"), "crashed");
    cr_assert_str_eq(tu_str(cell, "signal"), "SIGABRT");
    json_decref(cell);
    stop(&e);
}

Test(cells, exit_codes_and_missing_end_are_failed)
{
    struct env e;
    start(&e, NULL);
    json_t *cell = af_run_cell(&e.c, "fake:exit3", NULL, NULL);
    cr_assert_str_eq(tu_str(cell, "state"), "failed");
    cr_assert_eq(json_integer_value(json_object_get(cell, "exit_code")), 3);
    cr_assert(strstr(tu_str(cell, "reason"), "exit code 3") != NULL, "%s", tu_str(cell, "reason"));
    json_decref(cell);
    cell = af_run_cell(&e.c, "fake:noend", NULL, NULL);
    cr_assert_str_eq(tu_str(cell, "state"), "failed");
    cr_assert(strstr(tu_str(cell, "reason"), "end frame") != NULL, "%s", tu_str(cell, "reason"));
    json_decref(cell);
    cell = af_run_cell(&e.c, "fake:failed", NULL, NULL);
    cr_assert_str_eq(tu_str(cell, "state"), "failed");
    json_decref(cell);
    cell = af_run_cell(&e.c, "fake:unsupported", NULL, NULL);
    cr_assert_str_eq(tu_str(cell, "state"), "unsupported");
    cr_assert_neq(tu_str(cell, "reason")[0], 0, "the runner's reason is kept");
    json_decref(cell);
    stop(&e);
}

Test(cells, protocol_violations)
{
    struct env e;
    start(&e, NULL);
    int fds = warm_fds(&e);
    static const char *const cases[][2] = {
        {"fake:garbage", "JSON"},
        {"fake:long_header", "65536"},
        {"fake:short_payload", "payload"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *cell = af_run_cell(&e.c, cases[i][0], NULL, NULL);
        cr_assert_str_eq(tu_str(cell, "state"), "protocol_error", "%s: %s", cases[i][0],
                         tu_str(cell, "reason"));
        cr_assert(strstr(tu_str(cell, "reason"), cases[i][1]) != NULL, "%s reason: %s", cases[i][0],
                  tu_str(cell, "reason"));
        json_decref(cell);
    }
    json_t *cell = af_run_cell(&e.c, "fake:close_fd3", NULL, NULL);
    cr_assert_str_eq(tu_str(cell, "state"), "failed", "fd 3 closed early: %s",
                     tu_str(cell, "reason"));
    json_decref(cell);
    stop_clean(&e, fds);
}

/* The grandchild the fake runner left in CELL's scratch dir (kept by
 * keep_scratch) is gone within a few seconds of the cell's end. */
static void expect_grandchild_gone(struct env *e, json_t *cell)
{
    char path[600];
    snprintf(path, sizeof path, "%s/data/scratch/%s-1/grandchild.pid", e->c.dir,
             tu_str(cell, "id"));
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "grandchild pid file %s", path);
    int gpid = 0;
    cr_assert_eq(fscanf(f, "%d", &gpid), 1);
    fclose(f);
    usleep(300 * 1000);
    for (int k = 0; k < 40 && !gone(gpid); k++)
        usleep(50 * 1000);
    cr_assert(gone(gpid), "grandchild %d is gone", gpid);
}

Test(cells, timeout_kills_the_group, .timeout = 120)
{
    struct env e;
    start(&e, "{\"kill_grace_ms\": 500, \"keep_scratch\": true}");
    /* A cell that hangs; one that ignores SIGTERM, which SIGKILL after the
     * grace period still ends; and one whose grandchild in the group dies
     * with it. */
    static const char *const models[] = {"fake:hang", "fake:ignore_term", "fake:grandchild"};
    for (size_t i = 0; i < 3; i++) {
        json_t *cell = af_run_cell(&e.c, models[i], "{\"timeout_s\":1}", NULL);
        cr_assert_str_eq(tu_str(cell, "state"), "timeout", "%s", models[i]);
        if (i < 2)
            cr_assert_lt(json_integer_value(json_object_get(cell, "duration_ms")), 10000);
        else
            expect_grandchild_gone(&e, cell);
        json_decref(cell);
    }
    stop_clean(&e, -1);
}

Test(cells, lingering_grandchild_after_clean_exit_dies)
{
    struct env e;
    start(&e, "{\"keep_scratch\": true}");
    json_t *cell = run_ok(&e, "fake:grandchild__exit", NULL);
    expect_grandchild_gone(&e, cell);
    json_decref(cell);
    stop(&e);
}

Test(cells, log_flood_is_capped, .timeout = 300)
{
    struct env e;
    start(&e, "{\"cell_log_max_bytes\": 1048576}");
    char *job;
    json_t *cell = run_ok(&e, "fake:flood__1024", &job); /* 1 GiB */
    struct tu_resp r;
    get_log(&e, job, cell, &r);
    cr_assert_leq(r.len, 1048576 + 256, "log capped: %zu bytes", r.len);
    cr_assert_geq(r.len, 1048576 / 2, "the tail is kept: %zu bytes", r.len);
    cr_assert(strstr(r.body, "dropped") != NULL, "the log says it was cut");
    tu_resp_free(&r);
    json_decref(cell);
    free(job);
    stop_clean(&e, -1);
}

Test(cells, address_space_limit_holds)
{
    struct env e;
    start(&e, "{\"rlimit_as_bytes\": 268435456}");
    json_t *cell = af_run_cell(&e.c, "fake:oom", NULL, NULL);
    const char *state = tu_str(cell, "state");
    cr_assert(strcmp(state, "failed") == 0 || strcmp(state, "crashed") == 0, "oom: %s (%s)", state,
              tu_str(cell, "reason"));
    cr_assert_lt(json_integer_value(json_object_get(cell, "peak_rss_bytes")),
                 268435456 + (1 << 24));
    json_decref(cell);
    stop(&e);
}

Test(cells, clean_environment_and_fds)
{
    struct env e;
    start(&e, NULL);
    setenv("CAPD_TEST_SECRET", "leak", 1);
    char *job;
    json_t *notes, *cell = echo_env(&e, &job, &notes);
    json_t *rec = json_array_get(json_object_get(notes, "records"), 0);
    const char *msg = tu_str(rec, "message");
    cr_assert(strstr(msg, "CAPD_CELL_SPEC") != NULL, "spec path is set: %s", msg);
    cr_assert(strstr(msg, "ATEN_CPU_CAPABILITY") != NULL, "width variables are set");
    cr_assert(strstr(msg, "ONEDNN_MAX_CPU_ISA") != NULL);
    cr_assert(strstr(msg, "CAPD_BIN") == NULL, "capd's own environment does not leak: %s", msg);
    json_decref(notes);
    json_decref(cell);
    free(job);
    stop(&e);
}

/* What a fresh-exec cell starts with (daemon/child/spawn.c, between its clone and
 * its exec): its own session and group as capd's direct child, the
 * parent-death signal, the configured rlimits and no core files, only fds
 * 0-3, and its scratch dir as working directory. */
Test(cells, fresh_exec_child_isolation)
{
    struct env e;
    start(&e, "{\"rlimit_cpu_s\": 1234, \"rlimit_nofile\": 321, \"rlimit_nproc\": 2345}");
    char *job;
    json_t *notes, *cell = echo_env(&e, &job, &notes);
    json_t *rec = json_array_get(json_object_get(notes, "records"), 0);
    json_t *echo = json_loads(tu_str(rec, "message"), 0, NULL);
    cr_assert_not_null(echo);
    json_int_t pid = json_integer_value(json_object_get(echo, "pid"));
    cr_assert_eq(json_integer_value(json_object_get(echo, "ppid")), (json_int_t)e.c.pid,
                 "capd's own child");
    cr_assert_eq(json_integer_value(json_object_get(echo, "sid")), pid, "its own session");
    cr_assert_eq(json_integer_value(json_object_get(echo, "pgid")), pid, "its own group");
    cr_assert_eq(json_integer_value(json_object_get(echo, "pdeathsig")), SIGKILL);
    json_t *rl = json_object_get(echo, "rlimits");
    cr_assert_eq(json_integer_value(json_object_get(rl, "as")), -1,
                 "no address-space cap by default (memory is limited by its cgroup)");
    cr_assert_eq(json_integer_value(json_object_get(rl, "cpu")), 1234);
    cr_assert_eq(json_integer_value(json_object_get(rl, "nofile")), 321);
    cr_assert_eq(json_integer_value(json_object_get(rl, "nproc")), 2345);
    cr_assert_eq(json_integer_value(json_object_get(rl, "core")), 0);
    json_t *fds = json_object_get(echo, "fds");
    cr_assert_eq(json_array_size(fds), 4, "fds 0-3 only: %s", json_dumps(fds, 0));
    for (size_t i = 0; i < json_array_size(fds); i++)
        cr_assert_leq(json_integer_value(json_array_get(fds, i)), 3);
    const char *cwd = json_string_value(json_object_get(echo, "cwd"));
    cr_assert(cwd && strstr(cwd, "/scratch/") && strstr(cwd, tu_str(cell, "id")),
              "runs in its scratch dir: %s", cwd);
    json_decref(echo);
    json_decref(notes);
    json_decref(cell);
    free(job);
    stop(&e);
}

Test(cells, cancel_stops_running_and_queued, .timeout = 60)
{
    struct env e;
    start(&e, NULL);
    long st = 0;
    json_t *j;
    char *id = af_submit_job(&e.c, &(struct af_job){.project = "t",
                                                    .commit = "abcdef1",
                                                    .build = "fake",
                                                    .models = "\"fake:hang\"",
                                                    .widths = "\"avx2\",\"default\"",
                                                    .passes = "\"forward\""});
    wait_first_running(&e, id, 50);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
    j = tu_json(&e.c, "POST", path, NULL, &st);
    cr_assert_eq(st, 202);
    json_decref(j);
    j = tu_wait_job(&e.c, id, 30);
    cr_assert_not_null(j);
    cr_assert_str_eq(tu_str(j, "state"), "cancelled");
    json_decref(j);
    /* The running cell ends as cancelled once its group is gone. */
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    bool any_running = true;
    for (int k = 0; k < 200 && any_running; k++) {
        j = tu_json(&e.c, "GET", path, NULL, NULL);
        any_running = false;
        size_t n;
        json_t *c;
        json_array_foreach(json_object_get(j, "cells"), n, c)
        {
            any_running |= strcmp(tu_str(c, "state"), "running") == 0;
        }
        json_decref(j);
        if (any_running)
            usleep(50 * 1000);
    }
    j = tu_json(&e.c, "GET", path, NULL, NULL);
    size_t i;
    json_t *cell;
    json_array_foreach(json_object_get(j, "cells"), i, cell)
    {
        cr_assert_str_eq(tu_str(cell, "state"), "cancelled", "cell %zu", i);
    }
    json_decref(j);
    free(id);
    stop_clean(&e, -1);
}

/*
 * kill -9 while a cell streams: on restart the cell is interrupted and
 * re-queued, runs again, and its records appear exactly once; the database
 * passes integrity_check.
 */
Test(cells, kill9_restart_requeues_without_duplicates, .timeout = 120)
{
    struct env e;
    start(&e, NULL);
    char *job = tu_submit(&e.c, "fake", "fake:slow__1500", NULL);
    cr_assert_not_null(job);
    wait_first_running(&e, job, 20);
    usleep(500 * 1000); /* frames are streaming; the end is 1.5 s away */
    kill9_restart(&e, NULL);
    char dir[256];
    snprintf(dir, sizeof dir, "%s", e.c.dir);
    json_t *j = tu_wait_job(&e.c, job, 60);
    cr_assert_not_null(j);
    json_t *c0 = json_array_get(json_object_get(j, "cells"), 0);
    cr_assert_str_eq(tu_str(c0, "state"), "ok", "re-run after the restart: %s",
                     tu_str(c0, "reason"));
    cr_assert_eq(json_integer_value(json_object_get(c0, "attempts")), 2);
    char cp[160];
    snprintf(cp, sizeof cp, "/v1/jobs/%s/cells/%s", job, tu_str(c0, "id"));
    json_t *cell = tu_json(&e.c, "GET", cp, NULL, NULL);
    cr_assert_eq(count(cell, "tensor"), 3, "no record duplicated");
    cr_assert_eq(count(cell, "hello"), 1);
    json_decref(cell);
    json_decref(j);
    cr_assert_eq(tu_capd_stop(&e.c), 0);
    cr_assert_eq(tu_sh("test \"$(sqlite3 '%s/data/capd.db' 'PRAGMA integrity_check')\" = ok", dir),
                 0, "integrity_check ok");
    free(job);
}

/* With max_attempts 1 an interrupted cell is not re-run. */
Test(cells, interrupted_after_attempts_exhausted, .timeout = 120)
{
    struct env e;
    start(&e, "{\"max_attempts\": 1}");
    char *job = tu_submit(&e.c, "fake", "fake:hang", NULL);
    wait_first_running(&e, job, 20);
    const char *extra[] = {"--config", e.config, NULL};
    kill9_restart(&e, extra);
    json_t *j = tu_wait_job(&e.c, job, 30);
    cr_assert_not_null(j);
    cr_assert_str_eq(tu_str(json_array_get(json_object_get(j, "cells"), 0), "state"),
                     "interrupted");
    json_decref(j);
    free(job);
    stop(&e);
}

/*
 * Two cells at once: fake:memhog allocates 512 MiB past a 64 MiB limit and
 * must end oom with the limit and its peak in the reason, while fake:ok
 * beside it ends ok and the daemon keeps serving. Returns the mechanism
 * GET /v1/host reports.
 */
static char *memory_limit_case(struct env *e)
{
    long status = 0;
    json_t *host = tu_json(&e->c, "GET", "/v1/host", NULL, &status);
    cr_assert_eq(status, 200);
    json_t *mem = json_object_get(host, "memory");
    char *mech = strdup(tu_str(mem, "mechanism"));
    cr_assert_gt(json_integer_value(json_object_get(mem, "cell_memory_max_bytes")), 64 << 20);
    json_decref(host);
    if (strcmp(mech, "watchdog") == 0 && strstr(e->config, "watchdog") == NULL)
        return mech; /* the caller skips: no cgroup on this host */
    json_t *j = tu_jsonf(&e->c, "POST", "/v1/jobs", &status,
                         "{\"project\":\"t\",\"commit\":\"abcdef1\",\"build\":\"fake\","
                         "\"matrix\":{\"models\":[\"fake:memhog__512\",\"fake:ok\"],"
                         "\"widths\":[\"avx2\"],\"passes\":[\"forward\"]},"
                         "\"options\":{\"memory_max_bytes\":67108864}}");
    cr_assert_eq(status, 201, "job accepted");
    char *job = strdup(tu_str(j, "id"));
    json_decref(j);
    j = tu_wait_job(&e->c, job, 120);
    cr_assert_not_null(j);
    json_t *cells = json_object_get(j, "cells");
    for (size_t i = 0; i < json_array_size(cells); i++) {
        json_t *c = json_array_get(cells, i);
        if (strcmp(tu_str(c, "model"), "fake:ok") == 0) {
            cr_assert_str_eq(tu_str(c, "state"), "ok", "the other cell is unaffected: %s",
                             tu_str(c, "reason"));
            continue;
        }
        const char *reason = tu_str(c, "reason");
        cr_assert_str_eq(tu_str(c, "state"), "oom", "over its limit: %s (%s)", tu_str(c, "state"),
                         reason);
        cr_assert(strstr(reason, "limit 67108864 bytes") != NULL, "limit in reason: %s", reason);
        cr_assert(strstr(reason, "peak ") && !strstr(reason, "peak unknown"), "peak: %s", reason);
        cr_assert(strstr(reason, mech) != NULL, "mechanism in reason: %s", reason);
        json_int_t peak = json_integer_value(json_object_get(c, "peak_rss_bytes"));
        cr_assert_gt(peak, 32 << 20, "peak measured: %lld", (long long)peak);
        cr_assert_lt(peak, 256 << 20, "stopped near its limit: %lld", (long long)peak);
        cr_assert_eq(json_integer_value(json_object_get(c, "memory_limit_bytes")), 67108864);
        cr_assert(json_is_integer(json_object_get(c, "cpu_time_ms")));
    }
    json_decref(j);
    free(job);
    check_clean(e, -1);
    return mech;
}

Test(cells, memory_limit_watchdog, .timeout = 120)
{
    struct env e;
    start(&e, "{\"cell_memory_mechanism\": \"watchdog\", \"max_parallel\": 2}");
    char *mech = memory_limit_case(&e);
    cr_assert_str_eq(mech, "watchdog");
    free(mech);
    stop(&e);
}

Test(cells, memory_limit_cgroup, .timeout = 120)
{
    struct env e;
    start(&e, "{\"max_parallel\": 2}");
    char *mech = memory_limit_case(&e);
    if (strcmp(mech, "watchdog") == 0) {
        free(mech);
        stop(&e);
        cr_skip_test("no cgroup capd may use on this host (GET /v1/host memory.reason)");
    }
    free(mech);
    stop(&e);
}

Test(cells, memory_option_bounded)
{
    struct env e;
    start(&e, NULL);
    long status = 0;
    json_t *j = tu_jsonf(&e.c, "POST", "/v1/jobs", &status,
                         "{\"project\":\"t\",\"commit\":\"abcdef1\",\"build\":\"fake\","
                         "\"matrix\":{\"models\":[\"fake:ok\"],\"widths\":[\"avx2\"],"
                         "\"passes\":[\"forward\"]},"
                         "\"options\":{\"memory_max_bytes\":9223372036854775807}}");
    cr_assert_eq(status, 400, "above cell_memory_max_bytes is refused");
    cr_assert_str_eq(tu_str(json_object_get(j, "error"), "field"), "options.memory_max_bytes");
    json_decref(j);
    stop(&e);
}
