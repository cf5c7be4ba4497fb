/*
 * daemon/host/cpus.h - which CPUs each running cell may use, so that a timing
 * process never shares its CPUs with another cell's work.
 *
 * A cell that times (options.iterations > 0 on the CPU) takes an exclusive
 * set: as many CPUs as its threads, none held by any other running cell,
 * the highest-numbered free ones first. CPU 0 is where Linux does most of
 * its housekeeping and interrupt work on common hosts: on a 16-CPU KVM
 * guest, CPU 0 had spent 20 times the system time of any other, and every
 * timing process pinned there saw pair ratios off by up to 1.8x in CPU
 * time (docs/performance.md). A
 * numerics-only cell (nothing timed) takes every CPU no timing cell holds,
 * shared with other numerics-only cells. The scheduler asks cpus_can_start()
 * before claiming, so a timing cell waits until enough CPUs are free; on a
 * one-CPU host that serialises everything that involves timing. The set
 * goes into the cell spec ("cpus"); the runner pins itself and its timing
 * processes to it and reports it in every timing frame.
 *
 * Single-threaded (the loop thread). CPUs numbered CPU_SETSIZE or above
 * cannot be represented: cpus_pool_init() refuses them and says how many
 * (-E2BIG with the rest usable).
 */
#ifndef CAPD_DAEMON_CPUS_H
#define CAPD_DAEMON_CPUS_H

#include <sched.h>
#include <stdbool.h>

#include <jansson.h>

struct cpus_pool {
    cpu_set_t host;                     /* the CPUs capd may use */
    cpu_set_t timing;                   /* held exclusively by timing cells */
    unsigned short shared[CPU_SETSIZE]; /* numerics-only cells holding each CPU */
};

/* From the CPU numbers in host[0..n); -E2BIG when some were past CPU_SETSIZE. */
int cpus_pool_init(struct cpus_pool *p, const int *host, int n);
/* Whether a cell of this kind could take CPUs now. */
bool cpus_can_start(const struct cpus_pool *p, bool timing);
/* Takes a set (see above; want: a timing cell's threads); returns how many
 * CPUs, or -EBUSY when none is free for it. */
int cpus_take(struct cpus_pool *p, bool timing, int want, cpu_set_t *out);
void cpus_release(struct cpus_pool *p, bool timing, const cpu_set_t *set);
/* The set as a JSON array of CPU numbers (NULL on allocation failure). */
json_t *cpus_json(const cpu_set_t *set);

#endif
