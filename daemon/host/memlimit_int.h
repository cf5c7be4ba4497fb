/*
 * daemon/host/memlimit_int.h - what daemon/host/cgroup.c (the mechanism, the groups)
 * and daemon/host/memwatch.c (the watchdog) share; nothing else includes it.
 */
#ifndef CAPD_MEMLIMIT_INT_H
#define CAPD_MEMLIMIT_INT_H

#include "daemon/host/memlimit.h"

struct mem_cell {
    char dir[700]; /* the group's directory; "" under the watchdog */
    int procs_fd;  /* its cgroup.procs, for the child; -1 */
    uint64_t limit;
    pid_t pgid;   /* the watched process group; 0 when not watched */
    pid_t pgid2;  /* the prefork zygote's child's group, adopted; 0 */
    int slot;     /* index in the watchdog's table; -1 */
    bool oom;     /* killed for memory */
    int64_t peak; /* bytes; -1 unknown */
};

/* The watchdog (memwatch.c): every MEM_WATCH_MS the resident memory of each
 * watched cell's process group is added up; past its limit the group is
 * SIGKILLed and the cell marked oom. -ENOSPC when MEM_WATCH_CELLS are
 * watched already. */
void mem__watch_start(uv_loop_t *loop);
int mem__watch_add(struct mem_cell *c);
void mem__watch_remove(struct mem_cell *c);
/* One sample of process group PGID now (bytes resident), for tests of
 * the sum and for the last look at collect time. */
int64_t mem__group_rss(pid_t pgid);

#endif
