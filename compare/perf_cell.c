/*
 * compare/perf_cell.c - the perf of one matched cell pair: which timing
 * processes are the evidence, and how the answer reads in JSON.
 *
 * A head cell that carries reference processes (the control's build, timed
 * interleaved with the head's own processes in the head's job) is compared
 * on those pairs: both members of a pair ran back to back on the same CPUs,
 * so drift between jobs cancels. Any other cell is compared unpaired, its
 * own processes against the control cell's own processes. Either way each
 * process is one observation, its fastest sample (cell_timing.c: what
 * other tenants, interrupts and caches can only add to) in the clock of
 * the basis: device time on a GPU cell whose every process has it, own
 * time (wall time less the timing thread's run-queue delay)
 * when every process the design uses has it, else wall time, or CPU time
 * for records from before own time that all have it (docs/compare.md,
 * "Performance"); the medians of the other clocks go beside it. A cell
 * from before processes were recorded has one timing frame, i.e. one
 * observation, and says insufficient_data rather than raising a false
 * alarm.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmp_int.h"

static const struct cmp__tproc *find_ref(const struct cmp_cell *h, int64_t pair)
{
    for (size_t i = 0; i < h->n_procs; i++)
        if (h->procs[i].reference && h->procs[i].pair == pair)
            return &h->procs[i];
    return NULL;
}

static bool has_reference(const struct cmp_cell *h)
{
    for (size_t i = 0; i < h->n_procs; i++)
        if (h->procs[i].reference)
            return true;
    return false;
}

/* A process's observation: its fastest sample in the basis's clock. */
static double obs(const struct cmp__tproc *p, enum cmp_perf_basis b)
{
    return b == CMP_PERF_DEVICE_TIME ? p->device_min_ns
           : b == CMP_PERF_OWN_TIME  ? p->own_min_ns
           : b == CMP_PERF_CPU_TIME  ? p->cpu_min_ns
                                     : p->min_ns;
}

/* The processes a design uses, one side's, and their samples. */
struct used {
    const struct cmp__tproc **p;
    size_t n, samples;
};

static void use(struct used *u, const struct cmp__tproc *p)
{
    u->p[u->n++] = p;
    u->samples += p->n_samples;
}

/* Paired: each of the head cell's own processes with its reference
 * partner; unpaired: the own processes of each cell. */
static void pick(const struct cmp_cell *c, const struct cmp_cell *h, bool paired, struct used *uc,
                 struct used *uh)
{
    if (paired) {
        for (size_t i = 0; i < h->n_procs; i++) {
            const struct cmp__tproc *p = &h->procs[i], *r;
            if (p->reference || p->pair < 0 || (r = find_ref(h, p->pair)) == NULL)
                continue;
            use(uc, r);
            use(uh, p);
        }
        return;
    }
    for (size_t i = 0; i < c->n_procs; i++)
        if (!c->procs[i].reference)
            use(uc, &c->procs[i]);
    for (size_t i = 0; i < h->n_procs; i++)
        if (!h->procs[i].reference)
            use(uh, &h->procs[i]);
}

/*
 * The basis of the processes used (docs/compare.md, "Performance"): device
 * time when every one has it (a GPU cell); else own time when every one
 * has it; else wall time, but for records from before
 * own time whose every process has CPU-time samples, which keep the CPU
 * basis they were judged on.
 */
static void basis_of(const struct used *u, struct cmp_perf *out)
{
    size_t n = 0, own = 0, cpu = 0, measured = 0, device = 0;
    for (int side = 0; side < 2; side++)
        for (size_t i = 0; i < u[side].n; i++, n++) {
            own += !isnan(u[side].p[i]->own_median_ns);
            device += !isnan(u[side].p[i]->device_median_ns);
            cpu += !isnan(u[side].p[i]->cpu_median_ns);
            measured += u[side].p[i]->measured;
        }
    out->basis_lacking = n - own;
    out->basis = CMP_PERF_WALL_TIME;
    out->basis_why = CMP_PERF_WHY_NONE; /* no timing: nothing to explain */
    if (n > 0 && device == n) {
        out->basis = CMP_PERF_DEVICE_TIME;
    } else if (n > 0 && own == n) {
        out->basis = CMP_PERF_OWN_TIME;
    } else if (n == 0) {
        return;
    } else if (measured == n) {
        out->basis_why = CMP_PERF_WHY_NO_RUNQUEUE;
    } else if (measured > 0) {
        out->basis_why = CMP_PERF_WHY_MIXED;
    } else if (cpu == n) {
        out->basis = CMP_PERF_CPU_TIME;
        out->basis_why = CMP_PERF_WHY_OLD_CPU;
    } else {
        out->basis_why = CMP_PERF_WHY_OLD_WALL;
    }
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median over U's processes of the clock at byte OFF of a process,
 * over those that have it; NaN when none has. TMP holds U->n doubles. */
static double clock_median(const struct used *u, size_t off, double *tmp)
{
    size_t k = 0;
    for (size_t i = 0; i < u->n; i++) {
        double v;
        memcpy(&v, (const char *)u->p[i] + off, sizeof v);
        if (!isnan(v))
            tmp[k++] = v;
    }
    if (k == 0)
        return NAN;
    qsort(tmp, k, sizeof *tmp, by_value);
    return k % 2 ? tmp[k / 2] : (tmp[k / 2 - 1] + tmp[k / 2]) / 2;
}

static void times_of(const struct used *u, double *tmp, struct cmp_perf_times *t)
{
    t->wall_ns = clock_median(u, offsetof(struct cmp__tproc, median_ns), tmp);
    t->own_ns = clock_median(u, offsetof(struct cmp__tproc, own_median_ns), tmp);
    t->cpu_ns = clock_median(u, offsetof(struct cmp__tproc, cpu_median_ns), tmp);
    t->runqueue_ns = clock_median(u, offsetof(struct cmp__tproc, runqueue_median_ns), tmp);
    t->proc_runqueue_ns = clock_median(u, offsetof(struct cmp__tproc, proc_runqueue_ns), tmp);
    t->proc_cpu_ns = clock_median(u, offsetof(struct cmp__tproc, proc_cpu_ns), tmp);
    t->steal_ns = clock_median(u, offsetof(struct cmp__tproc, steal_ns), tmp);
    t->device_ns = clock_median(u, offsetof(struct cmp__tproc, device_median_ns), tmp);
}

int cmp__perf_cells(const struct cmp_cell *c, const struct cmp_cell *h, bool refused,
                    const struct cmp_options *o, struct cmp_perf *out)
{
    size_t cap = (c->n_procs > h->n_procs ? c->n_procs : h->n_procs) + 1;
    double *vc = malloc(cap * sizeof(*vc)), *vh = malloc(cap * sizeof(*vh));
    struct used u[2] = {{malloc(cap * sizeof(*u[0].p)), 0, 0},
                        {malloc(cap * sizeof(*u[1].p)), 0, 0}};
    enum cmp_perf_design d = !refused && has_reference(h) ? CMP_PERF_PAIRED : CMP_PERF_UNPAIRED;
    struct cmp_perf b = {0};
    int rc = -ENOMEM;

    if (vc == NULL || vh == NULL || u[0].p == NULL || u[1].p == NULL)
        goto out;
    if (!refused)
        pick(c, h, d == CMP_PERF_PAIRED, &u[0], &u[1]);
    basis_of(u, &b);
    for (size_t i = 0; i < u[0].n; i++)
        vc[i] = obs(u[0].p[i], b.basis);
    for (size_t i = 0; i < u[1].n; i++)
        vh[i] = obs(u[1].p[i], b.basis);
    rc = cmp_perf_compare(vc, u[0].n, vh, u[1].n, d, o, out);
    out->samples_control = u[0].samples;
    out->samples_head = u[1].samples;
    out->basis = b.basis;
    out->basis_why = b.basis_why;
    out->basis_lacking = b.basis_lacking;
    times_of(&u[0], vc, &out->times[0]);
    times_of(&u[1], vc, &out->times[1]);
out:
    free(vc);
    free(vh);
    free(u[0].p);
    free(u[1].p);
    return rc;
}

static const char *verdict_name(enum cmp_perf_verdict v)
{
    static const char *const names[] = {[CMP_PERF_INSUFFICIENT_DATA] = "insufficient_data",
                                        [CMP_PERF_SAME] = "same",
                                        [CMP_PERF_UNKNOWN] = "unknown",
                                        [CMP_PERF_REGRESSION] = "regression",
                                        [CMP_PERF_IMPROVEMENT] = "improvement",
                                        [CMP_PERF_UNSTABLE] = "unstable"};
    return (unsigned)v < sizeof names / sizeof names[0] ? names[v] : "insufficient_data";
}

/* Why a cell has the verdict it has, in one sentence for the reports. */
static void reason(const struct cmp_perf *p, const struct cmp_options *o, char *buf, size_t len)
{
    const char *unit = p->design == CMP_PERF_PAIRED ? "pairs" : "timing processes a side";
    switch (p->verdict) {
    case CMP_PERF_INSUFFICIENT_DATA:
        if (p->n_control == 0 || p->n_head == 0)
            snprintf(buf, len, "no timing on %s", p->n_control == 0 ? "the control" : "the head");
        else
            snprintf(buf, len, "%zu/%zu observations cannot reach alpha %g (needs %zu %s)",
                     p->n_control, p->n_head, o->alpha, p->min_n, unit);
        break;
    case CMP_PERF_UNSTABLE:
        snprintf(buf, len, "spread %.1f%% is wider than the threshold %.1f%%", 100 * p->spread,
                 100 * o->perf_threshold);
        break;
    case CMP_PERF_UNKNOWN:
        snprintf(buf, len,
                 "neither the 99%% interval lies past 1 +- %g nor the 90%% interval within it",
                 o->perf_threshold);
        break;
    default:
        buf[0] = 0;
    }
}

static int interval_json(json_t *o, const char *key, double lo, double hi)
{
    if (!isfinite(lo) || !isfinite(hi))
        return cmp__set(o, key, json_null());
    json_t *ci = json_pack("[f,f]", lo, hi);
    return ci ? cmp__set(o, key, ci) : -ENOMEM;
}

/* "ci99", the alarms' interval, and "ci90", the equivalence test's (`same`). */
static int ci_json(json_t *o, const struct cmp_perf *p)
{
    int rc = interval_json(o, "ci99", p->ci_lo, p->ci_hi);
    return rc ? rc : interval_json(o, "ci90", p->eq_lo, p->eq_hi);
}

/* Why the basis is not own time, in one sentence; "" when it is. */
static void basis_reason(const struct cmp_perf *p, char *buf, size_t len)
{
    size_t n = p->n_control + p->n_head;
    switch (p->basis_why) {
    case CMP_PERF_WHY_NO_RUNQUEUE:
        snprintf(buf, len,
                 "the kernel gave no run-queue delay for %zu of %zu timing processes: wall time, "
                 "which holds on the exclusive CPUs of timing cells",
                 p->basis_lacking, n);
        break;
    case CMP_PERF_WHY_MIXED:
        snprintf(buf, len,
                 "%zu of %zu timing processes have no own time (an older runner): wall time",
                 p->basis_lacking, n);
        break;
    case CMP_PERF_WHY_OLD_CPU:
        snprintf(buf, len, "records from before own time: CPU time, as they were judged then");
        break;
    case CMP_PERF_WHY_OLD_WALL:
        snprintf(buf, len, "records from before own time: wall time");
        break;
    default:
        buf[0] = 0;
    }
}

/* The medians of one side's clocks, per iteration (docs/compare.md). */
static json_t *times_json(const struct cmp_perf_times *t)
{
    json_t *o = json_object();
    const struct cmp__real f[] = {
        {"wall_ns", t->wall_ns},
        {"own_ns", t->own_ns},
        {"cpu_ns", t->cpu_ns},
        {"runqueue_ns", t->runqueue_ns},
        {"process_runqueue_ns", t->proc_runqueue_ns},
        {"process_cpu_ns", t->proc_cpu_ns},
        {"steal_ns", t->steal_ns},
        {"device_ns", t->device_ns},
    };
    if (o && cmp__set_reals(o, f, sizeof f / sizeof f[0])) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* basis, basis_reason and times: the clock judged and every other beside it. */
static int basis_json(json_t *o, const struct cmp_perf *p)
{
    static const char *const names[] = {[CMP_PERF_WALL_TIME] = "wall_time",
                                        [CMP_PERF_CPU_TIME] = "cpu_time",
                                        [CMP_PERF_OWN_TIME] = "own_time",
                                        [CMP_PERF_DEVICE_TIME] = "device_time"};
    char why[192];
    int rc = 0;
    basis_reason(p, why, sizeof why);
    rc |= cmp__set(o, "basis", json_string(names[p->basis]));
    rc |= cmp__set(o, "basis_reason", why[0] ? json_string(why) : json_null());
    json_t *t = json_object();
    rc |= t ? cmp__set(o, "times", t) : -ENOMEM;
    if (t) {
        rc |= cmp__set(t, "control", times_json(&p->times[0]));
        rc |= cmp__set(t, "head", times_json(&p->times[1]));
    }
    return rc;
}

int cmp__perf_json(const struct cmp_perf *p, const struct cmp_options *opt, json_t **out)
{
    int rc = 0;
    char why[192];
    json_t *o = json_object();
    if (o == NULL)
        return -ENOMEM;
    reason(p, opt, why, sizeof why);
    bool tested = p->n_control && p->n_head;
    rc |= cmp__set(o, "design", json_string(p->design == CMP_PERF_PAIRED ? "paired" : "unpaired"));
    rc |= basis_json(o, p);
    rc |= cmp__set_real(o, "control_median_ns", p->control_median_ns);
    rc |= cmp__set_real(o, "head_median_ns", p->head_median_ns);
    rc |= cmp__set_real(o, "ratio", p->ratio);
    rc |= ci_json(o, p);
    rc |= cmp__set_real(o, "p_value", p->p_value);
    bool paired = p->design == CMP_PERF_PAIRED;
    const char *method = paired ? "t" : p->p_exact ? "exact" : "normal";
    rc |= cmp__set(o, "p_method", tested ? json_string(method) : json_null());
    rc |= cmp__set(o, "test", json_string(paired ? "paired_t" : "mann_whitney"));
    rc |= cmp__set_real(o, paired ? "t" : "u", p->u);
    rc |= cmp__set_real(o, "hl_shift_ns", p->hl_shift_ns);
    rc |= cmp__set_real(o, "min_p", p->min_p);
    rc |= cmp__set(o, "min_n", json_integer((json_int_t)p->min_n));
    rc |= cmp__set_real(o, "spread", p->spread);
    rc |= cmp__set_real(o, "mde", p->mde);
    rc |= cmp__set(o, "verdict", json_string(verdict_name(p->verdict)));
    rc |= cmp__set(o, "reason", why[0] ? json_string(why) : json_null());
    rc |= cmp__set(o, "n_control", json_integer((json_int_t)p->n_control));
    rc |= cmp__set(o, "n_head", json_integer((json_int_t)p->n_head));
    rc |= cmp__set(o, "pairs",
                   json_integer(p->design == CMP_PERF_PAIRED ? (json_int_t)p->n_head : 0));
    rc |= cmp__set(o, "samples_control", json_integer((json_int_t)p->samples_control));
    rc |= cmp__set(o, "samples_head", json_integer((json_int_t)p->samples_head));
    if (rc) {
        json_decref(o);
        return -ENOMEM;
    }
    *out = o;
    return 0;
}
