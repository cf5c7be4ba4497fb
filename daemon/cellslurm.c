/*
 * daemon/cellslurm.c - executor "slurm": a remote attempt (cellremote.c)
 * whose worker Slurm starts (docs/scale.md). Each attempt is one `sbatch`
 * job of a small script that execs slurm_worker (capd-cell) with the
 * attempt's URL, id and token; the width's CPU features become
 * `--constraint`, a GPU cell asks `--gres=gpu:1`, a cell that times asks
 * `--exclusive` (slurm_exclusive_timing). One poll every slurm_poll_ms
 * asks the states of every job in flight in one squeue (daemon/slurm.h)
 * and maps them (slurm_state_map): a job that ended without the worker
 * having finished ends the attempt with Slurm's reason; NODE_FAIL,
 * PREEMPTED and BOOT_FAIL requeue the cell as a new attempt while
 * max_attempts allows. Cancelling scancels the job.
 *
 * The Slurm commands run on libuv's worker threads (they wait on the
 * controller); their results come back to the loop, which finds the
 * attempt again by its id, so an attempt that ended meanwhile is never
 * touched (its job, if any, is cancelled).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/remote.h"
#include "daemon/slurm.h"
#include "daemon/sup_int.h"
#include "daemon/widths.h"
#include "util/err.h"
#include "util/log.h"
#include "util/path.h"

/* Polls after a job left Slurm's lists, or ended, before capd gives up
 * waiting for its worker's finish. */
#define SLURM_GRACE_POLLS 2
/* Polls a worker's finish after a signal from outside waits for Slurm to
 * say why (a job completing is still RUNNING-like for a moment). */
#define SLURM_DEFER_POLLS SUP__SLURM_DEFER_POLLS

static struct {
    struct sup *head; /* attempts with a Slurm job (or one being submitted) */
    uv_timer_t timer;
    bool timer_on, querying;
    struct slurm_ctx ctx;
    const struct capd_config *cfg;
} S;

static void ctx_init(const struct capd_config *cfg)
{
    S.cfg = cfg;
    S.ctx.bin_dir = cfg->slurm_bin_dir[0] ? cfg->slurm_bin_dir : NULL;
    S.ctx.slurm_conf = cfg->slurm_conf[0] ? cfg->slurm_conf : NULL;
    S.ctx.timeout_ms = 30000;
    S.ctx.out_max = 4 << 20;
}

static struct sup *find(int64_t attempt_id)
{
    for (struct sup *s = S.head; s; s = s->slurm_next)
        if (s->run.attempt_id == attempt_id)
            return s;
    return NULL;
}

static void unlink_sup(struct sup *s)
{
    for (struct sup **p = &S.head; *p; p = &(*p)->slurm_next)
        if (*p == s) {
            *p = s->slurm_next;
            return;
        }
}

/* Ends attempt S from Slurm's side with STATE and REASON (once). */
static void end_with(struct sup *s, const char *state, const char *reason)
{
    if (!s->fail_state) {
        s->fail_state = strdup(state);
        s->fail_reason = strdup(reason);
    }
    remote_end(s->remote, state);
}

/* ---- scancel, fire and forget ---- */

struct cancel_work {
    uv_work_t w;
    uint32_t job;
};

static void cancel_run(uv_work_t *w)
{
    struct cancel_work *c = w->data;
    char *err = NULL;
    if (slurm_cancel(&S.ctx, &c->job, 1, &err) != 0)
        log_warn("slurm_cancel_failed", "slurm_job=%u err=%s", c->job, log_q(err));
    free(err);
}

static void cancel_done(uv_work_t *w, int status)
{
    (void)status;
    free(w->data);
}

static void cancel_job(uv_loop_t *loop, uint32_t job)
{
    struct cancel_work *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->job = job;
    c->w.data = c;
    if (uv_queue_work(loop, &c->w, cancel_run, cancel_done) != 0)
        free(c);
}

/* ---- submission ---- */

struct submit_work {
    uv_work_t w;
    int64_t attempt_id;
    char script[UTIL_PATH_MAX], constraint[512], name[64], time_s[16];
    bool gpu, exclusive;
    int time_min;
    uint32_t job;
    int rc;
    char *err;
};

static void submit_run(uv_work_t *w)
{
    struct submit_work *b = w->data;
    const struct capd_config *cfg = S.cfg;
    struct slurm_submit sub = {
        .script = b->script,
        .array_last = -1,
        .time_limit_min = b->time_min,
        .gpu = b->gpu,
        .exclusive = b->exclusive,
        .no_requeue = true,
        .job_name = b->name,
        .partition = cfg->slurm_partition[0] ? cfg->slurm_partition : NULL,
        .account = cfg->slurm_account[0] ? cfg->slurm_account : NULL,
        .qos = cfg->slurm_qos[0] ? cfg->slurm_qos : NULL,
        .constraint = b->constraint[0] ? b->constraint : NULL,
        .output = "/dev/null",
        .workdir = cfg->slurm_workdir[0] ? cfg->slurm_workdir : NULL,
    };
    b->rc = slurm_submit(&S.ctx, &sub, &b->job, &b->err);
}

static void submit_done(uv_work_t *w, int status)
{
    struct submit_work *b = w->data;
    struct sup *s = find(b->attempt_id);
    if (status == 0 && b->rc == 0 && (!s || s->finished || s->exited)) {
        cancel_job(w->loop, b->job); /* nobody wants it any more */
    } else if (s && !s->exited) {
        if (status != 0 || b->rc != 0) {
            char why[1200];
            snprintf(why, sizeof why, "sbatch refused the cell: %s",
                     b->err ? b->err : uv_strerror(status));
            log_warn("slurm_submit_failed", "job=%s cell=%s rc=%d err=%s", s->run.job_id,
                     s->run.cell_id, b->rc, log_q(b->err));
            end_with(s, b->rc == -ENOTSUP ? "unsupported" : "failed", why);
        } else {
            s->slurm_job = b->job;
            /* so that a capd restarted meanwhile polls it again */
            int rc = store_attempt_slurm_job(s->st, b->attempt_id, b->job);
            if (rc)
                log_warn("slurm_job_unstored", "job=%s cell=%s slurm_job=%u rc=%d", s->run.job_id,
                         s->run.cell_id, b->job, rc);
            log_info("slurm_submitted", "job=%s cell=%s attempt=%lld slurm_job=%u", s->run.job_id,
                     s->run.cell_id, (long long)s->run.attempt_id, b->job);
            char line[96];
            int n = snprintf(line, sizeof line, "[capd: Slurm job %u]\n", b->job);
            sup__log_write(s, line, (size_t)n);
        }
    }
    free(b->err);
    free(b);
}

/* The batch script: the worker with the attempt's variables, 0700 in the
 * scratch dir (sbatch sends its text to the controller). */
static int write_script(struct sup *s, const char *url, const char *token, char *path)
{
    char worker[UTIL_PATH_MAX];
    const struct capd_config *cfg = s->cfg;
    if (cfg->slurm_worker[0]) {
        snprintf(worker, sizeof worker, "%s", cfg->slurm_worker);
    } else {
        const char *slash = strrchr(cfg->exec_bin, '/');
        snprintf(worker, sizeof worker, "%.*s/capd-cell", slash ? (int)(slash - cfg->exec_bin) : 1,
                 slash ? cfg->exec_bin : ".");
    }
    int rc = util_path_join(path, s->scratch, "slurm-job.sh");
    if (rc)
        return rc;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0700);
    if (fd < 0)
        return -errno;
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        return -ENOMEM;
    }
    fprintf(f,
            "#!/bin/sh\n# capd: attempt %lld of cell %s (job %s)\n"
            "CAPD_URL='%s' CAPD_ATTEMPT=%lld CAPD_TOKEN='%s'\n"
            "export CAPD_URL CAPD_ATTEMPT CAPD_TOKEN\n"
            "exec '%s' --quiet\n",
            (long long)s->run.attempt_id, s->run.cell_id, s->run.job_id, url,
            (long long)s->run.attempt_id, token, worker);
    return fclose(f) == 0 ? 0 : -EIO;
}

/* The width's CPU features as a constraint: "avx512f&avx512bw"; -E2BIG
 * when they do not fit N bytes (a feature dropped would send the cell to a
 * node that lacks it). */
static int constraint_of(const struct sup *s, char *out, size_t n)
{
    json_t *req = width_requires(json_string_value(json_object_get(s->run.spec, "width")));
    size_t i, len = 0;
    json_t *v;
    out[0] = 0;
    json_array_foreach(req, i, v)
    {
        int w = snprintf(out + len, n - len, "%s%s", len ? "&" : "", json_string_value(v));
        if (w < 0 || (size_t)w >= n - len)
            return -E2BIG;
        len += (size_t)w;
    }
    return 0;
}

static void start_poll(uv_loop_t *loop);

int sup__slurm_submit(struct sup *s, const char *url, const char *token, char *reason, size_t rlen)
{
    if (!S.cfg)
        ctx_init(s->cfg);
    struct submit_work *b = calloc(1, sizeof *b);
    if (!b)
        return -ENOMEM;
    int rc = write_script(s, url, token, b->script);
    if (rc) {
        snprintf(reason, rlen, "cannot write the Slurm job's script in %s: %s", s->scratch,
                 strerror(-rc));
        free(b);
        return rc;
    }
    json_t *o = json_object_get(s->run.spec, "options");
    json_int_t timeout = json_integer_value(json_object_get(o, "timeout_s"));
    const char *device = json_string_value(json_object_get(o, "device"));
    b->attempt_id = s->run.attempt_id;
    b->gpu = device && strcmp(device, "gpu") == 0;
    b->exclusive =
        s->cfg->slurm_exclusive_timing && json_integer_value(json_object_get(o, "iterations")) > 0;
    /* the worker's own limit, the start-up and two minutes of margin */
    b->time_min = (int)(((timeout > 0 ? timeout : 600) + 180) / 60);
    snprintf(b->name, sizeof b->name, "capd-%s", s->run.cell_id);
    if (constraint_of(s, b->constraint, sizeof b->constraint) != 0) {
        snprintf(reason, rlen,
                 "width %s requires more CPU features than a constraint of %zu bytes "
                 "holds",
                 json_string_value(json_object_get(s->run.spec, "width")),
                 sizeof b->constraint - 1);
        free(b);
        return -E2BIG;
    }
    b->w.data = b;
    s->slurm_next = S.head;
    S.head = s;
    if ((rc = uv_queue_work(s->loop, &b->w, submit_run, submit_done)) != 0) {
        unlink_sup(s);
        snprintf(reason, rlen, "cannot queue the submission: %s", uv_strerror(rc));
        free(b);
        return rc;
    }
    start_poll(s->loop);
    return 0;
}

void sup__slurm_adopt(struct sup *s, uint32_t slurm_job)
{
    if (!S.cfg)
        ctx_init(s->cfg);
    s->slurm_job = slurm_job;
    s->slurm_next = S.head;
    S.head = s;
    start_poll(s->loop);
}

void sup__slurm_forget(struct sup *s)
{
    unlink_sup(s);
}

void sup__slurm_cancel(struct sup *s)
{
    if (s->slurm_job)
        cancel_job(s->loop, s->slurm_job);
    s->slurm_job = 0;
}

/* ---- the poll ---- */

struct query_work {
    uv_work_t w;
    size_t n;
    int64_t *attempt;
    struct slurm_job_state *rows;
    int rc;
    char *err;
};

static void query_run(uv_work_t *w)
{
    struct query_work *q = w->data;
    q->rc = slurm_query(&S.ctx, q->rows, q->n, &q->err);
}

/*
 * S's worker finished after a signal from outside: Slurm's final state
 * says what it was. A node failure or preemption requeues the cell,
 * someone's scancel cancels it, Slurm's time limit is a timeout; a job
 * still ending is waited for (SLURM_DEFER_POLLS at most), and anything
 * else leaves the worker's own report, failed with the signal.
 */
static void deferred(struct sup *s, const struct slurm_job_state *row)
{
    struct slurm_mapped m;
    slurm_state_map(row->known ? row->state : "UNKNOWN", row->reason, row->exit_code, row->signal,
                    &m);
    if ((m.verdict == SLURM_V_RUNNING || !row->known) && ++s->slurm_waits <= SLURM_DEFER_POLLS)
        return;
    char why[400];
    snprintf(why, sizeof why, "the worker got signal %d from outside capd; Slurm job %u: %s",
             s->deferred.worker_signal, row->job_id, row->known ? row->state : "unknown");
    if (m.verdict == SLURM_V_REQUEUE && s->run.attempt < s->cfg->max_attempts) {
        s->requeue = true;
        log_warn("slurm_requeue", "job=%s cell=%s attempt=%d reason=%s", s->run.job_id,
                 s->run.cell_id, s->run.attempt, log_q(why));
    } else if (m.verdict == SLURM_V_CANCELLED) {
        s->cancelled = true;
    } else if (m.verdict == SLURM_V_TIMEOUT) {
        s->timed_out = true;
    }
    if (!s->requeue && !s->cancelled && !s->timed_out) {
        s->fail_state = strdup("failed");
        s->fail_reason = strdup(why);
    }
    sup__remote_conclude(s);
}

/* What Slurm says of S's job, applied. */
static void apply(struct sup *s, const struct slurm_job_state *row)
{
    struct slurm_mapped m;
    char why[400];
    bool finished_worker = false;
    struct remote_exit ex;
    char state[96];
    if (remote_over(s->remote, &finished_worker, &ex, state, sizeof state) && !s->slurm_deferred)
        return; /* the worker finished, or capd ended it: nothing to add */
    if (s->slurm_deferred) {
        deferred(s, row);
        return;
    }
    if (!row->known) {
        if (++s->slurm_gone_polls > SLURM_GRACE_POLLS) {
            snprintf(why, sizeof why, "Slurm no longer knows job %u", row->job_id);
            end_with(s, "failed", why);
        }
        return;
    }
    slurm_state_map(row->state, row->reason, row->exit_code, row->signal, &m);
    snprintf(why, sizeof why, "Slurm job %u: %s%s%s", row->job_id, row->state,
             m.reason[0] ? ": " : "", m.reason);
    switch (m.verdict) {
    case SLURM_V_RUNNING:
        return;
    case SLURM_V_ENDED:
        /* the finish may still be on its way: a grace of a few polls */
        if (++s->slurm_gone_polls > SLURM_GRACE_POLLS) {
            snprintf(why, sizeof why,
                     "worker ended without finishing (Slurm job %u %s, exit code %d)", row->job_id,
                     row->state, row->exit_code);
            end_with(s, "protocol_error", why);
        }
        return;
    case SLURM_V_TIMEOUT:
    case SLURM_V_CANCELLED:
        /* capd's own outcomes: ran past the limit, or cancelled */
        *(m.verdict == SLURM_V_TIMEOUT ? &s->timed_out : &s->cancelled) = true;
        remote_end(s->remote, m.verdict == SLURM_V_TIMEOUT ? "timeout" : "cancelled");
        return;
    case SLURM_V_OOM:
    case SLURM_V_UNSUPPORTED:
    case SLURM_V_FAILED:
        end_with(s,
                 m.verdict == SLURM_V_OOM           ? "oom"
                 : m.verdict == SLURM_V_UNSUPPORTED ? "unsupported"
                                                    : "failed",
                 why);
        return;

    case SLURM_V_REQUEUE:
        if (s->run.attempt < s->cfg->max_attempts) {
            s->requeue = true;
            log_warn("slurm_requeue", "job=%s cell=%s attempt=%d reason=%s", s->run.job_id,
                     s->run.cell_id, s->run.attempt, log_q(why));
            sup__log_write(s, "[capd: ", 7);
            sup__log_write(s, why, strlen(why));
            sup__log_write(s, "; the cell is requeued]\n", 24);
            remote_end(s->remote, "requeued");
        } else {
            char all[500];
            snprintf(all, sizeof all, "%s, on each of its %d attempts", why, s->run.attempt);
            end_with(s, "failed", all);
        }
        return;
    }
}

static void query_done(uv_work_t *w, int status)
{
    struct query_work *q = w->data;
    S.querying = false;
    if (status != 0 || q->rc != 0) {
        log_warn("slurm_query_failed", "jobs=%zu rc=%d err=%s", q->n, q->rc, log_q(q->err));
    } else {
        for (size_t i = 0; i < q->n; i++) {
            struct sup *s = find(q->attempt[i]);
            if (s && !s->exited && s->slurm_job == q->rows[i].job_id)
                apply(s, &q->rows[i]);
        }
    }
    free(q->err);
    free(q->attempt);
    free(q->rows);
    free(q);
}

static void on_poll(uv_timer_t *t)
{
    size_t n = 0;
    for (struct sup *s = S.head; s; s = s->slurm_next)
        n += s->slurm_job && !s->exited;
    if (n == 0 && !S.head) {
        uv_timer_stop(t);
        S.timer_on = false;
        return;
    }
    if (n == 0 || S.querying)
        return;
    if (n > SLURM_QUERY_MAX)
        n = SLURM_QUERY_MAX; /* the rest are asked at the next poll */
    struct query_work *q = calloc(1, sizeof *q);
    if (q && (q->attempt = calloc(n, sizeof *q->attempt)) != NULL &&
        (q->rows = calloc(n, sizeof *q->rows)) != NULL) {
        size_t i = 0;
        for (struct sup *s = S.head; s && i < n; s = s->slurm_next) {
            if (!s->slurm_job || s->exited)
                continue;
            q->attempt[i] = s->run.attempt_id;
            q->rows[i].job_id = s->slurm_job;
            q->rows[i].task_id = -1;
            i++;
        }
        q->n = i;
        q->w.data = q;
        if (uv_queue_work(t->loop, &q->w, query_run, query_done) == 0) {
            S.querying = true;
            return;
        }
    }
    if (q) {
        free(q->attempt);
        free(q->rows);
    }
    free(q);
}

static void start_poll(uv_loop_t *loop)
{
    if (S.timer_on)
        return;
    if (S.timer.loop != loop)
        uv_timer_init(loop, &S.timer);
    uv_unref((uv_handle_t *)&S.timer);
    S.timer_on = true;
    uv_timer_start(&S.timer, on_poll, (uint64_t)S.cfg->slurm_poll_ms,
                   (uint64_t)S.cfg->slurm_poll_ms);
}
