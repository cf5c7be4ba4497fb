/*
 * daemon/child/spawn.h - starting a fresh-exec cell straight from the daemon loop:
 * one process, one exec. The child borrows capd's memory until its exec
 * (CLONE_VM | CLONE_VFORK, like glibc's posix_spawn) and on the way applies
 * what capd-exec applies to a cell (daemon/prefork/exec_shim.c): a new session, the
 * parent-death signal, the rlimits, no core files, the optional network
 * namespace, its cgroup, every fd above 3 closed, run_as_user, PR_SET_NO_NEW_PRIVS,
 * every signal at its default and unblocked. capd-exec starts prefork cells
 * (daemon/prefork/exec_zygote.c); a fresh cell does without it, so it pays for no
 * second process and exec.
 */
#ifndef CAPD_SPAWN_H
#define CAPD_SPAWN_H

#include <sys/types.h>

#include "daemon/child/launch.h"

struct spawn_cell {
    const char *path; /* the program, an absolute or relative path (no PATH search) */
    char *const *argv;
    char *const *envp;
    const char *cwd;
    int out_fd;   /* becomes 1 and 2 */
    int frame_fd; /* becomes 3 */
    /* The rlimits (RLIMIT_CORE is always 0), the network namespace and
     * the user, as launch_cell_limits() makes them. */
    struct launch_limits lim;
    /* An fd of the cell's cgroup.procs (daemon/host/memlimit.h), written "0"
     * before anything else so all the cell's memory is charged there; -1
     * (or 0, never a cgroup fd) for none. */
    int cgroup_fd;
};

/*
 * Starts the cell's process and returns its pid in *PID (0 or -errno). It
 * is its own session and process group leader. A failure after the clone
 * (a limit that cannot be set, credentials that do not stick, an exec that
 * fails) is reported on the child's stderr (the cell log) and ends it with
 * exit code 126 (setup) or 127 (exec), as capd-exec did. Loop thread only:
 * the child runs on one stack allocated once.
 */
int spawn_cell(const struct spawn_cell *c, pid_t *pid);

#endif
