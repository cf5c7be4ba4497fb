/*
 * compare/perf_cell.c - the perf of one matched cell pair: which timing
 * processes are the evidence, and how the answer reads in JSON.
 *
 * A head cell that carries reference processes (the control's build, timed
 * interleaved with the head's own processes in the head's job) is compared
 * on those pairs: both members of a pair ran back to back on the same CPUs,
 * so drift between jobs cancels. Any other cell is compared unpaired, its
 * own processes against the control cell's own processes. Either way each
 * process is one observation, its median (cell.c), of its CPU-time
 * samples when every process the design uses has them (basis cpu_time: a
 * process that shared its CPU with another tenant accrued no CPU time
 * while it waited, where its wall clock ran on), else of its wall-clock
 * samples (wall_time: older runners, several threads, GPUs); a cell from before
 * processes were recorded has one timing frame, i.e. one observation, and
 * says insufficient_data rather than raising a false alarm.
 */
#include <errno.h>
#include <math.h>
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

/* A process's observation: its CPU-time median on the CPU basis. */
static double obs(const struct cmp__tproc *p, bool cpu)
{
    return cpu ? p->cpu_median_ns : p->median_ns;
}

/* Own processes of a cell; samples counted into *ns. */
static size_t own_obs(const struct cmp_cell *c, bool cpu, double *v, size_t *ns)
{
    size_t n = 0;
    for (size_t i = 0; i < c->n_procs; i++)
        if (!c->procs[i].reference) {
            v[n++] = obs(&c->procs[i], cpu);
            *ns += c->procs[i].n_samples;
        }
    return n;
}

/* Whether every process the design uses has CPU-time samples; paired,
 * those of the head cell, else the own ones of both cells. */
static bool all_cpu(const struct cmp_cell *c, const struct cmp_cell *h, bool paired)
{
    size_t n = 0;
    for (int side = paired; side < 2; side++) {
        const struct cmp_cell *x = side ? h : c;
        for (size_t i = 0; i < x->n_procs; i++) {
            if (!paired && x->procs[i].reference)
                continue;
            if (isnan(x->procs[i].cpu_median_ns))
                return false;
            n++;
        }
    }
    return n > 0;
}

int cmp__perf_cells(const struct cmp_cell *c, const struct cmp_cell *h, bool refused,
                    const struct cmp_options *o, struct cmp_perf *out)
{
    size_t cap = (c->n_procs > h->n_procs ? c->n_procs : h->n_procs) + 1;
    double *vc = malloc(cap * sizeof(*vc)), *vh = malloc(cap * sizeof(*vh));
    size_t nc = 0, nh = 0, sc = 0, sh = 0;
    enum cmp_perf_design d = CMP_PERF_UNPAIRED;
    int rc = -ENOMEM;
    bool cpu = false;

    if (vc == NULL || vh == NULL)
        goto out;
    if (!refused && has_reference(h)) {
        d = CMP_PERF_PAIRED;
        cpu = all_cpu(c, h, true);
        for (size_t i = 0; i < h->n_procs; i++) {
            const struct cmp__tproc *p = &h->procs[i], *r;
            if (p->reference || p->pair < 0 || (r = find_ref(h, p->pair)) == NULL)
                continue;
            vc[nc++] = obs(r, cpu);
            vh[nh++] = obs(p, cpu);
            sc += r->n_samples;
            sh += p->n_samples;
        }
    } else if (!refused) {
        cpu = all_cpu(c, h, false);
        nc = own_obs(c, cpu, vc, &sc);
        nh = own_obs(h, cpu, vh, &sh);
    }
    rc = cmp_perf_compare(vc, nc, vh, nh, d, o, out);
    out->samples_control = sc;
    out->samples_head = sh;
    out->cpu_time = cpu;
out:
    free(vc);
    free(vh);
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
        snprintf(buf, len, "the interval is neither past nor within 1 +- %g", o->perf_threshold);
        break;
    default:
        buf[0] = 0;
    }
}

static int ci_json(json_t *o, const struct cmp_perf *p)
{
    if (!isfinite(p->ci_lo) || !isfinite(p->ci_hi))
        return cmp__set(o, "ci99", json_null());
    json_t *ci = json_pack("[f,f]", p->ci_lo, p->ci_hi);
    return ci ? cmp__set(o, "ci99", ci) : -ENOMEM;
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
    rc |= cmp__set(o, "basis", json_string(p->cpu_time ? "cpu_time" : "wall_time"));
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
