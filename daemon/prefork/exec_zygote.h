/*
 * daemon/prefork/exec_zygote.h - capd-exec's prefork mode (docs/prefork.md).
 *
 * With --zygote PATH, capd-exec does not fork the runner itself: it hands
 * the cell (its fds 0-3, environment, working directory, rlimits) to the
 * build's zygote listening on PATH, which forks a child that becomes the
 * cell. capd-exec then stands in for that child exactly as it does for a
 * fresh one: it forwards SIGTERM/SIGINT to the child's group, writes
 * "pid N\n" (the child, whose group is the cell) to --rusage-fd as soon as
 * it knows it and the child's rusage after it, and leaves with the child's exit status (or
 * raises its signal). If capd-exec is killed, the zygote sees the
 * connection close and SIGKILLs the child's group.
 */
#ifndef CAPD_EXEC_ZYGOTE_H
#define CAPD_EXEC_ZYGOTE_H

struct zc_limits {
    unsigned long long as, cpu, nofile, nproc;
    long uid;           /* -1: the cell keeps the zygote's user */
    const char *cgroup; /* the cell's cgroup directory, or NULL */
};

/*
 * Runs the cell through the zygote at PATH. ARGV is the runner command
 * line capd-exec would exec (the zygote checks it is its own interpreter
 * with "-m capd_runner"). Never returns once the zygote has forked the
 * cell. Returns (after saying why on stderr, i.e. in the cell log) when the
 * cell must be started by fresh exec instead: no zygote, or it refused the
 * cell. Nothing has been written to the frame pipe then.
 */
void zygote_client_run(const char *path, char *const argv[], const struct zc_limits *lim,
                       int rusage_fd);

/* Leaves exactly as a cell that ended with wait status STATUS did: the
 * same signal raised on capd-exec itself (no core file), else its exit
 * code, which it returns for the caller's _exit (exec_shim.c). */
int shim_exit_like(int status);

#endif
