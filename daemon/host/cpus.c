/*
 * daemon/host/cpus.c - exclusive CPU sets for timing cells (daemon/host/cpus.h).
 *
 * The bookkeeping is two sets and a count per CPU: a CPU held by a timing
 * cell belongs to it alone; a CPU held by numerics-only cells is counted,
 * so the last of them to end gives it back.
 */
#include "daemon/host/cpus.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

int cpus_pool_init(struct cpus_pool *p, const int *host, int n)
{
    int refused = 0;
    memset(p, 0, sizeof *p);
    CPU_ZERO(&p->host);
    CPU_ZERO(&p->timing);
    for (int i = 0; i < n; i++) {
        if (host[i] < 0 || host[i] >= CPU_SETSIZE) {
            refused++;
            continue;
        }
        CPU_SET(host[i], &p->host);
    }
    return refused ? -E2BIG : 0;
}

static bool free_for(const struct cpus_pool *p, int cpu, bool timing)
{
    if (!CPU_ISSET(cpu, &p->host) || CPU_ISSET(cpu, &p->timing))
        return false;
    if (!timing && p->shared[cpu] == USHRT_MAX)
        return false; /* the count cannot go higher: not for one more cell */
    return !timing || p->shared[cpu] == 0;
}

bool cpus_can_start(const struct cpus_pool *p, bool timing)
{
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (free_for(p, cpu, timing))
            return true;
    return false;
}

int cpus_take(struct cpus_pool *p, bool timing, int want, cpu_set_t *out)
{
    int got = 0;
    CPU_ZERO(out);
    /* Timing from the highest CPU down (see the header); numerics-only
     * cells take every free CPU, so their order does not matter. */
    for (int i = 0; i < CPU_SETSIZE && (!timing || got < want); i++) {
        int cpu = timing ? CPU_SETSIZE - 1 - i : i;
        if (!free_for(p, cpu, timing))
            continue;
        CPU_SET(cpu, out);
        got++;
    }
    if (got == 0)
        return -EBUSY;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, out))
            continue;
        if (timing)
            CPU_SET(cpu, &p->timing);
        else
            p->shared[cpu]++;
    }
    return got;
}

void cpus_release(struct cpus_pool *p, bool timing, const cpu_set_t *set)
{
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, set))
            continue;
        if (timing)
            CPU_CLR(cpu, &p->timing);
        else if (p->shared[cpu] > 0)
            p->shared[cpu]--;
    }
}

json_t *cpus_json(const cpu_set_t *set)
{
    json_t *a = json_array();
    for (int cpu = 0; a && cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, set) && json_array_append_new(a, json_integer(cpu))) {
            json_decref(a);
            return NULL;
        }
    return a;
}
