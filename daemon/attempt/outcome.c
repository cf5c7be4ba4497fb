/*
 * daemon/attempt/outcome.c - the outcome of a cell attempt from what the
 * supervisor saw (see outcome.h for the rules and their order). It owns
 * the wording of every stored reason capd writes for an ended attempt.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "daemon/attempt/outcome.h"
#include "util/cellstate.h"

static const char *or_default(const char *s, const char *dflt)
{
    return s ? s : dflt;
}

/* Killed for memory, or the runner saw the framework fail to allocate:
 * either way an outcome of its own, not a crash. The description gives the
 * limit and the peak it was held against. */
static void oom_reason(const struct outcome_in *in, char *reason, size_t rlen)
{
    const char *what = or_default(in->mem_what, "");
    if (in->oom_killed)
        snprintf(reason, rlen, "killed for memory (%s): %s", or_default(in->mem_mechanism, "?"),
                 what);
    else
        snprintf(reason, rlen, "%s (%s)", or_default(in->end_reason, "out of memory"), what);
}

/* Exit 127 before a single frame: the exec of the runner failed (spawn.c,
 * capd-exec). The reason says why as the cell user sees it, not a bare
 * exit code: usually the interpreter is behind a directory that user
 * cannot search. */
static void exec_reason(const struct outcome_in *in, char *reason, size_t rlen)
{
    if (in->exec_why)
        snprintf(reason, rlen, "exit code 127: the runner could not be executed: interpreter %s",
                 in->exec_why);
    else
        snprintf(reason, rlen,
                 "exit code 127: the runner could not be executed as the cell user %s (the cell "
                 "log says why)",
                 or_default(in->cell_user, "?"));
}

static void crash_reason(const struct outcome_in *in, struct outcome *out)
{
    const char *abbr = sigabbrev_np(in->term_signal);
    snprintf(out->signal_buf, sizeof out->signal_buf, "SIG%s", abbr ? abbr : "?");
    out->signal = out->signal_buf;
    snprintf(out->reason_buf, sizeof out->reason_buf, "killed by %s (%s)", out->signal_buf,
             strsignal(in->term_signal));
}

/* The first rule of outcome.h's list that applies; reason_buf holds its
 * reason (empty for ok). A fail_state that names no cell state is a
 * failure. */
static enum cell_state first_rule(const struct outcome_in *in, struct outcome *out)
{
    char *r = out->reason_buf;
    size_t rl = sizeof out->reason_buf;
    enum cell_state st = CELL_FAILED;
    if (in->cancelled) {
        snprintf(r, rl, "job cancelled");
        return CELL_CANCELLED;
    }
    if (in->timed_out) {
        snprintf(r, rl, "ran past timeout_s=%lld", in->timeout_s);
        return CELL_TIMEOUT;
    }
    if (in->oom_killed || cell_state_is(in->end_status, CELL_OOM)) {
        oom_reason(in, r, rl);
        return CELL_OOM;
    }
    if (in->fail_state) {
        snprintf(r, rl, "%s", or_default(in->fail_reason, ""));
        cell_state_parse(in->fail_state, &st);
        return st;
    }
    if (in->term_signal) {
        crash_reason(in, out);
        return CELL_CRASHED;
    }
    if (cell_state_is(in->end_status, CELL_UNSUPPORTED)) {
        snprintf(r, rl, "%s", or_default(in->end_reason, "runner reported unsupported"));
        return CELL_UNSUPPORTED;
    }
    if (in->exit_status == 127 && in->frames == 0)
        exec_reason(in, r, rl);
    else if (in->exit_status != 0)
        snprintf(r, rl, "exit code %lld%s%s", (long long)in->exit_status,
                 in->end_reason ? ": " : "", or_default(in->end_reason, ""));
    else if (!in->saw_end)
        snprintf(r, rl, "runner exited 0 without an end frame");
    else if (cell_state_is(in->end_status, CELL_FAILED))
        snprintf(r, rl, "%s", or_default(in->end_reason, "runner reported failure"));
    else
        return CELL_OK;
    return CELL_FAILED;
}

/* What the GPU runtimes and PyTorch say when device memory runs out: the
 * runner's oom reason carries the exception's type and first line
 * (runner/capd_runner/cell.py). */
static bool device_oom(const struct outcome_in *in)
{
    static const char *const says[] = {"CUDA out of memory", "HIP out of memory",
                                       "CUDA error: out of memory", "hipErrorOutOfMemory",
                                       "OutOfMemoryError"};
    if (in->oom_killed || !cell_state_is(in->end_status, CELL_OOM) || !in->end_reason)
        return false;
    for (size_t i = 0; i < sizeof says / sizeof says[0]; i++)
        if (strstr(in->end_reason, says[i]))
            return true;
    return false;
}

/* What the GPU runtimes say when the device itself fails, as opposed to
 * the model's code (an illegal address is the model's): no device, ECC,
 * unavailable or lost; and the runner's words for a runtime that does not
 * come up in a build that has one (runner/capd_runner/cell.py, _device). */
static bool device_error(const struct outcome_in *in, enum cell_state st)
{
    static const char *const says[] = {"no CUDA-capable device",
                                       "uncorrectable ECC",
                                       "ECC error",
                                       "busy or unavailable",
                                       "GPU is lost",
                                       "hipErrorNoDevice",
                                       "no ROCm-capable device",
                                       "torch.cuda.is_available() raised"};
    const char *r = in->fail_reason ? in->fail_reason : in->end_reason;
    if ((st != CELL_FAILED && st != CELL_CRASHED) || !r)
        return false;
    for (size_t i = 0; i < sizeof says / sizeof says[0]; i++)
        if (strstr(r, says[i]))
            return true;
    return strstr(r, "torch.cuda.is_available() is False") &&
           !strstr(r, "built with CUDA None / HIP None");
}

void outcome_classify(const struct outcome_in *in, struct outcome *out)
{
    memset(out, 0, sizeof *out);
    out->exit_code = in->term_signal ? -1 : (int)in->exit_status;
    enum cell_state st = first_rule(in, out);
    out->reason = st == CELL_OK ? NULL : out->reason_buf;
    /* A hole in the records overrides the rule, but not a cancellation;
     * the rule's reason stays when capd had ended the attempt itself. */
    if (in->records_lost && !in->cancelled) {
        st = CELL_FAILED;
        out->reason = out->reason_buf;
        if (!in->fail_state)
            snprintf(out->reason_buf, sizeof out->reason_buf,
                     "capd could not store this cell's records: storage unavailable (disk "
                     "full, read-only data dir or an I/O error); the records committed before "
                     "the failure are kept");
    }
    out->state = cell_state_name(st);
    out->partial = st != CELL_OK && st != CELL_UNSUPPORTED;
    out->device_oom = st == CELL_OOM && device_oom(in);
    out->device_error = !in->records_lost && device_error(in, st);
}
