/*
 * daemon/executors/cellstart.c - the local executor (daemon/config/executor.h): the
 * cell's process on capd's host, its pipes, its memory group, and the
 * start-up backend that makes it (struct sup__backend, daemon/attempt/sup_int.h).
 * Each backend produces the same process (a session leader in the scratch
 * dir, fds as sup_int.h says, the cell's exit status as its own), so the
 * rest of the attempt does not know which one ran. The backends' table
 * is the one place that chooses; a new backend is one more entry. Once
 * started, daemon/executors/cellproc.c watches the process.
 *
 *   prefork  a build registered with "prefork": capd-exec --zygote SOCKET
 *            (posix_spawn), which hands the cell to the build's zygote
 *            (daemon/prefork/zygote.h) and stands in for the forked child: its
 *            signals, its exit status, its pid and rusage on fd 4.
 *   fresh    everything else: spawn_cell (daemon/child/spawn.h), one clone and
 *            one exec of the interpreter.
 *
 * Neither starts the child with uv_spawn: libuv forks, and fork of this
 * multi-threaded daemon copies its page tables and then pays a
 * copy-on-write fault plus a TLB shoot-down on every CPU for each page the
 * loop touches until the child has exec'd; spawn_cell and glibc's
 * posix_spawn share the address space (CLONE_VM | CLONE_VFORK) and only
 * block the loop until the exec.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/config/executor.h"
#include "daemon/child/launch.h"
#include "daemon/host/memlimit.h"
#include "daemon/child/spawn.h"
#include "daemon/executors/celllocal.h"
#include "daemon/prefork/zygote.h"
#include "util/log.h"

/* ---- prefork: capd-exec --zygote ---- */

/*
 * Starts capd-exec in a new session, in the scratch dir, with fds 0..4 as
 * daemon/attempt/sup_int.h says and every signal back at its default disposition and
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

/* Takes the cell when its build has a zygote for this environment; the
 * rusage pipe is made here, so a failure is a set-up failure. */
static int prefork_prepare(struct sup *s, char *const *env, char *reason, size_t rlen)
{
    int rp[2];
    if (zyg_for_cell(s->run.build, s->run.spec, env, sup__loc(s)->zsock,
                     sizeof sup__loc(s)->zsock) != 0)
        return -ENOENT;
    if (pipe2(rp, O_CLOEXEC) != 0) {
        int rc = -errno;
        snprintf(reason, rlen, "cannot set up the cell's pipes/log: %s", strerror(errno));
        return rc;
    }
    fcntl(rp[0], F_SETFL, O_NONBLOCK);
    sup__loc(s)->rusage_fd = rp[0];
    sup__loc(s)->rusage_w = rp[1];
    return 0;
}

static int prefork_spawn(struct sup *s, const struct sup__start *st, pid_t *pid)
{
    struct launch_exec le = {
        .rusage_fd = 4,
        .zygote = sup__loc(s)->zsock,
        .cgroup = mem_cell_dir(s->mem),
    };
    struct launch_argv la;
    launch_cell_limits(s->cfg, s->run.spec, &le.lim);
    int rc = launch_exec_argv(s->cfg->exec_bin, &le, st->argv, &la);
    if (rc == 0)
        rc = spawn_child(s, la.argv, (char **)st->env, st->out_fd, st->frame_fd,
                         sup__loc(s)->rusage_w, pid);
    return rc;
}

/* ---- fresh exec: spawn_cell ---- */

static int fresh_spawn(struct sup *s, const struct sup__start *st, pid_t *pid)
{
    struct spawn_cell sc = {
        .path = st->python,
        .argv = st->argv,
        .envp = st->env,
        .cwd = s->scratch,
        .out_fd = st->out_fd,
        .frame_fd = st->frame_fd,
        .cgroup_fd = mem_cell_procs_fd(s->mem),
    };
    launch_cell_limits(s->cfg, s->run.spec, &sc.lim);
    return spawn_cell(&sc, pid);
}

/* ---- the choice ---- */

static const struct sup__backend prefork = {"prefork", prefork_prepare, prefork_spawn};
static const struct sup__backend fresh = {"fresh", NULL, fresh_spawn};

/* Asked in order; the last takes every cell. */
static const struct sup__backend *const backends[] = {&prefork, &fresh};

static int backend_pick(struct sup *s, char *const *env, char *reason, size_t rlen)
{
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++) {
        int rc = backends[i]->prepare ? backends[i]->prepare(s, env, reason, rlen) : 0;
        if (rc == -ENOENT)
            continue;
        if (rc == 0)
            sup__loc(s)->backend = backends[i];
        return rc;
    }
    return -ENOENT;
}

/* ---- the local executor ---- */

/* The cell's memory group with its limit: the job's memory_max_bytes
 * (validated against cell_memory_max_bytes when the job was accepted), or
 * cell_memory_max_bytes. */
static int memory_group(struct sup *s, char *reason, size_t rlen)
{
    int64_t want = s->run.opts.memory_max_bytes;
    uint64_t limit = want > 0 && (uint64_t)want < s->cfg->cell_memory_max_bytes
                         ? (uint64_t)want
                         : s->cfg->cell_memory_max_bytes;
    char name[96];
    snprintf(name, sizeof name, "%s-%d", s->run.cell_id, s->run.attempt);
    return mem_cell_new(name, limit, &s->mem, reason, rlen);
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
 * Starts the process through S's backend and watches it (daemon/executors/cellproc.c).
 * The read ends of the pipes go to the loop and the write ends are closed
 * here, whatever happens. A process that cannot join its memory group or
 * be watched is killed: it must not run unsupervised. On failure the cell
 * is finished as failed and S is freed once its handles have closed.
 */
static int start_process(struct sup *s, char *const *env, int fpipe[2], int lpipe[2])
{
    const char *python = json_string_value(json_object_get(s->run.build, "python"));
    char *prog[] = {(char *)python, "-m", "capd_runner", NULL};
    struct sup__start st = {
        .python = python, .argv = prog, .env = env, .out_fd = lpipe[1], .frame_fd = fpipe[1]};
    pid_t pid = 0;
    sup__proc_open(s, fpipe[0], lpipe[0]);
    fpipe[0] = lpipe[0] = -1;
    int rc = sup__loc(s)->backend->spawn(s, &st, &pid);
    if (rc == 0 && (rc = mem_cell_attach(s->mem, pid)) != 0)
        sup__kill_reap(pid);
    close(fpipe[1]);
    close(lpipe[1]);
    fpipe[1] = lpipe[1] = -1;
    if (sup__loc(s)->rusage_w >= 0)
        close(sup__loc(s)->rusage_w);
    sup__loc(s)->rusage_w = -1;
    if (rc == 0)
        rc = sup__proc_watch(s, pid);
    if (rc == 0) {
        sup__loc(s)->pid = pid;
        return 0;
    }
    char reason[1200];
    snprintf(reason, sizeof reason, "cannot spawn %s: %s", s->cfg->exec_bin, strerror(-rc));
    sup__store_setup_failure(s->st, &s->run, reason);
    s->finished = true;
    if (sup__loc(s)->rusage_fd >= 0)
        close(sup__loc(s)->rusage_fd);
    sup__loc(s)->rusage_fd = -1;
    close(s->log_fd);
    s->log_fd = -1;
    mem_cell_free(s->mem);
    s->mem = NULL;
    sup__proc_close(s);
    return rc;
}

/* The pipes and the rusage pipe, after a start that failed before the
 * process existed. */
static void close_fds(struct sup *s, int fpipe[2], int lpipe[2])
{
    for (int i = 0; i < 2; i++) {
        if (fpipe[i] >= 0)
            close(fpipe[i]);
        if (lpipe[i] >= 0)
            close(lpipe[i]);
    }
    struct sup__local *l = sup__loc(s);
    if (!l)
        return;
    if (l->rusage_fd >= 0)
        close(l->rusage_fd);
    if (l->rusage_w >= 0)
        close(l->rusage_w);
    l->rusage_fd = l->rusage_w = -1;
}

static int local_start(struct sup *s, char *const *env, const char *spec_path, char *reason,
                       size_t rlen)
{
    int fpipe[2] = {-1, -1}, lpipe[2] = {-1, -1};
    (void)spec_path; /* the environment names it */
    int rc = sup__local_new(s);
    if (rc == 0)
        rc = open_pipes(s, fpipe, lpipe, reason, rlen);
    if (rc == 0 && (rc = memory_group(s, reason, rlen)) == 0)
        rc = backend_pick(s, env, reason, rlen);
    if (rc) {
        close_fds(s, fpipe, lpipe);
        return rc;
    }
    if ((rc = start_process(s, env, fpipe, lpipe)) != 0)
        return rc; /* ended as failed: S goes with its handles */
    sup__proc_run(s, (uint64_t)s->run.opts.timeout_s * 1000);
    log_info("cell_started", "job=%s cell=%s attempt=%d pid=%d model=%s width=%s pass=%s",
             s->run.job_id, s->run.cell_id, s->run.attempt, sup__loc(s)->pid,
             log_q(json_string_value(json_object_get(s->run.spec, "model"))),
             json_string_value(json_object_get(s->run.spec, "width")),
             json_string_value(json_object_get(s->run.spec, "pass")));
    return 0;
}

static void local_close(struct sup *s)
{
    sup__close_handle(s, (uv_handle_t *)&sup__loc(s)->frames);
    sup__close_handle(s, (uv_handle_t *)&sup__loc(s)->logp);
}

const struct executor executor_local = {
    .name = "local",
    .on_host = true,
    .host_widths = true,
    .start = local_start,
    .stop = sup__local_stop,
    .close = local_close,
    .release = sup__local_release,
};
