/*
 * compare/cell_timing.c - a cell's timing processes as storage hands them
 * over: each process's wall-clock samples, then what else the runner
 * measured of the same samples (CPU time, own time, device time) and over them (the
 * run-queue delay of every thread, the process's CPU time, the host's
 * steal). Each process is kept as the minima and medians the comparison
 * needs (struct cmp__tproc); only the wall samples are kept whole.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmp_int.h"

/* The smallest of N > 0 samples. */
static double min_of(const int64_t *ns, size_t n)
{
    int64_t m = ns[0];
    for (size_t i = 1; i < n; i++)
        m = ns[i] < m ? ns[i] : m;
    return (double)m;
}

/* A process's samples (wall, CPU or own): each within 0..CMP_MAX_TIMING_NS. */
static bool samples_ok(const int64_t *ns, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ns[i] < 0 || ns[i] > CMP_MAX_TIMING_NS)
            return false;
    return true;
}

int cmp_cell_add_timing_process(struct cmp_cell *cell, const int64_t *samples_ns, size_t n,
                                int64_t pair, bool reference)
{
    if (cell == NULL || (samples_ns == NULL && n > 0) || !samples_ok(samples_ns, n))
        return -EINVAL;
    if (n == 0)
        return 0;
    if (n > CMP_MAX_TIMING_SAMPLES - cell->n_timing)
        return -E2BIG;
    int rc = cmp__grow((void **)&cell->timing, &cell->cap_timing, cell->n_timing + n,
                       sizeof(*cell->timing), CMP_MAX_TIMING_SAMPLES);
    if (rc == 0)
        rc = cmp__grow((void **)&cell->procs, &cell->cap_procs, cell->n_procs + 1,
                       sizeof(*cell->procs), CMP_MAX_TIMING_PROCESSES);
    if (rc < 0)
        return rc;
    memcpy(cell->timing + cell->n_timing, samples_ns, n * sizeof(*samples_ns));
    /* the observation this process contributes */
    double med;
    rc = cmp__median_ns(samples_ns, n, &med);
    if (rc < 0)
        return rc;
    cell->procs[cell->n_procs++] = (struct cmp__tproc){.min_ns = min_of(samples_ns, n),
                                                       .cpu_min_ns = NAN,
                                                       .own_min_ns = NAN,
                                                       .device_min_ns = NAN,
                                                       .median_ns = med,
                                                       .cpu_median_ns = NAN,
                                                       .own_median_ns = NAN,
                                                       .device_median_ns = NAN,
                                                       .runqueue_median_ns = NAN,
                                                       .proc_runqueue_ns = NAN,
                                                       .proc_cpu_ns = NAN,
                                                       .steal_ns = NAN,
                                                       .n_samples = n,
                                                       .pair = pair < 0 ? -1 : pair,
                                                       .reference = reference};
    cell->n_timing += n;
    return 0;
}

/* The last process's samples NS of another clock (CPU time, or device
 * time, which must have as many samples as the wall clock): their median
 * and their minimum. */
static int set_clock(struct cmp_cell *cell, const int64_t *ns, size_t n, bool device)
{
    if (cell == NULL || cell->n_procs == 0 || (ns == NULL && n > 0) || !samples_ok(ns, n))
        return -EINVAL;
    if (n == 0)
        return 0;
    struct cmp__tproc *p = &cell->procs[cell->n_procs - 1];
    if (device && n != p->n_samples)
        return -EINVAL;
    int rc = cmp__median_ns(ns, n, device ? &p->device_median_ns : &p->cpu_median_ns);
    if (rc == 0)
        *(device ? &p->device_min_ns : &p->cpu_min_ns) = min_of(ns, n);
    return rc;
}

int cmp_cell_set_process_cpu(struct cmp_cell *cell, const int64_t *cpu_ns, size_t n)
{
    return set_clock(cell, cpu_ns, n, false);
}

int cmp_cell_set_process_device(struct cmp_cell *cell, const int64_t *device_ns, size_t n)
{
    return set_clock(cell, device_ns, n, true);
}

/*
 * The own samples of the last process, and its timing thread's run-queue
 * delay per sample (wall less own): both medians are computed before
 * either is set, so a failure leaves the process as it was.
 */
int cmp_cell_set_process_own(struct cmp_cell *cell, const int64_t *own_ns, size_t n)
{
    if (cell == NULL || cell->n_procs == 0 || (own_ns == NULL && n > 0))
        return -EINVAL;
    if (n == 0)
        return 0;
    struct cmp__tproc *p = &cell->procs[cell->n_procs - 1];
    const int64_t *wall = cell->timing + cell->n_timing - p->n_samples;
    if (n != p->n_samples || !samples_ok(own_ns, n))
        return -EINVAL;
    int64_t *waited = malloc(n * sizeof(*waited));
    if (waited == NULL)
        return -ENOMEM;
    int rc = -EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (own_ns[i] > wall[i])
            goto out;
        waited[i] = wall[i] - own_ns[i];
    }
    double own, rq;
    if ((rc = cmp__median_ns(own_ns, n, &own)) < 0 || (rc = cmp__median_ns(waited, n, &rq)) < 0)
        goto out;
    p->own_median_ns = own;
    p->own_min_ns = min_of(own_ns, n);
    p->runqueue_median_ns = rq;
out:
    free(waited);
    return rc;
}

/* A total over ITERATIONS as a time per iteration; NaN when unknown. */
static double per_iteration(int64_t total, int64_t iterations)
{
    return total < 0 ? NAN : (double)total / (double)iterations;
}

int cmp_cell_set_process_totals(struct cmp_cell *cell, const struct cmp_proc_totals *t)
{
    if (cell == NULL || cell->n_procs == 0 || t == NULL || t->iterations <= 0 ||
        t->runqueue_ns > CMP_MAX_TIMING_NS || t->cpu_ns > CMP_MAX_TIMING_NS ||
        t->steal_ns > CMP_MAX_TIMING_NS)
        return -EINVAL;
    struct cmp__tproc *p = &cell->procs[cell->n_procs - 1];
    p->proc_runqueue_ns = per_iteration(t->runqueue_ns, t->iterations);
    p->proc_cpu_ns = per_iteration(t->cpu_ns, t->iterations);
    p->steal_ns = per_iteration(t->steal_ns, t->iterations);
    p->measured = true;
    return 0;
}

int cmp_cell_add_timing(struct cmp_cell *cell, const int64_t *samples_ns, size_t n)
{
    return cmp_cell_add_timing_process(cell, samples_ns, n, -1, false);
}
