/*
 * util/child.h - the steps a child takes between its clone (or vfork) and
 * the exec of a cell's program, shared by capd-exec (daemon/prefork/exec_shim.c)
 * and capd's one-step spawn (daemon/child/spawn.c), so that a cell gets the same
 * rlimits, parent-death signal, descriptors and credentials whichever
 * started it.
 *
 * The child borrows its parent's memory until its exec, so every function
 * here only makes system calls: no malloc, no stdio, no locks, and
 * credentials change through raw system calls (glibc's setresuid() would
 * ask every thread of a threaded parent to change its credentials too).
 * None reports an error itself: each returns what went wrong, and the
 * caller says it in its own words on the cell log and exits 126.
 * UTIL_CHILD marks a function that runs in such a child; the sanitizers
 * leave it alone, as it runs on a stack they do not know.
 *
 * Conventions: 0 or -errno, an enum where there are more outcomes.
 */
#ifndef CAPD_UTIL_CHILD_H
#define CAPD_UTIL_CHILD_H

#include <sys/types.h>

#if defined(__has_attribute)
#if __has_attribute(no_sanitize)
#define UTIL_CHILD __attribute__((no_sanitize("address", "undefined")))
#endif
#endif
#ifndef UTIL_CHILD
#define UTIL_CHILD
#endif

/* A cell's rlimits, each set as both its soft and hard limit. */
struct util_child_rlimits {
    unsigned long long as, cpu, nofile, nproc; /* 0: leave it as it is */
};

/*
 * Sets RLIMIT_CORE to 0 (a cell never dumps core), then each nonzero limit
 * of L. A hard limit already lower than asked is kept rather than fail the
 * cell. On failure returns -errno with *WHAT naming the limit ("core",
 * "as", "cpu", "nofile" or "nproc") and *VALUE the value asked.
 */
int util_child_rlimits(const struct util_child_rlimits *l, const char **what,
                       unsigned long long *value);

/* Sets the parent-death signal (SIGKILL) and checks that PARENT is still
 * the parent: -ESRCH when it died before the signal was armed. */
int util_child_die_with(pid_t parent);

/* Closes every descriptor above 3 (close_range where the kernel has it,
 * else one by one up to the descriptor limit: opendir would allocate), so
 * nothing the parent had open leaks into the cell. */
void util_child_close_above_3(void);

enum util_child_become {
    UTIL_CHILD_BECAME,       /* UID/GID for good */
    UTIL_CHILD_NOT_SWITCHED, /* a system call refused; *ERR says why */
    UTIL_CHILD_NOT_STUCK,    /* the ids differ, or uid 0 can be regained */
    UTIL_CHILD_ORPHANED,     /* PARENT died meanwhile */
};

/*
 * Becomes UID/GID for good: no supplementary groups, then the gid (while
 * still allowed to), then the uid; checks that they stuck and that uid 0
 * cannot be regained. A credential change clears the parent-death signal,
 * so it is armed again for PARENT (util_child_die_with). Anything but
 * UTIL_CHILD_BECAME must end the cell rather than run it as root.
 */
enum util_child_become util_child_become(uid_t uid, gid_t gid, pid_t parent, int *err);

#endif
