/*
 * util/child.c - the system calls a child makes before its exec (see
 * child.h).
 */
#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "util/child.h"

/* Sets one limit; keeps a hard limit that is already lower than V
 * (lowering a limit cannot fail otherwise). */
UTIL_CHILD static int set_limit(int res, unsigned long long v)
{
    struct rlimit rl = {.rlim_cur = v, .rlim_max = v};
    if (setrlimit(res, &rl) == 0)
        return 0;
    int e = errno;
    struct rlimit cur;
    if (getrlimit(res, &cur) == 0 && cur.rlim_max < v)
        return 0;
    return -e;
}

UTIL_CHILD int util_child_rlimits(const struct util_child_rlimits *l, const char **what,
                                  unsigned long long *value)
{
    const struct {
        int res;
        unsigned long long v;
        const char *name;
    } steps[] = {{RLIMIT_CORE, 0, "core"},
                 {RLIMIT_AS, l->as, "as"},
                 {RLIMIT_CPU, l->cpu, "cpu"},
                 {RLIMIT_NOFILE, l->nofile, "nofile"},
                 {RLIMIT_NPROC, l->nproc, "nproc"}};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        if (i > 0 && steps[i].v == 0)
            continue;
        int rc = set_limit(steps[i].res, steps[i].v);
        if (rc != 0) {
            *what = steps[i].name;
            *value = steps[i].v;
            return rc;
        }
    }
    return 0;
}

UTIL_CHILD int util_child_die_with(pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    return getppid() == parent ? 0 : -ESRCH;
}

UTIL_CHILD void util_child_close_above_3(void)
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

UTIL_CHILD enum util_child_become util_child_become(uid_t uid, gid_t gid, pid_t parent, int *err)
{
    if (syscall(SYS_setgroups, 0, NULL) != 0 || syscall(SYS_setresgid, gid, gid, gid) != 0 ||
        syscall(SYS_setresuid, uid, uid, uid) != 0) {
        *err = errno;
        return UTIL_CHILD_NOT_SWITCHED;
    }
    if (getuid() != uid || geteuid() != uid || getgid() != gid || getegid() != gid ||
        syscall(SYS_setuid, 0) == 0)
        return UTIL_CHILD_NOT_STUCK;
    return util_child_die_with(parent) == 0 ? UTIL_CHILD_BECAME : UTIL_CHILD_ORPHANED;
}
