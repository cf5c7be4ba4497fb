/*
 * daemon/sup.c - one cell attempt, from set-up to stored outcome: the
 * scratch dir, the cell spec and environment, the memory group, the start
 * through one of the start-up backends (daemon/cellstart.c), the frames
 * into storage as they stream, and, once the process is over
 * (daemon/cellproc.c), the outcome (daemon/outcome.h) stored with the
 * scheduler's next claim. daemon/sup_int.h says how the three files share
 * the work.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/cellenv.h"
#include "util/fs.h"
#include "util/log.h"
#include "util/metrics.h"
#include "daemon/outcome.h"
#include "daemon/reference.h"
#include "daemon/runas.h"
#include "daemon/sup_int.h"
#include "daemon/widths.h"
#include "storage/layout.h"

/* How often an outcome that could not be stored (disk full) is retried. */
#define SUP_STORE_RETRY_MS 1000

void sup_set_next_cb(struct sup *s, sup_next_cb cb)
{
    s->next_cb = cb;
}

bool sup_take_next(struct sup *s, struct store_cell_run *next)
{
    *next = s->next;
    memset(&s->next, 0, sizeof s->next);
    return next->cell_seq != 0;
}

const char *sup_job_id(const struct sup *s)
{
    return s->run.job_id;
}

const char *sup_cell_id(const struct sup *s)
{
    return s->run.cell_id;
}

static void set_fail(struct sup *s, const char *state, const char *reason)
{
    if (s->fail_state)
        return;
    s->fail_state = strdup(state);
    s->fail_reason = strdup(reason);
}

/* Whether an ingest batch holding records of this attempt was lost (a
 * failed write or commit rolled it back): the attempt then has a hole. */
static bool records_lost(const struct sup *s)
{
    return store_batch_losses(s->st) != s->losses0;
}

/*
 * What daemon/outcome.h decides from, gathered from the attempt. The
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
    if (sup_is_remote(s->cfg)) /* its worker's watchdog held the job's own limit */
        mem_describe((uint64_t)json_integer_value(json_object_get(
                         json_object_get(s->run.spec, "options"), "memory_max_bytes")),
                     peak, what, tlen);
    else
        mem_cell_describe(s->mem, peak, what, tlen);
    *in = (struct outcome_in){
        .cancelled = s->cancelled,
        .timed_out = s->timed_out,
        .timeout_s = (long long)json_integer_value(
            json_object_get(json_object_get(s->run.spec, "options"), "timeout_s")),
        .oom_killed = mem_cell_oom(s->mem) || s->remote_oom,
        .mem_mechanism = sup_is_remote(s->cfg) ? "capd-cell's watchdog" : mem_mechanism_name(),
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
 * Stores the attempt's outcome, as daemon/outcome.h decides it from the
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
    /* Slurm failed the node under it: a new attempt (daemon/cellslurm.c). */
    o.requeue = s->requeue;
    o.duration_ms = (int64_t)((uv_hrtime() - s->t0) / 1000000);
    o.peak_rss_bytes = s->peak_rss;
    o.cpu_time_ms = s->cpu_us / 1000;
    o.memory_limit_bytes = sup_is_remote(s->cfg)
                               ? json_integer_value(json_object_get(
                                     json_object_get(s->run.spec, "options"), "memory_max_bytes"))
                               : (int64_t)mem_cell_limit(s->mem);
    /* The scheduler's next claim rides in the same transaction when it
     * will make one once this cell is gone. Should that fail, the outcome
     * is stored alone and the scheduler claims as it did before. */
    bool skip_gpu = false;
    int rc = -EAGAIN;
    if (s->next_cb && s->next_cb(s->ud, s, &skip_gpu))
        rc = store_cell_finish_claim(s->st, &s->run, &o, skip_gpu, &s->next);
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
    /* An abandoned remote attempt's scratch holds its spec and spool,
     * which the next capd takes up (sup_reattach). */
    if (!s->cfg->keep_scratch && s->scratch[0] && !(s->remote && s->abandoned))
        util_rm_tree(s->scratch);
    sup__close_handle(s, (uv_handle_t *)&s->timer);
    if (s->remote) {
        sup__remote_close(s);
        return;
    }
    sup__close_handle(s, (uv_handle_t *)&s->frames);
    sup__close_handle(s, (uv_handle_t *)&s->logp);
}

void sup_cancel(struct sup *s)
{
    if (s->exited)
        return;
    s->cancelled = true;
    sup__proc_terminate(s);
}

void sup_abandon(struct sup *s)
{
    s->abandoned = true;
    sup__kill_group(s, SIGKILL);
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
        set_fail(s, "failed", msg);
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
            set_fail(s, "protocol_error", frame_error(s->fp));
        log_warn("cell_protocol_error", "job=%s cell=%s reason=%s", s->run.job_id, s->run.cell_id,
                 log_q(s->fail_reason));
        sup__kill_group(s, SIGKILL);
    }
}

void sup__frames_end(struct sup *s)
{
    s->frames_eof = true;
    if (!s->fail_state) {
        int rc = frame_finish(s->fp);
        if (rc == -EPROTO)
            set_fail(s, "protocol_error", frame_error(s->fp));
    }
}

void sup__frames_read(uv_stream_t *h, ssize_t n, const uv_buf_t *b)
{
    struct sup *s = h->data;
    if (n > 0) {
        sup__frames_bytes(s, b->base, (size_t)n);
        return;
    }
    if (n == 0)
        return;
    uv_read_stop(h);
    sup__frames_end(s);
    sup__finish(s);
}

/* ---- start ---- */

/* The child's environment: daemon/cellenv.h. */
static char **build_env(struct sup *s, const char *spec_path)
{
    json_t *env = cellenv_object(s->cfg, s->run.build, s->run.spec, s->scratch, spec_path);
    char **out = env ? cellenv_strv(env) : NULL;
    json_decref(env);
    return out;
}

static int write_spec(struct sup *s, const char *path)
{
    json_t *o = json_deep_copy(json_object_get(s->run.spec, "options"));
    if (!json_object_get(o, "sample_size"))
        json_object_set_new(o, "sample_size", json_integer(256));
    if (!json_object_get(o, "max_one_payload_bytes"))
        json_object_set_new(o, "max_one_payload_bytes",
                            json_integer((json_int_t)s->cfg->frame_max_payload));
    if (!json_object_get(o, "max_payload_bytes"))
        json_object_set_new(o, "max_payload_bytes",
                            json_integer((json_int_t)s->cfg->frame_max_total_payload));
    const char *device = json_string_value(json_object_get(o, "device"));
    json_t *spec =
        json_pack("{s:i,s:s,s:s,s:i,s:O,s:O,s:O*,s:O,s:s,s:i,s:s,s:O,s:o}", "protocol",
                  FRAME_PROTOCOL_VERSION, "job", s->run.job_id, "cell", s->run.cell_id, "attempt",
                  s->run.attempt, "model", json_object_get(s->run.spec, "model"), "width",
                  json_object_get(s->run.spec, "width"), "width_requires",
                  width_requires(json_string_value(json_object_get(s->run.spec, "width"))), "pass",
                  json_object_get(s->run.spec, "pass"), "device", device ? device : "cpu",
                  "frame_fd", 3, "scratch", s->scratch, "model_roots",
                  json_object_get(s->run.build, "model_roots"), "options", o);
    /* What the runner checks the libraries against (docs/widths.md): the
     * ATen capability to read back and the widest level any may run. */
    const char *wname = json_string_value(json_object_get(s->run.spec, "width"));
    json_t *isa = width_field(wname, "isa"), *eff = width_field(wname, "effective");
    if (spec) {
        json_object_set_new(spec, "width_isa", isa ? json_incref(isa) : json_null());
        json_object_set_new(spec, "width_effective", eff ? json_incref(eff) : json_null());
    }
    /* The cell's CPU set (daemon/cpus.h), when the scheduler gave one. */
    if (spec && json_is_array(json_object_get(s->run.spec, "cpus")))
        json_object_set(spec, "cpus", json_object_get(s->run.spec, "cpus"));
    /* The control build to time interleaved with this head (daemon/reference.h). */
    if (spec)
        ref_add_to_spec(s->cfg, s->st, &s->run, spec, s->scratch, path);
    int rc = spec && json_dump_file(spec, path, JSON_INDENT(2)) == 0 ? 0 : -EIO;
    json_decref(spec);
    return rc;
}

/* The cell's memory group with its limit: the job's memory_max_bytes
 * (validated against cell_memory_max_bytes when the job was accepted), or
 * cell_memory_max_bytes. */
static int sup_memory_group(struct sup *s, char *reason, size_t rlen)
{
    json_int_t want = json_integer_value(
        json_object_get(json_object_get(s->run.spec, "options"), "memory_max_bytes"));
    uint64_t limit = want > 0 && (uint64_t)want < s->cfg->cell_memory_max_bytes
                         ? (uint64_t)want
                         : s->cfg->cell_memory_max_bytes;
    char name[96];
    snprintf(name, sizeof name, "%s-%d", s->run.cell_id, s->run.attempt);
    return mem_cell_new(name, limit, &s->mem, reason, rlen);
}

static int finish_setup_failure(struct store *st, struct store_cell_run *run, const char *reason)
{
    struct store_outcome o = {.state = "failed", .exit_code = -1, .reason = reason};
    log_error("cell_setup_failed", "job=%s cell=%s reason=%s", run->job_id, run->cell_id,
              log_q(reason));
    return store_cell_finish(st, run, &o);
}

void sup__free(struct sup *s)
{
    store_cell_run_clear(&s->run);
    store_cell_run_clear(&s->next);
    frame_parser_free(s->fp);
    free(s->fail_state);
    free(s->fail_reason);
    free(s->log_path);
    free(s);
}

/* A new attempt of RUN (its ownership moves here) with nothing made yet. */
static struct sup *sup_new(uv_loop_t *loop, const struct capd_config *cfg, struct store *st,
                           struct store_cell_run *run, sup_done_cb done, void *ud)
{
    struct sup *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->loop = loop;
    s->cfg = cfg;
    s->st = st;
    s->run = *run;
    memset(run, 0, sizeof *run);
    s->done = done;
    s->ud = ud;
    s->log_fd = -1;
    s->rusage_fd = -1;
    s->rusage_w = -1;
    s->pidfd = -1;
    s->t0 = uv_hrtime();
    s->losses0 = store_batch_losses(st);
    s->buf = sup__read_buffer();
    return s;
}

/*
 * The cell's files: the interpreter checked as the cell user sees it, the
 * scratch dir (emptied), the log dir, the spec (*SPEC_PATH, caller frees)
 * and the hand-over to run_as_user. 0, or -errno with REASON (left empty
 * for want of memory).
 */
static int prepare_files(struct sup *s, char **spec_path, char *reason, size_t rlen)
{
    const struct capd_config *cfg = s->cfg;
    const char *python = json_string_value(json_object_get(s->run.build, "python"));
    char why[768];
    int rc = -ENOMEM;
    if (!python || runas_can_use(cfg, python, RUNAS_EXEC, why, sizeof why) != 0) {
        snprintf(reason, rlen, "build '%s': interpreter %s",
                 json_string_value(json_object_get(s->run.build, "name")),
                 python ? why : "(build no longer registered) is not executable");
        return -ENOENT;
    }
    char logdir[LAYOUT_PATH_MAX], logp[LAYOUT_PATH_MAX];
    if (layout_cell_scratch(s->scratch, sizeof s->scratch, cfg->data_dir, s->run.cell_id,
                            s->run.attempt) != 0 ||
        layout_job_logs(logdir, sizeof logdir, cfg->data_dir, s->run.job_id) != 0 ||
        layout_cell_log(logp, sizeof logp, cfg->data_dir, s->run.job_id, s->run.cell_id) != 0) {
        rc = -ENAMETOOLONG;
        snprintf(reason, rlen, "the cell's scratch dir or log path below %s is too long",
                 cfg->data_dir);
        goto out;
    }
    if (!(s->log_path = strdup(logp)) || asprintf(spec_path, "%s/cell.json", s->scratch) < 0) {
        *spec_path = NULL;
        goto out;
    }
    util_rm_tree(s->scratch);
    if ((rc = util_mkdir_p(s->scratch, 0700)) != 0 || (rc = util_mkdir_p(logdir, 0750)) != 0) {
        snprintf(reason, rlen, "cannot create %s: %s", s->scratch, strerror(-rc));
        goto out;
    }
    if ((rc = write_spec(s, *spec_path)) != 0) {
        snprintf(reason, rlen, "cannot write the cell spec %s", *spec_path);
        goto out;
    }
    /* A remote attempt's scratch holds capd's spool, not the cell's files. */
    rc = sup_is_remote(cfg) ? 0 : runas_prepare_cell(cfg, s->scratch, *spec_path, reason, rlen);
out:
    return rc;
}

/* The log's first part and the two pipes. A bigger frame pipe lets a
 * runner stream payloads without a context switch per 64 KiB; failing to
 * get one only costs speed. */
static int open_pipes(struct sup *s, int fpipe[2], int lpipe[2], char *reason, size_t rlen)
{
    if (sup__log_open(s) != 0 || pipe2(fpipe, O_CLOEXEC) != 0 || pipe2(lpipe, O_CLOEXEC) != 0) {
        int rc = -errno;
        snprintf(reason, rlen, "cannot set up the cell's pipes/log: %s", strerror(errno));
        return rc;
    }
    fcntl(fpipe[0], F_SETPIPE_SZ, 1 << 20);
    return 0;
}

/*
 * A set-up failure before any process: the cell is finished as failed
 * with REASON (a generic one when none was given) and everything made so
 * far goes, the scratch dir included.
 */
static void setup_failed(struct sup *s, int fpipe[2], int lpipe[2], char *reason, size_t rlen,
                         int rc)
{
    if (!reason[0])
        snprintf(reason, rlen, "capd could not prepare the cell (error %d)", rc);
    finish_setup_failure(s->st, &s->run, reason);
    for (int i = 0; i < 2; i++) {
        if (fpipe[i] >= 0)
            close(fpipe[i]);
        if (lpipe[i] >= 0)
            close(lpipe[i]);
    }
    if (s->rusage_fd >= 0)
        close(s->rusage_fd);
    if (s->rusage_w >= 0)
        close(s->rusage_w);
    if (s->log_fd >= 0)
        close(s->log_fd);
    if (s->scratch[0] && !s->cfg->keep_scratch)
        util_rm_tree(s->scratch);
    mem_cell_free(s->mem);
    sup__free(s);
}

/*
 * Starts the process through S's backend and watches it (daemon/cellproc.c).
 * The read ends of the pipes go to the loop and the write ends are closed
 * here, whatever happens. A process that cannot join its memory group or
 * be watched is killed: it must not run unsupervised. On failure the cell
 * is finished as failed and S is freed once its handles have closed.
 */
static int start_process(struct sup *s, char **env, int fpipe[2], int lpipe[2])
{
    const char *python = json_string_value(json_object_get(s->run.build, "python"));
    char *prog[] = {(char *)python, "-m", "capd_runner", NULL};
    struct sup__start st = {
        .python = python, .argv = prog, .env = env, .out_fd = lpipe[1], .frame_fd = fpipe[1]};
    pid_t pid = 0;
    sup__proc_open(s, fpipe[0], lpipe[0]);
    fpipe[0] = lpipe[0] = -1;
    int rc = s->backend->spawn(s, &st, &pid);
    if (rc == 0 && (rc = mem_cell_attach(s->mem, pid)) != 0)
        sup__kill_reap(pid);
    close(fpipe[1]);
    close(lpipe[1]);
    fpipe[1] = lpipe[1] = -1;
    if (s->rusage_w >= 0)
        close(s->rusage_w);
    s->rusage_w = -1;
    if (rc == 0)
        rc = sup__proc_watch(s, pid);
    if (rc == 0) {
        s->pid = pid;
        return 0;
    }
    char reason[1200];
    snprintf(reason, sizeof reason, "cannot spawn %s: %s", s->cfg->exec_bin, strerror(-rc));
    finish_setup_failure(s->st, &s->run, reason);
    s->finished = true;
    if (s->rusage_fd >= 0)
        close(s->rusage_fd);
    s->rusage_fd = -1;
    close(s->log_fd);
    s->log_fd = -1;
    mem_cell_free(s->mem);
    s->mem = NULL;
    sup__proc_close(s);
    return rc;
}

/* S's frame parser, with the configured limits. */
static int parser_new(struct sup *s)
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

int sup_reattach(uv_loop_t *loop, const struct capd_config *cfg, struct store *st,
                 struct store_cell_run *run, struct store_slurm_job slurm, sup_done_cb done,
                 void *ud, struct sup **out)
{
    char logp[LAYOUT_PATH_MAX], spec_path[1100], reason[1200] = "";
    char **env = NULL;
    struct sup *s = sup_new(loop, cfg, st, run, done, ud);
    if (!s)
        return -ENOMEM;
    int rc = parser_new(s);
    if (rc == 0 &&
        (layout_cell_scratch(s->scratch, sizeof s->scratch, cfg->data_dir, s->run.cell_id,
                             s->run.attempt) != 0 ||
         layout_cell_log(logp, sizeof logp, cfg->data_dir, s->run.job_id, s->run.cell_id) != 0))
        rc = -ENAMETOOLONG;
    if (rc == 0 && !(s->log_path = strdup(logp)))
        rc = -ENOMEM;
    snprintf(spec_path, sizeof spec_path, "%s/cell.json", s->scratch);
    if (rc == 0 && !(env = build_env(s, spec_path)))
        rc = -ENOMEM;
    if (rc == 0)
        rc = sup__remote_reattach(s, env, spec_path, slurm, reason, sizeof reason);
    cellenv_free(env);
    if (rc) {
        if (!reason[0])
            snprintf(reason, sizeof reason, "capd could not take the attempt up again (%d)", rc);
        finish_setup_failure(st, &s->run, reason);
        if (s->log_fd >= 0)
            close(s->log_fd);
        sup__free(s);
        return rc;
    }
    *out = s;
    return 0;
}

int sup_start(uv_loop_t *loop, const struct capd_config *cfg, struct store *st,
              struct store_cell_run *run, sup_done_cb done, void *ud, struct sup **out)
{
    int rc = -ENOMEM;
    int fpipe[2] = {-1, -1}, lpipe[2] = {-1, -1};
    char **env = NULL, *spec_path = NULL, reason[1200] = "";
    struct sup *s = sup_new(loop, cfg, st, run, done, ud);
    if (!s)
        return -ENOMEM;
    if (parser_new(s) != 0)
        goto fail;
    if ((rc = prepare_files(s, &spec_path, reason, sizeof reason)) != 0)
        goto fail;
    if (sup_is_remote(cfg)) {
        rc = -ENOMEM;
        if (!(env = build_env(s, spec_path)) ||
            (rc = sup__remote_start(s, env, spec_path, reason, sizeof reason)) != 0)
            goto fail;
        *out = s;
        goto out;
    }
    if ((rc = open_pipes(s, fpipe, lpipe, reason, sizeof reason)) != 0)
        goto fail;
    if (!(env = build_env(s, spec_path)))
        goto fail;
    if ((rc = sup_memory_group(s, reason, sizeof reason)) != 0 ||
        (rc = sup__backend_pick(s, env, reason, sizeof reason)) != 0)
        goto fail;
    if ((rc = start_process(s, env, fpipe, lpipe)) != 0)
        goto out;
    json_int_t timeout =
        json_integer_value(json_object_get(json_object_get(s->run.spec, "options"), "timeout_s"));
    sup__proc_run(s, (uint64_t)(timeout > 0 ? timeout : 600) * 1000);
    log_info("cell_started", "job=%s cell=%s attempt=%d pid=%d model=%s width=%s pass=%s",
             s->run.job_id, s->run.cell_id, s->run.attempt, s->pid,
             log_q(json_string_value(json_object_get(s->run.spec, "model"))),
             json_string_value(json_object_get(s->run.spec, "width")),
             json_string_value(json_object_get(s->run.spec, "pass")));
    *out = s;
out:
    cellenv_free(env);
    free(spec_path);
    return rc;
fail:
    setup_failed(s, fpipe, lpipe, reason, sizeof reason, rc);
    cellenv_free(env);
    free(spec_path);
    return rc ? rc : -EIO;
}
