/*
 * daemon/outcome.c - the outcome of a cell attempt from what the
 * supervisor saw (see outcome.h for the rules and their order). It owns
 * the wording of every stored reason capd writes for an ended attempt.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "daemon/outcome.h"

static bool is(const char *a, const char *b)
{
    return a && strcmp(a, b) == 0;
}

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
 * reason (empty for ok). */
static const char *first_rule(const struct outcome_in *in, struct outcome *out)
{
    char *r = out->reason_buf;
    size_t rl = sizeof out->reason_buf;
    if (in->cancelled) {
        snprintf(r, rl, "job cancelled");
        return "cancelled";
    }
    if (in->timed_out) {
        snprintf(r, rl, "ran past timeout_s=%lld", in->timeout_s);
        return "timeout";
    }
    if (in->oom_killed || is(in->end_status, "oom")) {
        oom_reason(in, r, rl);
        return "oom";
    }
    if (in->fail_state) {
        snprintf(r, rl, "%s", or_default(in->fail_reason, ""));
        return in->fail_state;
    }
    if (in->term_signal) {
        crash_reason(in, out);
        return "crashed";
    }
    if (is(in->end_status, "unsupported")) {
        snprintf(r, rl, "%s", or_default(in->end_reason, "runner reported unsupported"));
        return "unsupported";
    }
    if (in->exit_status == 127 && in->frames == 0)
        exec_reason(in, r, rl);
    else if (in->exit_status != 0)
        snprintf(r, rl, "exit code %lld%s%s", (long long)in->exit_status,
                 in->end_reason ? ": " : "", or_default(in->end_reason, ""));
    else if (!in->saw_end)
        snprintf(r, rl, "runner exited 0 without an end frame");
    else if (is(in->end_status, "failed"))
        snprintf(r, rl, "%s", or_default(in->end_reason, "runner reported failure"));
    else
        return "ok";
    return "failed";
}

void outcome_classify(const struct outcome_in *in, struct outcome *out)
{
    memset(out, 0, sizeof *out);
    out->exit_code = in->term_signal ? -1 : (int)in->exit_status;
    out->state = first_rule(in, out);
    out->reason = strcmp(out->state, "ok") == 0 ? NULL : out->reason_buf;
    /* A hole in the records overrides the rule, but not a cancellation;
     * the rule's reason stays when capd had ended the attempt itself. */
    if (in->records_lost && !in->cancelled) {
        out->state = "failed";
        out->reason = out->reason_buf;
        if (!in->fail_state)
            snprintf(out->reason_buf, sizeof out->reason_buf,
                     "capd could not store this cell's records: storage unavailable (disk "
                     "full, read-only data dir or an I/O error); the records committed before "
                     "the failure are kept");
    }
    out->partial = strcmp(out->state, "ok") != 0 && strcmp(out->state, "unsupported") != 0;
}
