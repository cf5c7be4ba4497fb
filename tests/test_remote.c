/*
 * tests/test_remote.c - remote attempts (executor "remote", docs/scale.md):
 * a real capd whose remote_launch writes the attempt's id and token to a
 * file, and the test as the worker on the same host: it fetches the spec,
 * runs the runner it names (the fake runner) with the environment it names
 * and fd 3 to a file, and uploads the frames and log over real HTTP, with
 * replays, gaps, forged tokens and every end capd can give an attempt.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/testutil.h"

struct rt {
    struct tu_capd c;
    char dir[256];
    char launch[320]; /* where remote_launch writes "ATTEMPT TOKEN" */
    long long attempt;
    char token[128];
    char auth[160]; /* "Authorization: Bearer TOKEN" */
};

static struct rt *R;

static void rt_stop(void)
{
    if (R) {
        af_stop_own_capd(&R->c);
        /* capd-cell outlives its capd on purpose (it waits for a restart):
         * the workers this test's capd launched go with the test */
        if (R->dir[0])
            tu_sh("pkill -KILL -f -- '--scratch %s/w-' >/dev/null 2>&1", R->dir);
        free(R);
        R = NULL;
    }
}

/* capd with executor remote, the fake build and CONFIG_EXTRA (more JSON
 * members, or ""). Its remote_launch runs capd-cell itself on this host
 * (WORKER), or writes the attempt's id and token to R->launch for the
 * test to act as the worker. */
static struct rt *rt_start_as(bool worker, const char *config_extra)
{
    struct rt *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    R = r;
    char *dir = tu_tmpdir();
    cr_assert_not_null(dir);
    snprintf(r->dir, sizeof r->dir, "%s", dir);
    snprintf(r->launch, sizeof r->launch, "%s/launch.txt", dir);
    char cfg[512], launch[1200], text[2048];
    if (worker)
        snprintf(launch, sizeof launch, "exec '%s' --quiet --scratch %s/w-$CAPD_ATTEMPT",
                 tu_bin("CAPD_CELL_BIN"), dir);
    else
        snprintf(launch, sizeof launch,
                 "echo \\\"$CAPD_ATTEMPT $CAPD_TOKEN\\\" > %s.tmp && mv %s.tmp %s", r->launch,
                 r->launch, r->launch);
    snprintf(cfg, sizeof cfg, "%s/capd.json", dir);
    snprintf(text, sizeof text, "{\"executor\": \"remote\", \"remote_launch\": \"%s\"%s}", launch,
             config_extra);
    af_put_file(cfg, text);
    const char *extra[] = {"--config", cfg, NULL};
    af_start_capd(&r->c, dir, extra);
    free(dir);
    cr_assert_eq(tu_fake_build(&r->c, "fake", NULL), 201);
    return r;
}

static struct rt *rt_start(const char *config_extra)
{
    return rt_start_as(false, config_extra);
}

/* Waits for the launcher's file and reads the attempt and its token. */
static void rt_launched(struct rt *r)
{
    char *t = NULL;
    for (int i = 0; i < 200; i++) {
        t = tu_slurp(r->launch);
        if (t[0])
            break;
        free(t);
        t = NULL;
        usleep(50 * 1000);
    }
    cr_assert(t && t[0], "remote_launch ran and wrote %s", r->launch);
    cr_assert_eq(sscanf(t, "%lld %127s", &r->attempt, r->token), 2, "launch.txt: %s", t);
    free(t);
    unlink(r->launch);
    cr_assert(strncmp(r->token, "capd_at_", 8) == 0, "token %s", r->token);
    snprintf(r->auth, sizeof r->auth, "Authorization: Bearer %s", r->token);
}

/* METHOD PATH (BODY of LEN bytes, TYPE) with the header AUTH; its status
 * and its reply (owned, json null when not JSON). */
static json_t *rt_call(struct rt *r, const char *method, const char *path, const char *body,
                       size_t len, const char *type, const char *auth, long *status)
{
    char ct[96];
    snprintf(ct, sizeof ct, "Content-Type: %s", type ? type : "application/octet-stream");
    const char *hdrs[] = {auth ? auth : "Authorization:", ct, NULL};
    struct tu_resp resp;
    cr_assert_eq(tu_http(&r->c, method, path, body, len, hdrs, &resp), 0, "%s %s", method, path);
    *status = resp.status;
    json_t *j = resp.body ? json_loadb(resp.body, resp.len, 0, NULL) : NULL;
    tu_resp_free(&resp);
    return j ? j : json_null();
}

/* POSTs LEN bytes of DATA at OFFSET of STREAM ("frames" or "log"). */
static json_t *rt_post(struct rt *r, const char *stream, long long offset, const char *data,
                       size_t len, long *status)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/attempts/%lld/%s?offset=%lld", r->attempt, stream, offset);
    return rt_call(r, "POST", path, data, len, NULL, r->auth, status);
}

static json_int_t jint(json_t *j, const char *k)
{
    return json_integer_value(json_object_get(j, k));
}

/* Runs the spec's argv with exactly the spec's env, fd 3 to DIR/frames.bin
 * and output to DIR/out.log, as capd-cell does; waits for it. */
static void run_worker(struct rt *r, json_t *spec)
{
    json_t *argv = json_object_get(spec, "argv");
    json_t *env = json_object_get(spec, "env");
    cr_assert_eq(json_array_size(argv), 3);
    const char *envp[128];
    size_t n = 0;
    const char *k;
    json_t *v;
    json_object_foreach(env, k, v)
    {
        cr_assert_lt(n, 127);
        char *kv = NULL;
        cr_assert_geq(asprintf(&kv, "%s=%s", k, json_string_value(v)), 0);
        envp[n++] = kv;
    }
    envp[n] = NULL;
    char frames[320], out[320];
    snprintf(frames, sizeof frames, "%s/frames.bin", r->dir);
    snprintf(out, sizeof out, "%s/out.log", r->dir);
    const char *args[] = {"/bin/sh",
                          "-c",
                          "exec \"$0\" \"$1\" \"$2\" 3>\"$3\"",
                          json_string_value(json_array_get(argv, 0)),
                          json_string_value(json_array_get(argv, 1)),
                          json_string_value(json_array_get(argv, 2)),
                          frames,
                          NULL};
    struct tu_fd fds[3] = {{"/dev/null", O_RDONLY, 0},
                           {out, O_WRONLY | O_CREAT | O_TRUNC, 0},
                           {out, O_WRONLY | O_CREAT | O_APPEND, 0}};
    pid_t pid;
    cr_assert_eq(tu_spawn(&pid, args, envp, fds), 0);
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    char *log = tu_slurp(out);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the runner exited %d: %s", st, log);
    free(log);
    for (size_t i = 0; i < n; i++)
        free((char *)envp[i]);
}

static char *slurp_n(const char *path, size_t *len)
{
    char *t = tu_slurp(path);
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0, "%s", path);
    *len = (size_t)sb.st_size;
    return t;
}

/* capd with the file launcher, one cell of MODEL of the fake build, and
 * the attempt's token read (its job id, owned). */
static char *launched_cell_of(const char *model, struct rt **out)
{
    struct rt *r = rt_start("");
    char *job = tu_submit(&r->c, "fake", model, NULL);
    cr_assert_not_null(job);
    rt_launched(r);
    *out = r;
    return job;
}

static char *launched_cell(struct rt **out)
{
    return launched_cell_of("mlp", out);
}

/* PATH: the attempt endpoint WHAT ("spec", "finish") of attempt ATTEMPT. */
static void attempt_path(char *path, size_t size, long long attempt, const char *what)
{
    snprintf(path, size, "/v1/attempts/%lld/%s", attempt, what);
}

/* The attempt's spec, fetched as its worker does (owned). */
static json_t *rt_spec(struct rt *r)
{
    char path[128];
    long st = 0;
    attempt_path(path, sizeof path, r->attempt, "spec");
    json_t *spec = rt_call(r, "GET", path, NULL, 0, NULL, r->auth, &st);
    cr_assert_eq(st, 200, "%s", af_dump(spec));
    return spec;
}

/* POSTs the attempt's finish: exit 0 after FLEN bytes of frames and LLEN of
 * log, with EXTRA members (or ""); its reply (owned). */
static json_t *rt_finish(struct rt *r, size_t flen, size_t llen, const char *extra, long *status)
{
    char path[128], fin[256];
    attempt_path(path, sizeof path, r->attempt, "finish");
    snprintf(fin, sizeof fin,
             "{\"exit_status\":0,\"signal\":null,\"frames_bytes\":%zu,\"log_bytes\":%zu,"
             "\"peak_rss_bytes\":1000,\"cpu_time_ms\":5%s}",
             flen, llen, extra);
    return rt_call(r, "POST", path, fin, strlen(fin), "application/json", r->auth, status);
}

/* What run_worker left in R's dir: the frames (*FB, *FLEN bytes) and the
 * runner's output (*LB, *LLEN bytes), both owned. */
static void worker_output(struct rt *r, char **fb, size_t *flen, char **lb, size_t *llen)
{
    char path[320];
    snprintf(path, sizeof path, "%s/frames.bin", r->dir);
    *fb = slurp_n(path, flen);
    snprintf(path, sizeof path, "%s/out.log", r->dir);
    *lb = slurp_n(path, llen);
}

Test(remote, a_worker_streams_a_cell_with_replays_and_gaps, .fini = rt_stop, .timeout = 120)
{
    struct rt *r;
    char *job = launched_cell_of("fake:ok__5", &r);
    long st = 0;
    char path[128];
    attempt_path(path, sizeof path, r->attempt, "spec");

    /* no token, a forged secret, a malformed one, another attempt's */
    json_decref(rt_call(r, "GET", path, NULL, 0, NULL, NULL, &st));
    cr_assert_eq(st, 401, "no token");
    char forged[200];
    snprintf(forged, sizeof forged, "Authorization: Bearer %.*s%s", (int)strlen(r->token) - 4,
             r->token, "0000");
    if (strcmp(forged + 22, r->token) == 0)
        forged[strlen(forged) - 1] = '1';
    json_decref(rt_call(r, "GET", path, NULL, 0, NULL, forged, &st));
    cr_assert_eq(st, 401, "a forged secret");
    json_decref(rt_call(r, "GET", path, NULL, 0, NULL, "Authorization: Bearer capd_at_x", &st));
    cr_assert_eq(st, 401, "malformed");
    /* the daemon's admin token is no attempt token */
    char admin[200];
    snprintf(admin, sizeof admin, "Authorization: Bearer %s", r->c.token);
    json_decref(rt_call(r, "GET", path, NULL, 0, NULL, admin, &st));
    cr_assert_eq(st, 401, "an API token does not open /v1/attempts");
    char other[128];
    attempt_path(other, sizeof other, r->attempt + 1, "spec");
    json_decref(rt_call(r, "GET", other, NULL, 0, NULL, r->auth, &st));
    cr_assert_eq(st, 403, "the token of another attempt");

    json_t *spec = rt_spec(r);
    cr_assert_eq(jint(spec, "attempt"), r->attempt);
    cr_assert_str_eq(tu_str(json_object_get(spec, "spec"), "model"), "fake:ok__5");
    cr_assert_not_null(tu_jstr(json_object_get(spec, "env"), "CAPD_CELL_SPEC"));
    cr_assert_eq(jint(spec, "frames_received"), 0);
    run_worker(r, spec);
    json_decref(spec);

    size_t flen, llen;
    char *fb, *lb;
    worker_output(r, &fb, &flen, &lb, &llen);
    cr_assert_gt(flen, 200, "the runner wrote frames");
    size_t a = flen / 3, b = 2 * flen / 3;

    json_t *j = rt_post(r, "frames", 0, fb, a, &st);
    cr_assert_eq(st, 200);
    cr_assert_eq(jint(j, "received"), (json_int_t)a);
    json_decref(j);
    /* the same chunk again (a retry after a lost reply): nothing appended */
    j = rt_post(r, "frames", 0, fb, a, &st);
    cr_assert_eq(st, 200);
    cr_assert_eq(jint(j, "received"), (json_int_t)a, "a replay duplicates nothing");
    json_decref(j);
    /* a gap is refused, naming what capd holds */
    j = rt_post(r, "frames", (long long)b, fb + b, flen - b, &st);
    cr_assert_eq(st, 409, "%s", af_dump(j));
    cr_assert_eq(jint(j, "frames_received"), (json_int_t)a);
    json_decref(j);
    /* an overlapping chunk: only its new part counts */
    j = rt_post(r, "frames", (long long)(a / 2), fb + a / 2, b - a / 2, &st);
    cr_assert_eq(st, 200);
    cr_assert_eq(jint(j, "received"), (json_int_t)b);
    json_decref(j);
    j = rt_post(r, "frames", (long long)b, fb + b, flen - b, &st);
    cr_assert_eq(jint(j, "received"), (json_int_t)flen);
    json_decref(j);
    j = rt_post(r, "log", 0, lb, llen, &st);
    cr_assert_eq(st, 200);
    json_decref(j);

    /* a finish that claims bytes capd does not hold is refused */
    json_decref(rt_finish(r, flen + 1, llen, "", &st));
    cr_assert_eq(st, 409, "finish past the bytes held");
    json_t *bad = rt_finish(r, flen, llen, ",\"worker_oom\":1", &st);
    cr_assert_eq(st, 400, "worker_oom must be a boolean");
    cr_assert_str_eq(tu_str(json_object_get(bad, "error"), "field"), "worker_oom", "%s",
                     af_dump(bad));
    json_decref(bad);
    json_decref(rt_finish(r, flen, llen, "", &st));
    cr_assert_eq(st, 200, "finish");

    json_t *done = af_wait_job(&r->c, job, 30);
    json_t *cell = json_array_get(json_object_get(done, "cells"), 0);
    cr_assert_str_eq(tu_str(cell, "state"), "ok", "%s", af_dump(cell));
    af_expect_local_records(&r->c, job, tu_str(cell, "id"), "fake:ok__5",
                            "the records that came through the spool");
    /* the runner's output is the cell log */
    snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s/log", job, tu_str(cell, "id"));
    struct tu_resp lr;
    cr_assert_eq(tu_http(&r->c, "GET", path, NULL, 0, NULL, &lr), 0);
    cr_assert_eq(lr.status, 200);
    cr_assert_eq(lr.len, llen, "the cell log holds the uploaded output");
    tu_resp_free(&lr);
    json_decref(done);

    /* after the end, an upload is told the attempt is over */
    j = rt_post(r, "frames", (long long)flen, "x", 1, &st);
    cr_assert_eq(st, 410, "%s", af_dump(j));
    json_decref(j);
    free(fb);
    free(lb);
    free(job);
}

/* The job's one cell once it no longer runs: ends in STATE, and an upload
 * at OFFSET is then told the attempt is over (410). */
static void expect_ended(struct rt *r, const char *job, const char *state, long long offset)
{
    json_t *done = NULL, *cell = NULL;
    for (int i = 0; i < 200; i++) {
        json_decref(done);
        done = af_wait_job(&r->c, job, 30);
        cell = json_array_get(json_object_get(done, "cells"), 0);
        if (strcmp(tu_str(cell, "state"), "running") != 0)
            break;
        usleep(50 * 1000);
    }
    cr_assert_str_eq(tu_str(cell, "state"), state, "%s", af_dump(cell));
    long st = 0;
    json_t *j = rt_post(r, "frames", offset, "x", 1, &st);
    cr_assert_eq(st, 410, "%s", af_dump(j));
    cr_assert_str_eq(tu_str(j, "state"), state, "the 410 names how it ended");
    json_decref(j);
    json_decref(done);
}

Test(remote, garbage_frames_end_the_attempt_protocol_error, .fini = rt_stop, .timeout = 60)
{
    struct rt *r;
    char *job = launched_cell(&r);
    long st = 0;
    static const char junk[] = "this is not a frame stream at all, not even close\n";
    json_decref(rt_post(r, "frames", 0, junk, sizeof junk - 1, &st));
    cr_assert_eq(st, 200);
    expect_ended(r, job, "protocol_error", sizeof junk - 1);
    free(job);
}

Test(remote, cancel_is_told_to_the_worker, .fini = rt_stop, .timeout = 60)
{
    struct rt *r;
    char *job = launched_cell(&r);
    long st = 0;
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", job);
    json_decref(tu_json(&r->c, "POST", path, "{}", &st));
    cr_assert(st == 200 || st == 202, "cancel: %ld", st);
    expect_ended(r, job, "cancelled", 0);
    free(job);
}

Test(remote, no_worker_within_the_start_timeout_fails_the_cell, .fini = rt_stop, .timeout = 60)
{
    struct rt *r = rt_start(", \"remote_start_timeout_s\": 1");
    char *job = tu_submit(&r->c, "fake", "mlp", NULL);
    json_t *done = af_wait_job(&r->c, job, 30);
    json_t *cell = json_array_get(json_object_get(done, "cells"), 0);
    cr_assert_str_eq(tu_str(cell, "state"), "failed", "%s", af_dump(cell));
    cr_assert(strstr(tu_str(cell, "reason"), "remote_start_timeout_s"), "%s", af_dump(cell));
    json_decref(done);
    free(job);
}

Test(remote, a_failing_launcher_fails_the_cell_at_once, .fini = rt_stop, .timeout = 60)
{
    struct rt *r = calloc(1, sizeof *r);
    R = r;
    char *dir = tu_tmpdir();
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/capd.json", dir);
    af_put_file(cfg,
                "{\"executor\": \"remote\", \"remote_launch\": \"echo no slurm here; exit 3\"}");
    const char *extra[] = {"--config", cfg, NULL};
    af_start_capd(&r->c, dir, extra);
    free(dir);
    cr_assert_eq(tu_fake_build(&r->c, "fake", NULL), 201);
    double t0 = tu_now_s();
    char *job = tu_submit(&r->c, "fake", "mlp", NULL);
    json_t *done = af_wait_job(&r->c, job, 30);
    json_t *cell = json_array_get(json_object_get(done, "cells"), 0);
    cr_assert_str_eq(tu_str(cell, "state"), "failed", "%s", af_dump(cell));
    cr_assert(strstr(tu_str(cell, "reason"), "remote_launch exited 3"), "%s", af_dump(cell));
    cr_assert_lt(tu_now_s() - t0, 20, "not after the start timeout");
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s/log", job, tu_str(cell, "id"));
    struct tu_resp lr;
    cr_assert_eq(tu_http(&r->c, "GET", path, NULL, 0, NULL, &lr), 0);
    cr_assert(lr.body && strstr(lr.body, "no slurm here"), "the launcher's output is in the log");
    tu_resp_free(&lr);
    json_decref(done);
    free(job);
}

/* capd with the config file TEXT: its exit status, its stderr in *ERR. */
static int run_with_config(const char *dir, const char *text, char **err)
{
    char cfg[400], p[400];
    snprintf(cfg, sizeof cfg, "%s/bad.json", dir);
    af_put_file(cfg, text);
    int rc = tu_sh("timeout 20 '%s' --listen 127.0.0.1:0 --data-dir '%s/data' --config '%s' "
                   ">/dev/null 2>'%s/err' </dev/null",
                   tu_bin("CAPD_BIN"), dir, cfg, dir);
    snprintf(p, sizeof p, "%s/err", dir);
    *err = tu_slurp(p);
    return rc;
}

Test(remote, bad_executor_settings_stop_capd, .timeout = 60)
{
    char *dir = tu_tmpdir(), *err = NULL;
    static const struct {
        const char *config, *says;
    } cases[] = {
        {"{\"executor\": \"cluster\"}",
         "executor must be \"local\", \"remote\" or \"slurm\", not \"cluster\""},
        {"{\"executor\": \"remote\"}", "executor \"remote\" needs remote_launch"},
        {"{\"executor\": \"remote\", \"remote_launch\": \"true\", \"remote_url\": \"ftp://x\"}",
         "remote_url must start with http:// or https://"},
        {"{\"remote_start_timeout_s\": 0}", "remote_start_timeout_s"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = run_with_config(dir, cases[i].config, &err);
        cr_assert_neq(rc, 0, "%s: capd refuses to start", cases[i].config);
        cr_assert(strstr(err, cases[i].says), "%s: says '%s', got: %s", cases[i].config,
                  cases[i].says, err);
        free(err);
    }
    tu_sh("rm -rf '%s'", dir);
    free(dir);
}

/* capd whose remote_launch runs capd-cell itself, on this host. */
static struct rt *rt_start_worker(const char *config_extra)
{
    return rt_start_as(true, config_extra);
}

/* Every outcome through capd-cell, as the local executor gives it: the
 * state, and the records a crash leaves. */
Test(remote, capd_cell_runs_cells_as_the_local_executor_does, .fini = rt_stop, .timeout = 120)
{
    struct rt *r = rt_start_worker("");
    static const struct {
        const char *model, *options, *state;
        int tensors; /* tensor records kept; -1: as the local executor's */
    } cases[] = {
        {"fake:ok__5", NULL, "ok", -1},
        {"fake:segv", NULL, "crashed", 2},
        {"fake:exit3", NULL, "failed", 0},
        {"fake:garbage", NULL, "protocol_error", 0},
        {"fake:hang", "{\"timeout_s\":1}", "timeout", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *job = NULL;
        json_t *cell = af_run_cell(&r->c, cases[i].model, cases[i].options, &job);
        char path[128];
        snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s/log", job, tu_str(cell, "id"));
        struct tu_resp lr;
        cr_assert_eq(tu_http(&r->c, "GET", path, NULL, 0, NULL, &lr), 0);
        cr_assert_str_eq(tu_str(cell, "state"), cases[i].state, "%s: %s; log: %s", cases[i].model,
                         af_dump(cell), lr.body ? lr.body : "");
        tu_resp_free(&lr);
        json_t *t = af_cell_records(&r->c, job, tu_str(cell, "id"), "tensor");
        if (cases[i].tensors >= 0) {
            cr_assert_eq(json_array_size(t), (size_t)cases[i].tensors, "%s: tensors kept",
                         cases[i].model);
        } else {
            af_expect_local_records(&r->c, job, tu_str(cell, "id"), cases[i].model, cases[i].model);
        }
        json_decref(t);
        json_decref(cell);
        free(job);
    }
}

/* capd killed -9 while capd-cell streams a cell, and started again on the
 * same port and data dir: it takes the attempt up again (no second
 * attempt, no second run), reads the spool anew, and the cell ends ok with
 * the local executor's records. */
static void restart_mid_cell(bool kill9);

Test(remote, capd_killed_mid_cell_takes_the_attempt_up_again, .fini = rt_stop, .timeout = 120)
{
    restart_mid_cell(true);
}

/* The same with capd stopped the ordinary way (SIGTERM): it leaves the
 * attempt open and its spool in place for the next capd. */
Test(remote, capd_stopped_mid_cell_hands_the_attempt_over, .fini = rt_stop, .timeout = 120)
{
    restart_mid_cell(false);
}

/* The job's one cell, once done (TIMEOUT_S at most): ok on its first
 * attempt, with the records of MODEL run locally (WHAT names them). */
static void expect_ok_once(struct rt *r, const char *job, int timeout_s, const char *model,
                           const char *what)
{
    json_t *done = af_wait_job(&r->c, job, timeout_s);
    json_t *cell = json_array_get(json_object_get(done, "cells"), 0);
    cr_assert_str_eq(tu_str(cell, "state"), "ok", "%s", af_dump(cell));
    cr_assert_eq(json_integer_value(json_object_get(cell, "attempts")), 1,
                 "the same attempt, not a second one: %s", af_dump(cell));
    af_expect_local_records(&r->c, job, tu_str(cell, "id"), model, what);
    json_decref(done);
}

static void restart_mid_cell(bool kill9)
{
    struct rt *r = rt_start_worker("");
    char *job = tu_submit(&r->c, "fake", "fake:slow__4000", NULL);
    cr_assert_not_null(job);
    /* the worker has fetched its spec and the runner streams */
    char *log = NULL;
    for (int i = 0; i < 200; i++) {
        free(log);
        log = tu_slurp(r->c.errlog);
        if (strstr(log, "cell_remote_started"))
            break;
        usleep(50 * 1000);
    }
    cr_assert(strstr(log, "cell_remote_started"), "the worker started: %s", log);
    free(log);
    usleep(500 * 1000);
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/capd.json", r->dir);
    af_restart_capd(&r->c, cfg, kill9);
    expect_ok_once(r, job, 60, "fake:slow__4000", "the records read anew from the spool");
    log = tu_slurp(r->c.errlog);
    cr_assert(strstr(log, "cell_reattached"), "%s", log);
    free(log);
    free(job);
}

/* capd killed -9 right after it answered the worker's finish: the finish
 * was kept in the spool dir before the answer, so the next capd ends the
 * same attempt with it (the worker, told 200, never sends it again): ok,
 * one attempt, every record. Whether the first capd stored the outcome
 * before the kill is a race; the test holds either way and says which. */
Test(remote, a_finish_answered_before_a_kill_is_not_lost, .fini = rt_stop, .timeout = 120)
{
    struct rt *r;
    char *job = launched_cell_of("fake:ok__5", &r);
    json_t *spec = rt_spec(r);
    run_worker(r, spec);
    json_decref(spec);
    size_t flen = 0, llen = 0;
    char *fb, *lb;
    worker_output(r, &fb, &flen, &lb, &llen);
    long st = 0;
    json_decref(rt_post(r, "frames", 0, fb, flen, &st));
    cr_assert_eq(st, 200);
    json_decref(rt_post(r, "log", 0, lb, llen, &st));
    cr_assert_eq(st, 200);
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/capd.json", r->dir);
    json_decref(rt_finish(r, flen, llen, "", &st));
    af_restart_capd(&r->c, cfg, true);
    cr_assert_eq(st, 200, "finish");
    expect_ok_once(r, job, 30, "fake:ok__5", "the records of the finished attempt");
    char *log = tu_slurp(r->c.errlog);
    fprintf(stderr, "a_finish_answered_before_a_kill: the outcome was %s\n",
            strstr(log, "cell_reattached") ? "stored by the next capd, from finish.json"
                                           : "stored before the kill");
    cr_assert(!strstr(log, "cell_reattached") || strstr(log, "finished=1"),
              "a reattached attempt is ended by its kept finish: %s", log);
    free(log);
    free(fb);
    free(lb);
    free(job);
}
