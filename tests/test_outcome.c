/*
 * tests/test_outcome.c - daemon/attempt/outcome.h, the outcome of a cell attempt
 * from what the supervisor saw: one table row per rule and per precedence
 * between two rules that both apply, checked for state, reason, signal,
 * exit code and the partial flag. The function is pure, so no process is
 * started; the supervisor's use of it is covered by the cell tests
 * (test_cells, test_limits, test_secure).
 */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <signal.h>
#include <string.h>

#include "daemon/attempt/outcome.h"

/* What a row wants outcome_classify to give. */
struct want {
    const char *state;
    const char *reason; /* NULL: none */
    const char *signal; /* NULL: none */
    int exit_code;
    bool partial;
};

struct row {
    const char *name;
    struct outcome_in in;
    struct want want;
};

#define WHAT "limit 16777216 bytes (16.0 MiB), peak 20971520 bytes (20.0 MiB)"
#define LOST                                                                                       \
    "capd could not store this cell's records: storage unavailable (disk full, read-only data "    \
    "dir or an I/O error); the records committed before the failure are kept"

/* A clean run: exit 0 after an end frame that says ok. */
#define CLEAN .saw_end = true, .end_status = "ok", .frames = 5, .mem_what = WHAT

static const struct row rows[] = {
    {"ok", {CLEAN}, {"ok", NULL, NULL, 0, false}},
    {"ok_end_without_status",
     {.saw_end = true, .frames = 1, .mem_what = WHAT},
     {"ok", NULL, NULL, 0, false}},
    {"cancelled_over_everything",
     {CLEAN, .cancelled = true, .timed_out = true, .oom_killed = true, .fail_state = "failed",
      .fail_reason = "x", .term_signal = SIGTERM},
     {"cancelled", "job cancelled", NULL, -1, true}},
    {"cancelled_exit_code_kept",
     {CLEAN, .cancelled = true, .exit_status = 143},
     {"cancelled", "job cancelled", NULL, 143, true}},
    {"timeout_over_oom",
     {CLEAN, .timed_out = true, .timeout_s = 30, .oom_killed = true, .mem_mechanism = "cgroup2",
      .term_signal = SIGKILL},
     {"timeout", "ran past timeout_s=30", NULL, -1, true}},
    {"timeout_unset",
     {CLEAN, .timed_out = true},
     {"timeout", "ran past timeout_s=0", NULL, 0, true}},
    {"oom_killed_over_fail_state",
     {CLEAN, .oom_killed = true, .mem_mechanism = "watchdog", .fail_state = "protocol_error",
      .fail_reason = "bad frame", .term_signal = SIGKILL},
     {"oom", "killed for memory (watchdog): " WHAT, NULL, -1, true}},
    {"oom_end_frame_reason",
     {.saw_end = true,
      .end_status = "oom",
      .end_reason = "CUDA out of memory",
      .exit_status = 1,
      .frames = 3,
      .mem_what = WHAT},
     {"oom", "CUDA out of memory (" WHAT ")", NULL, 1, true}},
    {"oom_end_frame_no_reason",
     {.saw_end = true, .end_status = "oom", .frames = 3, .mem_what = WHAT},
     {"oom", "out of memory (" WHAT ")", NULL, 0, true}},
    {"fail_state_over_signal",
     {CLEAN, .fail_state = "protocol_error", .fail_reason = "frame header too long",
      .term_signal = SIGKILL},
     {"protocol_error", "frame header too long", NULL, -1, true}},
    {"fail_state_failed",
     {CLEAN, .fail_state = "failed", .fail_reason = "capd could not store record 3: io"},
     {"failed", "capd could not store record 3: io", NULL, 0, true}},
    {"crashed_sigkill",
     {.term_signal = SIGKILL, .frames = 2},
     {"crashed", "killed by SIGKILL (Killed)", "SIGKILL", -1, true}},
    {"crashed_sigsegv_over_unsupported",
     {.term_signal = SIGSEGV, .saw_end = true, .end_status = "unsupported"},
     {"crashed", "killed by SIGSEGV (Segmentation fault)", "SIGSEGV", -1, true}},
    {"crashed_unknown_signal",
     {.term_signal = 200},
     {"crashed", "killed by SIG? (Unknown signal 200)", "SIG?", -1, true}},
    {"unsupported_reason",
     {.saw_end = true,
      .end_status = "unsupported",
      .end_reason = "width bf16 not on this CPU",
      .frames = 2},
     {"unsupported", "width bf16 not on this CPU", NULL, 0, false}},
    {"unsupported_no_reason",
     {.saw_end = true, .end_status = "unsupported", .frames = 1},
     {"unsupported", "runner reported unsupported", NULL, 0, false}},
    {"unsupported_over_exit_127",
     {.exit_status = 127, .end_status = "unsupported"},
     {"unsupported", "runner reported unsupported", NULL, 127, false}},
    {"exit_127_interpreter",
     {.exit_status = 127,
      .exec_why = "/opt/py/bin/python: /opt/py is mode 0700",
      .cell_user = "nobody (uid 65534, gid 65534)"},
     {"failed",
      "exit code 127: the runner could not be executed: interpreter /opt/py/bin/python: /opt/py "
      "is mode 0700",
      NULL, 127, true}},
    {"exit_127_cell_user",
     {.exit_status = 127, .cell_user = "nobody (uid 65534, gid 65534)"},
     {"failed",
      "exit code 127: the runner could not be executed as the cell user nobody (uid 65534, gid "
      "65534) (the cell log says why)",
      NULL, 127, true}},
    {"exit_127_after_frames",
     {.exit_status = 127, .frames = 1},
     {"failed", "exit code 127", NULL, 127, true}},
    {"exit_nonzero_end_reason",
     {.exit_status = 3, .saw_end = true, .end_status = "failed", .end_reason = "boom", .frames = 4},
     {"failed", "exit code 3: boom", NULL, 3, true}},
    {"exit_nonzero_over_no_end",
     {.exit_status = 2, .frames = 4},
     {"failed", "exit code 2", NULL, 2, true}},
    {"exit_0_without_end",
     {.frames = 4},
     {"failed", "runner exited 0 without an end frame", NULL, 0, true}},
    {"end_failed_reason",
     {.saw_end = true, .end_status = "failed", .end_reason = "model not found", .frames = 1},
     {"failed", "model not found", NULL, 0, true}},
    {"end_failed_no_reason",
     {.saw_end = true, .end_status = "failed", .frames = 1},
     {"failed", "runner reported failure", NULL, 0, true}},
    {"records_lost_over_ok", {CLEAN, .records_lost = true}, {"failed", LOST, NULL, 0, true}},
    {"records_lost_over_unsupported",
     {.saw_end = true, .end_status = "unsupported", .records_lost = true},
     {"failed", LOST, NULL, 0, true}},
    {"records_lost_under_cancelled",
     {CLEAN, .cancelled = true, .records_lost = true},
     {"cancelled", "job cancelled", NULL, 0, true}},
    {"records_lost_keeps_fail_reason",
     {CLEAN, .fail_state = "failed", .fail_reason = "capd could not store record 7: full",
      .records_lost = true},
     {"failed", "capd could not store record 7: full", NULL, 0, true}},
    {"records_lost_over_timeout",
     {CLEAN, .timed_out = true, .timeout_s = 5, .records_lost = true},
     {"failed", LOST, NULL, 0, true}},
    {"records_lost_fail_state_keeps_rule_reason",
     {CLEAN, .timed_out = true, .timeout_s = 5, .fail_state = "failed", .fail_reason = "x",
      .records_lost = true},
     {"failed", "ran past timeout_s=5", NULL, 0, true}},
    {"records_lost_crash_drops_signal_reason",
     {.term_signal = SIGKILL, .records_lost = true},
     {"failed", LOST, "SIGKILL", -1, true}},
};

static bool same(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

Test(outcome, table)
{
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const char *name = rows[i].name;
        const struct want *w = &rows[i].want;
        struct outcome out;
        outcome_classify(&rows[i].in, &out);
        cr_expect(same(out.state, w->state), "%s: state %s, want %s", name, out.state, w->state);
        cr_expect(same(out.reason, w->reason), "%s: reason '%s', want '%s'", name,
                  out.reason ? out.reason : "(null)", w->reason ? w->reason : "(null)");
        cr_expect(same(out.signal, w->signal), "%s: signal %s, want %s", name,
                  out.signal ? out.signal : "(null)", w->signal ? w->signal : "(null)");
        cr_expect_eq(out.exit_code, w->exit_code, "%s: exit_code %d, want %d", name, out.exit_code,
                     w->exit_code);
        cr_expect_eq(out.partial, w->partial, "%s: partial %d, want %d", name, out.partial,
                     w->partial);
    }
}

/* A reason longer than OUTCOME_REASON_MAX is cut, never overrun. */
Test(outcome, long_reason_is_cut)
{
    static char big[3 * OUTCOME_REASON_MAX];
    memset(big, 'r', sizeof big - 1);
    struct outcome_in in = {.fail_state = "failed", .fail_reason = big};
    struct outcome out;
    outcome_classify(&in, &out);
    cr_assert_str_eq(out.state, "failed");
    cr_assert_eq(strlen(out.reason), OUTCOME_REASON_MAX - 1);
    cr_assert_eq(strncmp(out.reason, big, OUTCOME_REASON_MAX - 1), 0);
}

/* The state of a fail_state row is the cell state it names (util/cellstate.h),
 * so protocol_error and any later capd-decided state pass through; a word
 * that names no cell state is a failure. */
Test(outcome, fail_state_passes_through)
{
    struct outcome_in in = {.fail_state = "protocol_error", .fail_reason = "bad magic"};
    struct outcome out;
    outcome_classify(&in, &out);
    cr_assert_str_eq(out.state, "protocol_error");
    cr_assert_str_eq(out.reason, "bad magic");
    in.fail_state = "not_a_state";
    outcome_classify(&in, &out);
    cr_assert_str_eq(out.state, "failed");
    cr_assert_str_eq(out.reason, "bad magic");
}

/* A device oom is an oom the runner reported with the GPU runtime's words;
 * a kill for host memory, an allocator failure of the CPU, and a device
 * error that is not memory are not. */
Test(outcome, device_oom_is_the_runtime_running_out)
{
    static const struct {
        const char *status, *reason;
        bool killed, want;
    } cases[] = {
        {"oom",
         "the framework could not allocate memory: OutOfMemoryError: CUDA out of memory. Tried "
         "to allocate 2.00 GiB",
         false, true},
        {"oom", "the framework could not allocate memory: RuntimeError: HIP out of memory", false,
         true},
        {"oom", "the framework could not allocate memory: RuntimeError: CUDA error: out of memory",
         false, true},
        {"oom", "CUDA out of memory", true, false},
        {"oom",
         "the framework could not allocate memory: RuntimeError: DefaultCPUAllocator: "
         "can't allocate memory",
         false, false},
        {"failed", "exception in model code: RuntimeError: CUDA error: an illegal memory access",
         false, false},
        {"oom", NULL, false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct outcome_in in = {.saw_end = true,
                                .end_status = cases[i].status,
                                .end_reason = cases[i].reason,
                                .oom_killed = cases[i].killed,
                                .exit_status = 1,
                                .frames = 3};
        struct outcome out;
        outcome_classify(&in, &out);
        cr_expect_eq(out.device_oom, cases[i].want, "case %zu (%s): device_oom %d", i,
                     cases[i].reason ? cases[i].reason : "(null)", out.device_oom);
    }
}

/* A device error is a failure or crash whose reason is the runtime saying
 * the device itself failed; the model's own CUDA errors, an oom and a
 * CPU-only build asked for a GPU are not. */
Test(outcome, device_error_is_the_device_failing)
{
    static const struct {
        const char *status, *reason;
        int exit_status;
        bool want;
    } cases[] = {
        {"failed",
         "exception in model code: RuntimeError: CUDA error: uncorrectable ECC error "
         "encountered",
         1, true},
        {"failed",
         "exception in model code: RuntimeError: CUDA error: no CUDA-capable device is "
         "detected",
         1, true},
        {"failed",
         "device gpu requested but torch.cuda.is_available() is False (torch 2.11, "
         "built with CUDA 13.0 / HIP None)",
         1, true},
        {"failed",
         "device gpu requested but torch.cuda.is_available() is False (torch 2.11, "
         "built with CUDA None / HIP None)",
         1, false},
        {"failed",
         "exception in model code: RuntimeError: CUDA error: an illegal memory access "
         "was encountered",
         1, false},
        {"oom", "CUDA error: uncorrectable ECC error encountered", 1, false},
        {"ok", NULL, 0, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct outcome_in in = {.saw_end = true,
                                .end_status = cases[i].status,
                                .end_reason = cases[i].reason,
                                .exit_status = cases[i].exit_status,
                                .frames = 3};
        struct outcome out;
        outcome_classify(&in, &out);
        cr_expect_eq(out.device_error, cases[i].want, "case %zu (%s): device_error %d", i,
                     cases[i].reason ? cases[i].reason : "(null)", out.device_error);
    }
}
