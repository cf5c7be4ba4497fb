/*
 * daemon/slurm/slurm.h - capd's Slurm command-line module: it builds the
 * command lines of sbatch, squeue, scontrol and scancel, runs them, parses
 * what they print and maps a Slurm job state to what capd does with the
 * cell. It talks to Slurm only through Debian's slurm-client programs (no
 * REST, no library), so any site whose login node has them works.
 *
 * Conventions: 0 or a negative errno, and a sentence in *err (util/err.h).
 * Nothing here keeps global state or touches signal dispositions: a
 * struct slurm_ctx carries the configuration and a spawn counter, and the
 * runner waits only for the child it started (through a pidfd), so the
 * functions may run on a libuv worker thread. A ctx may be shared by
 * threads (the counter is atomic; the rest is read-only).
 *
 * Limits (each refused out loud): a command line has at most
 * SLURM_ARGV_MAX words (-E2BIG); names (job, partition, account, qos) at
 * most SLURM_NAME_MAX bytes without whitespace, other strings at most
 * SLURM_STR_MAX bytes, none with a control character (newline, tab, ...);
 * an array's last index at most SLURM_ARRAY_LAST_MAX (Slurm's default
 * MaxArraySize is 1001); a query at most SLURM_QUERY_MAX jobs or tasks;
 * a command's stdout at most ctx.out_max bytes (killed beyond, -E2BIG),
 * its stderr kept to SLURM_STDERR_MAX bytes for the message.
 *
 * Job states: squeue lists the jobs Slurm still schedules; a finished job
 * leaves squeue, so for every wanted id squeue no longer lists, one
 * `scontrol -o show job` (every job the controller still keeps, for
 * MinJobAge seconds) gives its final state and exit code. scontrol rather
 * than the jobcomp file: the file lies on the controller's disk, which
 * capd on a login node cannot read, while scontrol asks the controller
 * over the network exactly as squeue does. docs/scale.md has the table of
 * states and what each becomes (slurm_state_map).
 */
#ifndef CAPD_DAEMON_SLURM_H
#define CAPD_DAEMON_SLURM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"

#define SLURM_ARGV_MAX       64
#define SLURM_NAME_MAX       128
#define SLURM_STR_MAX        4096
#define SLURM_ARRAY_LAST_MAX 1000
#define SLURM_TIME_MAX_MIN   (366 * 24 * 60)
#define SLURM_QUERY_MAX      1024
#define SLURM_STDERR_MAX     4096
#define SLURM_STATE_MAX      32
#define SLURM_REASON_MAX     128

/* How the commands run. bin_dir: the folder of sbatch & co (NULL: PATH).
 * slurm_conf: SLURM_CONF for the children (NULL: the environment's own
 * passes through). timeout_ms: each command's wall-clock limit, after
 * which it is killed. out_max: the ceiling on its stdout. spawns: counts
 * the commands started, so a caller (and the tests) can see that a query
 * of N jobs is one squeue. */
struct slurm_ctx {
    const char *bin_dir;
    const char *slurm_conf;
    long timeout_ms;
    size_t out_max;
    atomic_ulong spawns;
};

/* A command line: argv[0..argc-1] malloc'd, argv[argc] NULL. */
struct slurm_argv {
    int argc;
    char *argv[SLURM_ARGV_MAX + 1];
};

void slurm_argv_init(struct slurm_argv *a);
void slurm_argv_free(struct slurm_argv *a);
/* Appends one formatted word; -E2BIG (and a message naming the limit)
 * when the line already has SLURM_ARGV_MAX words. */
int slurm_argv_addf(struct slurm_argv *a, char **err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The string options of a submission, in the order they go on the
 * command line: the field, sbatch's option, the limit, and whether the
 * value is a name (no whitespace). slurm_submit declares one field a row
 * and slurm_sbatch_argv checks and adds them from the same rows. */
#define SLURM_SUBMIT_STRINGS(X)                                                                    \
    X(job_name, "job-name", SLURM_NAME_MAX, true)                                                  \
    X(partition, "partition", SLURM_NAME_MAX, true)                                                \
    X(account, "account", SLURM_NAME_MAX, true)                                                    \
    X(qos, "qos", SLURM_NAME_MAX, true)                                                            \
    X(constraint, "constraint", SLURM_STR_MAX, false)                                              \
    X(output, "output", SLURM_STR_MAX, false)                                                      \
    X(error, "error", SLURM_STR_MAX, false)                                                        \
    X(workdir, "chdir", SLURM_STR_MAX, false)                                                      \
    X(export_env, "export", SLURM_STR_MAX, false)

/* One sbatch submission. NULL strings and zero numbers are left out.
 * array_last < 0: no array; else --array=0-array_last, with %throttle
 * when throttle > 0. script must be an absolute path (it is the one
 * positional word). */
struct slurm_submit {
    const char *script;
    int array_last;
    int throttle;
    int time_limit_min;
    long long mem_mb; /* --mem in MiB (0: the partition's default) */
    bool gpu;
    bool exclusive;
    /* --no-requeue: a node failure ends the job (capd, not Slurm, starts
     * the next attempt, with a token of its own) */
    bool no_requeue;
#define SLURM_SUBMIT_FIELD(field, opt, max, name) const char *field;
    SLURM_SUBMIT_STRINGS(SLURM_SUBMIT_FIELD)
#undef SLURM_SUBMIT_FIELD
};

/* `sbatch --parsable ...` into OUT (initialised here; free it with
 * slurm_argv_free even on failure). -EINVAL naming the field that is bad. */
int slurm_sbatch_argv(const struct slurm_submit *s, struct slurm_argv *out, char **err);

/* sbatch --parsable's reply, "12345" or "12345;cluster" with at most one
 * trailing newline; anything else is -EINVAL. */
int slurm_parse_parsable(const char *text, uint32_t *job_id, char **err);

/* One job or array task and what Slurm says of it. task_id -1: not an
 * array task. known: some command listed it. exit_known: the exit code
 * and signal come from scontrol (squeue prints none). */
struct slurm_job_state {
    uint32_t job_id;
    int32_t task_id;
    bool known;
    bool exit_known;
    int exit_code;
    int signal;
    char state[SLURM_STATE_MAX];
    char reason[SLURM_REASON_MAX];
};

/* `squeue -h -a -r -o %i|%T|%r` lines ("123_4|RUNNING|None") into ROWS
 * (at most MAX, -E2BIG beyond); *N gets the count. -EINVAL on a bad line. */
int slurm_parse_squeue(const char *text, struct slurm_job_state *rows, size_t max, size_t *n,
                       char **err);

/* `scontrol -o show job` lines into ROWS, like slurm_parse_squeue. An
 * array's pending remainder (ArrayTaskId=2-5%2) is skipped: squeue -r
 * lists those tasks one by one. */
int slurm_parse_scontrol(const char *text, struct slurm_job_state *rows, size_t max, size_t *n,
                         char **err);

/* What capd does with a cell in a Slurm state. */
enum slurm_verdict {
    SLURM_V_RUNNING,     /* Slurm still holds it: poll again */
    SLURM_V_ENDED,       /* the worker ended: its end frame decides */
    SLURM_V_FAILED,      /* exit_code is the cell's */
    SLURM_V_TIMEOUT,     /* the time limit (or deadline) passed */
    SLURM_V_OOM,         /* the allocation's memory ran out */
    SLURM_V_CANCELLED,   /* scancel, by capd or a person */
    SLURM_V_REQUEUE,     /* the node or Slurm failed it: a new attempt */
    SLURM_V_UNSUPPORTED, /* no node can ever run it */
};

struct slurm_mapped {
    enum slurm_verdict verdict;
    int exit_code;
    char reason[256];
};

/* The verdict for STATE (squeue/scontrol spelling), REASON (may be NULL),
 * EXIT_CODE and SIGNAL. Pure; docs/scale.md has the table. */
void slurm_state_map(const char *state, const char *reason, int exit_code, int signal,
                     struct slurm_mapped *out);
const char *slurm_verdict_name(enum slurm_verdict v);

/* A command's end: status is its exit status (-1 when a signal ended it,
 * then sig is that signal); out its stdout, errtext its stderr (cut to
 * SLURM_STDERR_MAX). */
struct slurm_result {
    int status;
    int sig;
    struct ubuf out;
    char errtext[SLURM_STDERR_MAX + 1];
};

/* Runs ARGV (argv[0] looked up in ctx->bin_dir or PATH) and waits for it.
 * 0 when it ran to its end, whatever its status; -ETIMEDOUT (killed),
 * -E2BIG (stdout past out_max, killed), -ENOENT or another errno from
 * starting it. R is initialised here; ubuf_free(&r->out) afterwards. */
int slurm_run(struct slurm_ctx *ctx, const struct slurm_argv *argv, struct slurm_result *r,
              char **err);

/* Submits S: 0 and *JOB_ID; -ENOTSUP when sbatch refuses the constraint
 * (no node has the feature: the width is unsupported), other errors with
 * sbatch's stderr in the message. */
int slurm_submit(struct slurm_ctx *ctx, const struct slurm_submit *s, uint32_t *job_id, char **err);

/* The states of WANT[0..n-1] (job_id and task_id set by the caller),
 * filled in place: one squeue, and one scontrol only when squeue left
 * some out. A row no command lists stays known = false. */
int slurm_query(struct slurm_ctx *ctx, struct slurm_job_state *want, size_t n, char **err);

/* One scancel of IDS[0..n-1]: task TASKS[i] of array IDS[i] ("123_4"),
 * or the whole job (all its array's tasks) where TASKS is NULL or
 * TASKS[i] is -1. */
int slurm_cancel(struct slurm_ctx *ctx, const uint32_t *ids, const int32_t *tasks, size_t n,
                 char **err);

#endif
