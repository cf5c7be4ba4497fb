/*
 * daemon/executors/cellslurm.c - executor "slurm": a remote attempt (cellremote.c)
 * whose worker Slurm starts (docs/scale.md). The attempts the scheduler
 * starts in one loop turn wait for the turn's end; then those that ask the
 * same resources become one `sbatch --array=0-N%max_parallel` (at most
 * SLURM_ARRAY_LAST_MAX + 1 tasks; more make a second array) of a small
 * script in which task i execs slurm_worker (capd-cell) with attempt i's
 * URL, id and token. The width's CPU features become `--constraint`, a GPU
 * cell asks `--gres=gpu:1`, a cell that times asks `--exclusive`
 * (slurm_exclusive_timing); the pairs of a timed cell are one attempt, so
 * they run in one allocation on one node. One poll every slurm_poll_ms
 * asks the states of every job in flight in one squeue (daemon/slurm/slurm.h)
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

#include "daemon/executors/remote.h"
#include "daemon/slurm/slurm.h"
#include "daemon/config/executor.h"
#include "daemon/executors/cellremote.h"
#include "daemon/cpu/widths.h"
#include "storage/layout.h"
#include "util/err.h"
#include "util/log.h"
#include "util/path.h"
#include "util/str.h"

/* Polls after a job left Slurm's lists, or ended, before capd gives up
 * waiting for its worker's finish. */
#define SLURM_GRACE_POLLS 2
/* Polls a worker's finish after a signal from outside waits for Slurm to
 * say why (a job completing is still RUNNING-like for a moment). */
#define SLURM_DEFER_POLLS SUP__DEFER_POLLS
/* What sbatch's --mem adds to a cell's memory_max_bytes: capd-cell and the
 * batch shell beside the runner. */
#define SLURM_WORKER_MEM_MB 64
/* The longest wait between two polls while squeue keeps failing. */
#define SLURM_POLL_BACKOFF_MAX_MS 60000

static struct {
    struct sup *head; /* attempts with a Slurm job (or one being submitted) */
    uv_timer_t timer;
    bool timer_on, querying;
    int fails; /* polls in a row that failed: the next waits longer */
    struct slurm_ctx ctx;
    const struct capd_config *cfg;
} S;

/* What executor "slurm" keeps of an attempt, behind its remote state's
 * LAUNCH (daemon/executors/cellremote.h): its Slurm job and array task (job 0 until
 * sbatch answered), polls since the job ended or left Slurm's lists, polls
 * a deferred finish has waited for Slurm's word, and the next attempt on
 * the poll's list. */
struct slurm_att {
    struct store_slurm_job job;
    int gone_polls, waits;
    struct sup *next;
};

/* S's Slurm state, or NULL before its launch. */
static struct slurm_att *slu(const struct sup *s)
{
    return sup__rem(s)->launch;
}

/* S's Slurm state, made on its first use. 0 or -ENOMEM. */
static int att_new(struct sup *s)
{
    if (!sup__rem(s)->launch)
        sup__rem(s)->launch = calloc(1, sizeof(struct slurm_att));
    return slu(s) ? 0 : -ENOMEM;
}

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
    for (struct sup *s = S.head; s; s = slu(s)->next)
        if (s->run.attempt_id == attempt_id)
            return s;
    return NULL;
}

static void unlink_sup(struct sup *s)
{
    for (struct sup **p = &S.head; *p; p = &slu(*p)->next)
        if (*p == s) {
            *p = slu(s)->next;
            return;
        }
}

/* Ends attempt S from Slurm's side with STATE and REASON (once). */
static void end_with(struct sup *s, enum cell_state state, const char *reason)
{
    sup__fail(s, state, reason);
    remote_end(sup__rem(s)->remote, cell_state_name(state));
}

/* ---- scancel, fire and forget ---- */

struct cancel_work {
    uv_work_t w;
    uint32_t job;
    int32_t task;
};

static void cancel_run(uv_work_t *w)
{
    struct cancel_work *c = w->data;
    char *err = NULL;
    if (slurm_cancel(&S.ctx, &c->job, &c->task, 1, &err) != 0)
        log_warn("slurm_cancel_failed", "slurm_job=%u_%d err=%s", c->job, c->task, log_q(err));
    free(err);
}

static void cancel_done(uv_work_t *w, int status)
{
    (void)status;
    free(w->data);
}

static void cancel_job(uv_loop_t *loop, uint32_t job, int32_t task)
{
    struct cancel_work *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->job = job;
    c->task = task;
    c->w.data = c;
    if (uv_queue_work(loop, &c->w, cancel_run, cancel_done) != 0)
        free(c);
}

/* ---- submission: one job array a loop turn and a set of resources ---- */

/* What the tasks of one array share: all of sbatch's options. */
struct batch_key {
    char constraint[512];
    bool gpu, exclusive;
    int time_min;
    long long mem_mb;
};

/* An attempt waiting for its loop turn's sbatch. Its token lives here and
 * in the array's script only; both are wiped once sbatch has read it. */
struct pending {
    int64_t attempt_id;
    struct batch_key key;
    char token[STORE_ATTEMPT_TOKEN_MAX];
    struct pending *next;
};

static struct {
    struct pending *head, **tail;
    uv_timer_t timer;
    bool timer_on;
    unsigned seq; /* names the array scripts */
    char url[600];
} P = {.tail = &P.head};

/* One sbatch of an array: task i runs attempt[i]. */
struct submit_work {
    uv_work_t w;
    struct batch_key key;
    char script[LAYOUT_PATH_MAX], name[64];
    size_t n;
    int64_t attempt[SLURM_ARRAY_LAST_MAX + 1];
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
        .array_last = (int)b->n - 1,
        .throttle = cfg->max_parallel,
        .time_limit_min = b->key.time_min,
        .mem_mb = b->key.mem_mb,
        .gpu = b->key.gpu,
        .exclusive = b->key.exclusive,
        .no_requeue = true,
        .job_name = b->name,
        .partition = cfg->slurm_partition[0] ? cfg->slurm_partition : NULL,
        .account = cfg->slurm_account[0] ? cfg->slurm_account : NULL,
        .qos = cfg->slurm_qos[0] ? cfg->slurm_qos : NULL,
        .constraint = b->key.constraint[0] ? b->key.constraint : NULL,
        .output = "/dev/null",
        .workdir = cfg->slurm_workdir[0] ? cfg->slurm_workdir : NULL,
    };
    b->rc = slurm_submit(&S.ctx, &sub, &b->job, &b->err);
    unlink(b->script); /* sbatch sent its text to the controller */
}

/* Task TASK of array JOB is attempt S's (which may be gone by now). */
static void task_submitted(uv_loop_t *loop, struct sup *s, uint32_t job, int32_t task)
{
    if (!s || s->finished || s->exited) {
        cancel_job(loop, job, task); /* nobody wants it any more */
        return;
    }
    slu(s)->job = (struct store_slurm_job){job, task};
    /* so that a capd restarted meanwhile polls it again */
    int rc = store_attempt_slurm_job(s->st, s->run.attempt_id, slu(s)->job);
    if (rc)
        log_warn("slurm_job_unstored", "job=%s cell=%s slurm_job=%u_%d rc=%d", s->run.job_id,
                 s->run.cell_id, job, task, rc);
    log_info("slurm_submitted", "job=%s cell=%s attempt=%lld slurm_job=%u_%d", s->run.job_id,
             s->run.cell_id, (long long)s->run.attempt_id, job, task);
    char line[96];
    int n = snprintf(line, sizeof line, "[capd: Slurm job %u_%d]\n", job, task);
    sup__log_write(s, line, (size_t)n);
}

static void submit_done(uv_work_t *w, int status)
{
    struct submit_work *b = w->data;
    bool ok = status == 0 && b->rc == 0;
    char why[1200];
    snprintf(why, sizeof why, "sbatch refused the cell: %s",
             b->err ? b->err : uv_strerror(status ? status : b->rc));
    if (!ok)
        log_warn("slurm_submit_failed", "tasks=%zu rc=%d err=%s", b->n, b->rc, log_q(b->err));
    else
        log_info("slurm_array_submitted", "slurm_job=%u tasks=%zu throttle=%d", b->job, b->n,
                 S.cfg->max_parallel);
    for (size_t i = 0; i < b->n; i++) {
        struct sup *s = find(b->attempt[i]);
        if (ok)
            task_submitted(w->loop, s, b->job, (int32_t)i);
        else if (s && !s->exited)
            end_with(s, b->rc == -ENOTSUP ? CELL_UNSUPPORTED : CELL_FAILED, why);
    }
    free(b->err);
    free(b);
}

/* capd-cell's path on the nodes: slurm_worker, else beside capd-exec. */
static void worker_path(const struct capd_config *cfg, char *out, size_t n)
{
    if (cfg->slurm_worker[0]) {
        snprintf(out, n, "%s", cfg->slurm_worker);
        return;
    }
    const char *slash = strrchr(cfg->exec_bin, '/');
    snprintf(out, n, "%.*s/capd-cell", slash ? (int)(slash - cfg->exec_bin) : 1,
             slash ? cfg->exec_bin : ".");
}

/* The array's script, 0700: task i gets the variables of the attempt of
 * PS[i] and execs the worker. */
static int write_script(struct submit_work *b, struct pending *const *ps)
{
    char worker[UTIL_PATH_MAX];
    worker_path(S.cfg, worker, sizeof worker);
    int rc = layout_slurm_script(b->script, sizeof b->script, S.cfg->data_dir, ++P.seq);
    if (rc)
        return rc;
    int fd = open(b->script, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0700);
    if (fd < 0)
        return -errno;
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        unlink(b->script);
        return -ENOMEM;
    }
    fprintf(f, "#!/bin/sh\n# capd: %zu attempts, one an array task\nCAPD_URL='%s'\n", b->n, P.url);
    fprintf(f, "case \"$SLURM_ARRAY_TASK_ID\" in\n");
    for (size_t i = 0; i < b->n; i++)
        fprintf(f, "%zu) CAPD_ATTEMPT=%lld CAPD_TOKEN='%s' ;;\n", i, (long long)ps[i]->attempt_id,
                ps[i]->token);
    fprintf(f,
            "*) echo \"capd: no attempt for array task $SLURM_ARRAY_TASK_ID\" >&2; exit 2 ;;\n"
            "esac\nexport CAPD_URL CAPD_ATTEMPT CAPD_TOKEN\nexec '%s' --quiet\n",
            worker);
    if (fclose(f) != 0) {
        unlink(b->script);
        return -EIO;
    }
    return 0;
}

static void pending_free(struct pending *p)
{
    memset(p->token, 0, sizeof p->token);
    free(p);
}

/* Takes off the pending list the first attempt's batch: every attempt with
 * its key, in order, up to an array's size (the rest wait for the next). */
static size_t take_batch(struct pending **out, size_t max)
{
    struct batch_key key = P.head->key;
    size_t n = 0;
    for (struct pending **pp = &P.head; *pp && n < max;) {
        struct pending *p = *pp;
        struct sup *s = find(p->attempt_id);
        if (!s || s->finished || s->exited) { /* ended before its sbatch */
            *pp = p->next;
            pending_free(p);
        } else if (memcmp(&p->key, &key, sizeof key) == 0) {
            *pp = p->next;
            out[n++] = p;
        } else {
            pp = &p->next;
        }
    }
    P.tail = &P.head;
    while (*P.tail)
        P.tail = &(*P.tail)->next;
    return n;
}

/* Submits one batch: its script written, its sbatch on a worker thread. */
static void submit_batch(uv_loop_t *loop, struct pending **ps, size_t n)
{
    struct submit_work *b = calloc(1, sizeof *b);
    int rc = b ? 0 : -ENOMEM;
    if (b) {
        b->n = n;
        b->key = ps[0]->key;
        struct sup *first = find(ps[0]->attempt_id);
        snprintf(b->name, sizeof b->name, "capd-%s", first->run.job_id);
        for (size_t i = 0; i < n; i++)
            b->attempt[i] = ps[i]->attempt_id;
        b->w.data = b;
        if ((rc = write_script(b, ps)) == 0 &&
            (rc = uv_queue_work(loop, &b->w, submit_run, submit_done)) != 0)
            unlink(b->script);
    }
    for (size_t i = 0; i < n; i++) {
        struct sup *s = find(ps[i]->attempt_id);
        if (rc && s) {
            char why[300];
            snprintf(why, sizeof why, "cannot submit the Slurm job array: %s", strerror(-rc));
            end_with(s, CELL_FAILED, why);
        }
        pending_free(ps[i]);
    }
    if (rc)
        free(b);
}

/* The loop turn's end: every pending attempt into an array of its kind. */
static void on_flush(uv_timer_t *t)
{
    static struct pending *batch[SLURM_ARRAY_LAST_MAX + 1];
    P.timer_on = false;
    while (P.head) {
        size_t n = take_batch(batch, sizeof batch / sizeof batch[0]);
        if (n)
            submit_batch(t->loop, batch, n);
    }
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
        if (util_join(out, n, &len, "&", json_string_value(v)) != 0)
            return -E2BIG;
    }
    return 0;
}

static void start_poll(uv_loop_t *loop);

static int attempt_submit(struct sup *s, const char *url, const char *token, char *reason,
                          size_t rlen)
{
    if (!S.cfg)
        ctx_init(s->cfg);
    struct pending *p = att_new(s) == 0 ? calloc(1, sizeof *p) : NULL;
    if (!p) {
        snprintf(reason, rlen, "capd ran out of memory submitting the Slurm job");
        return -ENOMEM;
    }
    const struct cell_options *o = &s->run.opts;
    p->attempt_id = s->run.attempt_id;
    p->key.gpu = strcmp(o->device, "gpu") == 0;
    p->key.exclusive = s->cfg->slurm_exclusive_timing && o->iterations > 0;
    /* the worker's own limit, the start-up and two minutes of margin */
    p->key.time_min = (int)((o->timeout_s + 180) / 60);
    /* the runner's limit (its worker's watchdog holds it) and room for the
     * worker and its shell */
    if (o->memory_max_bytes > 0)
        p->key.mem_mb =
            (long long)((o->memory_max_bytes + (1 << 20) - 1) >> 20) + SLURM_WORKER_MEM_MB;
    if (constraint_of(s, p->key.constraint, sizeof p->key.constraint) != 0) {
        snprintf(reason, rlen,
                 "width %s requires more CPU features than a constraint of %zu bytes "
                 "holds",
                 json_string_value(json_object_get(s->run.spec, "width")),
                 sizeof p->key.constraint - 1);
        free(p);
        return -E2BIG;
    }
    snprintf(p->token, sizeof p->token, "%s", token);
    snprintf(P.url, sizeof P.url, "%s", url);
    *P.tail = p;
    P.tail = &p->next;
    if (!P.timer_on) {
        if (P.timer.loop != s->loop)
            uv_timer_init(s->loop, &P.timer);
        uv_unref((uv_handle_t *)&P.timer);
        uv_timer_start(&P.timer, on_flush, 0, 0);
        P.timer_on = true;
    }
    slu(s)->next = S.head;
    S.head = s;
    start_poll(s->loop);
    return 0;
}

static void attempt_adopt(struct sup *s, struct store_slurm_job slurm)
{
    if (!S.cfg)
        ctx_init(s->cfg);
    if (att_new(s) != 0) {
        /* unpolled, it ends at its timeout */
        log_error("slurm_adopt_failed", "job=%s cell=%s slurm_job=%u_%d reason=no memory",
                  s->run.job_id, s->run.cell_id, slurm.job, slurm.task);
        return;
    }
    slu(s)->job = slurm;
    slu(s)->next = S.head;
    S.head = s;
    start_poll(s->loop);
}

static void attempt_forget(struct sup *s)
{
    if (slu(s))
        unlink_sup(s);
    free(sup__rem(s)->launch);
    sup__rem(s)->launch = NULL;
    for (struct pending **pp = &P.head; *pp; pp = &(*pp)->next)
        if ((*pp)->attempt_id == s->run.attempt_id) {
            struct pending *p = *pp;
            *pp = p->next;
            if (P.tail == &p->next)
                P.tail = pp;
            pending_free(p);
            break;
        }
}

static void attempt_cancel(struct sup *s)
{
    if (!slu(s))
        return;
    if (slu(s)->job.job)
        cancel_job(s->loop, slu(s)->job.job, slu(s)->job.task);
    slu(s)->job.job = 0;
}

/* ---- the poll ---- */

/* "123_4" for task 4 of array 123, "123" for a job of its own. */
static const char *job_text(const struct slurm_job_state *row, char id[32])
{
    if (row->task_id >= 0)
        snprintf(id, 32, "%u_%d", row->job_id, row->task_id);
    else
        snprintf(id, 32, "%u", row->job_id);
    return id;
}

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
 * someone's scancel cancels it, Slurm's time limit is a timeout, its
 * OUT_OF_MEMORY is oom; a job still ending is waited for
 * (SLURM_DEFER_POLLS at most), and anything else leaves the worker's own
 * report: failed with the worker's signal,
 * or the runner's end as it was (a runner killed by SIGTERM or SIGKILL
 * that the worker did not send is asked about too).
 */
static void deferred(struct sup *s, const struct slurm_job_state *row)
{
    struct slurm_mapped m;
    char id[32];
    slurm_state_map(row->known ? row->state : "UNKNOWN", row->reason, row->exit_code, row->signal,
                    &m);
    if ((m.verdict == SLURM_V_RUNNING || !row->known) && ++slu(s)->waits <= SLURM_DEFER_POLLS)
        return;
    char why[400];
    int wsig = sup__rem(s)->report.worker_signal;
    snprintf(why, sizeof why, "the %s got signal %d from outside capd; Slurm job %s: %s",
             wsig ? "worker" : "runner", wsig ? wsig : sup__rem(s)->report.signal,
             job_text(row, id), row->known ? row->state : "unknown");
    if (m.verdict == SLURM_V_REQUEUE && s->run.attempt < s->cfg->max_attempts) {
        s->requeue = true;
        log_warn("slurm_requeue", "job=%s cell=%s attempt=%d reason=%s", s->run.job_id,
                 s->run.cell_id, s->run.attempt, log_q(why));
    } else if (m.verdict == SLURM_V_CANCELLED) {
        s->cancelled = true;
    } else if (m.verdict == SLURM_V_TIMEOUT) {
        s->timed_out = true;
    }
    if (!s->requeue && !s->cancelled && !s->timed_out && (wsig || m.verdict == SLURM_V_OOM))
        sup__fail(s, m.verdict == SLURM_V_OOM ? CELL_OOM : CELL_FAILED, why);
    /* else the runner's own end says it */
    sup__remote_conclude(s);
}

/* What Slurm says of S's job, applied. */
static void apply(struct sup *s, const struct slurm_job_state *row)
{
    struct slurm_mapped m;
    char why[400], id[32];
    bool finished_worker = false;
    struct remote_exit ex;
    char state[96];
    if (remote_over(sup__rem(s)->remote, &finished_worker, &ex, state, sizeof state) &&
        !sup__rem(s)->deferred)
        return; /* the worker finished, or capd ended it: nothing to add */
    if (sup__rem(s)->deferred) {
        deferred(s, row);
        return;
    }
    if (!row->known) {
        if (++slu(s)->gone_polls > SLURM_GRACE_POLLS) {
            snprintf(why, sizeof why, "Slurm no longer knows job %s", job_text(row, id));
            end_with(s, CELL_FAILED, why);
        }
        return;
    }
    slurm_state_map(row->state, row->reason, row->exit_code, row->signal, &m);
    snprintf(why, sizeof why, "Slurm job %s: %s%s%s", job_text(row, id), row->state,
             m.reason[0] ? ": " : "", m.reason);
    switch (m.verdict) {
    case SLURM_V_RUNNING:
        return;
    case SLURM_V_ENDED:
        /* the finish may still be on its way: a grace of a few polls */
        if (++slu(s)->gone_polls > SLURM_GRACE_POLLS) {
            snprintf(why, sizeof why,
                     "worker ended without finishing (Slurm job %s %s, exit code %d)",
                     job_text(row, id), row->state, row->exit_code);
            end_with(s, CELL_PROTOCOL_ERROR, why);
        }
        return;
    case SLURM_V_TIMEOUT:
    case SLURM_V_CANCELLED:
        /* capd's own outcomes: ran past the limit, or cancelled */
        *(m.verdict == SLURM_V_TIMEOUT ? &s->timed_out : &s->cancelled) = true;
        remote_end(sup__rem(s)->remote, m.verdict == SLURM_V_TIMEOUT ? "timeout" : "cancelled");
        return;
    case SLURM_V_OOM:
    case SLURM_V_UNSUPPORTED:
    case SLURM_V_FAILED:
        end_with(s,
                 m.verdict == SLURM_V_OOM           ? CELL_OOM
                 : m.verdict == SLURM_V_UNSUPPORTED ? CELL_UNSUPPORTED
                                                    : CELL_FAILED,
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
            remote_end(sup__rem(s)->remote, "requeued");
        } else {
            char all[500];
            snprintf(all, sizeof all, "%s, on each of its %d attempts", why, s->run.attempt);
            end_with(s, CELL_FAILED, all);
        }
        return;
    }
}

static void query_done(uv_work_t *w, int status)
{
    struct query_work *q = w->data;
    S.querying = false;
    if (status != 0 || q->rc != 0) {
        /* back off: slurm_poll_ms doubled a failure in a row, at most
         * SLURM_POLL_BACKOFF_MAX_MS, until a poll succeeds again */
        uint64_t wait = (uint64_t)S.cfg->slurm_poll_ms << (S.fails < 10 ? ++S.fails : 10);
        if (wait > SLURM_POLL_BACKOFF_MAX_MS)
            wait = SLURM_POLL_BACKOFF_MAX_MS > (uint64_t)S.cfg->slurm_poll_ms
                       ? SLURM_POLL_BACKOFF_MAX_MS
                       : (uint64_t)S.cfg->slurm_poll_ms;
        uv_timer_set_repeat(&S.timer, wait);
        log_warn("slurm_query_failed", "jobs=%zu rc=%d err=%s next_poll_ms=%llu", q->n, q->rc,
                 log_q(q->err), (unsigned long long)wait);
    } else {
        if (S.fails) {
            S.fails = 0;
            uv_timer_set_repeat(&S.timer, (uint64_t)S.cfg->slurm_poll_ms);
        }
        for (size_t i = 0; i < q->n; i++) {
            struct sup *s = find(q->attempt[i]);
            if (s && !s->exited && slu(s)->job.job == q->rows[i].job_id &&
                slu(s)->job.task == q->rows[i].task_id)
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
    for (struct sup *s = S.head; s; s = slu(s)->next)
        n += slu(s)->job.job && !s->exited;
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
        for (struct sup *s = S.head; s && i < n; s = slu(s)->next) {
            if (!slu(s)->job.job || s->exited)
                continue;
            q->attempt[i] = s->run.attempt_id;
            q->rows[i].job_id = slu(s)->job.job;
            q->rows[i].task_id = slu(s)->job.task;
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

/* ---- the executor "slurm": remote, launched by sbatch ---- */

static bool slurm_knows_why(const struct sup *s)
{
    return slu(s) && slu(s)->job.job != 0;
}

const struct executor executor_slurm = {
    .name = "slurm",
    .on_host = false,
    .host_widths = false, /* the width is the node's constraint */
    .start = sup__remote_start,
    .reattach = sup__remote_reattach,
    .stop = sup__remote_kill,
    .close = sup__remote_close,
    .release = sup__remote_release,
    .launch = attempt_submit,
    .launch_adopt = attempt_adopt,
    .launch_stop = attempt_cancel,
    .launch_forget = attempt_forget,
    .knows_why_stopped = slurm_knows_why,
};
