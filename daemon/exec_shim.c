/*
 * daemon/exec_shim.c - capd-exec, the small program capd spawns for every
 * cell of a prefork build and for each zygote (a fresh-exec cell gets the
 * same treatment from daemon/spawn.c, without a second process). It
 * applies what posix_spawn cannot, then runs the runner:
 *
 *   capd-exec [--as BYTES] [--cpu SECONDS] [--nofile N] [--nproc N]
 *             [--unshare-net] [--rusage-fd FD] [--uid UID --gid GID]
 *             [--zygote SOCKET [--cgroup DIR]] -- PROGRAM ARGS...
 *
 * With --zygote the build's prefork zygote forks the cell instead (see
 * exec_zygote.h); the shim falls back to the fork+exec below when the
 * zygote cannot serve it. --cgroup names the cell's memory group
 * (daemon/memlimit.h): capd has moved the shim there, and the shim moves
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
#include <sys/syscall.h>
#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/exec_zygote.h"

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

static void set_limit(int res, unsigned long long v, const char *what)
{
    struct rlimit rl = {.rlim_cur = v, .rlim_max = v};
    if (setrlimit(res, &rl) != 0) {
        /* Lowering a limit cannot fail unless the hard limit is already
         * lower; then keep the lower one rather than fail the cell. */
        struct rlimit cur;
        if (getrlimit(res, &cur) == 0 && cur.rlim_max < v)
            return;
        say("capd-exec: setrlimit(%s, %llu): %s\n", what, v, strerror(errno));
        _exit(126);
    }
}

/* Closes every descriptor above 3 (close_range where the kernel has it,
 * else one by one up to the descriptor limit: opendir would allocate, which
 * the vfork child must not), so nothing capd had open leaks in. */
static void close_stray_fds(void)
{
#ifdef SYS_close_range
    if (syscall(SYS_close_range, 4U, ~0U, 0U) == 0)
        return;
#endif
    struct rlimit rl;
    long max = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                   ? (long)rl.rlim_cur
                   : 65536;
    for (long fd = 4; fd < max; fd++)
        close((int)fd);
}

/*
 * Becomes UID/GID for good: no supplementary groups, then the gid (while
 * still allowed to), then the uid. Any failure ends the cell rather than
 * run it as root. Changing credentials clears the parent-death signal, so
 * it is set again, and the parent is checked again in case the shim died
 * in between.
 */
static void drop_privileges(uid_t uid, gid_t gid, pid_t shim)
{
    if (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0) {
        say("capd-exec: cannot switch to uid %u gid %u: %s\n", (unsigned)uid, (unsigned)gid,
            strerror(errno));
        _exit(126);
    }
    if (getuid() != uid || geteuid() != uid || getgid() != gid || getegid() != gid ||
        setuid(0) == 0) {
        say("capd-exec: uid %u gid %u did not stick\n", (unsigned)uid, (unsigned)gid);
        _exit(126);
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != shim)
        _exit(126);
}

/* What the command line asks for; main() keeps it in static storage (see
 * there). */
struct shim_opts {
    unsigned long long as, cpu, nofile, nproc, rfd, uid, gid;
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
            dst = &o->as;
        } else if (strcmp(a, "--cpu") == 0) {
            dst = &o->cpu;
        } else if (strcmp(a, "--nofile") == 0) {
            dst = &o->nofile;
        } else if (strcmp(a, "--nproc") == 0) {
            dst = &o->nproc;
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
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != shim)
        _exit(126);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    set_limit(RLIMIT_CORE, 0, "core");
    if (o->as)
        set_limit(RLIMIT_AS, o->as, "as");
    if (o->cpu)
        set_limit(RLIMIT_CPU, o->cpu, "cpu");
    if (o->nofile)
        set_limit(RLIMIT_NOFILE, o->nofile, "nofile");
    if (o->nproc)
        set_limit(RLIMIT_NPROC, o->nproc, "nproc");
    close_stray_fds();
    if (o->have_uid)
        drop_privileges((uid_t)o->uid, (gid_t)o->gid, shim);
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
        struct zc_limits zl = {o.as,    o.cpu, o.nofile, o.nproc, o.have_uid ? (long)o.uid : -1,
                               o.cgroup};
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
