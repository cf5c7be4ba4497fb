/*
 * daemon/attempt/outcome.h - how a cell attempt ended, in words: the facts the
 * supervisor gathered (flags, the end frame, the exit status, what capd
 * itself ended it for) in, the stored state and reason out. Pure: no
 * system calls, no globals, nothing but string formatting, so every rule
 * is tested by a table (tests/test_outcome.c).
 *
 * The first rule that applies decides, in this order:
 *
 *   cancelled     the job was cancelled
 *   timeout       it ran past options.timeout_s
 *   oom           killed for memory, or the runner's end frame says "oom"
 *   FAIL_STATE    capd ended it (protocol_error, or failed with the reason)
 *   crashed       killed by a signal (SIGNAL names it)
 *   unsupported   the runner's end frame says so
 *   failed        exit code 127 before any frame (the exec failed), any
 *                 other non-zero exit, exit 0 without an end frame, or an
 *                 end frame that says "failed"
 *   ok            everything else
 *
 * An oom that the runner reported (not a kill for host memory) whose
 * reason is the GPU runtime's (CUDA or HIP out of memory, PyTorch's
 * OutOfMemoryError) is a device oom (DEVICE_OOM): a GPU cell that shared
 * its device then runs again alone (daemon/host/devices.h).
 *
 * A failed or crashed attempt whose reason (the runner's or capd's) is the
 * GPU runtime saying the device itself failed (no CUDA-capable device,
 * ECC errors, busy or unavailable, GPU lost; or torch.cuda.is_available()
 * false or raising in a build that has CUDA or HIP) is a device error
 * (DEVICE_ERROR): the device leaves the pool (daemon/host/devices.h).
 *
 * Then, whatever the rule: an attempt that lost records to a failed write
 * (RECORDS_LOST) and was not cancelled is "failed", since committing it as
 * anything else would make a comparison read a stream with a hole.
 *
 * Usage:
 *
 *     struct outcome_in in = {.exit_status = 0, .saw_end = true, ...};
 *     struct outcome out;
 *     outcome_classify(&in, &out);
 *     store o.state = out.state, o.reason = out.reason, ...
 */
#ifndef CAPD_OUTCOME_H
#define CAPD_OUTCOME_H

#include <stdbool.h>
#include <stdint.h>

/* The longest reason kept; a longer one is cut. */
#define OUTCOME_REASON_MAX 1024

struct outcome_in {
    bool cancelled;
    bool timed_out;
    long long timeout_s; /* options.timeout_s as the job gave it */
    /* Memory: whether the cell's memory group killed something, the
     * mechanism's name and the "limit ..., peak ..." description
     * (mem_cell_describe). */
    bool oom_killed;
    const char *mem_mechanism;
    const char *mem_what;
    /* The runner's end frame (NULL status and reason when none came or it
     * had none), whether one came, and how many frames came at all. */
    const char *end_status;
    const char *end_reason;
    bool saw_end;
    uint64_t frames;
    /* Set when capd ended the attempt: "protocol_error" or "failed". */
    const char *fail_state;
    const char *fail_reason;
    int64_t exit_status;
    int term_signal; /* 0 when it exited */
    /* For exit 127 before any frame: why the interpreter cannot be run by
     * the cell user (runas_can_use's WHY), NULL when it can; and who that
     * user is (runas_describe). */
    const char *exec_why;
    const char *cell_user;
    bool records_lost;
};

struct outcome {
    const char *state;  /* a name of util/cellstate.h's table */
    const char *reason; /* NULL for ok, else REASON_BUF */
    const char *signal; /* "SIGKILL" and so on for crashed, else NULL; in SIGNAL_BUF */
    int exit_code;      /* the exit status, -1 when a signal ended it */
    bool partial;       /* anything but ok and unsupported */
    bool device_oom;    /* oom, and the device's memory ran out (see above) */
    bool device_error;  /* failed or crashed, and the device itself failed (see above) */
    char reason_buf[OUTCOME_REASON_MAX];
    char signal_buf[32];
};

/* Fills OUT from IN (see the rules above). OUT's pointers point into OUT
 * or at IN's strings, so OUT lives no longer than either. */
void outcome_classify(const struct outcome_in *in, struct outcome *out);

#endif
