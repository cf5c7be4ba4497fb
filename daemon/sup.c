/*
 * daemon/sup.c - one cell attempt, from spawn to stored outcome.
 *
 * The child is the build's interpreter running the runner, started by
 * spawn_cell (daemon/spawn.h: rlimits, parent-death signal, stray fds
 * closed, run_as_user, between the clone and the exec) or, for a prefork
 * build, capd-exec --zygote standing in for the zygote's child. It gets:
 *   fd 0  /dev/null
 *   fd 1,2  one pipe, read here into the capped cell log
 *   fd 3  the frame pipe, parsed here and written to storage as it streams
 *   fd 4  (capd-exec only) the zygote child's rusage, read after exit
 * Either way it is a new session (its pid is its process group, and a
 * signal to -pid reaches every descendant that did not leave), and it is
 * not started with uv_spawn: libuv forks, and fork of this multi-threaded
 * daemon copies its page tables and then pays a copy-on-write fault plus a
 * TLB shoot-down on every CPU for each page the loop touches until the
 * child has exec'd; spawn_cell and glibc's posix_spawn (capd-exec) share
 * the address space (CLONE_VM | CLONE_VFORK) and only block the loop until
 * the exec. Its exit is watched through a pidfd (uv_poll), or a SIGCHLD
 * uv_signal where the kernel has no pidfd_open, and reaped with wait4 on
 * its own pid only (which also gives its peak RSS), so libuv's children
 * (zygotes, GPU probe) stay libuv's.
 *
 * The attempt ends when the process has exited and both pipes reached EOF
 * (or a short drain timer ran out because some grandchild still holds them
 * open: the group is SIGKILLed at exit, so that only happens when one
 * escaped into its own session).
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <spawn.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/cellenv.h"
#include "daemon/frame.h"
#include "daemon/launch.h"
#include "daemon/log.h"
#include "daemon/memlimit.h"
#include "daemon/metrics.h"
#include "daemon/outcome.h"
#include "daemon/reference.h"
#include "daemon/runas.h"
#include "daemon/spawn.h"
#include "daemon/sup.h"
#include "daemon/widths.h"
#include "daemon/zygote.h"

#define SUP_READ_BUF (1u << 20)
#define SUP_DRAIN_MS 2000
/* How often an outcome that could not be stored (disk full) is retried. */
#define SUP_STORE_RETRY_MS 1000

extern char **environ;

struct sup {
    uv_loop_t *loop;
    const struct capd_config *cfg;
    struct store *st;
    struct store_cell_run run;
    sup_done_cb done;
    sup_next_cb next_cb;
    void *ud;
    struct store_cell_run next; /* claimed with the outcome, for DONE */

    /* Exit watch: a pidfd made readable by the exit, or SIGCHLD. */
    union {
        uv_poll_t poll;
        uv_signal_t sig;
    } exitw;
    int pidfd;
    uv_pipe_t frames, logp;
    uv_timer_t timer;
    int handles_open;
    /* capd-exec's rusage pipe (prefork): "pid N" once it knows the zygote's
     * child, its rusage at the end; watched until the pid is in. */
    int rusage_fd;
    uv_poll_t rpoll;
    bool rpoll_on, adopted;
    char rbuf[160];
    size_t rlen;
    pid_t pid;

    bool exited, frames_eof, log_eof, finished;
    bool timed_out, cancelled, abandoned, kill_sent;
    int64_t exit_status;
    int term_signal;
    uint64_t t0;
    int64_t peak_rss, cpu_us;
    struct mem_cell *mem; /* the cell's memory group (daemon/memlimit.h) */

    struct frame_parser *fp;
    char *fail_state; /* protocol_error or failed, set when capd ended it */
    char *fail_reason;
    int64_t rec_seq;
    uint64_t losses0; /* store_batch_losses() when the attempt started */
    char effective_width[32];

    int log_fd;
    uint64_t log_part_bytes, log_dropped;
    char *log_path;
    char scratch[1024];
    char *buf; /* read_buffer(): shared by every cell, not owned */
};

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

char *sup_log_path(const char *data_dir, const char *job_id, const char *cell_id)
{
    char *p;
    if (asprintf(&p, "%s/logs/%s/%s.log", data_dir, job_id, cell_id) < 0)
        return NULL;
    return p;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void rm_tree(const char *dir)
{
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Creates PATH and any missing parents. The common case, a new directory
 * in an existing one, is a single mkdir; the walk from the root is only
 * taken when a parent is missing. */
static int mkdir_p(const char *path, mode_t mode)
{
    if (mkdir(path, mode) == 0 || errno == EEXIST)
        return 0;
    if (errno != ENOENT)
        return -errno;
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, mode) != 0 && errno != EEXIST)
                return -errno;
            *p = '/';
        }
    }
    if (mkdir(tmp, mode) != 0 && errno != EEXIST)
        return -errno;
    return 0;
}

static void set_fail(struct sup *s, const char *state, const char *reason)
{
    if (s->fail_state)
        return;
    s->fail_state = strdup(state);
    s->fail_reason = strdup(reason);
}

static void kill_group(struct sup *s, int sig)
{
    if (s->pid > 0)
        kill(-s->pid, sig);
}

/* ---- the capped log: tail kept ----
 * Output goes to LOG.part; when that reaches half the cap it becomes
 * LOG.prev (replacing the older one) and a new part starts, so the last
 * cap/2..cap bytes always survive. At the end the two are joined. */

static void log_write(struct sup *s, const char *data, size_t n)
{
    if (s->log_fd < 0)
        return;
    uint64_t half = s->cfg->cell_log_max_bytes / 2;
    while (n > 0) {
        if (s->log_part_bytes >= half) {
            char prev[1100], part[1100];
            snprintf(prev, sizeof prev, "%s.prev", s->log_path);
            snprintf(part, sizeof part, "%s.part", s->log_path);
            struct stat sb;
            if (stat(prev, &sb) == 0)
                s->log_dropped += (uint64_t)sb.st_size;
            close(s->log_fd);
            rename(part, prev);
            s->log_fd = open(part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
            s->log_part_bytes = 0;
            if (s->log_fd < 0)
                return;
        }
        size_t room = half - s->log_part_bytes;
        size_t w = n < room ? n : room;
        ssize_t r = write(s->log_fd, data, w);
        if (r <= 0)
            return;
        s->log_part_bytes += (uint64_t)r;
        data += r;
        n -= (size_t)r;
    }
}

static void log_finish(struct sup *s)
{
    char prev[1100], part[1100];
    snprintf(prev, sizeof prev, "%s.prev", s->log_path);
    snprintf(part, sizeof part, "%s.part", s->log_path);
    if (s->log_fd >= 0)
        close(s->log_fd);
    s->log_fd = -1;
    int in = open(prev, O_RDONLY | O_CLOEXEC);
    if (in < 0) {
        rename(part, s->log_path);
        return;
    }
    int out = open(s->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (out >= 0) {
        char note[160];
        int nn = snprintf(note, sizeof note,
                          "[capd: log over its %llu-byte cap; %llu earlier bytes dropped, the "
                          "tail follows]\n",
                          (unsigned long long)s->cfg->cell_log_max_bytes,
                          (unsigned long long)s->log_dropped);
        ssize_t wr = write(out, note, (size_t)nn);
        (void)wr;
        for (int pass = 0; pass < 2; pass++) {
            ssize_t r;
            while ((r = read(in, s->buf, SUP_READ_BUF)) > 0)
                if (write(out, s->buf, (size_t)r) != r)
                    break;
            close(in);
            in = pass == 0 ? open(part, O_RDONLY | O_CLOEXEC) : -1;
            if (in < 0)
                break;
        }
        close(out);
    }
    if (in >= 0)
        close(in);
    unlink(prev);
    unlink(part);
}

/* ---- ending ---- */

static void on_close(uv_handle_t *h)
{
    struct sup *s = h->data;
    if (--s->handles_open > 0)
        return;
    if (s->pidfd >= 0)
        close(s->pidfd);
    store_cell_run_clear(&s->run);
    store_cell_run_clear(&s->next);
    frame_parser_free(s->fp);
    free(s->fail_state);
    free(s->fail_reason);
    free(s->log_path);
    free(s);
}

static void close_handle(struct sup *s, uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, on_close);
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
    mem_cell_describe(s->mem, peak, what, tlen);
    *in = (struct outcome_in){
        .cancelled = s->cancelled,
        .timed_out = s->timed_out,
        .timeout_s = (long long)json_integer_value(
            json_object_get(json_object_get(s->run.spec, "options"), "timeout_s")),
        .oom_killed = mem_cell_oom(s->mem),
        .mem_mechanism = mem_mechanism_name(),
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
    o.duration_ms = (int64_t)((uv_hrtime() - s->t0) / 1000000);
    o.peak_rss_bytes = s->peak_rss;
    o.cpu_time_ms = s->cpu_us / 1000;
    o.memory_limit_bytes = (int64_t)mem_cell_limit(s->mem);
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

static void finish(struct sup *s)
{
    if (s->finished || !s->exited || !s->frames_eof || !s->log_eof)
        return;
    s->finished = true;
    uv_timer_stop(&s->timer);
    log_finish(s);
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
    if (!s->cfg->keep_scratch && s->scratch[0])
        rm_tree(s->scratch);
    close_handle(s, (uv_handle_t *)&s->timer);
    close_handle(s, (uv_handle_t *)&s->frames);
    close_handle(s, (uv_handle_t *)&s->logp);
}

static void on_drain_timeout(uv_timer_t *t)
{
    struct sup *s = t->data;
    /* Something outside the group still holds the pipes: stop reading. */
    if (!s->frames_eof) {
        uv_read_stop((uv_stream_t *)&s->frames);
        s->frames_eof = true;
        if (!s->fail_state && !frame_saw_end(s->fp))
            frame_finish(s->fp);
    }
    if (!s->log_eof) {
        uv_read_stop((uv_stream_t *)&s->logp);
        s->log_eof = true;
    }
    finish(s);
}

/* Reads what capd-exec has written on its rusage pipe so far; true at its
 * end. Two short lines fit RBUF: more is refused (logged), not kept. */
static bool rusage_pull(struct sup *s)
{
    for (;;) {
        if (s->rlen + 1 >= sizeof s->rbuf) {
            log_warn("cell_rusage_ignored", "job=%s cell=%s reason=%s", s->run.job_id,
                     s->run.cell_id, log_q("capd-exec wrote more than its two lines"));
            return true;
        }
        ssize_t n = read(s->rusage_fd, s->rbuf + s->rlen, sizeof s->rbuf - 1 - s->rlen);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n == 0;
        s->rlen += (size_t)n;
        s->rbuf[s->rlen] = 0;
    }
}

/* The zygote's child is the cell: its process group joins the cell's
 * memory group (daemon/memlimit.h), so the watchdog sees a prefork cell. */
static void rusage_adopt(struct sup *s)
{
    long long pid = 0;
    if (s->adopted || !strchr(s->rbuf, '\n') || sscanf(s->rbuf, "pid %lld", &pid) != 1)
        return;
    s->adopted = true;
    if (mem_cell_adopt(s->mem, (pid_t)pid) != 0)
        log_warn("cell_adopt_failed", "job=%s cell=%s pid=%lld", s->run.job_id, s->run.cell_id,
                 pid);
}

static void on_rusage_readable(uv_poll_t *h, int status, int events)
{
    struct sup *s = h->data;
    (void)events;
    bool eof = status < 0 || rusage_pull(s);
    rusage_adopt(s);
    if (eof || s->adopted)
        uv_poll_stop(h);
}

/* The rusage line after the optional "pid" one: 0, or -1 when there is none. */
static int rusage_parse(const struct sup *s, long long *kb, long long *cpu_us)
{
    const char *line = s->rbuf;
    if (strncmp(line, "pid ", 4) == 0)
        line = strchr(line, '\n') ? strchr(line, '\n') + 1 : "";
    long long ut = 0, st = 0;
    if (sscanf(line, "%lld %lld %lld", kb, &ut, &st) < 1)
        return -1;
    *cpu_us = ut + st;
    return 0;
}

/* MAXRSS_KB is the reaped child's own peak RSS; capd-exec (prefork) reports
 * the zygote child's, which is no child of capd, on its rusage pipe. */
static void on_exit_cb(struct sup *s, int64_t exit_status, int term_signal, long maxrss_kb,
                       int64_t cpu_us)
{
    s->exited = true;
    s->exit_status = exit_status;
    s->term_signal = term_signal;
    /* Whatever the runner left behind in its group goes with it. */
    kill_group(s, SIGKILL);
    s->peak_rss = (int64_t)maxrss_kb * 1024;
    s->cpu_us = cpu_us;
    if (s->rusage_fd >= 0) {
        long long kb = 0, cpu = 0;
        rusage_pull(s);
        if (rusage_parse(s, &kb, &cpu) == 0) {
            s->peak_rss = kb * 1024;
            s->cpu_us = cpu;
        }
        /* The poll handle lets go of the fd before it is closed. */
        if (s->rpoll_on)
            close_handle(s, (uv_handle_t *)&s->rpoll);
        close(s->rusage_fd);
        s->rusage_fd = -1;
    }
    /* The group's own peak counts every process of the cell. */
    if (mem_cell_peak(s->mem) > s->peak_rss)
        s->peak_rss = mem_cell_peak(s->mem);
    s->pid = 0;
    close_handle(s, (uv_handle_t *)&s->exitw);
    uv_timer_stop(&s->timer);
    uv_timer_start(&s->timer, on_drain_timeout, SUP_DRAIN_MS, 0);
    finish(s);
}

/* Reaps the child if it has exited; anything else (still running, or a
 * SIGCHLD meant for another child) leaves it alone. */
static void reap(struct sup *s)
{
    int status = 0;
    siginfo_t si;
    if (s->exited || s->pid <= 0)
        return;
    memset(&si, 0, sizeof si);
    if (waitid(P_PID, (id_t)s->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid != s->pid)
        return;
    /* The group first, while the unreaped leader keeps its id from being
     * reused: whatever the runner left behind goes with it. */
    kill_group(s, SIGKILL);
    mem_cell_collect(s->mem);
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(s->pid, &status, 0, &ru) < 0 && errno == EINTR)
        ;
    if (s->pidfd >= 0)
        uv_poll_stop(&s->exitw.poll);
    else
        uv_signal_stop(&s->exitw.sig);
    int64_t cpu = (int64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000 +
                  ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
    if (WIFSIGNALED(status))
        on_exit_cb(s, 0, WTERMSIG(status), ru.ru_maxrss, cpu);
    else
        on_exit_cb(s, WIFEXITED(status) ? WEXITSTATUS(status) : 0, 0, ru.ru_maxrss, cpu);
}

static void on_pidfd(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    reap(h->data);
}

static void on_sigchld(uv_signal_t *h, int signum)
{
    (void)signum;
    reap(h->data);
}

static void on_kill_timer(uv_timer_t *t)
{
    struct sup *s = t->data;
    kill_group(s, SIGKILL);
}

/* SIGTERM to the group first so a runner can flush; SIGKILL after grace. */
static void terminate(struct sup *s)
{
    if (s->kill_sent || s->exited)
        return;
    s->kill_sent = true;
    kill_group(s, SIGTERM);
    uv_timer_stop(&s->timer);
    uv_timer_start(&s->timer, on_kill_timer, (uint64_t)s->cfg->kill_grace_ms, 0);
}

static void on_timeout(uv_timer_t *t)
{
    struct sup *s = t->data;
    s->timed_out = true;
    log_warn("cell_timeout", "job=%s cell=%s", s->run.job_id, s->run.cell_id);
    terminate(s);
}

void sup_cancel(struct sup *s)
{
    if (s->exited)
        return;
    s->cancelled = true;
    terminate(s);
}

void sup_abandon(struct sup *s)
{
    s->abandoned = true;
    kill_group(s, SIGKILL);
}

/* ---- streams ---- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    struct sup *s = h->data;
    (void)suggested;
    b->base = s->buf;
    b->len = SUP_READ_BUF;
}

static int on_frame(void *ud, const struct frame *f)
{
    struct sup *s = ud;
    if (f->kind == FRAME_ENV) {
        const char *w = json_string_value(json_object_get(frame_header(f), "effective_width"));
        if (w)
            snprintf(s->effective_width, sizeof s->effective_width, "%s", w);
    }
    const char *key = f->kind == FRAME_TENSOR ? f->tensor.key : NULL;
    /* Records after a lost batch would follow a hole: stop at the loss. */
    int rc = records_lost(s)
                 ? -ENOSPC
                 : store_record_add(s->st, s->run.attempt_id, s->rec_seq, frame_kind_name(f->kind),
                                    key, f->hdr_text, f->hdr_len, f->payload, (size_t)f->nbytes);
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

static void on_frames_read(uv_stream_t *h, ssize_t n, const uv_buf_t *b)
{
    struct sup *s = h->data;
    if (n > 0) {
        if (s->fail_state)
            return; /* already ending: drain and drop */
        int rc = frame_feed(s->fp, b->base, (size_t)n);
        if (rc) {
            if (rc == -EPROTO)
                set_fail(s, "protocol_error", frame_error(s->fp));
            log_warn("cell_protocol_error", "job=%s cell=%s reason=%s", s->run.job_id,
                     s->run.cell_id, log_q(s->fail_reason));
            kill_group(s, SIGKILL);
        }
        return;
    }
    if (n == 0)
        return;
    uv_read_stop(h);
    s->frames_eof = true;
    if (!s->fail_state) {
        int rc = frame_finish(s->fp);
        if (rc == -EPROTO)
            set_fail(s, "protocol_error", frame_error(s->fp));
    }
    finish(s);
}

static void on_log_read(uv_stream_t *h, ssize_t n, const uv_buf_t *b)
{
    struct sup *s = h->data;
    if (n > 0) {
        log_write(s, b->base, (size_t)n);
        return;
    }
    if (n == 0)
        return;
    uv_read_stop(h);
    s->log_eof = true;
    finish(s);
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

static void free_strv(char **v)
{
    cellenv_free(v);
}

static int write_spec(struct sup *s, const char *path)
{
    json_t *o = json_deep_copy(json_object_get(s->run.spec, "options"));
    if (!json_object_get(o, "sample_size"))
        json_object_set_new(o, "sample_size", json_integer(256));
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

/*
 * The read buffer of every cell: all reads happen on the loop thread and
 * each is consumed (parsed, or written to the log) before the callback
 * returns, so one buffer serves them all. Allocated once: a 1 MiB malloc
 * per cell is an mmap and a munmap, and the munmap of a multi-threaded
 * process interrupts every CPU that runs one of its threads.
 */
static char *read_buffer(void)
{
    static char *buf;
    if (!buf)
        buf = malloc(SUP_READ_BUF);
    return buf;
}

/* Whether this kernel has pidfd_open (5.3+), asked once. */
static bool have_pidfd(void)
{
    static int have = -1;
    if (have < 0) {
        int fd = (int)syscall(SYS_pidfd_open, getpid(), 0);
        have = fd >= 0;
        if (fd >= 0)
            close(fd);
    }
    return have;
}

/*
 * Starts capd-exec in a new session, in the scratch dir, with fds 0..4 as
 * sup.c's header says and every signal back at its default disposition and
 * unblocked (capd ignores SIGPIPE; an ignored disposition survives exec).
 * Every other fd of capd is O_CLOEXEC. Returns 0 or -errno (exec failures
 * included: glibc's posix_spawn reports them).
 */
static int spawn_child(struct sup *s, char **args, char **env, int logw, int framew, int rusew,
                       pid_t *pid)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    sigset_t all, none;
    int src[3] = {logw, framew, rusew}, tmp[3] = {-1, -1, -1}, rc;
    /* A source fd below 5 could be overwritten by an earlier dup2 of the
     * list; move such ones out of the way first. */
    for (int i = 0; i < 3; i++) {
        if (src[i] <= 4) {
            if ((tmp[i] = fcntl(src[i], F_DUPFD_CLOEXEC, 5)) < 0) {
                rc = -errno;
                goto out_fds;
            }
            src[i] = tmp[i];
        }
    }
    sigfillset(&all);
    sigemptyset(&none);
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    rc = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF |
                                           POSIX_SPAWN_SETSIGMASK);
    if (!rc)
        rc = posix_spawnattr_setsigdefault(&at, &all);
    if (!rc)
        rc = posix_spawnattr_setsigmask(&at, &none);
    if (!rc)
        rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (!rc)
        rc = posix_spawn_file_actions_adddup2(&fa, src[0], 1);
    if (!rc)
        rc = posix_spawn_file_actions_adddup2(&fa, src[0], 2);
    if (!rc)
        rc = posix_spawn_file_actions_adddup2(&fa, src[1], 3);
    if (!rc)
        rc = posix_spawn_file_actions_adddup2(&fa, src[2], 4);
    if (!rc)
        rc = posix_spawn_file_actions_addchdir_np(&fa, s->scratch);
    if (!rc)
        rc = posix_spawn(pid, s->cfg->exec_bin, &fa, &at, args, env);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    rc = -rc;
out_fds:
    for (int i = 0; i < 3; i++)
        if (tmp[i] >= 0)
            close(tmp[i]);
    return rc;
}

int sup_start(uv_loop_t *loop, const struct capd_config *cfg, struct store *st,
              struct store_cell_run *run, sup_done_cb done, void *ud, struct sup **out)
{
    int rc = -ENOMEM;
    int fpipe[2] = {-1, -1}, lpipe[2] = {-1, -1}, rpipe[2] = {-1, -1};
    char **env = NULL;
    char *spec_path = NULL, *logdir = NULL, reason[1200] = "";
    struct sup *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->loop = loop;
    s->cfg = cfg;
    s->st = st;
    s->run = *run;
    memset(run, 0, sizeof *run);
    s->done = done;
    s->ud = ud;
    s->log_fd = -1;
    s->rusage_fd = -1;
    s->pidfd = -1;
    s->t0 = uv_hrtime();
    s->losses0 = store_batch_losses(st);
    s->buf = read_buffer();
    struct frame_limits lim = {
        .max_header = (size_t)cfg->frame_max_header,
        .max_payload = cfg->frame_max_payload,
        .max_frames = cfg->frame_max_frames,
        .max_total_payload = cfg->frame_max_total_payload,
    };
    if (!s->buf || frame_parser_new(&lim, on_frame, s, &s->fp) != 0)
        goto fail;

    const char *python = json_string_value(json_object_get(s->run.build, "python"));
    char why[768];
    if (!python || runas_can_use(cfg, python, RUNAS_EXEC, why, sizeof why) != 0) {
        snprintf(reason, sizeof reason, "build '%s': interpreter %s",
                 json_string_value(json_object_get(s->run.build, "name")),
                 python ? why : "(build no longer registered) is not executable");
        rc = -ENOENT;
        goto fail;
    }
    snprintf(s->scratch, sizeof s->scratch, "%s/scratch/%s-%d", cfg->data_dir, s->run.cell_id,
             s->run.attempt);
    if (asprintf(&logdir, "%s/logs/%s", cfg->data_dir, s->run.job_id) < 0 ||
        !(s->log_path = sup_log_path(cfg->data_dir, s->run.job_id, s->run.cell_id)) ||
        asprintf(&spec_path, "%s/cell.json", s->scratch) < 0) {
        logdir = spec_path = NULL;
        goto fail;
    }
    rm_tree(s->scratch);
    if ((rc = mkdir_p(s->scratch, 0700)) != 0 || (rc = mkdir_p(logdir, 0750)) != 0) {
        snprintf(reason, sizeof reason, "cannot create %s: %s", s->scratch, strerror(-rc));
        goto fail;
    }
    if ((rc = write_spec(s, spec_path)) != 0) {
        snprintf(reason, sizeof reason, "cannot write the cell spec %s", spec_path);
        goto fail;
    }
    if ((rc = runas_prepare_cell(cfg, s->scratch, spec_path, reason, sizeof reason)) != 0)
        goto fail;
    char part[1100];
    snprintf(part, sizeof part, "%s.part", s->log_path);
    s->log_fd = open(part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (s->log_fd < 0 || pipe2(fpipe, O_CLOEXEC) != 0 || pipe2(lpipe, O_CLOEXEC) != 0) {
        rc = -errno;
        snprintf(reason, sizeof reason, "cannot set up the cell's pipes/log: %s", strerror(errno));
        goto fail;
    }
    /* A bigger pipe lets a runner stream payloads without a context switch
     * per 64 KiB; failure only costs speed. */
    fcntl(fpipe[0], F_SETPIPE_SZ, 1 << 20);
    if (!(env = build_env(s, spec_path)))
        goto fail;
    if ((rc = sup_memory_group(s, reason, sizeof reason)) != 0)
        goto fail;
    /* Prefork builds: capd-exec hands the cell to the build's zygote
     * (daemon/zygote.h) and reports the zygote child's rusage on a pipe;
     * everything below is the same either way. */
    char zsock[128];
    bool prefork = zyg_for_cell(s->run.build, s->run.spec, env, zsock, sizeof zsock) == 0;
    if (prefork) {
        if (pipe2(rpipe, O_CLOEXEC) != 0) {
            rc = -errno;
            snprintf(reason, sizeof reason, "cannot set up the cell's pipes/log: %s",
                     strerror(errno));
            goto fail;
        }
        fcntl(rpipe[0], F_SETFL, O_NONBLOCK);
    }

    /* The same limits either way (daemon/launch.h); capd-exec gets them as
     * flags, spawn_cell as fields. */
    struct launch_exec le = {
        .rusage_fd = 4,
        .zygote = prefork ? zsock : NULL,
        .cgroup = mem_cell_dir(s->mem),
    };
    launch_cell_limits(cfg, s->run.spec, &le.lim);
    char *prog[] = {(char *)python, "-m", "capd_runner", NULL};
    struct launch_argv la;

    uv_timer_init(loop, &s->timer);
    uv_pipe_init(loop, &s->frames, 0);
    uv_pipe_init(loop, &s->logp, 0);
    s->timer.data = s->frames.data = s->logp.data = s->exitw.poll.data = s;
    s->handles_open = 3;
    uv_pipe_open(&s->frames, fpipe[0]);
    uv_pipe_open(&s->logp, lpipe[0]);
    fpipe[0] = lpipe[0] = -1;
    /* Without pidfds the SIGCHLD watch must be in place before the child
     * can exit, or its only signal could be missed. */
    bool by_pidfd = have_pidfd();
    if (!by_pidfd) {
        uv_signal_init(loop, &s->exitw.sig);
        s->exitw.sig.data = s;
        uv_signal_start(&s->exitw.sig, on_sigchld, SIGCHLD);
        s->handles_open++;
    }
    pid_t pid = 0;
    int src;
    if (prefork) {
        src = launch_exec_argv(cfg->exec_bin, &le, prog, &la);
        if (src == 0)
            src = spawn_child(s, la.argv, env, lpipe[1], fpipe[1], rpipe[1], &pid);
    } else {
        struct spawn_cell sc = {
            .path = python,
            .argv = prog,
            .envp = env,
            .cwd = s->scratch,
            .out_fd = lpipe[1],
            .frame_fd = fpipe[1],
            .as = le.lim.as,
            .cpu = le.lim.cpu,
            .nofile = le.lim.nofile,
            .nproc = le.lim.nproc,
            .unshare_net = le.lim.unshare_net,
            .uid = le.lim.uid,
            .gid = le.lim.gid,
            .cgroup_fd = mem_cell_procs_fd(s->mem),
        };
        src = spawn_cell(&sc, &pid);
    }
    if (src == 0 && (src = mem_cell_attach(s->mem, pid)) != 0) {
        kill(-pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    close(fpipe[1]);
    close(lpipe[1]);
    if (rpipe[1] >= 0)
        close(rpipe[1]);
    fpipe[1] = lpipe[1] = rpipe[1] = -1;
    if (src == 0 && by_pidfd) {
        s->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
        if (s->pidfd < 0)
            src = -errno;
        else if (fcntl(s->pidfd, F_SETFD, FD_CLOEXEC) != 0 ||
                 (src = uv_poll_init(loop, &s->exitw.poll, s->pidfd)) != 0) {
            src = src ? src : -errno;
            close(s->pidfd);
            s->pidfd = -1;
        } else {
            s->exitw.poll.data = s;
            uv_poll_start(&s->exitw.poll, UV_READABLE, on_pidfd);
            s->handles_open++;
        }
        if (src) {
            /* Cannot watch it: it must not run unsupervised. */
            kill(-pid, SIGKILL);
            while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                ;
        }
    }
    if (src != 0) {
        snprintf(reason, sizeof reason, "cannot spawn %s: %s", cfg->exec_bin, strerror(-src));
        finish_setup_failure(st, &s->run, reason);
        s->finished = true;
        if (!by_pidfd)
            close_handle(s, (uv_handle_t *)&s->exitw.sig);
        close_handle(s, (uv_handle_t *)&s->timer);
        close_handle(s, (uv_handle_t *)&s->frames);
        close_handle(s, (uv_handle_t *)&s->logp);
        if (rpipe[0] >= 0)
            close(rpipe[0]);
        close(s->log_fd);
        s->log_fd = -1;
        mem_cell_free(s->mem);
        s->mem = NULL;
        rc = src;
        goto out_started;
    }
    s->pid = pid;
    s->rusage_fd = rpipe[0];
    rpipe[0] = -1;
    if (s->rusage_fd >= 0) {
        if (uv_poll_init(loop, &s->rpoll, s->rusage_fd) == 0) {
            s->rpoll.data = s;
            s->rpoll_on = true;
            s->handles_open++;
            uv_poll_start(&s->rpoll, UV_READABLE, on_rusage_readable);
        } else {
            log_warn("cell_rusage_unwatched", "job=%s cell=%s", s->run.job_id, s->run.cell_id);
        }
    }
    uv_read_start((uv_stream_t *)&s->frames, on_alloc, on_frames_read);
    uv_read_start((uv_stream_t *)&s->logp, on_alloc, on_log_read);
    json_int_t timeout =
        json_integer_value(json_object_get(json_object_get(s->run.spec, "options"), "timeout_s"));
    uv_timer_start(&s->timer, on_timeout, (uint64_t)(timeout > 0 ? timeout : 600) * 1000, 0);
    log_info("cell_started", "job=%s cell=%s attempt=%d pid=%d model=%s width=%s pass=%s",
             s->run.job_id, s->run.cell_id, s->run.attempt, s->pid,
             log_q(json_string_value(json_object_get(s->run.spec, "model"))),
             json_string_value(json_object_get(s->run.spec, "width")),
             json_string_value(json_object_get(s->run.spec, "pass")));
    *out = s;
    rc = 0;
out_started:
    free_strv(env);
    free(spec_path);
    free(logdir);
    return rc;

fail:
    if (!reason[0])
        snprintf(reason, sizeof reason, "capd could not prepare the cell (error %d)", rc);
    finish_setup_failure(st, &s->run, reason);
    for (int i = 0; i < 2; i++) {
        if (fpipe[i] >= 0)
            close(fpipe[i]);
        if (lpipe[i] >= 0)
            close(lpipe[i]);
        if (rpipe[i] >= 0)
            close(rpipe[i]);
    }
    if (s->log_fd >= 0)
        close(s->log_fd);
    if (s->scratch[0] && !cfg->keep_scratch)
        rm_tree(s->scratch);
    store_cell_run_clear(&s->run);
    frame_parser_free(s->fp);
    mem_cell_free(s->mem);
    free(s->log_path);
    free(s);
    free_strv(env);
    free(spec_path);
    free(logdir);
    return rc ? rc : -EIO;
}
