/*
 * daemon/attempt/cellend.c - the attempt's stream and end, whatever its executor
 * (daemon/config/executor.h): its frames parsed into storage as they arrive,
 * the outcome (daemon/attempt/outcome.h) decided from the facts and stored with
 * the scheduler's next claim, and the end: the done callback, the scratch
 * dir, the executor's handles closed.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/config/executor.h"
#include "daemon/attempt/outcome.h"
#include "daemon/child/runas.h"
#include "daemon/attempt/sup_int.h"
#include "util/cellstate.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/metrics.h"

/* How often an outcome that could not be stored (disk full) is retried. */
#define SUP_STORE_RETRY_MS 1000

/* Whether an ingest batch holding records of this attempt was lost (a
 * failed write or commit rolled it back): the attempt then has a hole. */
static bool records_lost(const struct sup *s)
{
    return store_batch_losses(s->st) != s->losses0;
}

/*
 * What daemon/attempt/outcome.h decides from, gathered from the attempt. The
 * interpreter check (a walk of its path as the cell user sees it) is only
 * made for the case it explains: exit 127 before any frame. WHY, WHO and
 * WHAT are the caller's buffers the strings point into.
 */
static void outcome_facts(struct sup *s, struct outcome_in *in, char *why, size_t wlen, char *who,
                          size_t hlen, char *what, size_t tlen)
{
    /* The peak the limit was held against: the group's where it has one
     * (a prefork child's RSS also counts the zygote's pages, which are
     * charged to the zygote), else the process's own. */
    int64_t peak = mem_cell_peak(s->mem) >= 0 ? mem_cell_peak(s->mem) : s->peak_rss;
    if (!s->exec->on_host) /* its worker's watchdog held the job's own limit */
        mem_describe((uint64_t)s->run.opts.memory_max_bytes, peak, what, tlen);
    else
        mem_cell_describe(s->mem, peak, what, tlen);
    *in = (struct outcome_in){
        .cancelled = s->cancelled,
        .timed_out = s->timed_out,
        .timeout_s = (long long)s->run.opts.timeout_s,
        .oom_killed = mem_cell_oom(s->mem) || s->worker_oom,
        .mem_mechanism = !s->exec->on_host ? "capd-cell's watchdog" : mem_mechanism_name(),
        .mem_what = what,
        .end_status = frame_end_status(s->fp),
        .end_reason = frame_end_reason(s->fp),
        .saw_end = frame_saw_end(s->fp),
        .frames = (uint64_t)frame_count(s->fp),
        .fail_state = s->fail_state,
        .fail_reason = s->fail_reason,
        .exit_status = s->exit_status,
        .term_signal = s->term_signal,
        .records_lost = records_lost(s),
    };
    if (s->exit_status == 127 && in->frames == 0) {
        const char *py = json_string_value(json_object_get(s->run.build, "python"));
        runas_describe(s->cfg, who, hlen);
        in->cell_user = who;
        if (py && runas_can_use(s->cfg, py, RUNAS_EXEC, why, wlen) != 0)
            in->exec_why = why;
    }
}

/*
 * A GPU cell that ran out of device memory while it shared its device
 * (the spec's device_share, daemon/host/devices.h) may have lost the
 * memory to its neighbours rather than need more than the device has: it
 * is queued again to hold a device alone, once (a cell that ran alone is
 * never sent back), and WHY says so in its reason meanwhile.
 */
static bool gpu_alone_again(struct sup *s, const char *reason, char *why, size_t wlen)
{
    const char *share = json_string_value(json_object_get(s->run.spec, "device_share"));
    if (!share || strcmp(share, "shared") != 0)
        return false;
    snprintf(why, wlen, "out of device memory while sharing the GPU; queued again to run alone: %s",
             reason ? reason : "");
    log_warn("cell_gpu_oom_alone", "job=%s cell=%s attempt=%d reason=%s", s->run.job_id,
             s->run.cell_id, s->run.attempt, log_q(reason));
    return true;
}

/*
 * A GPU cell whose device failed under it (the runtime said so) takes the
 * device out of the pool (the scheduler reads device_failed) and is
 * queued again, once, to run on another device; WHY says so in its reason
 * meanwhile. Returns whether it is queued again.
 */
static bool gpu_moved_again(struct sup *s, const char *reason, char *why, size_t wlen)
{
    if (!json_object_get(s->run.spec, "device_share"))
        return false; /* capd did not place it (another executor's device) */
    snprintf(s->device_failed, sizeof s->device_failed, "%s", reason ? reason : "device error");
    log_warn("cell_gpu_device_error", "job=%s cell=%s attempt=%d moved=%d reason=%s", s->run.job_id,
             s->run.cell_id, s->run.attempt, !s->run.gpu_moved, log_q(reason));
    if (s->run.gpu_moved)
        return false;
    snprintf(why, wlen, "the GPU failed under the cell; queued again for another device: %s",
             reason ? reason : "");
    return true;
}

/*
 * Stores the attempt's outcome, as daemon/attempt/outcome.h decides it from the
 * facts (an attempt that lost records to a failed write ends "failed",
 * whatever the runner did). Returns what store_cell_finish returned.
 */
static int store_outcome(struct sup *s)
{
    char why[768], who[160], what[256];
    struct outcome_in in;
    struct outcome out;
    outcome_facts(s, &in, why, sizeof why, who, sizeof who, what, sizeof what);
    outcome_classify(&in, &out);
    struct store_outcome o = {
        .state = out.state,
        .reason = out.reason,
        .signal = out.signal,
        .exit_code = out.exit_code,
        .partial = out.partial,
    };
    o.effective_width = s->effective_width[0] ? s->effective_width : NULL;
    /* Slurm failed the node under it: a new attempt (daemon/executors/cellslurm.c). */
    o.requeue = s->requeue;
    char again_why[OUTCOME_REASON_MAX + 96];
    if (!o.requeue && out.device_oom &&
        gpu_alone_again(s, out.reason, again_why, sizeof again_why)) {
        o.requeue = o.alone = true;
        o.reason = again_why;
    }
    if (!o.requeue && out.device_error &&
        gpu_moved_again(s, out.reason, again_why, sizeof again_why)) {
        o.requeue = o.moved = true;
        o.reason = again_why;
    }
    o.duration_ms = (int64_t)((uv_hrtime() - s->t0) / 1000000);
    o.peak_rss_bytes = s->peak_rss;
    o.cpu_time_ms = s->cpu_us / 1000;
    o.memory_limit_bytes =
        !s->exec->on_host ? s->run.opts.memory_max_bytes : (int64_t)mem_cell_limit(s->mem);
    /* The scheduler's next claim rides in the same transaction when it
     * will make one once this cell is gone. Should that fail, the outcome
     * is stored alone and the scheduler claims as it did before. */
    int64_t gpu_seq = STORE_GPU_NONE;
    int rc = -EAGAIN;
    if (s->next_cb && s->next_cb(s->ud, s, &gpu_seq))
        rc = store_cell_finish_claim(s->st, &s->run, &o, gpu_seq, &s->next);
    if (rc)
        rc = store_cell_finish(s->st, &s->run, &o);
    if (rc) {
        log_error("cell_store_failed", "job=%s cell=%s rc=%d err=%s", s->run.job_id, s->run.cell_id,
                  rc, log_q(store_errmsg(s->st)));
        return rc;
    }
    metrics_cell_finished(o.state, o.duration_ms);
    log_info("cell_finished",
             "job=%s cell=%s model=%s width=%s pass=%s outcome=%s duration_ms=%lld "
             "records=%lld reason=%s",
             s->run.job_id, s->run.cell_id,
             log_q(json_string_value(json_object_get(s->run.spec, "model"))),
             json_string_value(json_object_get(s->run.spec, "width")),
             json_string_value(json_object_get(s->run.spec, "pass")), o.state,
             (long long)o.duration_ms, (long long)s->rec_seq, log_q(o.reason));
    return 0;
}

static void finish_tail(struct sup *s);

/* The outcome could not be stored because storage is unavailable: the
 * cell stays running (it holds its place under max_parallel) and the
 * outcome is stored once room is made, without a restart. A shutdown
 * meanwhile (abandoned) leaves it to start-up recovery. */
static void on_store_retry(uv_timer_t *t)
{
    struct sup *s = t->data;
    int rc = s->abandoned ? 0 : store_outcome(s);
    if (rc == -ENOSPC || rc == -EBUSY) {
        uv_timer_start(&s->timer, on_store_retry, SUP_STORE_RETRY_MS, 0);
        return;
    }
    finish_tail(s);
}

void sup__finish(struct sup *s)
{
    if (s->finished || !s->exited || !s->frames_eof || !s->log_eof)
        return;
    s->finished = true;
    uv_timer_stop(&s->timer);
    sup__log_finish(s);
    if (!s->abandoned) {
        int rc = store_outcome(s);
        if (rc == -ENOSPC || rc == -EBUSY) {
            log_warn("cell_store_retry", "job=%s cell=%s retry_ms=%d", s->run.job_id,
                     s->run.cell_id, SUP_STORE_RETRY_MS);
            uv_timer_start(&s->timer, on_store_retry, SUP_STORE_RETRY_MS, 0);
            return;
        }
    }
    finish_tail(s);
}

static void finish_tail(struct sup *s)
{
    /* The next cell is started first: removing a directory can take
     * milliseconds on a busy file system, and nothing waits for it. */
    if (s->done)
        s->done(s->ud, s);
    mem_cell_free(s->mem);
    s->mem = NULL;
    /* An abandoned attempt that the next capd takes up (sup_reattach)
     * keeps its scratch: its spec and spool. */
    if (!s->cfg->keep_scratch && s->scratch[0] && !(s->exec->reattach && s->abandoned))
        util_rm_tree(s->scratch);
    sup__close_handle(s, (uv_handle_t *)&s->timer);
    s->exec->close(s);
}

static int on_frame(void *ud, const struct frame *f)
{
    struct sup *s = ud;
    if (f->kind == FRAME_ENV) {
        const char *w = json_string_value(json_object_get(frame_header(f), "effective_width"));
        if (w)
            snprintf(s->effective_width, sizeof s->effective_width, "%s", w);
    }
    bool tensor = f->kind == FRAME_TENSOR;
    const char *key = tensor ? f->tensor.key : NULL;
    const char *alg = tensor ? frame_hash_alg_name(f->tensor.hash_alg) : NULL;
    /* Records after a lost batch would follow a hole: stop at the loss. */
    int rc = records_lost(s) ? -ENOSPC
                             : store_record_add(s->st, s->run.attempt_id, s->rec_seq,
                                                frame_kind_name(f->kind), key, alg, f->hdr_text,
                                                f->hdr_len, f->payload, (size_t)f->nbytes);
    if (rc) {
        char msg[512];
        if (rc == -ENOSPC)
            snprintf(msg, sizeof msg,
                     "capd could not store record %lld: storage unavailable (disk full, "
                     "read-only data dir or an I/O error); the records committed before it "
                     "are kept",
                     (long long)s->rec_seq);
        else
            snprintf(msg, sizeof msg, "capd could not store record %lld: %s", (long long)s->rec_seq,
                     store_errmsg(s->st));
        sup__fail(s, CELL_FAILED, msg);
        log_warn("cell_store_failed", "job=%s cell=%s rc=%d reason=%s", s->run.job_id,
                 s->run.cell_id, rc, log_q(msg));
        return -EIO;
    }
    metrics_ingest(1, f->hdr_len + (uint64_t)f->nbytes);
    s->rec_seq++;
    return 0;
}

void sup__frames_bytes(struct sup *s, const char *data, size_t n)
{
    if (s->fail_state)
        return; /* already ending: drain and drop */
    int rc = frame_feed(s->fp, data, n);
    if (rc) {
        if (rc == -EPROTO)
            sup__fail(s, CELL_PROTOCOL_ERROR, frame_error(s->fp));
        log_warn("cell_protocol_error", "job=%s cell=%s reason=%s", s->run.job_id, s->run.cell_id,
                 log_q(s->fail_reason));
        s->exec->stop(s, SIGKILL);
    }
}

void sup__frames_end(struct sup *s)
{
    s->frames_eof = true;
    if (!s->fail_state) {
        int rc = frame_finish(s->fp);
        if (rc == -EPROTO)
            sup__fail(s, CELL_PROTOCOL_ERROR, frame_error(s->fp));
    }
}

void sup__pipe_read(uv_stream_t *h, ssize_t n, const uv_buf_t *b,
                    void (*bytes)(struct sup *s, const char *data, size_t n),
                    void (*end)(struct sup *s))
{
    struct sup *s = h->data;
    if (n > 0) {
        bytes(s, b->base, (size_t)n);
        return;
    }
    if (n == 0)
        return;
    uv_read_stop(h);
    end(s);
    sup__finish(s);
}

void sup__frames_read(uv_stream_t *h, ssize_t n, const uv_buf_t *b)
{
    sup__pipe_read(h, n, b, sup__frames_bytes, sup__frames_end);
}

/* S's frame parser, with the configured limits. */
int sup__parser_new(struct sup *s)
{
    const struct capd_config *cfg = s->cfg;
    struct frame_limits lim = {
        .max_header = (size_t)cfg->frame_max_header,
        .max_payload = cfg->frame_max_payload,
        .max_frames = cfg->frame_max_frames,
        .max_total_payload = cfg->frame_max_total_payload,
    };
    return !s->buf ? -ENOMEM : frame_parser_new(&lim, on_frame, s, &s->fp);
}

int sup_end_unrun(struct store *st, const struct store_cell_run *run, const char *event,
                  const struct store_outcome *o)
{
    if (cell_state_is(o->state, CELL_UNSUPPORTED))
        log_info(event, "job=%s cell=%s state=%s reason=%s", run->job_id, run->cell_id, o->state,
                 log_q(o->reason));
    else
        log_error(event, "job=%s cell=%s state=%s reason=%s", run->job_id, run->cell_id, o->state,
                  log_q(o->reason));
    int rc = store_cell_finish(st, run, o);
    if (rc)
        log_error("cell_finish_failed", "job=%s cell=%s rc=%d err=%s", run->job_id, run->cell_id,
                  rc, log_q(store_errmsg(st)));
    else
        metrics_cell_finished(o->state, -1);
    return rc;
}

int sup__store_setup_failure(struct store *st, struct store_cell_run *run, const char *reason)
{
    struct store_outcome o = {
        .state = cell_state_name(CELL_FAILED), .exit_code = -1, .reason = reason};
    return sup_end_unrun(st, run, "cell_setup_failed", &o);
}
