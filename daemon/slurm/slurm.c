/*
 * daemon/slurm/slurm.c - the pure half of the Slurm module (slurm.h): command
 * lines, the parsers of what the commands print, and the state map. The
 * runner and the calls that use it are in slurm_run.c.
 */
#include "daemon/slurm/slurm.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

void slurm_argv_init(struct slurm_argv *a)
{
    memset(a, 0, sizeof(*a));
}

void slurm_argv_free(struct slurm_argv *a)
{
    for (int i = 0; i < a->argc; i++)
        free(a->argv[i]);
    slurm_argv_init(a);
}

int slurm_argv_addf(struct slurm_argv *a, char **err, const char *fmt, ...)
{
    if (a->argc >= SLURM_ARGV_MAX)
        return util_errf(err, -E2BIG, "a Slurm command line has at most %d words", SLURM_ARGV_MAX);
    va_list ap;
    va_start(ap, fmt);
    char *w = NULL;
    int n = vasprintf(&w, fmt, ap);
    va_end(ap);
    if (n < 0)
        return util_errf(err, -ENOMEM, "out of memory building a Slurm command line");
    a->argv[a->argc++] = w;
    a->argv[a->argc] = NULL;
    return 0;
}

/* A string that goes into a command line: bounded, not empty, and free of
 * control characters (a newline would end an sbatch directive or a
 * parsed line); names also free of whitespace, since scontrol's one-line
 * output separates its fields by spaces. */
static int check_str(const char *field, const char *v, size_t max, bool name, char **err)
{
    size_t n = strlen(v);
    if (n == 0)
        return util_errf(err, -EINVAL, "slurm %s is empty", field);
    if (n > max)
        return util_errf(err, -EINVAL, "slurm %s is %zu bytes, at most %zu", field, n, max);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        if (c < 0x20 || c == 0x7f)
            return util_errf(err, -EINVAL, "slurm %s has a control character (0x%02x) at byte %zu",
                             field, c, i);
        if (name && c == ' ')
            return util_errf(err, -EINVAL, "slurm %s has a space at byte %zu", field, i);
    }
    return 0;
}

/* "--opt=value" when V is set. */
static int add_opt(struct slurm_argv *a, const char *opt, const char *v, size_t max, bool name,
                   char **err)
{
    if (!v)
        return 0;
    int rc = check_str(opt, v, max, name, err);
    return rc ? rc : slurm_argv_addf(a, err, "--%s=%s", opt, v);
}

int slurm_sbatch_argv(const struct slurm_submit *s, struct slurm_argv *a, char **err)
{
    int rc;
    slurm_argv_init(a);
    if (!s->script)
        return util_errf(err, -EINVAL, "slurm script is missing");
    if ((rc = check_str("script", s->script, SLURM_STR_MAX, false, err)) != 0)
        return rc;
    if (s->script[0] != '/')
        return util_errf(err, -EINVAL, "slurm script '%s' is not an absolute path", s->script);
    if (s->array_last > SLURM_ARRAY_LAST_MAX)
        return util_errf(err, -EINVAL, "slurm array's last index %d is over %d", s->array_last,
                         SLURM_ARRAY_LAST_MAX);
    if (s->throttle < 0)
        return util_errf(err, -EINVAL, "slurm array throttle %d is negative", s->throttle);
    if (s->throttle > 0 && s->array_last < 0)
        return util_errf(err, -EINVAL, "slurm array throttle %d without an array", s->throttle);
    if (s->time_limit_min < 0 || s->time_limit_min > SLURM_TIME_MAX_MIN)
        return util_errf(err, -EINVAL, "slurm time limit %d min is outside 0..%d",
                         s->time_limit_min, SLURM_TIME_MAX_MIN);
    if ((rc = slurm_argv_addf(a, err, "sbatch")) || (rc = slurm_argv_addf(a, err, "--parsable")))
        return rc;
    const struct {
        const char *opt;
        const char *v;
        size_t max;
        bool name;
    } opts[] = {
#define SLURM_SUBMIT_OPT(field, opt, max, name) {opt, s->field, max, name},
        SLURM_SUBMIT_STRINGS(SLURM_SUBMIT_OPT)
#undef SLURM_SUBMIT_OPT
    };
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        if ((rc = add_opt(a, opts[i].opt, opts[i].v, opts[i].max, opts[i].name, err)) != 0)
            return rc;
    if (s->array_last >= 0) {
        rc = s->throttle > 0
                 ? slurm_argv_addf(a, err, "--array=0-%d%%%d", s->array_last, s->throttle)
                 : slurm_argv_addf(a, err, "--array=0-%d", s->array_last);
        if (rc)
            return rc;
    }
    if (s->time_limit_min > 0 && (rc = slurm_argv_addf(a, err, "--time=%d", s->time_limit_min)))
        return rc;
    if (s->mem_mb > 0 && (rc = slurm_argv_addf(a, err, "--mem=%lldM", s->mem_mb)))
        return rc;
    if (s->gpu && (rc = slurm_argv_addf(a, err, "--gres=gpu:1")))
        return rc;
    if (s->exclusive && (rc = slurm_argv_addf(a, err, "--exclusive")))
        return rc;
    if (s->no_requeue && (rc = slurm_argv_addf(a, err, "--no-requeue")))
        return rc;
    return slurm_argv_addf(a, err, "%s", s->script);
}

/* A decimal uint32 of 1..10 digits at *P, which moves past it. */
static bool parse_u32(const char **p, uint32_t *v)
{
    const char *s = *p;
    unsigned long long x = 0;
    int n = 0;
    while (isdigit((unsigned char)s[n]) && n < 11)
        x = x * 10 + (unsigned long long)(s[n++] - '0');
    if (n == 0 || n > 10 || x > UINT32_MAX)
        return false;
    *v = (uint32_t)x;
    *p = s + n;
    return true;
}

int slurm_parse_parsable(const char *text, uint32_t *job_id, char **err)
{
    const char *p = text;
    if (!parse_u32(&p, job_id) || *job_id == 0)
        return util_errf(err, -EINVAL, "sbatch's reply '%.64s' does not start with a job id", text);
    if (*p == ';') {
        const char *c = ++p;
        while (isalnum((unsigned char)*p) || *p == '_' || *p == '-')
            p++;
        if (p == c)
            return util_errf(err, -EINVAL, "sbatch's reply '%.64s' has an empty cluster", text);
    }
    if (*p == '\n')
        p++;
    if (*p != '\0')
        return util_errf(err, -EINVAL, "sbatch's reply '%.64s' has more than a job id", text);
    return 0;
}

/* "123" or "123_4" (squeue's %i with -r). */
static bool parse_id(const char **p, struct slurm_job_state *r)
{
    if (!parse_u32(p, &r->job_id))
        return false;
    r->task_id = -1;
    if (**p == '_') {
        uint32_t t;
        (*p)++;
        if (!parse_u32(p, &t) || t > INT32_MAX)
            return false;
        r->task_id = (int32_t)t;
    }
    return true;
}

/* Copies [s, e) into DST of size N; false when it does not fit or is
 * empty. */
static bool copy_field(char *dst, size_t n, const char *s, const char *e)
{
    if (e <= s || (size_t)(e - s) >= n)
        return false;
    memcpy(dst, s, (size_t)(e - s));
    dst[e - s] = '\0';
    return true;
}

/* The lines of a command's output, one at a time: [s, e) is the line
 * without its newline, line its number from 1, next where the one after
 * starts. A last line without a newline counts; an empty text has none. */
struct lines {
    const char *next;
    const char *s, *e;
    int line;
};

static bool next_line(struct lines *l)
{
    if (!*l->next)
        return false;
    l->s = l->next;
    l->e = strchr(l->s, '\n');
    if (!l->e)
        l->e = l->s + strlen(l->s);
    l->line++;
    l->next = *l->e ? l->e + 1 : l->e;
    return true;
}

int slurm_parse_squeue(const char *text, struct slurm_job_state *rows, size_t max, size_t *n,
                       char **err)
{
    *n = 0;
    for (struct lines l = {.next = text}; next_line(&l);) {
        if (*n >= max)
            return util_errf(err, -E2BIG, "squeue listed more than %zu jobs", max);
        struct slurm_job_state *r = &rows[*n];
        memset(r, 0, sizeof(*r));
        const char *q = l.s, *eol = l.e;
        const char *bar = NULL;
        if (!parse_id(&q, r) || *q != '|' || !(bar = memchr(q + 1, '|', (size_t)(eol - q - 1))) ||
            !copy_field(r->state, sizeof(r->state), q + 1, bar) ||
            !copy_field(r->reason, sizeof(r->reason), bar + 1, eol) ||
            memchr(bar + 1, '|', (size_t)(eol - bar - 1)))
            return util_errf(err, -EINVAL, "squeue line %d '%.80s' is not ID|STATE|REASON", l.line,
                             l.s);
        r->known = true;
        (*n)++;
    }
    return 0;
}

/* The value of " KEY=" in LINE [s, e) (or "KEY=" at its start), up to the
 * next space; false when absent. */
static bool kv(const char *s, const char *e, const char *key, const char **v, const char **ve)
{
    size_t k = strlen(key);
    for (const char *p = s; p + k + 1 <= e; p++) {
        if ((p == s || p[-1] == ' ') && memcmp(p, key, k) == 0 && p[k] == '=') {
            *v = p + k + 1;
            *ve = *v;
            while (*ve < e && **ve != ' ')
                (*ve)++;
            return true;
        }
    }
    return false;
}

/* One `scontrol -o show job` line; 1 filled, 0 skipped, -1 bad. */
static int scontrol_line(const char *s, const char *e, struct slurm_job_state *r)
{
    const char *v, *ve;
    memset(r, 0, sizeof(*r));
    r->task_id = -1;
    if (!kv(s, e, "JobId", &v, &ve) || !parse_u32(&v, &r->job_id) || v != ve)
        return -1;
    if (kv(s, e, "ArrayJobId", &v, &ve)) {
        const char *t, *te;
        uint32_t task;
        if (!parse_u32(&v, &r->job_id) || v != ve || !kv(s, e, "ArrayTaskId", &t, &te))
            return -1;
        if (!parse_u32(&t, &task) || t != te)
            return 0;
        if (task > INT32_MAX)
            return -1;
        r->task_id = (int32_t)task;
    }
    if (!kv(s, e, "JobState", &v, &ve) || !copy_field(r->state, sizeof(r->state), v, ve))
        return -1;
    if (kv(s, e, "Reason", &v, &ve) && !copy_field(r->reason, sizeof(r->reason), v, ve))
        return -1;
    if (kv(s, e, "ExitCode", &v, &ve)) {
        uint32_t code, sig;
        if (!parse_u32(&v, &code) || *v++ != ':' || !parse_u32(&v, &sig) || v != ve || code > 255 ||
            sig > 255)
            return -1;
        r->exit_code = (int)code;
        r->signal = (int)sig;
        r->exit_known = true;
    }
    r->known = true;
    return 1;
}

int slurm_parse_scontrol(const char *text, struct slurm_job_state *rows, size_t max, size_t *n,
                         char **err)
{
    *n = 0;
    for (struct lines l = {.next = text}; next_line(&l);) {
        if (l.e == l.s)
            continue;
        struct slurm_job_state r;
        int got = scontrol_line(l.s, l.e, &r);
        if (got < 0)
            return util_errf(err, -EINVAL, "scontrol line %d '%.80s' is not a job", l.line, l.s);
        if (got > 0) {
            if (*n >= max)
                return util_errf(err, -E2BIG, "scontrol listed more than %zu jobs", max);
            rows[(*n)++] = r;
        }
    }
    return 0;
}

const char *slurm_verdict_name(enum slurm_verdict v)
{
    static const char *const names[] = {"running", "ended",     "failed",  "timeout",
                                        "oom",     "cancelled", "requeue", "unsupported"};
    return (unsigned)v < sizeof(names) / sizeof(names[0]) ? names[v] : "?";
}

/* The rows of docs/scale.md's table, in its order. */
static const struct {
    const char *state;
    enum slurm_verdict v;
    const char *why;
} state_table[] = {
    {"PENDING", SLURM_V_RUNNING, "waiting for resources"},
    {"CONFIGURING", SLURM_V_RUNNING, "its node is being configured"},
    {"RUNNING", SLURM_V_RUNNING, "running"},
    {"COMPLETING", SLURM_V_RUNNING, "its processes are ending"},
    {"SUSPENDED", SLURM_V_RUNNING, "suspended by Slurm"},
    {"REQUEUED", SLURM_V_RUNNING, "requeued by Slurm itself"},
    {"RESIZING", SLURM_V_RUNNING, "being resized"},
    {"SIGNALING", SLURM_V_RUNNING, "being signalled"},
    {"STAGE_OUT", SLURM_V_RUNNING, "staging out"},
    {"STOPPED", SLURM_V_RUNNING, "stopped by Slurm"},
    {"COMPLETED", SLURM_V_ENDED, "the worker exited 0; its end frame decides"},
    {"FAILED", SLURM_V_FAILED, "the worker failed"},
    {"TIMEOUT", SLURM_V_TIMEOUT, "Slurm's time limit passed"},
    {"DEADLINE", SLURM_V_TIMEOUT, "Slurm's deadline passed before the cell finished"},
    {"OUT_OF_MEMORY", SLURM_V_OOM, "the allocation ran out of memory"},
    {"CANCELLED", SLURM_V_CANCELLED, "cancelled in Slurm"},
    {"NODE_FAIL", SLURM_V_REQUEUE, "its node failed"},
    {"PREEMPTED", SLURM_V_REQUEUE, "preempted by another job"},
    {"BOOT_FAIL", SLURM_V_REQUEUE, "its node failed to boot"},
};

void slurm_state_map(const char *state, const char *reason, int exit_code, int signal,
                     struct slurm_mapped *out)
{
    memset(out, 0, sizeof(*out));
    size_t i, n = sizeof(state_table) / sizeof(state_table[0]);
    for (i = 0; i < n; i++)
        if (strcmp(state, state_table[i].state) == 0)
            break;
    if (i == n) {
        out->verdict = SLURM_V_FAILED;
        out->exit_code = exit_code;
        snprintf(out->reason, sizeof(out->reason), "slurm state %.32s is not one capd knows",
                 state);
        return;
    }
    out->verdict = state_table[i].v;
    out->exit_code = exit_code;
    if (strcmp(state, "PENDING") == 0 && reason && strcmp(reason, "BadConstraints") == 0) {
        out->verdict = SLURM_V_UNSUPPORTED;
        snprintf(out->reason, sizeof(out->reason),
                 "no Slurm node has the features the width needs (BadConstraints)");
    } else if (out->verdict == SLURM_V_FAILED && signal > 0) {
        snprintf(out->reason, sizeof(out->reason), "slurm: the worker was killed by signal %d",
                 signal);
    } else if (out->verdict == SLURM_V_FAILED) {
        snprintf(out->reason, sizeof(out->reason), "slurm: the worker exited %d", exit_code);
    } else {
        snprintf(out->reason, sizeof(out->reason), "slurm %s: %s", state, state_table[i].why);
    }
}
