/*
 * daemon/sup_int.h - what the files of one cell attempt and its executors
 * share and nobody else sees. Internal names carry the sup__ prefix. The
 * calls run one way, down this list: an executor reaches the attempt's
 * set-up only through its table row (daemon/executor.h), and the attempt
 * reaches an executor only through S->exec.
 *
 *   sup.c        the attempt's set-up (scratch dir, spec, environment)
 *                and public API: start, reattach, cancel, abandon
 *   executor.c   the table of executors
 *   cellslurm.c  executor "slurm": remote, its worker an sbatch job
 *                array task, its state polled and mapped
 *   cellremote.c executor "remote": no local process; remote_launch
 *                starts capd-cell, whose frames and log arrive through
 *                the API's spool files
 *   cellstart.c  executor "local": the pipes, the memory group and the
 *                start-up backends behind struct sup__backend: fresh
 *                exec (spawn_cell) and prefork (capd-exec --zygote)
 *   cellproc.c   the local process once started: the exit watch and
 *                reap, capd-exec's rusage pipe, the timeout
 *   cellend.c    the stream and the end, whatever the executor: frames
 *                into storage, the outcome (daemon/outcome.h), the finish
 *   cellbase.c   every attempt's pieces: the capped log, the handles
 *                whose last close frees it, the shared read buffer, the
 *                SIGTERM-then-SIGKILL sequence
 *
 * Whatever starts it, a local cell's process is a process group leader in a
 * new session, started in the scratch dir with:
 *   fd 0  /dev/null
 *   fd 1,2  one pipe, read by cellproc.c into the capped cell log
 *   fd 3  the frame pipe, parsed by sup.c and written to storage as it streams
 *   fd 4  (capd-exec only) the zygote child's pid and rusage
 * and its exit status is the cell's. Loop thread only.
 */
#ifndef CAPD_SUP_INT_H
#define CAPD_SUP_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "daemon/frame.h"
#include "daemon/memlimit.h"
#include "daemon/config.h"
#include "daemon/remote.h"
#include "storage/store.h"

struct executor;

/* Polls a deferred Slurm attempt waits for its job's final state. */
#define SUP__SLURM_DEFER_POLLS 10

/* The read buffer every cell shares (see sup__read_buffer). */
#define SUP__READ_BUF (1u << 20)

struct sup__backend;

struct sup {
    const struct executor *exec; /* where it runs: daemon/executor.h */
    uv_loop_t *loop;
    const struct capd_config *cfg;
    struct store *st;
    struct store_cell_run run;
    /* sup_done_cb and sup_next_cb (daemon/sup.h, which the executors'
     * files have no need of) */
    void (*done)(void *ud, struct sup *s);
    bool (*next_cb)(void *ud, struct sup *s, bool *skip_gpu);
    void *ud;
    struct store_cell_run next; /* claimed with the outcome, for DONE */

    /* Exit watch: a pidfd made readable by the exit, or SIGCHLD. */
    union {
        uv_poll_t poll;
        uv_signal_t sig;
    } exitw;
    int pidfd;
    bool by_sigchld;
    uv_pipe_t frames, logp;
    uv_timer_t timer;
    int handles_open;
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

    /* A remote attempt (cellremote.c): its spool table entry and the
     * handle the API wakes the loop with; no pid, pipes or exit watch. */
    struct remote_att *remote;
    uv_async_t wake;
    bool remote_running; /* the worker has started: the timeout runs */
    bool remote_oom;     /* its watchdog killed the runner for memory */
    /* executor "slurm" (cellslurm.c): the attempt's Slurm job and array
     * task (job 0 until sbatch answered), polls since it ended or left
     * Slurm's lists, the list of attempts with a job, and whether Slurm's
     * failure of the node asks for a new attempt. */
    struct store_slurm_job slurm;
    int slurm_gone_polls;
    /* The worker finished after a signal from outside (slurm_waits polls
     * so far): the outcome waits for the job's final state in Slurm. */
    bool slurm_deferred; /* at most SUP__SLURM_DEFER_POLLS polls, then the report */
    int slurm_waits;
    struct remote_exit deferred;
    struct sup *slurm_next;
    bool requeue;

    bool exited, frames_eof, log_eof, finished;
    bool timed_out, cancelled, abandoned, kill_sent;
    int64_t exit_status;
    int term_signal;
    uint64_t t0;
    int64_t peak_rss, cpu_us;
    struct mem_cell *mem; /* the cell's memory group (daemon/memlimit.h) */

    struct frame_parser *fp;
    char *fail_state; /* protocol_error or failed, set when capd ended it */
    char *fail_reason;
    int64_t rec_seq;
    uint64_t losses0; /* store_batch_losses() when the attempt started */
    char effective_width[32];

    int log_fd;
    uint64_t log_part_bytes, log_dropped;
    char *log_path;
    char scratch[1024];
    char *buf; /* sup__read_buffer(): shared by every cell, not owned */
};

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

/* ---- every attempt's pieces (cellbase.c) ---- */

/* The read buffer of every cell (SUP__READ_BUF bytes); NULL without memory. */
char *sup__read_buffer(void);

/* Opens LOG.part, the capped log's first part. 0 or -errno. */
int sup__log_open(struct sup *s);
/* Writes N bytes of the cell's output to the capped log. */
void sup__log_write(struct sup *s, const char *data, size_t n);
/* Closes the log and joins its parts into LOG (the tail kept). */
void sup__log_finish(struct sup *s);

/* Closes H; the last of S's handles to close frees S (after its
 * executor's release). */
void sup__close_handle(struct sup *s, uv_handle_t *h);
/* Frees S (once its last handle has closed). */
void sup__free(struct sup *s);

/* SIGTERM through the executor's stop, so a runner can flush; SIGKILL
 * after the grace period. */
void sup__terminate(struct sup *s);

/* ---- the local process (cellproc.c) ---- */

/* The local executor's stop: SIG to the cell's process group. */
void sup__local_stop(struct sup *s, int sig);
/* The local executor's release: the pidfd. */
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

/* ---- a remote attempt (cellremote.c) ---- */

/* Starts remote attempt S, whose spec is at SPEC_PATH and environment ENV:
 * its spool, its token, the launcher, the start timeout. 0, or -errno
 * with REASON (S is then the caller's to fail). */
int sup__remote_start(struct sup *s, char *const *env, const char *spec_path, char *reason,
                      size_t rlen);
/* sup_reattach's remote side: the spool reopened, the Slurm job SLURM
 * (job 0: none) polled again, the timeout restarted. */
int sup__remote_reattach(struct sup *s, char *const *env, const char *spec_path,
                         struct store_slurm_job slurm, char *reason, size_t rlen);
/* Ends a deferred attempt with the worker's report, after Slurm's state
 * (applied by the caller) or the wait for it. */
void sup__remote_conclude(struct sup *s);
/* Tells the worker the attempt is over. */
void sup__remote_stop(struct sup *s);
/* The remote executors' stop: sup__remote_stop, whatever SIG. */
void sup__remote_kill(struct sup *s, int sig);
/* Unregisters the attempt and closes its handles (finish_tail's side). */
void sup__remote_close(struct sup *s);

/* ---- the stream and the end (cellend.c) ---- */

/* The frame pipe's read callback, and its two halves, which a remote
 * attempt's spool is read into: N bytes of the stream, and its end. */
void sup__frames_read(uv_stream_t *h, ssize_t n, const uv_buf_t *b);
void sup__frames_bytes(struct sup *s, const char *data, size_t n);
void sup__frames_end(struct sup *s);
/* S's frame parser, which stores what it parses, with the configured
 * limits. 0 or -errno. */
int sup__parser_new(struct sup *s);
/* Ends the attempt once the process has exited and both pipes are done. */
void sup__finish(struct sup *s);
/* Stores RUN as failed with REASON: its set-up failed before any process. */
int sup__store_setup_failure(struct store *st, struct store_cell_run *run, const char *reason);

#endif
