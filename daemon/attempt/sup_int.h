/*
 * daemon/attempt/sup_int.h - what the files of one cell attempt and its executors
 * share and nobody else sees. Internal names carry the sup__ prefix. The
 * calls run one way, down this list: an executor reaches the attempt's
 * set-up only through its table row (daemon/config/executor.h), and the attempt
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
 *                into storage, the outcome (daemon/attempt/outcome.h), the finish
 *   cellbase.c   every attempt's pieces: the capped log, the handles
 *                whose last close frees it, the shared read buffer, the
 *                SIGTERM-then-SIGKILL sequence
 *
 * Each executor's own state is S->ex, behind its own header:
 * daemon/executors/celllocal.h (the local process, its pipes and exit watch) and
 * daemon/executors/cellremote.h (the spool, the worker, the launcher's state).
 * Loop thread only.
 */
#ifndef CAPD_SUP_INT_H
#define CAPD_SUP_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "daemon/frame/frame.h"
#include "daemon/host/memlimit.h"
#include "daemon/config/config.h"
#include "storage/store.h"
#include "util/cellstate.h"

struct executor;

/* The read buffer every cell shares (see sup__read_buffer). */
#define SUP__READ_BUF (1u << 20)

struct sup {
    const struct executor *exec; /* where it runs: daemon/config/executor.h */
    uv_loop_t *loop;
    const struct capd_config *cfg;
    struct store *st;
    struct store_cell_run run;
    /* sup_done_cb and sup_next_cb (daemon/attempt/sup.h, which the executors'
     * files have no need of) */
    void (*done)(void *ud, struct sup *s);
    bool (*next_cb)(void *ud, struct sup *s, int64_t *gpu_seq);
    void *ud;
    struct store_cell_run next; /* claimed with the outcome, for DONE */

    /* What its executor keeps (daemon/config/executor.h): struct sup__local
     * (celllocal.h) or struct sup__remote (cellremote.h); its release
     * frees it. */
    void *ex;
    uv_timer_t timer; /* the executor's timeout, then the store retry */
    int handles_open;
    bool worker_oom; /* a remote worker's watchdog killed the runner */
    bool requeue;    /* the executor asks a new attempt (a failed node) */
    /* Why its GPU failed under it (outcome.h, device_error): "" when it
     * did not; the scheduler takes the device out of the pool. */
    char device_failed[512];

    bool exited, frames_eof, log_eof, finished;
    bool timed_out, cancelled, abandoned, kill_sent;
    int64_t exit_status;
    int term_signal;
    uint64_t t0;
    int64_t peak_rss, cpu_us;
    struct mem_cell *mem; /* the cell's memory group (daemon/host/memlimit.h) */

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

/* ---- every attempt's pieces (cellbase.c) ---- */

/* The read buffer of every cell (SUP__READ_BUF bytes); NULL without memory. */
char *sup__read_buffer(void);

/* Opens LOG.part, the capped log's first part. 0 or -errno. */
int sup__log_open(struct sup *s);
/* Writes N bytes of the cell's output to the capped log. */
void sup__log_write(struct sup *s, const char *data, size_t n);
/* Closes the log and joins its parts into LOG (the tail kept). */
void sup__log_finish(struct sup *s);

/* Closes H; the last of S's handles to close frees S. */
void sup__close_handle(struct sup *s, uv_handle_t *h);
/* Frees S (once its last handle has closed), its executor's state
 * first (its release). */
void sup__free(struct sup *s);

/* capd ends the attempt as STATE (failed, protocol_error) for REASON;
 * the first such decision wins. */
void sup__fail(struct sup *s, enum cell_state state, const char *reason);

/* SIGTERM through the executor's stop, so a runner can flush; SIGKILL
 * after the grace period. */
void sup__terminate(struct sup *s);

/* ---- the stream and the end (cellend.c) ---- */

/* What a read callback of one of S's pipes (H->data is S) does with its
 * N and B: N > 0 bytes go to BYTES; at the pipe's end (EOF or an error)
 * reading stops, END marks the pipe done, and the attempt ends if it was
 * the last thing waited for (sup__finish). */
void sup__pipe_read(uv_stream_t *h, ssize_t n, const uv_buf_t *b,
                    void (*bytes)(struct sup *s, const char *data, size_t n),
                    void (*end)(struct sup *s));
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
