/*
 * daemon/child/spawn.c - a fresh-exec cell started from the loop thread in one
 * step (daemon/child/spawn.h).
 *
 * Until this module, every cell was capd-exec started by posix_spawn, and
 * capd-exec vforked the runner: two processes and two execs per cell. On
 * the paravirtualized hosts capd runs on, an exec (new page tables, the
 * ELF mapping, libc's start-up with its trapping CPUID probes) costs
 * milliseconds, and the shim's was as expensive as the runner's own: it
 * was most of what capd added to a short cell. The child here does the
 * shim's work itself, between the clone and the exec of the runner.
 *
 * The child shares capd's memory (CLONE_VM) while capd's loop thread is
 * suspended (CLONE_VFORK) and the other threads keep running, so it only
 * makes system calls: no malloc, no stdio, no locks, and credentials are
 * changed with raw system calls, because glibc's setresuid() would ask
 * every capd thread to change its credentials too. Every signal is blocked
 * across the clone, so no handler of capd's can run on the child's stack;
 * the child puts every disposition back to its default (an ignored signal
 * would stay ignored across exec) and unblocks them right before its exec.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "daemon/child/spawn.h"
#include "util/child.h"

/* The child's stack: it makes system calls and formats error messages
 * without stdio, so a small one is plenty; a guard page below it. */
#define SPAWN_STACK (128u * 1024u)

struct child_args {
    const struct spawn_cell *c;
    pid_t parent;
    int out_fd, frame_fd;
};

/* Writes the pieces of an error message to the child's stderr (the cell
 * log), then the errno's text: no stdio in the child. */
UTIL_CHILD static void say(const char *a, const char *b, int err)
{
    const char *parts[5] = {"capd: ", a, b ? b : "", err ? ": " : "",
                            err ? strerrordesc_np(err) : ""};
    for (int i = 0; i < 5; i++) {
        size_t n = parts[i] ? strlen(parts[i]) : 0;
        if (n && write(2, parts[i], n) < 0)
            return;
    }
    if (write(2, "\n", 1) < 0)
        return;
}

/* Ends the child (exit 126) with the reason a credential change failed,
 * unless it stuck. */
UTIL_CHILD static void become(uid_t uid, gid_t gid, pid_t parent)
{
    int err = 0;
    switch (util_child_become(uid, gid, parent, &err)) {
    case UTIL_CHILD_BECAME:
        return;
    case UTIL_CHILD_NOT_SWITCHED:
        say("cannot switch to run_as_user", NULL, err);
        break;
    case UTIL_CHILD_NOT_STUCK:
        say("run_as_user's uid/gid did not stick", NULL, 0);
        break;
    case UTIL_CHILD_ORPHANED:
        break;
    }
    _exit(126);
}

UTIL_CHILD static int child_main(void *arg)
{
    const struct child_args *a = arg;
    const struct spawn_cell *c = a->c;
    /* The kernel's struct sigaction, all zero: SIG_DFL, no flags. */
    struct {
        void *handler;
        unsigned long flags;
        void *restorer;
        uint64_t mask;
    } dfl = {0};
    for (int sig = 1; sig < _NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP)
            syscall(SYS_rt_sigaction, sig, &dfl, NULL, sizeof dfl.mask);
    /* Dies with capd (the loop thread that cloned it). */
    if (util_child_die_with(a->parent) != 0)
        _exit(126);
    if (setsid() < 0)
        _exit(126);
    /* Into the cell's memory group before it can allocate anything of its
     * own (the exec's new address space is charged to the group). */
    if (c->cgroup_fd > 0 && write(c->cgroup_fd, "0", 1) != 1) {
        say("cannot enter the cell's cgroup", NULL, errno);
        _exit(126);
    }
    int null = open("/dev/null", O_RDONLY);
    if (null < 0 || (null != 0 && (dup2(null, 0) < 0 || close(null) != 0)) ||
        dup2(a->out_fd, 1) < 0 || dup2(a->out_fd, 2) < 0 || dup2(a->frame_fd, 3) < 0)
        _exit(126);
    if (chdir(c->cwd) != 0) {
        say("cannot enter the scratch dir ", c->cwd, errno);
        _exit(126);
    }
    if (c->lim.unshare_net && unshare(CLONE_NEWNET) != 0)
        say("unshare(CLONE_NEWNET) not permitted; continuing with the host network", NULL, errno);
    const char *what = NULL;
    unsigned long long v = 0;
    int rc = util_child_rlimits(&c->lim.rl, &what, &v);
    if (rc != 0) {
        say("cannot set the rlimit ", what, -rc);
        _exit(126);
    }
    /* Every fd of capd is O_CLOEXEC already; this also covers any that a
     * library opened without it. */
    util_child_close_above_3();
    if (c->lim.uid >= 0)
        become((uid_t)c->lim.uid, (gid_t)c->lim.gid, a->parent);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        say("PR_SET_NO_NEW_PRIVS", NULL, errno);
        _exit(126);
    }
    uint64_t none = 0;
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, sizeof none);
    execve(c->path, c->argv, c->envp);
    say("cannot execute ", c->path, errno);
    _exit(127);
}

/* The child's stack, mapped once (only the loop thread spawns cells). */
static char *child_stack(void)
{
    static char *stack;
    if (!stack) {
        long page = sysconf(_SC_PAGESIZE);
        char *p = mmap(NULL, SPAWN_STACK + (size_t)page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
        if (mprotect(p, (size_t)page, PROT_NONE) != 0) {
            munmap(p, SPAWN_STACK + (size_t)page);
            return NULL;
        }
        stack = p + page;
    }
    return stack;
}

int spawn_cell(const struct spawn_cell *c, pid_t *pid)
{
    int rc, tmp[2] = {-1, -1};
    struct child_args a = {
        .c = c, .parent = getpid(), .out_fd = c->out_fd, .frame_fd = c->frame_fd};
    /* dup2 onto 1..3 must not overwrite a source still to be copied, and
     * a source already at its target would keep O_CLOEXEC: both move up. */
    int *src[2] = {&a.out_fd, &a.frame_fd};
    for (int i = 0; i < 2; i++) {
        if (*src[i] <= 4) {
            if ((tmp[i] = fcntl(*src[i], F_DUPFD_CLOEXEC, 5)) < 0) {
                rc = -errno;
                goto out;
            }
            *src[i] = tmp[i];
        }
    }
    char *stack = child_stack();
    if (!stack) {
        rc = -ENOMEM;
        goto out;
    }
    uint64_t all = ~(uint64_t)0, old = 0;
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, &old, sizeof all);
    /* Returns once the child has exec'd or exited. */
    pid_t p = clone(child_main, stack + SPAWN_STACK, CLONE_VM | CLONE_VFORK | SIGCHLD, &a);
    int e = errno;
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, sizeof old);
    if (p < 0) {
        rc = -e;
        goto out;
    }
    *pid = p;
    rc = 0;
out:
    for (int i = 0; i < 2; i++)
        if (tmp[i] >= 0)
            close(tmp[i]);
    return rc;
}
