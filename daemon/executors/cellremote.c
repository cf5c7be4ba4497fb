/*
 * daemon/executors/cellremote.c - a remote attempt (daemon/attempt/sup_int.h,
 * daemon/executors/remote.h): the spec reply, the token, the launcher, and the loop
 * side of the spool: what the worker uploaded is read into the frame
 * parser and the capped log, its finish ends the attempt, and capd's own
 * ends (timeout, cancel, a protocol error, shutdown) are told to the
 * worker through the API's 410.
 *
 * Timeouts: the worker must fetch its spec within remote_start_timeout_s
 * of the launch (a batch queue may hold it that long); the cell's own
 * timeout_s runs from then on. The token expires once both could have
 * passed, with a grace for the last uploads.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/config/executor.h"
#include "daemon/executors/remote.h"
#include "daemon/executors/cellremote.h"
#include "storage/layout.h"
#include "util/clock.h"
#include "util/log.h"

#define REMOTE_TOKEN_GRACE_S 600

extern char **environ;

/* The spec reply (docs/api.md, GET /v1/attempts/{id}/spec). */
static json_t *spec_reply(struct sup *s, char *const *env, const char *spec_path)
{
    json_t *spec = json_load_file(spec_path, 0, NULL);
    json_t *envo = json_object();
    const char *python = json_string_value(json_object_get(s->run.build, "python"));
    for (char *const *e = env; envo && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (eq) {
            char key[256];
            snprintf(key, sizeof key, "%.*s", (int)(eq - *e), *e);
            json_object_set_new(envo, key, json_string(eq + 1));
        }
    }
    if (!spec || !envo || !python) {
        json_decref(spec);
        json_decref(envo);
        return NULL;
    }
    /* The job's own limit only: capd's cell_memory_max_bytes is a share of
     * capd's host, which says nothing of the worker's. */
    return json_pack("{s:I,s:s,s:s,s:[s,s,s],s:o,s:o,s:s,s:I,s:I,s:I}", "attempt",
                     (json_int_t)s->run.attempt_id, "job", s->run.job_id, "cell", s->run.cell_id,
                     "argv", python, "-m", "capd_runner", "env", envo, "spec", spec, "scratch",
                     s->scratch, "timeout_s", (json_int_t)s->run.opts.timeout_s, "chunk_max_bytes",
                     (json_int_t)s->cfg->max_body_bytes, "memory_max_bytes",
                     (json_int_t)s->run.opts.memory_max_bytes);
}

/* ---- the loop side of the spool ---- */

/* Everything uploaded so far, into the parser and the log. */
static void drain(struct sup *s)
{
    ssize_t n;
    while (!s->frames_eof &&
           (n = remote_read(sup__rem(s)->remote, REMOTE_FRAMES, s->buf, SUP__READ_BUF)) > 0)
        sup__frames_bytes(s, s->buf, (size_t)n);
    while ((n = remote_read(sup__rem(s)->remote, REMOTE_LOG, s->buf, SUP__READ_BUF)) > 0)
        sup__log_write(s, s->buf, (size_t)n);
}

static void on_timeout(uv_timer_t *t)
{
    struct sup *s = t->data;
    bool finished = false;
    struct remote_exit ex;
    char state[96];
    if (sup__rem(s)->deferred) {
        /* Slurm did not say in time why the worker was stopped */
        char why[160];
        snprintf(why, sizeof why,
                 "the worker got signal %d from outside capd; Slurm did not say why within %d "
                 "polls",
                 sup__rem(s)->report.worker_signal, SUP__DEFER_POLLS);
        if (sup__rem(s)->report.worker_signal)
            sup__fail(s, CELL_FAILED, why); /* else the runner's own end says it */
        sup__remote_conclude(s);
        return;
    }
    /* a finish that came in this very loop turn is no timeout */
    if (remote_over(sup__rem(s)->remote, &finished, &ex, state, sizeof state) && finished)
        return;
    if (!sup__rem(s)->running) {
        char why[160];
        snprintf(why, sizeof why,
                 "no worker fetched the cell's spec within remote_start_timeout_s (%d s) of its "
                 "launch",
                 s->cfg->remote_start_timeout_s);
        sup__fail(s, CELL_FAILED, why);
    } else {
        s->timed_out = true;
    }
    log_warn("cell_timeout", "job=%s cell=%s remote=1 started=%d", s->run.job_id, s->run.cell_id,
             sup__rem(s)->running);
    sup__remote_stop(s); /* tells the worker, and scancels its Slurm job */
}

/* Whether the attempt was stopped by something outside capd and its
 * worker: the worker got a signal, or the runner was killed by SIGTERM or
 * SIGKILL that the worker did not send (a batch system signals every
 * process of a job, the runner often before the worker). */
static bool stopped_from_outside(const struct remote_exit *ex)
{
    if (ex->worker_signal)
        return true;
    return (ex->signal == SIGTERM || ex->signal == SIGKILL) && !ex->worker_timeout &&
           !ex->worker_oom;
}

/* The attempt is over: what the worker said of its runner, or, when capd
 * ended it, a kill. */
static void over(struct sup *s, bool finished, const struct remote_exit *ex, const char *state)
{
    drain(s);
    uint64_t dropped = remote_log_dropped(sup__rem(s)->remote);
    if (dropped && !sup__rem(s)->deferred) {
        char note[160];
        int n = snprintf(note, sizeof note,
                         "\n[capd: %llu bytes of the worker's output past the spool's %llu were "
                         "dropped]\n",
                         (unsigned long long)dropped, (unsigned long long)REMOTE_LOG_SPOOL_MAX);
        sup__log_write(s, note, (size_t)n);
    }
    if (finished && ex->worker_timeout)
        s->timed_out = true; /* the worker's own clock ran out first */
    if (finished && ex->worker_oom)
        s->worker_oom = true;
    if (finished && !sup__rem(s)->decided && stopped_from_outside(ex) && !s->cancelled &&
        !s->timed_out && !s->fail_state) {
        /* Stopped from outside: Slurm knows why (node failure, preemption,
         * someone's scancel, its time limit); elsewhere nobody does. */
        if (s->exec->knows_why_stopped && s->exec->knows_why_stopped(s)) {
            log_info("cell_stopped_from_outside",
                     "job=%s cell=%s attempt=%lld worker_signal=%d runner_signal=%d", s->run.job_id,
                     s->run.cell_id, (long long)s->run.attempt_id, ex->worker_signal, ex->signal);
            sup__rem(s)->deferred = true;
            sup__rem(s)->report = *ex;
            /* the wait for Slurm's word is bounded even if squeue fails */
            uv_timer_stop(&s->timer);
            uv_timer_start(&s->timer, on_timeout,
                           (uint64_t)(SUP__DEFER_POLLS + 2) * (uint64_t)s->cfg->slurm_poll_ms, 0);
            return;
        }
        if (ex->worker_signal) {
            char why[200];
            snprintf(why, sizeof why,
                     "the worker got signal %d from outside capd and stopped its runner",
                     ex->worker_signal);
            sup__fail(s, CELL_FAILED, why);
        }
    }
    /* Ended by something other than capd's own decisions: say what. */
    if (!finished && !s->fail_state && !s->cancelled && !s->timed_out && !s->abandoned) {
        char why[200];
        snprintf(why, sizeof why, "the remote attempt ended before its worker finished: %s", state);
        sup__fail(s, CELL_FAILED, why);
    }
    if (finished && !s->frames_eof)
        sup__frames_end(s);
    s->frames_eof = s->log_eof = s->exited = true;
    s->exit_status = finished ? ex->exit_status : 0;
    s->term_signal = finished ? ex->signal : SIGKILL;
    if (finished) {
        s->peak_rss = ex->peak_rss_bytes;
        s->cpu_us = ex->cpu_time_ms < INT64_MAX / 1000 ? ex->cpu_time_ms * 1000 : INT64_MAX;
    }
    uv_timer_stop(&s->timer);
    sup__finish(s);
}

void sup__remote_conclude(struct sup *s)
{
    struct remote_exit ex = sup__rem(s)->report;
    sup__rem(s)->decided = true; /* what the signal meant */
    sup__rem(s)->deferred = false;
    over(s, true, &ex, "finished");
}

static void on_wake(uv_async_t *h)
{
    struct sup *s = h->data;
    if (s->finished || !sup__rem(s)->remote || sup__rem(s)->deferred)
        return;
    if (!sup__rem(s)->running && remote_started(sup__rem(s)->remote)) {
        sup__rem(s)->running = true;
        uv_timer_stop(&s->timer);
        uv_timer_start(&s->timer, on_timeout, (uint64_t)s->run.opts.timeout_s * 1000, 0);
        log_info("cell_remote_started", "job=%s cell=%s attempt=%lld", s->run.job_id,
                 s->run.cell_id, (long long)s->run.attempt_id);
    }
    drain(s);
    bool finished = false;
    struct remote_exit ex;
    char state[96];
    if (remote_over(sup__rem(s)->remote, &finished, &ex, state, sizeof state))
        over(s, finished, &ex, state);
}

void sup__remote_stop(struct sup *s)
{
    if (sup__rem(s)->deferred) { /* the worker has finished: end with its report */
        sup__remote_conclude(s);
        return;
    }
    /* capd stopping leaves the worker running: the next capd takes the
     * attempt up again (sup_reattach), and meanwhile the API answers 503. */
    if (s->exec->launch_stop && !s->abandoned)
        s->exec->launch_stop(s);
    const char *state = s->cancelled    ? "cancelled"
                        : s->timed_out  ? "timeout"
                        : s->fail_state ? s->fail_state
                        : s->abandoned  ? REMOTE_STATE_STOPPING
                                        : "ended";
    remote_end(sup__rem(s)->remote, state);
}

void sup__remote_close(struct sup *s)
{
    if (s->exec->launch_forget)
        s->exec->launch_forget(s);
    /* capd stopping: the spool stays for the next capd (sup_reattach) */
    remote_close(sup__rem(s)->remote, s->abandoned);
    sup__rem(s)->remote = NULL;
    sup__close_handle(s, (uv_handle_t *)&sup__rem(s)->wake);
}

/* ---- the launcher ---- */

struct launch {
    uv_process_t proc;
    int64_t attempt_id;
    char job[16], cell[16];
    struct launch *next; /* the launchers whose handle is open */
};

static struct launch *launches;

static void launch_closed(uv_handle_t *h)
{
    struct launch *l = h->data;
    for (struct launch **p = &launches; *p; p = &(*p)->next)
        if (*p == l) {
            *p = l->next;
            break;
        }
    free(l);
}

/* capd stops: the launchers still running are left to run (a launcher
 * may be the worker itself); their handles close. */
static void launchers_shutdown(void)
{
    for (struct launch *l = launches; l; l = l->next)
        if (!uv_is_closing((uv_handle_t *)&l->proc))
            uv_close((uv_handle_t *)&l->proc, launch_closed);
}

static void launch_exit(uv_process_t *p, int64_t status, int sig)
{
    struct launch *l = p->data;
    /* A launcher that fails ends its attempt (if it is still waiting: a
     * launcher may also be the worker itself, which ends after it). */
    if (status != 0 || sig != 0) {
        char why[96];
        snprintf(why, sizeof why, "remote_launch %s %d (its output is in the cell log)",
                 sig ? "was killed by signal" : "exited", sig ? sig : (int)status);
        log_warn("cell_launch_failed", "job=%s cell=%s exit=%lld signal=%d", l->job, l->cell,
                 (long long)status, sig);
        remote_end_id(l->attempt_id, why);
    }
    uv_close((uv_handle_t *)p, launch_closed);
}

/* The URL workers reach capd at: remote_url, else the listen address. */
static void capd_url(const struct capd_config *cfg, char *out, size_t n)
{
    if (cfg->remote_url[0])
        snprintf(out, n, "%s", cfg->remote_url);
    else
        snprintf(out, n, "%s://%s:%d", cfg->tls_cert[0] ? "https" : "http", cfg->listen_addr,
                 cfg->listen_port);
}

/* capd's own environment and the attempt's variables, for the launcher. */
static char **launch_env(struct sup *s, const char *url, const char *token)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 7, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "CAPD_", 5) != 0)
            env[k++] = strdup(environ[i]);
    if (asprintf(&env[k++], "CAPD_URL=%s", url) < 0 ||
        asprintf(&env[k++], "CAPD_ATTEMPT=%lld", (long long)s->run.attempt_id) < 0 ||
        asprintf(&env[k++], "CAPD_TOKEN=%s", token) < 0 ||
        asprintf(&env[k++], "CAPD_JOB=%s", s->run.job_id) < 0 ||
        asprintf(&env[k++], "CAPD_CELL=%s", s->run.cell_id) < 0)
        env[k - 1] = NULL;
    for (size_t i = 0; i < k; i++)
        if (!env[i]) {
            for (size_t j = 0; j < k; j++)
                free(env[j]);
            free(env);
            return NULL;
        }
    return env;
}

/* Runs remote_launch through /bin/sh, its output into the cell log. */
static int launch(struct sup *s, const char *url, const char *token)
{
    struct launch *l = calloc(1, sizeof *l);
    char **env = launch_env(s, url, token);
    int rc = -ENOMEM;
    if (l && env) {
        l->attempt_id = s->run.attempt_id;
        snprintf(l->job, sizeof l->job, "%s", s->run.job_id);
        snprintf(l->cell, sizeof l->cell, "%s", s->run.cell_id);
        char *args[] = {"/bin/sh", "-c", (char *)s->cfg->remote_launch, NULL};
        uv_stdio_container_t stdio[3] = {{.flags = UV_IGNORE},
                                         {.flags = UV_INHERIT_FD, .data.fd = s->log_fd},
                                         {.flags = UV_INHERIT_FD, .data.fd = s->log_fd}};
        uv_process_options_t po = {.exit_cb = launch_exit,
                                   .file = args[0],
                                   .args = args,
                                   .env = env,
                                   .cwd = s->scratch,
                                   .flags = UV_PROCESS_DETACHED,
                                   .stdio_count = 3,
                                   .stdio = stdio};
        l->proc.data = l;
        l->next = launches;
        launches = l;
        rc = uv_spawn(s->loop, &l->proc, &po);
        if (rc)
            uv_close((uv_handle_t *)&l->proc, launch_closed);
        else
            uv_unref((uv_handle_t *)&l->proc); /* capd's stop never waits for it */
        l = NULL;
    }
    free(l);
    for (char **e = env; e && *e; e++)
        free(*e);
    free(env);
    return rc;
}

/* The attempt's two handles: its timer and the API's wake-up. */
static void remote_handles(struct sup *s)
{
    uv_timer_init(s->loop, &s->timer);
    uv_async_init(s->loop, &sup__rem(s)->wake, on_wake);
    s->timer.data = sup__rem(s)->wake.data = s;
    s->handles_open = 2;
}

/* S's remote state, in S->ex. 0 or -ENOMEM. */
static int remote_new(struct sup *s)
{
    s->ex = calloc(1, sizeof(struct sup__remote));
    return s->ex ? 0 : -ENOMEM;
}

void sup__remote_release(struct sup *s)
{
    free(s->ex);
    s->ex = NULL;
}

int sup__remote_reattach(struct sup *s, char *const *env, const char *spec_path,
                         struct store_slurm_job slurm, char *reason, size_t rlen)
{
    if (remote_new(s) != 0)
        return -ENOMEM;
    json_t *reply = spec_reply(s, env, spec_path);
    if (!reply) {
        snprintf(reason, rlen, "cannot read the attempt's spec %s again", spec_path);
        return -ENOENT;
    }
    /* the log is written anew from the spool's first byte */
    char prev[LAYOUT_PATH_MAX + 8];
    snprintf(prev, sizeof prev, "%s.prev", s->log_path);
    unlink(prev);
    int rc = sup__log_open(s);
    if (rc == 0)
        rc = remote_reopen(s->run.attempt_id, s->scratch, reply, &sup__rem(s)->wake,
                           &sup__rem(s)->remote);
    json_decref(reply);
    if (rc) {
        snprintf(reason, rlen, "cannot reopen the attempt's spool in %s: %s", s->scratch,
                 strerror(-rc));
        return rc;
    }
    remote_handles(s);
    /* The worker's own clock is not known: its timeout runs afresh. */
    sup__rem(s)->running = remote_started(sup__rem(s)->remote);
    uint64_t ms = sup__rem(s)->running ? (uint64_t)s->run.opts.timeout_s * 1000
                                       : (uint64_t)s->cfg->remote_start_timeout_s * 1000;
    uv_timer_start(&s->timer, on_timeout, ms, 0);
    if (s->exec->launch_adopt && slurm.job)
        s->exec->launch_adopt(s, slurm);
    bool finished = false;
    struct remote_exit ex;
    char state[96];
    remote_over(sup__rem(s)->remote, &finished, &ex, state, sizeof state);
    log_info("cell_reattached",
             "job=%s cell=%s attempt=%lld slurm_job=%u slurm_task=%d started=%d finished=%d",
             s->run.job_id, s->run.cell_id, (long long)s->run.attempt_id, slurm.job, slurm.task,
             sup__rem(s)->running, finished);
    uv_async_send(&sup__rem(s)->wake); /* read the spool from its first byte */
    return 0;
}

int sup__remote_start(struct sup *s, char *const *env, const char *spec_path, char *reason,
                      size_t rlen)
{
    char token[STORE_ATTEMPT_TOKEN_MAX];
    json_t *reply = spec_reply(s, env, spec_path);
    int64_t expires = util_wall_ms() + ((int64_t)s->cfg->remote_start_timeout_s +
                                        s->run.opts.timeout_s + REMOTE_TOKEN_GRACE_S) *
                                           1000;
    int rc = -ENOMEM;
    if (!reply || remote_new(s) != 0)
        goto fail;
    if ((rc = sup__log_open(s)) != 0) {
        snprintf(reason, rlen, "cannot open the cell log %s: %s", s->log_path, strerror(-rc));
        goto fail;
    }
    if ((rc = store_attempt_token_create(s->st, s->run.attempt_id, expires, token)) != 0 ||
        (rc = store_flush(s->st)) != 0) {
        snprintf(reason, rlen, "cannot store the attempt's token: %s", store_errmsg(s->st));
        goto fail;
    }
    if ((rc = remote_open(s->run.attempt_id, s->scratch, reply, &sup__rem(s)->wake,
                          &sup__rem(s)->remote)) != 0) {
        snprintf(reason, rlen, "cannot create the attempt's spool in %s: %s", s->scratch,
                 strerror(-rc));
        goto fail;
    }
    json_decref(reply);
    remote_handles(s);
    uv_timer_start(&s->timer, on_timeout, (uint64_t)s->cfg->remote_start_timeout_s * 1000, 0);
    /* From here the attempt ends the ordinary way, even if the launch fails. */
    char url[600], why[1200] = "";
    capd_url(s->cfg, url, sizeof url);
    rc = s->exec->launch(s, url, token, why, sizeof why);
    memset(token, 0, sizeof token);
    if (rc) {
        sup__fail(s, CELL_FAILED, why);
        remote_end(sup__rem(s)->remote, cell_state_name(CELL_FAILED));
    }
    log_info("cell_started", "job=%s cell=%s attempt=%d remote=1 model=%s width=%s pass=%s",
             s->run.job_id, s->run.cell_id, s->run.attempt,
             log_q(json_string_value(json_object_get(s->run.spec, "model"))),
             json_string_value(json_object_get(s->run.spec, "width")),
             json_string_value(json_object_get(s->run.spec, "pass")));
    return 0;
fail:
    memset(token, 0, sizeof token);
    json_decref(reply);
    if (sup__rem(s) && sup__rem(s)->remote) {
        remote_close(sup__rem(s)->remote, false);
        sup__rem(s)->remote = NULL;
    }
    return rc;
}

/* ---- the executor "remote" ---- */

void sup__remote_kill(struct sup *s, int sig)
{
    (void)sig; /* the worker ends its runner its own way */
    sup__remote_stop(s);
}

/* remote_launch through /bin/sh: the launch of executor "remote". */
static int launch_command(struct sup *s, const char *url, const char *token, char *why, size_t wlen)
{
    int rc = launch(s, url, token);
    if (rc)
        snprintf(why, wlen, "cannot run remote_launch: %s", uv_strerror(rc));
    return rc;
}

static const char *remote_config_problem(const struct capd_config *cfg)
{
    return cfg->remote_launch[0] ? NULL
                                 : "executor \"remote\" needs remote_launch: the command that "
                                   "starts capd-cell for an attempt (docs/scale.md)";
}

const struct executor executor_remote = {
    .name = "remote",
    .on_host = false,
    .host_widths = true,
    .config_problem = remote_config_problem,
    .start = sup__remote_start,
    .reattach = sup__remote_reattach,
    .stop = sup__remote_kill,
    .close = sup__remote_close,
    .release = sup__remote_release,
    .shutdown = launchers_shutdown,
    .launch = launch_command,
};
