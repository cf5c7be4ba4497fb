/*
 * daemon/executors/remote.h - remote attempts: a cell attempt whose process runs away
 * from capd's host (executor "remote", docs/scale.md "Remote attempts").
 *
 * capd makes the attempt as for a local cell (scratch dir, spec, the cell's
 * environment), mints its token (storage: store_attempt_token_create), and
 * runs remote_launch, which starts capd-cell somewhere; capd-cell fetches
 * the spec and streams the runner's frames and log back through the
 * /v1/attempts endpoints (api/api_attempts.c). The two sides meet here:
 *
 *   the API (any HTTP thread) appends each stream's bytes at the offset the
 *     worker names to a spool file of the attempt, idempotent by offset (a
 *     retried chunk duplicates nothing, a gap is refused), and wakes the
 *     loop;
 *   the loop (daemon/attempt/sup.c) reads each spool from where it stopped into the
 *     frame parser and the capped log, exactly as it reads a local cell's
 *     pipes, and ends the attempt when the worker has finished (or capd
 *     stops it: timeout, cancel, a protocol error), after which the API
 *     answers 410.
 *
 * One mutex guards the table of attempts and one each attempt, so uploads
 * of different attempts are written at once. A finish is kept in the
 * spool dir before it is answered (a restarted capd finds it).
 */
#ifndef CAPD_REMOTE_H
#define CAPD_REMOTE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

enum remote_stream { REMOTE_FRAMES, REMOTE_LOG, REMOTE_STREAMS };

/* The state of an attempt capd ended only because capd is stopping: its
 * worker should retry (503), the next capd takes the attempt up again. */
#define REMOTE_STATE_STOPPING "capd stopping"

/* What the worker reports at its end (POST .../finish). */
struct remote_exit {
    int64_t exit_status; /* the runner's exit status, when it exited */
    int signal;          /* the signal that killed it, else 0 */
    int64_t peak_rss_bytes, cpu_time_ms;
    uint64_t bytes[REMOTE_STREAMS]; /* each stream's length in all */
    /* The worker stopped its runner itself: on a signal it got from
     * outside (Slurm's scancel, a node failure, preemption: 0 when none),
     * or at the attempt's timeout. */
    int worker_signal;
    bool worker_timeout;
    /* The worker's watchdog killed the runner's group for passing the
     * spec's memory_max_bytes. */
    bool worker_oom;
};

struct remote_att;

/* ---- API side: any thread ---- */

/*
 * Appends the N bytes of DATA, which the worker says start at OFFSET of
 * stream WHICH, to attempt ATTEMPT_ID: the part past what is held already
 * is written, the rest was received before. RECEIVED gets both streams'
 * lengths afterwards. 0; -ERANGE when OFFSET lies past it (a gap); -ESTALE
 * when the attempt has ended (*STATE, of SLEN bytes, says how); -ENOENT
 * when this capd holds no such attempt (it restarted); -EIO on a write
 * error (nothing is counted then).
 */
int remote_append(int64_t attempt_id, enum remote_stream which, uint64_t offset, const void *data,
                  size_t n, uint64_t received[REMOTE_STREAMS], char *state, size_t slen);

/* The worker's spec reply (docs/api.md): the JSON capd made at the start
 * with "frames_received" and "log_received" added, and the attempt marked
 * started (its timeout runs from here). Errors as for remote_append. */
int remote_spec(int64_t attempt_id, json_t **out, char *state, size_t slen);

/* The worker's end. 0 once the attempt holds each stream's bytes in EX
 * (then the loop ends the attempt; a repeated finish answers 0 again);
 * -ERANGE with RECEIVED[] filled when it does not yet; the others as for
 * remote_append. */
int remote_finish(int64_t attempt_id, const struct remote_exit *ex,
                  uint64_t received[REMOTE_STREAMS], char *state, size_t slen);

/* ---- loop side: daemon/attempt/sup.c ---- */

/*
 * Registers attempt ATTEMPT_ID with its spool files in DIR (made anew) and
 * the spec reply SPEC (its reference is taken). The API wakes the loop
 * through WAKE, the caller's initialised uv_async handle, which must stay
 * open until remote_close. 0 or -errno.
 */
int remote_open(int64_t attempt_id, const char *dir, json_t *spec, uv_async_t *wake,
                struct remote_att **out);
/* The most of the worker's output (the log stream) the spool keeps; what
 * comes past it is acknowledged and dropped, and remote_log_dropped says
 * how much (the cell log keeps only its tail anyway). */
#define REMOTE_LOG_SPOOL_MAX (64ull << 20)
uint64_t remote_log_dropped(struct remote_att *r);
/* The same for an attempt a restarted capd takes up again: the spool files
 * in DIR are kept, and what they hold counts as received (the loop reads
 * them from their first byte). */
int remote_reopen(int64_t attempt_id, const char *dir, json_t *spec, uv_async_t *wake,
                  struct remote_att **out);

/* Reads up to N bytes of stream WHICH from where the loop stopped into
 * BUF: the byte count, 0 when there is nothing new, -errno on error. */
ssize_t remote_read(struct remote_att *r, enum remote_stream which, char *buf, size_t n);

/* Whether the worker has started (fetched its spec); whether the attempt
 * is over, and then how: *EX filled when the worker finished (true
 * returned with *FINISHED set), else capd ended it and STATE says how. Everything appended
 * before the end has been (or can still be) read. */
bool remote_started(struct remote_att *r);
bool remote_over(struct remote_att *r, bool *finished, struct remote_exit *ex, char *state,
                 size_t slen);

/* Ends the attempt from capd's side (timeout, cancel, a protocol error,
 * shutdown): later API calls answer 410 naming STATE; the loop is woken. */
void remote_end(struct remote_att *r, const char *state);
/* The same for the attempt of ID, if this capd holds it (any thread). */
void remote_end_id(int64_t attempt_id, const char *state);

/* Forgets the attempt: unregistered (WAKE is never sent again), spool
 * files closed and, unless KEEP (capd stopping: the next capd reopens
 * them), removed; R freed. */
void remote_close(struct remote_att *r, bool keep);

#endif
