/*
 * worker/run.c - the runner's process and its two streams (worker.h).
 *
 * One thread and one poll loop: the runner's log pipe (stdout+stderr),
 * its frame pipe (fd 3) and a signalfd (SIGCHLD, and SIGTERM, SIGINT and
 * SIGHUP, which are passed on to the runner's group). Each stream keeps
 * what it read until capd acknowledged it (struct worker_window), so a
 * POST that failed is repeated at the same offset after a backoff while
 * the loop goes on reading; a stream whose buffer is full is not read,
 * and the runner then waits on its pipe. The POSTs themselves block: the
 * kernel's pipe buffers hold the runner's output meanwhile.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/child.h"
#include "util/clock.h"
#include "util/procmem.h"
#include "worker/run_int.h"

#define READ_MAX   (64u * 1024u)   /* bytes of one read from a pipe */
#define BUFFER_MIN (1024u * 1024u) /* the least a stream may hold unacknowledged */
#define PIPE_BYTES (1024 * 1024)   /* the pipes' capacity asked of the kernel */

/* The signals the loop reads from its signalfd. */
static void loop_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGCHLD);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGHUP);
}

/* The child: its own session, no core file, /dev/null, the log pipe and
 * the frame pipe on 0 to 3 and nothing else, the scratch dir, the exec.
 * It is a copy of the worker, but reports with dprintf only: what it
 * writes on fd 2 lands in the cell log capd keeps. */
static void child_exec(const struct worker_spec *spec, const char *scratch, int out_w, int frame_w,
                       pid_t parent)
{
    sigset_t none;
    sigemptyset(&none);
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (util_child_die_with(parent) != 0 || setsid() < 0)
        _exit(126);
    int null = open("/dev/null", O_RDONLY);
    /* Above 3 first, so no dup2 below overwrites a source still to copy. */
    int o = fcntl(out_w, F_DUPFD, 5), f = fcntl(frame_w, F_DUPFD, 5);
    if (null < 0 || o < 0 || f < 0 || dup2(null, 0) < 0 || dup2(o, 1) < 0 || dup2(o, 2) < 0 ||
        dup2(f, 3) < 0)
        _exit(126);
    if (chdir(scratch) != 0) {
        dprintf(2, "capd-cell: cannot enter the scratch dir %s: %s\n", scratch, strerror(errno));
        _exit(126);
    }
    const struct util_child_rlimits lim = {0};
    const char *what = NULL;
    unsigned long long v = 0;
    int rc = util_child_rlimits(&lim, &what, &v);
    if (rc != 0) {
        dprintf(2, "capd-cell: cannot set the rlimit %s: %s\n", what, strerror(-rc));
        _exit(126);
    }
    util_child_close_above_3();
    execve(spec->argv[0], spec->argv, spec->env);
    dprintf(2, "capd-cell: cannot execute %s: %s\n", spec->argv[0], strerror(errno));
    _exit(127);
}

/* The pipes and the child. 0 or -errno. */
static int start_runner(struct run *r)
{
    int lp[2], fp[2];
    if (pipe2(lp, O_CLOEXEC) != 0)
        return -errno;
    if (pipe2(fp, O_CLOEXEC) != 0) {
        int e = errno;
        close(lp[0]);
        close(lp[1]);
        return -e;
    }
    /* Larger pipes let the runner go on while a POST is under way. */
    fcntl(lp[1], F_SETPIPE_SZ, PIPE_BYTES);
    fcntl(fp[1], F_SETPIPE_SZ, PIPE_BYTES);
    pid_t parent = getpid(), pid = fork();
    if (pid == 0)
        child_exec(r->spec, r->o->scratch, lp[1], fp[1], parent);
    int e = errno;
    close(lp[1]);
    close(fp[1]);
    r->s[RUN_LOG].fd = lp[0];
    r->s[RUN_FRAMES].fd = fp[0];
    if (pid < 0)
        return -e;
    r->pid = pid;
    r->started_ms = util_mono_ms();
    return 0;
}

static void stream_init(struct run_stream *s, const char *name, size_t chunk)
{
    memset(s, 0, sizeof *s);
    s->name = name;
    s->fd = -1;
    ubuf_init(&s->buf, chunk * 4 > BUFFER_MIN ? chunk * 4 : BUFFER_MIN);
}

static void stream_close(struct run_stream *s)
{
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
}

/* Reads what the pipe has, as far as the buffer has room; EOF closes it. */
static void stream_read(struct run_stream *s)
{
    size_t room = s->buf.max - s->buf.len;
    size_t n = room < READ_MAX ? room : READ_MAX;
    if (n == 0 || ubuf_reserve(&s->buf, n) != 0)
        return;
    ssize_t got = read(s->fd, s->buf.p + s->buf.len, n);
    if (got > 0) {
        ubuf_setlen(&s->buf, s->buf.len + (size_t)got);
        s->w.buffered += (size_t)got;
        s->total += (uint64_t)got;
    } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        stream_close(s);
    }
}

/* Reaps the runner once it has ended, keeping its status and rusage. */
static void try_reap(struct run *r)
{
    if (r->reaped)
        return;
    pid_t p = wait4(r->pid, &r->status, WNOHANG, &r->ru);
    if (p == r->pid || (p < 0 && errno == ECHILD)) {
        r->reaped = true;
        r->reaped_ms = util_mono_ms();
    }
}

/* SIG to the runner's group; to the runner alone while it has none yet
 * (it was signalled between its fork and its setsid). */
static void signal_group(const struct run *r, int sig)
{
    if (kill(-r->pid, sig) != 0 && errno == ESRCH)
        kill(r->pid, sig);
}

/* SIGTERM to the runner's group now, SIGKILL after the grace. */
static void terminate(struct run *r, const char *why)
{
    if (r->kill_ms || r->reaped)
        return;
    if (!r->o->quiet)
        worker_say("attempt %lld: %s: stopping the runner", r->o->attempt, why);
    signal_group(r, SIGTERM);
    r->kill_ms = util_mono_ms() + WORKER_KILL_GRACE_MS;
}

static void read_signals(struct run *r)
{
    struct signalfd_siginfo si;
    while (read(r->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGCHLD) {
            try_reap(r);
            continue;
        }
        if (!r->stopped_by && !r->timed_out)
            r->stopped_by = (int)si.ssi_signo;
        terminate(r, si.ssi_signo == SIGTERM  ? "the worker got SIGTERM"
                     : si.ssi_signo == SIGINT ? "the worker got SIGINT"
                                              : "the worker got SIGHUP");
    }
}

/* The memory watchdog (every WORKER_MEM_MS): the runner's group's
 * resident memory summed, its peak kept, the group SIGKILLed past the
 * limit, as capd's watchdog does for a local cell (daemon/host/memwatch.c). */
static void check_memory(struct run *r, int64_t now)
{
    if (r->spec->memory_max_bytes <= 0 || r->reaped || r->oom || now - r->mem_ms < WORKER_MEM_MS)
        return;
    r->mem_ms = now;
    int64_t rss = util_pgrp_rss(r->pid);
    if (rss > r->mem_peak)
        r->mem_peak = rss;
    if (rss <= r->spec->memory_max_bytes)
        return;
    r->oom = true;
    signal_group(r, SIGKILL);
    if (!r->o->quiet)
        worker_say("attempt %lld: the runner's group holds %lld bytes, over its limit of %lld: "
                   "killed",
                   r->o->attempt, (long long)rss, r->spec->memory_max_bytes);
}

/* The runner's deadlines: its timeout, the SIGKILL after a SIGTERM, and
 * the pipes that some descendant still holds once the runner is reaped. */
static void check_deadlines(struct run *r, int64_t now)
{
    check_memory(r, now);
    if (!r->reaped && r->spec->timeout_s > 0 && now - r->started_ms >= r->spec->timeout_s * 1000) {
        r->timed_out = r->timed_out || !r->stopped_by;
        terminate(r, "the attempt's timeout passed");
    }
    if (!r->reaped && r->kill_ms && now >= r->kill_ms)
        signal_group(r, SIGKILL);
    if (r->reaped && now - r->reaped_ms >= WORKER_KILL_GRACE_MS &&
        (r->s[0].fd >= 0 || r->s[1].fd >= 0)) {
        signal_group(r, SIGKILL);
        for (int i = 0; i < 2; i++)
            stream_close(&r->s[i]);
    }
}

/* Whether a stream has a POST to make right now, so the loop must not
 * wait (the tail after the runner ended goes out chunk after chunk). */
static bool post_ready(const struct run *r, int64_t now)
{
    struct worker_chunk ch;
    for (int i = 0; i < 2; i++) {
        const struct run_stream *s = &r->s[i];
        if ((!s->retry_ms || now >= s->retry_ms) &&
            worker_chunk_next(&s->w, r->chunk, now - s->last_post_ms >= WORKER_POST_MS, s->fd < 0,
                              &ch))
            return true;
    }
    return false;
}

/* One round of the loop: waits for the pipes and signals (50 ms at most,
 * so POSTs and deadlines are looked at in time; not at all when a POST is
 * ready), reads, and checks the runner's deadlines. */
static void wait_round(struct run *r)
{
    struct pollfd pf[3];
    int idx[3], n = 0;
    for (int i = 0; i < 2; i++) {
        if (r->s[i].fd >= 0 && r->s[i].buf.len < r->s[i].buf.max) {
            pf[n] = (struct pollfd){.fd = r->s[i].fd, .events = POLLIN};
            idx[n++] = i;
        }
    }
    pf[n] = (struct pollfd){.fd = r->sfd, .events = POLLIN};
    idx[n++] = -1;
    int wait = post_ready(r, util_mono_ms()) ? 0 : WORKER_POST_MS / 2;
    if (poll(pf, (nfds_t)n, wait) > 0) {
        for (int k = 0; k < n; k++) {
            if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (idx[k] < 0)
                read_signals(r);
            else
                stream_read(&r->s[idx[k]]);
        }
    }
    try_reap(r);
    check_deadlines(r, util_mono_ms());
}

/* Ends the runner for good when the worker gives up: SIGTERM, and SIGKILL
 * when the group outlives the grace. */
static void stop_runner(struct run *r)
{
    if (r->pid <= 0 || r->reaped)
        return;
    signal_group(r, SIGTERM);
    for (int64_t end = util_mono_ms() + WORKER_KILL_GRACE_MS; util_mono_ms() < end;) {
        try_reap(r);
        if (r->reaped)
            return;
        poll(NULL, 0, 50);
    }
    signal_group(r, SIGKILL);
    while (!r->reaped && waitpid(r->pid, &r->status, 0) >= 0)
        r->reaped = true;
}

static bool streams_done(const struct run *r)
{
    for (int i = 0; i < 2; i++)
        if (r->s[i].fd >= 0 || r->s[i].w.buffered > 0)
            return false;
    return r->reaped;
}

/* Streams both outputs to capd until the runner has ended and capd holds
 * every byte; -1 (said on stderr) when capd refused or went away. */
static int stream_all(struct run *r)
{
    while (!streams_done(r)) {
        wait_round(r);
        int64_t now = util_mono_ms();
        for (int i = 0; i < 2; i++)
            if (run__post_due(r, &r->s[i], now) != 0)
                return -1;
    }
    return 0;
}

int worker_run(struct worker_http *c, const struct worker_opts *o, const struct worker_spec *spec)
{
    struct run r = {.c = c, .o = o, .spec = spec, .pid = -1, .sfd = -1};
    sigset_t set, old;
    int rc = WORKER_EXIT_ERROR;
    r.chunk = o->chunk;
    if (spec->chunk_max_bytes && spec->chunk_max_bytes < r.chunk)
        r.chunk = spec->chunk_max_bytes;
    stream_init(&r.s[RUN_FRAMES], "frames", r.chunk);
    stream_init(&r.s[RUN_LOG], "log", r.chunk);
    loop_signals(&set);
    sigprocmask(SIG_BLOCK, &set, &old);
    if ((r.sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC)) < 0) {
        worker_say("signalfd: %s", strerror(errno));
        goto out;
    }
    int e = start_runner(&r);
    if (e != 0) {
        worker_say("cannot start the runner: %s", strerror(-e));
        goto out;
    }
    if (!o->quiet)
        worker_say("attempt %lld: running %s in %s (pid %d)", o->attempt, spec->argv[0], o->scratch,
                   (int)r.pid);
    if (stream_all(&r) == 0 && run__finish(&r) == 0)
        rc = WORKER_EXIT_OK;
out:
    stop_runner(&r);
    for (int i = 0; i < 2; i++) {
        stream_close(&r.s[i]);
        ubuf_free(&r.s[i].buf);
    }
    if (r.sfd >= 0)
        close(r.sfd);
    sigprocmask(SIG_SETMASK, &old, NULL);
    return rc;
}
