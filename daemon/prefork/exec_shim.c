/*
 * daemon/prefork/exec_shim.c - capd-exec, the small program capd spawns for every
 * cell of a prefork build and for each zygote (a fresh-exec cell gets the
 * same treatment from daemon/child/spawn.c, without a second process). It
 * applies what posix_spawn cannot, then runs the runner:
 *
 *   capd-exec [--as BYTES] [--cpu SECONDS] [--nofile N] [--nproc N]
 *             [--unshare-net] [--rusage-fd FD] [--uid UID --gid GID]
 *             [--zygote SOCKET [--cgroup DIR]] -- PROGRAM ARGS...
 *
 * With --zygote the build's prefork zygote forks the cell instead (see
 * exec_zygote.h); the shim falls back to the fork+exec below when the
 * zygote cannot serve it. --cgroup names the cell's memory group
 * (daemon/host/memlimit.h): capd has moved the shim there, and the shim moves
 * the zygote's child, which is no descendant of it, once it knows its pid.
 *
 * capd has already put it in a new session (its own process group) with a
 * clean environment and the frame pipe on fd 3. The shim vforks once (the
 * child borrows the shim's memory until its exec, so no address space is
 * copied: on a paravirtualized host each page-table copy is the most
 * expensive step of starting a cell; the child therefore only makes system
 * calls and reports errors with say()): the child sets a parent-death signal, the rlimits, closes
 * every fd above 3, switches to UID/GID when asked (capd runs as root and run_as_user is set:
 * supplementary groups dropped, then gid, then uid), sets PR_SET_NO_NEW_PRIVS (always: no setuid
 * binary can raise a cell's privileges) and execs PROGRAM; the shim itself stays behind to collect
 * the child's resource usage with wait4() (libuv reaps without rusage), writes it to
 * --rusage-fd as "maxrss_kb utime_us stime_us\n", and then leaves exactly
 * as the child did: same exit code, or the same signal raised on itself,
 * so capd classifies the cell from the shim's own status.
 *
 * Exit codes of its own: 125 bad usage, 126 setup failed, 127 exec failed
 * (the child prints why on stderr, which lands in the cell log).
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/prefork/exec_zygote.h"
#include "util/child.h"

/* An error message on stderr without stdio, whose buffers the vfork child
 * shares with the shim. */
static void say(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 1)
        n = (int)sizeof line - 1;
    if (n > 0 && write(2, line, (size_t)n) < 0)
        return;
}

static void usage(void)
{
    fprintf(stderr, "usage: capd-exec [--as BYTES] [--cpu SECONDS] [--nofile N] [--nproc N] "
                    "[--unshare-net] [--rusage-fd FD] [--uid UID --gid GID] [--zygote SOCKET "
                    "[--cgroup DIR]] "
                    "-- PROGRAM ARGS...\n");
    exit(125);
}

static int parse_u64(const char *s, unsigned long long *v)
{
    char *end;
    errno = 0;
    *v = strtoull(s, &end, 10);
    return errno || end == s || *end ? -1 : 0;
}

/* Ends the child (exit 126) with the reason a credential change failed,
 * unless it stuck; the shim dying in between ends it too. */
static void become(uid_t uid, gid_t gid, pid_t shim)
{
    int err = 0;
    switch (util_child_become(uid, gid, shim, &err)) {
    case UTIL_CHILD_BECAME:
        return;
    case UTIL_CHILD_NOT_SWITCHED:
        say("capd-exec: cannot switch to uid %u gid %u: %s\n", (unsigned)uid, (unsigned)gid,
            strerror(err));
        break;
    case UTIL_CHILD_NOT_STUCK:
        say("capd-exec: uid %u gid %u did not stick\n", (unsigned)uid, (unsigned)gid);
        break;
    case UTIL_CHILD_ORPHANED:
        break;
    }
    _exit(126);
}

/* What the command line asks for; main() keeps it in static storage (see
 * there). */
struct shim_opts {
    struct util_child_rlimits rl;
    unsigned long long rfd, uid, gid;
    int unshare_net, have_rfd, have_uid, have_gid;
    const char *zygote, *cgroup;
    char **prog; /* PROGRAM ARGS..., NULL-terminated (argv's tail) */
};

/* Parses the options before "--" into O, and the program after it; any
 * mistake is a usage error (exit 125) before anything has changed. */
static void parse_args(int argc, char **argv, struct shim_opts *o)
{
    int i;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        unsigned long long *dst = NULL;
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        } else if (strcmp(a, "--unshare-net") == 0) {
            o->unshare_net = 1;
            continue;
        } else if (strcmp(a, "--zygote") == 0) {
            if (i + 1 >= argc)
                usage();
            o->zygote = argv[++i];
            continue;
        } else if (strcmp(a, "--cgroup") == 0) {
            if (i + 1 >= argc)
                usage();
            o->cgroup = argv[++i];
            continue;
        } else if (strcmp(a, "--as") == 0) {
            dst = &o->rl.as;
        } else if (strcmp(a, "--cpu") == 0) {
            dst = &o->rl.cpu;
        } else if (strcmp(a, "--nofile") == 0) {
            dst = &o->rl.nofile;
        } else if (strcmp(a, "--nproc") == 0) {
            dst = &o->rl.nproc;
        } else if (strcmp(a, "--rusage-fd") == 0) {
            dst = &o->rfd;
            o->have_rfd = 1;
        } else if (strcmp(a, "--uid") == 0) {
            dst = &o->uid;
            o->have_uid = 1;
        } else if (strcmp(a, "--gid") == 0) {
            dst = &o->gid;
            o->have_gid = 1;
        } else {
            usage();
        }
        if (i + 1 >= argc || parse_u64(argv[++i], dst) != 0)
            usage();
    }
    if (i >= argc || o->have_uid != o->have_gid || (o->have_uid && (o->uid == 0 || o->gid == 0)))
        usage();
    o->prog = &argv[i];
}

/* The vfork child: it borrows the shim's memory until its exec, so it only
 * makes system calls, reports with say() and never returns. It dies with
 * the shim, restores the signals the shim ignores, applies the limits,
 * drops privileges when asked and execs the program. */
_Noreturn static void child_exec(const struct shim_opts *o, pid_t shim)
{
    if (util_child_die_with(shim) != 0)
        _exit(126);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    const char *what = NULL;
    unsigned long long v = 0;
    int rc = util_child_rlimits(&o->rl, &what, &v);
    if (rc != 0) {
        say("capd-exec: setrlimit(%s, %llu): %s\n", what, v, strerror(-rc));
        _exit(126);
    }
    util_child_close_above_3();
    if (o->have_uid)
        become((uid_t)o->uid, (gid_t)o->gid, shim);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        say("capd-exec: PR_SET_NO_NEW_PRIVS: %s\n", strerror(errno));
        _exit(126);
    }
    execvp(o->prog[0], o->prog);
    say("capd-exec: cannot execute %s: %s\n", o->prog[0], strerror(errno));
    _exit(127);
}

/* Writes the child's resource usage to FD as "maxrss_kb utime_us
 * stime_us\n" (libuv reaps without rusage, so capd reads it here). */
static void report_rusage(int fd, const struct rusage *ru)
{
    char line[96];
    int n = snprintf(line, sizeof line, "%ld %lld %lld\n", ru->ru_maxrss,
                     (long long)ru->ru_utime.tv_sec * 1000000 + ru->ru_utime.tv_usec,
                     (long long)ru->ru_stime.tv_sec * 1000000 + ru->ru_stime.tv_usec);
    ssize_t w = write(fd, line, (size_t)n);
    (void)w;
    close(fd);
}

/* Leaves exactly as the child did, so capd classifies the cell from the
 * shim's own status: the same signal raised on itself (without a core
 * dump), or the same exit code. */
int shim_exit_like(int status)
{
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        struct rlimit zero = {0, 0};
        setrlimit(RLIMIT_CORE, &zero);
        signal(sig, SIG_DFL);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, sig);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        raise(sig);
        /* A signal whose default action is not to terminate. */
        return 128 + sig;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 126;
}

int main(int argc, char **argv)
{
    /* Static: the vfork child runs on this frame, so nothing the shim reads
     * after it may live in a register the child could clobber. */
    static struct shim_opts o;
    parse_args(argc, argv, &o);

    /* The shim dies with capd, and takes its child with it below. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1)
        _exit(126);
    if (o.unshare_net && unshare(CLONE_NEWNET) != 0)
        fprintf(stderr,
                "capd-exec: unshare(CLONE_NEWNET) not permitted (%s); continuing with the "
                "host network\n",
                strerror(errno));

    /* Prefork (docs/prefork.md): the build's zygote forks the cell and this
     * process stands in for it; it only comes back here to fall back to a
     * fresh exec, before anything was written to the frame pipe. */
    if (o.zygote) {
        struct zc_limits zl = {
            o.rl.as, o.rl.cpu, o.rl.nofile, o.rl.nproc, o.have_uid ? (long)o.uid : -1, o.cgroup};
        zygote_client_run(o.zygote, o.prog, &zl, o.have_rfd ? (int)o.rfd : -1);
    }

    /* capd signals the whole group; the shim only waits, so the child's own
     * reaction to SIGTERM decides the outcome. Ignored before the vfork, as
     * the shim is suspended until the child's exec; the child restores the
     * defaults (an ignored signal would stay ignored across exec). */
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    pid_t shim = getpid();
    pid_t pid = vfork();
    if (pid < 0) {
        fprintf(stderr, "capd-exec: vfork: %s\n", strerror(errno));
        return 126;
    }
    if (pid == 0)
        child_exec(&o, shim);

    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(pid, &status, 0, &ru) < 0) {
        if (errno != EINTR) {
            fprintf(stderr, "capd-exec: wait4: %s\n", strerror(errno));
            return 126;
        }
    }
    if (o.have_rfd)
        report_rusage((int)o.rfd, &ru);
    return shim_exit_like(status);
}
