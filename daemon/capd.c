/*
 * daemon/capd.c - the daemon loop: signals, the scheduler, the ingest flush
 * and the shutdown sequence.
 *
 * The scheduler is deliberately simple: the database is the queue. Whenever
 * something may have changed (a job was posted, a cell ended, a cancel came
 * in) the loop claims queued cells in job order until max_parallel children
 * run. HTTP threads never touch children; they only wake the loop.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "daemon/bisect.h"
#include "daemon/replay/auto.h"
#include "daemon/replay/compiler.h"
#include "daemon/replay/isolate.h"
#include "daemon/capd.h"
#include "daemon/host/cpus.h"
#include "daemon/host/devices.h"
#include "daemon/config/executor.h"
#include "util/cellstate.h"
#include "util/log.h"
#include "daemon/host/memlimit.h"
#include "daemon/attempt/reference.h"
#include "daemon/retention.h"
#include "daemon/attempt/sup.h"
#include "daemon/cpu/widths.h"
#include "daemon/prefork/zygote.h"
#include "storage/layout.h"
#include "storage/store.h"
#include "util/err.h"

#define CAPD_MAX_CANCELS 1024

struct sup_node {
    struct sup *sup;
    int device;     /* the GPU the cell holds; -1 for none */
    bool numerics;  /* options.iterations 0 on the CPU: no timing to disturb */
    bool timing;    /* options.iterations > 0, on any device */
    cpu_set_t cpus; /* daemon/host/cpus.h: exclusive while timing */
    struct sup_node *next;
};

struct capd {
    struct capd_config cfg;
    const struct executor *exec; /* cfg.executor's row (daemon/config/executor.h) */
    uv_loop_t loop;
    struct store *st;
    uv_async_t wake;
    uv_signal_t sigterm, sigint;
    uv_timer_t shutdown_timer;
    uv_timer_t schedule_retry; /* after a claim failed (disk full): try again */
    uv_check_t flush;
    struct capd_http_hooks hooks;

    /* Messages from HTTP threads, drained completely on every wake-up
     * because uv_async_send coalesces. */
    pthread_mutex_t mu;
    bool work_pending;
    bool devices_refresh_pending;
    int ncancel;
    char cancels[CAPD_MAX_CANCELS][16];
    bool cancel_overflow; /* more came than the queue holds: ask the store */

    struct sup_node *running;
    unsigned nrunning;
    /* nrunning as /healthz reads it (another thread), set once the loop has
     * settled: a cell handed straight to the next one (on_cell_next) never
     * shows as none running in between. */
    unsigned nrunning_shown;
    unsigned nnumerics, ncores;     /* numerics-only cells running; online CPUs */
    struct devices *dev;            /* the GPUs (daemon/host/devices.h) */
    struct store_gpu_cell gpu_next; /* what gpu_gate last read of the next GPU cell */
    struct cpus_pool cpus;          /* which CPUs each running cell holds */
    bool stopping, http_stopped;
    uint64_t stop_deadline;
};

void capd_set_bound_port(struct capd *d, int port)
{
    d->cfg.listen_port = port;
}

const struct capd_config *capd_cfg(const struct capd *d)
{
    return &d->cfg;
}

unsigned capd_running_cells(const struct capd *d)
{
    return __atomic_load_n(&d->nrunning_shown, __ATOMIC_RELAXED);
}

static void show_running(struct capd *d)
{
    __atomic_store_n(&d->nrunning_shown, d->nrunning, __ATOMIC_RELAXED);
}

void capd_notify_work(struct capd *d)
{
    pthread_mutex_lock(&d->mu);
    d->work_pending = true;
    pthread_mutex_unlock(&d->mu);
    uv_async_send(&d->wake);
}

void capd_notify_cancel(struct capd *d, const char *job_id)
{
    pthread_mutex_lock(&d->mu);
    if (d->ncancel < CAPD_MAX_CANCELS)
        snprintf(d->cancels[d->ncancel++], 16, "%s", job_id);
    else
        d->cancel_overflow = true;
    d->work_pending = true;
    pthread_mutex_unlock(&d->mu);
    uv_async_send(&d->wake);
}

struct devices *capd_devices(struct capd *d)
{
    return d->dev;
}

void capd_notify_devices_refresh(struct capd *d)
{
    pthread_mutex_lock(&d->mu);
    d->devices_refresh_pending = true;
    pthread_mutex_unlock(&d->mu);
    uv_async_send(&d->wake);
}

static void schedule(struct capd *d, struct store_cell_run *claimed);

/*
 * The scheduler, then the bisections (daemon/bisect.h), the automatic
 * replays (daemon/replay/auto.h), the replays' isolated pairs
 * (daemon/replay/isolate.h) and the compiler bisections
 * (daemon/replay/compiler.h) as long as they submit jobs: a probe whose build does
 * not start ends inside schedule() without a cell ever running, so nothing else would wake the loop
 * for it. Each pass that goes on created a job, and a bisection creates at most one per commit, so
 * this ends.
 */
static void schedule_and_bisect(struct capd *d, struct store_cell_run *claimed)
{
    schedule(d, claimed);
    while (!d->stopping && (bisect_step(d->st, &d->cfg) | replay_auto_step(d->st, &d->cfg) |
                            replay_step(d->st, &d->cfg) | compiler_bisect_step(d->st, &d->cfg)))
        schedule(d, NULL);
}

/* How soon the scheduler tries again after the database refused a claim. */
#define CAPD_SCHEDULE_RETRY_MS 1000

static void on_schedule_retry(uv_timer_t *t)
{
    schedule(t->data, NULL);
}

/*
 * Which GPU cell the next claim may take (store_cell_claim_filtered's
 * GPU_SEQ): the first queued GPU cell when a device can take it now
 * (daemon/host/devices.h), else none. GPU cells start in queue order among
 * themselves, so a timing cell waiting for an empty device keeps every
 * GPU cell behind it from starting on any device until one is empty; CPU
 * cells pass them all. Its facts are kept for the placement after the
 * claim.
 */
static int64_t gpu_gate(struct capd *d)
{
    if (!d->exec->on_host) /* Slurm or the remote worker places it */
        return store_next_gpu_cell(d->st, &d->gpu_next) == 0 ? d->gpu_next.cell_seq
                                                             : STORE_GPU_NONE;
    if (store_next_gpu_cell(d->st, &d->gpu_next) != 0 || d->gpu_next.cell_seq == 0 ||
        !devices_room(d->dev, &d->gpu_next))
        return STORE_GPU_NONE;
    return d->gpu_next.cell_seq;
}

/*
 * Whether schedule() will claim a cell once S is gone: it then claims in
 * the transaction that stores S's outcome. Only while S holds no GPU (its
 * release would change which cells may be claimed) and the claim does not
 * depend on the numerics-only rule (which reads the queue itself).
 */
static bool on_cell_next(void *ud, struct sup *s, int64_t *gpu_seq)
{
    struct capd *d = ud;
    /* With other cells running, the next one's CPU set depends on theirs
     * (daemon/host/cpus.h): schedule() checks it before claiming. */
    if (d->stopping || d->nrunning - 1 >= (unsigned)d->cfg.max_parallel || d->nrunning > 1)
        return false;
    for (struct sup_node *n = d->running; n; n = n->next)
        if (n->sup == s) {
            if (n->device >= 0)
                return false;
            *gpu_seq = gpu_gate(d);
            return true;
        }
    return false;
}

static void on_cell_done(void *ud, struct sup *s)
{
    struct capd *d = ud;
    struct store_cell_run next;
    bool have_next = sup_take_next(s, &next);
    for (struct sup_node **pp = &d->running; *pp; pp = &(*pp)->next) {
        if ((*pp)->sup == s) {
            struct sup_node *n = *pp;
            *pp = n->next;
            if (sup_device_failed(s))
                devices_fail(d->dev, n->device, sup_device_failed(s));
            devices_release(d->dev, n->device, sup_cell_id(n->sup));
            cpus_release(&d->cpus, n->timing, &n->cpus);
            d->nnumerics -= n->numerics;
            free(n);
            d->nrunning--;
            break;
        }
    }
    /* A job this cell finished joins its branch's history (storage/history.c). */
    int hrc = store_history_drain(d->st, NULL);
    if (hrc)
        log_warn("history_drain_failed", "rc=%d err=%s", hrc, log_q(store_errmsg(d->st)));
    if (d->stopping) {
        /* Claimed just before the stop: start-up recovery's re-queue at the
         * end of shutdown puts it back, as for a cell that was running. */
        store_cell_run_clear(&next);
        show_running(d);
        return;
    }
    schedule_and_bisect(d, have_next ? &next : NULL);
}

/*
 * Numerics-only cells (options.iterations 0: nothing is timed, so nothing
 * is disturbed by sharing the CPU) may run beside each other up to
 * max_parallel_numerics (0, the default: no further than max_parallel,
 * which then means what its name says for every kind of job), while every
 * running cell is numerics-only and so is the next one in the queue. A
 * timing cell at the head of the queue waits for them to finish as it
 * would for any cell.
 */
static bool numerics_room(struct capd *d)
{
    bool next = false;
    return d->nnumerics == d->nrunning && d->nrunning < (unsigned)d->cfg.max_parallel_numerics &&
           store_next_cell_numerics(d->st, &next, NULL) == 0 && next;
}

/* The CPUs capd itself may run on are the pool the cells' sets come from. */
static void cpus_init_host(struct capd *d)
{
    cpu_set_t mine;
    int host[CPU_SETSIZE], n = 0;
    if (sched_getaffinity(0, sizeof mine, &mine) != 0) {
        CPU_ZERO(&mine);
        for (unsigned i = 0; i < d->ncores && i < CPU_SETSIZE; i++)
            CPU_SET((int)i, &mine);
    }
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &mine))
            host[n++] = cpu;
    if (cpus_pool_init(&d->cpus, host, n) != 0)
        log_warn("cpus_refused", "cpus_past=%d (not used for cells)", CPU_SETSIZE);
}

/*
 * Whether the next queued cell could get its CPU set now: a timing cell
 * needs a CPU nobody holds, a numerics-only cell one no timing cell holds.
 * Otherwise it waits for a cell to end (which schedules again).
 */
static bool cpus_room(struct capd *d)
{
    bool numerics = false, untimed = false;
    /* a remote attempt runs on its worker's host, not on capd's CPUs */
    if (d->nrunning == 0 || !d->exec->on_host)
        return true;
    if (store_next_cell_numerics(d->st, &numerics, &untimed) != 0)
        return true; /* the claim reports the storage problem */
    return cpus_can_start(&d->cpus, !untimed);
}

/* Takes N's CPU set and puts it into the spec the runner reads ("cpus"). */
static void cpus_assign(struct capd *d, struct sup_node *n, struct store_cell_run *run)
{
    int rc = cpus_take(&d->cpus, n->timing, (int)run->opts.threads, &n->cpus);
    if (rc < 0) {
        /* Claimed before its CPUs were free (a claim in the transaction of
         * an ending cell with nothing else running cannot get here). */
        log_warn("cpus_busy", "job=%s cell=%s timing=%d", run->job_id, run->cell_id, n->timing);
        CPU_ZERO(&n->cpus);
        return;
    }
    json_object_set_new(run->spec, "cpus", cpus_json(&n->cpus));
}

/*
 * A cell at a width this host's CPU cannot run (daemon/cpu/widths.h) ends
 * unsupported here, before any child exists: started anyway, the framework
 * would trust ATEN_CPU_CAPABILITY, execute instructions the CPU lacks and
 * die of SIGILL. Returns true when the cell was ended (RUN is consumed).
 */
static bool host_refuses(struct capd *d, struct store_cell_run *run)
{
    char why[300], missing[256];
    const char *width = json_string_value(json_object_get(run->spec, "width"));
    /* Slurm's nodes run it, not this host: the width is their constraint. */
    if (!d->exec->host_widths || width_runnable(width, why, sizeof why, missing, sizeof missing))
        return false;
    struct store_outcome o = {.state = cell_state_name(CELL_UNSUPPORTED),
                              .exit_code = -1,
                              .reason = why,
                              .host_missing = missing};
    sup_end_unrun(d->st, run, "cell_not_run", &o);
    store_cell_run_clear(run);
    return true;
}

/* A GPU cell on capd's host takes a device (*DEVICE) as the placement rule
 * says (daemon/host/devices.h); without one it ends failed here, before
 * any child exists. True when the cell was ended (RUN is consumed). */
static bool gpu_refuses(struct capd *d, struct store_cell_run *run, int *device)
{
    char why[1200];
    struct store_gpu_cell c = d->gpu_next;
    bool gpu = strcmp(run->opts.device, "gpu") == 0;
    /* the facts gpu_gate read, unless the claim took another cell */
    if (gpu && c.cell_seq != run->cell_seq && store_gpu_cell_of(d->st, run, &c) != 0)
        c.cell_seq = 0;
    if (devices_acquire(d->dev, run, gpu && c.cell_seq ? &c : NULL, device, why, sizeof why) == 0)
        return false;
    struct store_outcome o = {
        .state = cell_state_name(CELL_FAILED), .exit_code = -1, .reason = why};
    sup_end_unrun(d->st, run, "cell_no_gpu", &o);
    store_cell_run_clear(run);
    return true;
}

/* The control build a paired head cell times beside its own
 * (daemon/attempt/reference.h), resolved here, before the attempt, which only
 * writes it into the cell spec: "reference" in RUN's spec. */
static void pair_cell(struct capd *d, struct store_cell_run *run)
{
    char scratch[LAYOUT_PATH_MAX], spec[LAYOUT_PATH_MAX];
    /* a path too long fails the attempt's set-up, which says so */
    if (layout_cell_scratch(scratch, sizeof scratch, d->cfg.data_dir, run->cell_id, run->attempt) ==
            0 &&
        layout_cell_spec(spec, sizeof spec, d->cfg.data_dir, run->cell_id, run->attempt) == 0)
        ref_add_to_spec(&d->cfg, d->st, run, run->spec, scratch, spec);
}

/* Claims and starts queued cells until max_parallel children run. A cell
 * whose set-up fails is already stored as failed; the next one is tried.
 * A GPU cell needs a device that can take it (gpu_gate): while none can,
 * GPU cells stay queued and CPU cells behind them are started instead.
 * GPU cells count against max_parallel like any cell. CLAIMED, when not
 * NULL, is a cell already claimed (with the outcome of the cell that just
 * ended, on_cell_next): it is started first. */
static void schedule_cells(struct capd *d, struct store_cell_run *claimed)
{
    while (claimed ||
           (!d->stopping && (d->nrunning < (unsigned)d->cfg.max_parallel || numerics_room(d)))) {
        struct store_cell_run run;
        int device = -1;
        int rc;
        if (claimed) {
            run = *claimed;
            memset(claimed, 0, sizeof *claimed);
            claimed = NULL;
            rc = 0;
        } else {
            rc = cpus_room(d) ? store_cell_claim_filtered(d->st, gpu_gate(d), &run) : -ENOENT;
        }
        if (rc == -ENOENT)
            return;
        if (rc) {
            /* Storage unavailable (disk full) or busy: queued cells must
             * not wait for the next job or cell end to be looked at again,
             * so the scheduler retries on its own once room is made. */
            log_error("schedule_failed", "rc=%d err=%s retry_ms=%d", rc, log_q(store_errmsg(d->st)),
                      CAPD_SCHEDULE_RETRY_MS);
            uv_timer_start(&d->schedule_retry, on_schedule_retry, CAPD_SCHEDULE_RETRY_MS, 0);
            return;
        }
        struct sup *s = NULL;
        struct sup_node *n = calloc(1, sizeof *n);
        if (!n) {
            store_cell_run_clear(&run);
            return;
        }
        n->numerics = run.opts.iterations == 0 && strcmp(run.opts.device, "gpu") != 0;
        n->timing = run.opts.iterations > 0;
        if (host_refuses(d, &run)) {
            free(n); /* stored as unsupported: no child */
            continue;
        }
        /* Slurm gives a GPU cell its device (--gres); a remote worker's
         * scheduler sets its visibility variables (worker/spec.c) */
        if (d->exec->on_host && gpu_refuses(d, &run, &device)) {
            free(n); /* stored as failed: no GPU */
            continue;
        }
        if (d->exec->on_host)
            cpus_assign(d, n, &run);
        pair_cell(d, &run);
        char cell_id[sizeof run.cell_id];
        memcpy(cell_id, run.cell_id, sizeof cell_id);
        rc = sup_start(&d->loop, &d->cfg, d->st, &run, on_cell_done, d, &s);
        if (rc) {
            devices_release(d->dev, device, cell_id);
            cpus_release(&d->cpus, n->timing, &n->cpus);
            free(n);
            continue;
        }
        sup_set_next_cb(s, on_cell_next);
        n->sup = s;
        n->device = device;
        d->nnumerics += n->numerics;
        n->next = d->running;
        d->running = n;
        d->nrunning++;
    }
}

static void schedule(struct capd *d, struct store_cell_run *claimed)
{
    schedule_cells(d, claimed);
    show_running(d);
}

/* A new device list may let queued GPU cells start. */
static void on_devices_changed(void *ud)
{
    struct capd *d = ud;
    if (!d->stopping)
        schedule(d, NULL);
}

/* More cancels came between two wake-ups than CAPD_MAX_CANCELS: a job is
 * cancelled in the store before it is queued here, so every running cell
 * whose job the store calls cancelled is stopped. */
static void cancel_from_store(struct capd *d)
{
    log_warn("cancel_queue_full", "max=%d reason=%s", CAPD_MAX_CANCELS,
             log_q("checking every running cell's job in the store"));
    for (struct sup_node *n = d->running; n; n = n->next) {
        json_t *job = NULL;
        const char *state = store_job_get(d->st, sup_job_id(n->sup), &job) == 0
                                ? json_string_value(json_object_get(job, "state"))
                                : NULL;
        if (state && strcmp(state, "cancelled") == 0) {
            log_info("cell_cancel", "job=%s cell=%s", sup_job_id(n->sup), sup_cell_id(n->sup));
            sup_cancel(n->sup);
        }
        json_decref(job);
    }
}

static void on_wake(uv_async_t *a)
{
    struct capd *d = a->data;
    char cancels[CAPD_MAX_CANCELS][16];
    int nc;
    bool refresh;
    pthread_mutex_lock(&d->mu);
    nc = d->ncancel;
    memcpy(cancels, d->cancels, sizeof cancels[0] * (size_t)nc);
    d->ncancel = 0;
    bool overflow = d->cancel_overflow;
    d->cancel_overflow = false;
    d->work_pending = false;
    refresh = d->devices_refresh_pending;
    d->devices_refresh_pending = false;
    pthread_mutex_unlock(&d->mu);
    if (refresh && !d->stopping)
        devices_refresh(d->dev, &d->loop, on_devices_changed, d);
    for (int i = 0; i < nc; i++)
        for (struct sup_node *n = d->running; n; n = n->next)
            if (strcmp(sup_job_id(n->sup), cancels[i]) == 0) {
                log_info("cell_cancel", "job=%s cell=%s", cancels[i], sup_cell_id(n->sup));
                sup_cancel(n->sup);
            }
    if (overflow)
        cancel_from_store(d);
    schedule_and_bisect(d, NULL);
}

static void on_flush(uv_check_t *c)
{
    struct capd *d = c->data;
    int rc = store_flush(d->st);
    if (rc)
        log_error("ingest_flush_failed", "rc=%d err=%s", rc, log_q(store_errmsg(d->st)));
}

static void close_cb_noop(uv_handle_t *h)
{
    (void)h;
}

/* The last step of shutdown: every child is gone; cells they ran are put
 * back in the queue exactly as start-up recovery would after a crash. */
static void final_stop(struct capd *d)
{
    int requeued = 0, interrupted = 0;
    store_flush(d->st);
    /* remote attempts stay open for the next capd (daemon/attempt/sup.h) */
    store_recover(d->st, d->cfg.max_attempts, d->exec->reattach != NULL, &requeued, &interrupted);
    log_info("stopped", "requeued_cells=%d interrupted_cells=%d", requeued, interrupted);
    zyg_shutdown();
    mem_shutdown();
    uv_stop(&d->loop);
}

static void on_shutdown_tick(uv_timer_t *t)
{
    struct capd *d = t->data;
    if (!d->http_stopped) {
        unsigned inflight = d->hooks.inflight ? d->hooks.inflight(d->hooks.ud) : 0;
        if (inflight > 0 && uv_now(&d->loop) < d->stop_deadline)
            return;
        if (inflight > 0)
            log_warn("shutdown_deadline", "abandoned_requests=%u", inflight);
        if (d->hooks.stop)
            d->hooks.stop(d->hooks.ud);
        d->http_stopped = true;
        for (struct sup_node *n = d->running; n; n = n->next)
            sup_abandon(n->sup);
    }
    if (d->running)
        return;
    uv_timer_stop(t);
    final_stop(d);
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct capd *d = h->data;
    if (d->stopping) {
        log_warn("shutdown_signal_again", "signal=%d", signum);
        return;
    }
    d->stopping = true;
    log_info("shutdown", "signal=%s running_cells=%u deadline_ms=%d",
             signum == SIGTERM ? "SIGTERM" : "SIGINT", d->nrunning, d->cfg.shutdown_deadline_ms);
    if (d->hooks.quiesce)
        d->hooks.quiesce(d->hooks.ud);
    d->stop_deadline = uv_now(&d->loop) + (uint64_t)d->cfg.shutdown_deadline_ms;
    uv_timer_start(&d->shutdown_timer, on_shutdown_tick, 0, 20);
}

/* One remote attempt start-up recovery kept open, taken up again before
 * the API listens (its worker's next upload finds it). */
static int reattach_one(void *ctx, struct store_cell_run *run, struct store_slurm_job slurm)
{
    struct capd *d = ctx;
    struct sup_node *n = calloc(1, sizeof *n);
    struct sup *s = NULL;
    if (!n) {
        store_cell_run_clear(run);
        return -ENOMEM;
    }
    n->device = -1;
    if (sup_reattach(&d->loop, &d->cfg, d->st, run, slurm, on_cell_done, d, &s) != 0) {
        free(n); /* stored as failed, with the reason */
        return 0;
    }
    sup_set_next_cb(s, on_cell_next);
    n->sup = s;
    n->next = d->running;
    d->running = n;
    d->nrunning++;
    return 0;
}

int capd_new(const struct capd_config *cfg, struct capd **out, char **err)
{
    struct capd *d = calloc(1, sizeof *d);
    int rc;
    if (!d)
        return -ENOMEM;
    d->cfg = *cfg;
    if (!(d->exec = executor_find(cfg->executor))) {
        free(d);
        return util_errf(err, -EINVAL, "no executor named \"%s\"", cfg->executor);
    }
    pthread_mutex_init(&d->mu, NULL);
    if ((rc = widths_init()) != 0) {
        util_errf(err, rc, "embedded width/model tables are broken (%d)", rc);
        goto fail;
    }
    if ((rc = store_open(cfg->data_dir, true, &d->st, err)) != 0)
        goto fail;
    int requeued = 0, interrupted = 0;
    if ((rc = store_recover(d->st, cfg->max_attempts, d->exec->reattach != NULL, &requeued,
                            &interrupted)) != 0) {
        util_errf(err, rc, "start-up recovery failed: %s", store_errmsg(d->st));
        goto fail;
    }
    if (requeued || interrupted)
        log_warn("recovered", "requeued_cells=%d interrupted_cells=%d", requeued, interrupted);
    /* The loop commits every ingest batch; copying the WAL back into the
     * database is left to a thread of storage's own. */
    if ((rc = store_checkpoint_in_background(d->st)) != 0)
        log_warn("checkpoint_thread_failed", "rc=%d (checkpoints stay on the loop)", rc);
    rc = 0;
    /* The device list must be known before the first job is validated or
     * scheduled: the probe runs to completion here. */
    if ((rc = devices_new(&d->cfg, &d->dev)) != 0 || (rc = devices_probe_now(d->dev)) != 0) {
        util_errf(err, rc, "GPU discovery could not start (%d)", rc);
        goto fail;
    }
    uv_loop_init(&d->loop);
    zyg_init(&d->loop, &d->cfg, d->st);
    mem_start(&d->loop);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    d->ncores = ncpu > 0 ? (unsigned)ncpu : 1;
    cpus_init_host(d);
    uv_async_init(&d->loop, &d->wake, on_wake);
    uv_signal_init(&d->loop, &d->sigterm);
    uv_signal_init(&d->loop, &d->sigint);
    /* Watch the signals before the port is announced: a SIGTERM that
     * arrives right after start-up is held by libuv until uv_run. */
    uv_signal_start(&d->sigterm, on_signal, SIGTERM);
    uv_signal_start(&d->sigint, on_signal, SIGINT);
    uv_timer_init(&d->loop, &d->shutdown_timer);
    uv_timer_init(&d->loop, &d->schedule_retry);
    d->schedule_retry.data = d;
    uv_check_init(&d->loop, &d->flush);
    d->wake.data = d->sigterm.data = d->sigint.data = d->shutdown_timer.data = d->flush.data = d;
    if (d->exec->reattach && (rc = store_remote_reattach(d->st, reattach_one, d)) != 0)
        log_warn("reattach_failed", "rc=%d err=%s", rc, log_q(store_errmsg(d->st)));
    *out = d;
    return 0;
fail:
    devices_free(d->dev);
    store_close(d->st);
    pthread_mutex_destroy(&d->mu);
    free(d);
    return rc;
}

void capd_set_http_hooks(struct capd *d, const struct capd_http_hooks *h)
{
    d->hooks = *h;
}

int capd_run(struct capd *d)
{
    uv_check_start(&d->flush, on_flush);
    /* Prunes old heads' payloads on a timer when retention is configured. */
    retention_start(&d->loop, &d->cfg, NULL);
    /* A broken pipe from a client must not kill the daemon. */
    signal(SIGPIPE, SIG_IGN);
    /* Bisections a stopped capd left running carry on. */
    schedule_and_bisect(d, NULL);
    uv_run(&d->loop, UV_RUN_DEFAULT);
    devices_stop(d->dev);
    if (d->exec->shutdown)
        d->exec->shutdown();
    uv_close((uv_handle_t *)&d->wake, close_cb_noop);
    uv_close((uv_handle_t *)&d->sigterm, close_cb_noop);
    uv_close((uv_handle_t *)&d->sigint, close_cb_noop);
    uv_close((uv_handle_t *)&d->shutdown_timer, close_cb_noop);
    uv_close((uv_handle_t *)&d->schedule_retry, close_cb_noop);
    uv_close((uv_handle_t *)&d->flush, close_cb_noop);
    uv_run(&d->loop, UV_RUN_DEFAULT);
    return 0;
}

static void close_any(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

void capd_free(struct capd *d)
{
    if (!d)
        return;
    if (d->hooks.stop && !d->http_stopped)
        d->hooks.stop(d->hooks.ud);
    /* Freed without capd_run (a start-up error after capd_new): its handles
     * are still open, and the loop frees nothing until they are closed. */
    uv_walk(&d->loop, close_any, NULL);
    uv_run(&d->loop, UV_RUN_DEFAULT);
    uv_loop_close(&d->loop);
    devices_free(d->dev);
    store_close(d->st);
    pthread_mutex_destroy(&d->mu);
    free(d);
}
