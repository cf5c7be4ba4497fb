/*
 * daemon/executors/celllocal.h - the local executor's own state and functions,
 * shared by cellstart.c (its start: pipes, memory group, start-up
 * backends) and cellproc.c (the process once started), and seen by no
 * other file: the attempt (daemon/attempt/sup_int.h) holds it as S->ex.
 *
 * Whatever starts it, the cell's process is a process group leader in a
 * new session, started in the scratch dir with:
 *   fd 0  /dev/null
 *   fd 1,2  one pipe, read by cellproc.c into the capped cell log
 *   fd 3  the frame pipe, parsed by cellend.c and written to storage as it
 *         streams
 *   fd 4  (capd-exec only) the zygote child's pid and rusage
 * and its exit status is the cell's. Loop thread only.
 */
#ifndef CAPD_CELLLOCAL_H
#define CAPD_CELLLOCAL_H

#include "daemon/attempt/sup_int.h"

struct sup__backend;

struct sup__local {
    /* Exit watch: a pidfd made readable by the exit, or SIGCHLD. */
    union {
        uv_poll_t poll;
        uv_signal_t sig;
    } exitw;
    int pidfd;
    bool by_sigchld;
    uv_pipe_t frames, logp;
    /* capd-exec's rusage pipe (prefork): "pid N" once it knows the zygote's
     * child, its rusage at the end; watched until the pid is in. RUSAGE_W
     * is its write end, held by the backend until the spawn. */
    int rusage_fd, rusage_w;
    uv_poll_t rpoll;
    bool rpoll_on, adopted;
    char rbuf[160];
    size_t rlen;
    pid_t pid;

    /* The start-up backend and what it keeps between prepare and spawn. */
    const struct sup__backend *backend;
    char zsock[128]; /* prefork: the zygote's socket */
};

/* S's local state (S->ex). */
static inline struct sup__local *sup__loc(const struct sup *s)
{
    return (struct sup__local *)s->ex;
}

/* ---- start-up backends (cellstart.c) ---- */

/* What every backend is given to start the cell's process. */
struct sup__start {
    const char *python;
    char *const *argv; /* PYTHON -m capd_runner */
    char *const *env;
    int out_fd;   /* the log pipe's write end: becomes 1 and 2 */
    int frame_fd; /* the frame pipe's write end: becomes 3 */
};

/*
 * How a cell's process comes to be. Every backend produces the same thing
 * (see the top of this file), so everything after the start is shared; a
 * new way to start cells is one more of these in cellstart.c's table.
 */
struct sup__backend {
    const char *name;
    /* Whether it takes the cell, once its environment ENV and memory group
     * exist: 0 yes, -ENOENT no (the next backend is asked), another -errno
     * a set-up failure that REASON explains. */
    int (*prepare)(struct sup *s, char *const *env, char *reason, size_t rlen);
    /* Starts the process; its pid in *PID. 0 or -errno. */
    int (*spawn)(struct sup *s, const struct sup__start *st, pid_t *pid);
};

/* ---- the local process (cellproc.c) ---- */

/* The local executor's stop: SIG to the cell's process group. */
void sup__local_stop(struct sup *s, int sig);
/* S's local state, in S->ex. 0 or -ENOMEM. */
int sup__local_new(struct sup *s);
/* The local executor's release: its state and the pidfd. */
void sup__local_release(struct sup *s);

/* Takes the read ends of the frame and log pipes into the loop and makes
 * the timer; without pidfds also starts the SIGCHLD watch, which must be
 * in place before the child can exit. */
void sup__proc_open(struct sup *s, int frames_fd, int log_fd);
/* Watches PID's exit (its pidfd, unless SIGCHLD does); a process that
 * cannot be watched is killed and reaped. 0 or -errno. */
int sup__proc_watch(struct sup *s, pid_t pid);
/* Closes what sup__proc_open made, after a start that failed. */
void sup__proc_close(struct sup *s);
/* Starts reading the pipes (frames to sup__frames_read) and the rusage
 * pipe, and the timeout of TIMEOUT_MS. */
void sup__proc_run(struct sup *s, uint64_t timeout_ms);

/* SIGKILL to PID's group and its reap, for a process that must not run
 * unsupervised. */
void sup__kill_reap(pid_t pid);

#endif
