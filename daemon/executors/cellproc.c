/*
 * daemon/executors/cellproc.c - the local executor's running process, however it
 * was started (daemon/executors/cellstart.c): its pipes, the exit watch and the
 * reap, capd-exec's rusage pipe and the timeout. The attempt's end
 * (daemon/attempt/cellend.c) is told when the frames come in (sup__frames_read)
 * and when all of it is over (sup__finish); the log and the
 * SIGTERM-then-SIGKILL sequence are every attempt's (daemon/attempt/cellbase.c).
 *
 * The exit is watched through a pidfd (uv_poll), or a SIGCHLD uv_signal
 * where the kernel has no pidfd_open, and reaped with wait4 on the cell's
 * own pid only (which also gives its peak RSS), so libuv's children
 * (zygotes, GPU probe) stay libuv's. The group is SIGKILLed while the
 * exited leader is still unreaped, so its process-group id cannot have
 * been reused.
 *
 * The process is over when it has exited and both pipes reached EOF (or a
 * short drain timer ran out because some grandchild still holds them open:
 * the group is SIGKILLed at exit, so that only happens when one escaped
 * into its own session).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/log.h"
#include "daemon/executors/celllocal.h"

#define SUP_DRAIN_MS 2000

void sup__local_stop(struct sup *s, int sig)
{
    if (sup__loc(s)->pid > 0)
        kill(-sup__loc(s)->pid, sig);
}

int sup__local_new(struct sup *s)
{
    struct sup__local *l = calloc(1, sizeof *l);
    if (!l)
        return -ENOMEM;
    l->pidfd = l->rusage_fd = l->rusage_w = -1;
    s->ex = l;
    return 0;
}

void sup__local_release(struct sup *s)
{
    struct sup__local *l = sup__loc(s);
    if (l && l->pidfd >= 0)
        close(l->pidfd);
    free(l);
    s->ex = NULL;
}

static void on_drain_timeout(uv_timer_t *t)
{
    struct sup *s = t->data;
    /* Something outside the group still holds the pipes: stop reading. */
    if (!s->frames_eof) {
        uv_read_stop((uv_stream_t *)&sup__loc(s)->frames);
        s->frames_eof = true;
        if (!s->fail_state && !frame_saw_end(s->fp))
            frame_finish(s->fp);
    }
    if (!s->log_eof) {
        uv_read_stop((uv_stream_t *)&sup__loc(s)->logp);
        s->log_eof = true;
    }
    sup__finish(s);
}

/* Reads what capd-exec has written on its rusage pipe so far; true at its
 * end. Two short lines fit RBUF: more is refused (logged), not kept. */
static bool rusage_pull(struct sup *s)
{
    for (;;) {
        if (sup__loc(s)->rlen + 1 >= sizeof sup__loc(s)->rbuf) {
            log_warn("cell_rusage_ignored", "job=%s cell=%s reason=%s", s->run.job_id,
                     s->run.cell_id, log_q("capd-exec wrote more than its two lines"));
            return true;
        }
        ssize_t n = read(sup__loc(s)->rusage_fd, sup__loc(s)->rbuf + sup__loc(s)->rlen,
                         sizeof sup__loc(s)->rbuf - 1 - sup__loc(s)->rlen);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n == 0;
        sup__loc(s)->rlen += (size_t)n;
        sup__loc(s)->rbuf[sup__loc(s)->rlen] = 0;
    }
}

/* The zygote's child is the cell: its process group joins the cell's
 * memory group (daemon/host/memlimit.h), so the watchdog sees a prefork cell. */
static void rusage_adopt(struct sup *s)
{
    long long pid = 0;
    if (sup__loc(s)->adopted || !strchr(sup__loc(s)->rbuf, '\n') ||
        sscanf(sup__loc(s)->rbuf, "pid %lld", &pid) != 1)
        return;
    sup__loc(s)->adopted = true;
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
    if (eof || sup__loc(s)->adopted)
        uv_poll_stop(h);
}

/* The rusage line after the optional "pid" one: 0, or -1 when there is none. */
static int rusage_parse(const struct sup *s, long long *kb, long long *cpu_us)
{
    const char *line = sup__loc(s)->rbuf;
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
    sup__local_stop(s, SIGKILL);
    s->peak_rss = (int64_t)maxrss_kb * 1024;
    s->cpu_us = cpu_us;
    if (sup__loc(s)->rusage_fd >= 0) {
        long long kb = 0, cpu = 0;
        rusage_pull(s);
        if (rusage_parse(s, &kb, &cpu) == 0) {
            s->peak_rss = kb * 1024;
            s->cpu_us = cpu;
        }
        /* The poll handle lets go of the fd before it is closed. */
        if (sup__loc(s)->rpoll_on)
            sup__close_handle(s, (uv_handle_t *)&sup__loc(s)->rpoll);
        close(sup__loc(s)->rusage_fd);
        sup__loc(s)->rusage_fd = -1;
    }
    /* The group's own peak counts every process of the cell. */
    if (mem_cell_peak(s->mem) > s->peak_rss)
        s->peak_rss = mem_cell_peak(s->mem);
    sup__loc(s)->pid = 0;
    sup__close_handle(s, (uv_handle_t *)&sup__loc(s)->exitw);
    uv_timer_stop(&s->timer);
    uv_timer_start(&s->timer, on_drain_timeout, SUP_DRAIN_MS, 0);
    sup__finish(s);
}

/* Reaps the child if it has exited; anything else (still running, or a
 * SIGCHLD meant for another child) leaves it alone. */
static void reap(struct sup *s)
{
    int status = 0;
    siginfo_t si;
    if (s->exited || sup__loc(s)->pid <= 0)
        return;
    memset(&si, 0, sizeof si);
    if (waitid(P_PID, (id_t)sup__loc(s)->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 ||
        si.si_pid != sup__loc(s)->pid)
        return;
    /* The group first, while the unreaped leader keeps its id from being
     * reused: whatever the runner left behind goes with it. */
    sup__local_stop(s, SIGKILL);
    mem_cell_collect(s->mem);
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(sup__loc(s)->pid, &status, 0, &ru) < 0 && errno == EINTR)
        ;
    if (sup__loc(s)->pidfd >= 0)
        uv_poll_stop(&sup__loc(s)->exitw.poll);
    else
        uv_signal_stop(&sup__loc(s)->exitw.sig);
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

static void on_timeout(uv_timer_t *t)
{
    struct sup *s = t->data;
    s->timed_out = true;
    log_warn("cell_timeout", "job=%s cell=%s", s->run.job_id, s->run.cell_id);
    sup__terminate(s);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    struct sup *s = h->data;
    (void)suggested;
    b->base = s->buf;
    b->len = SUP__READ_BUF;
}

static void log_end(struct sup *s)
{
    s->log_eof = true;
}

static void on_log_read(uv_stream_t *h, ssize_t n, const uv_buf_t *b)
{
    sup__pipe_read(h, n, b, sup__log_write, log_end);
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

void sup__kill_reap(pid_t pid)
{
    kill(-pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
}

void sup__proc_open(struct sup *s, int frames_fd, int log_fd)
{
    uv_timer_init(s->loop, &s->timer);
    uv_pipe_init(s->loop, &sup__loc(s)->frames, 0);
    uv_pipe_init(s->loop, &sup__loc(s)->logp, 0);
    s->timer.data = sup__loc(s)->frames.data = sup__loc(s)->logp.data =
        sup__loc(s)->exitw.poll.data = s;
    s->handles_open = 3;
    uv_pipe_open(&sup__loc(s)->frames, frames_fd);
    uv_pipe_open(&sup__loc(s)->logp, log_fd);
    sup__loc(s)->by_sigchld = !have_pidfd();
    if (sup__loc(s)->by_sigchld) {
        uv_signal_init(s->loop, &sup__loc(s)->exitw.sig);
        sup__loc(s)->exitw.sig.data = s;
        uv_signal_start(&sup__loc(s)->exitw.sig, on_sigchld, SIGCHLD);
        s->handles_open++;
    }
}

int sup__proc_watch(struct sup *s, pid_t pid)
{
    int rc = 0;
    if (sup__loc(s)->by_sigchld)
        return 0;
    sup__loc(s)->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (sup__loc(s)->pidfd < 0) {
        rc = -errno;
    } else if (fcntl(sup__loc(s)->pidfd, F_SETFD, FD_CLOEXEC) != 0 ||
               (rc = uv_poll_init(s->loop, &sup__loc(s)->exitw.poll, sup__loc(s)->pidfd)) != 0) {
        rc = rc ? rc : -errno;
        close(sup__loc(s)->pidfd);
        sup__loc(s)->pidfd = -1;
    } else {
        sup__loc(s)->exitw.poll.data = s;
        uv_poll_start(&sup__loc(s)->exitw.poll, UV_READABLE, on_pidfd);
        s->handles_open++;
    }
    /* Cannot watch it: it must not run unsupervised. */
    if (rc)
        sup__kill_reap(pid);
    return rc;
}

void sup__proc_close(struct sup *s)
{
    if (sup__loc(s)->by_sigchld)
        sup__close_handle(s, (uv_handle_t *)&sup__loc(s)->exitw.sig);
    sup__close_handle(s, (uv_handle_t *)&s->timer);
    sup__close_handle(s, (uv_handle_t *)&sup__loc(s)->frames);
    sup__close_handle(s, (uv_handle_t *)&sup__loc(s)->logp);
}

void sup__proc_run(struct sup *s, uint64_t timeout_ms)
{
    if (sup__loc(s)->rusage_fd >= 0) {
        if (uv_poll_init(s->loop, &sup__loc(s)->rpoll, sup__loc(s)->rusage_fd) == 0) {
            sup__loc(s)->rpoll.data = s;
            sup__loc(s)->rpoll_on = true;
            s->handles_open++;
            uv_poll_start(&sup__loc(s)->rpoll, UV_READABLE, on_rusage_readable);
        } else {
            log_warn("cell_rusage_unwatched", "job=%s cell=%s", s->run.job_id, s->run.cell_id);
        }
    }
    uv_read_start((uv_stream_t *)&sup__loc(s)->frames, on_alloc, sup__frames_read);
    uv_read_start((uv_stream_t *)&sup__loc(s)->logp, on_alloc, on_log_read);
    uv_timer_start(&s->timer, on_timeout, timeout_ms, 0);
}
