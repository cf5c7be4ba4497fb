/*
 * daemon/cellstart.c - the start-up backends of a cell (struct
 * sup__backend, daemon/sup_int.h): how the cell's process comes to be.
 * Each produces the same process (a session leader in the scratch dir,
 * fds as sup_int.h says, the cell's exit status as its own), so the rest
 * of the attempt does not know which one ran. The table at the end is the
 * one place that chooses; a new backend is one more entry.
 *
 *   prefork  a build registered with "prefork": capd-exec --zygote SOCKET
 *            (posix_spawn), which hands the cell to the build's zygote
 *            (daemon/zygote.h) and stands in for the forked child: its
 *            signals, its exit status, its pid and rusage on fd 4.
 *   fresh    everything else: spawn_cell (daemon/spawn.h), one clone and
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
#include <string.h>
#include <unistd.h>

#include "daemon/launch.h"
#include "daemon/spawn.h"
#include "daemon/sup_int.h"
#include "daemon/zygote.h"

/* ---- prefork: capd-exec --zygote ---- */

/*
 * Starts capd-exec in a new session, in the scratch dir, with fds 0..4 as
 * daemon/sup_int.h says and every signal back at its default disposition and
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
    if (zyg_for_cell(s->run.build, s->run.spec, env, s->zsock, sizeof s->zsock) != 0)
        return -ENOENT;
    if (pipe2(rp, O_CLOEXEC) != 0) {
        int rc = -errno;
        snprintf(reason, rlen, "cannot set up the cell's pipes/log: %s", strerror(errno));
        return rc;
    }
    fcntl(rp[0], F_SETFL, O_NONBLOCK);
    s->rusage_fd = rp[0];
    s->rusage_w = rp[1];
    return 0;
}

static int prefork_spawn(struct sup *s, const struct sup__start *st, pid_t *pid)
{
    struct launch_exec le = {
        .rusage_fd = 4,
        .zygote = s->zsock,
        .cgroup = mem_cell_dir(s->mem),
    };
    struct launch_argv la;
    launch_cell_limits(s->cfg, s->run.spec, &le.lim);
    int rc = launch_exec_argv(s->cfg->exec_bin, &le, st->argv, &la);
    if (rc == 0)
        rc = spawn_child(s, la.argv, (char **)st->env, st->out_fd, st->frame_fd, s->rusage_w, pid);
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

int sup__backend_pick(struct sup *s, char *const *env, char *reason, size_t rlen)
{
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++) {
        int rc = backends[i]->prepare ? backends[i]->prepare(s, env, reason, rlen) : 0;
        if (rc == -ENOENT)
            continue;
        if (rc == 0)
            s->backend = backends[i];
        return rc;
    }
    return -ENOENT;
}
