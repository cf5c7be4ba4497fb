/*
 * daemon/host/memwatch.c - the watchdog of daemon/host/memlimit.h: where capd has no
 * cgroup to limit a cell with, a timer on the loop samples the resident
 * memory of every process in each watched cell's process group and kills
 * the group once the sum passes the cell's limit.
 *
 * A prefork cell is two process groups: capd-exec's, which capd started,
 * and the zygote's child's (the zygote forks it into a session of its
 * own), which capd-exec names on its rusage pipe and cellproc.c adopts; both
 * are summed, and both are killed.
 *
 * One walk of /proc per tick serves every watched cell (util/procmem.h).
 * A cell can grow by what it allocates in 100 ms past its limit before it
 * is seen; that is the price of a mechanism without the kernel's help, and
 * why the cgroup ones are preferred.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/log.h"
#include "util/procmem.h"
#include "daemon/host/memlimit_int.h"

static struct {
    struct mem_cell *cells[MEM_WATCH_CELLS];
    int n;
    uv_timer_t timer;
    bool have_timer, running;
} w;

int64_t mem__group_rss(pid_t pgid)
{
    return util_pgrp_rss(pgid);
}

/* Every watched cell has its leader's group at 2i and, once adopted, the
 * prefork zygote child's at 2i+1 (0, matching no process, before). */
static void on_tick(uv_timer_t *t)
{
    static pid_t pgids[2 * MEM_WATCH_CELLS];
    static int64_t sum[2 * MEM_WATCH_CELLS];
    (void)t;
    for (int i = 0; i < w.n; i++) {
        pgids[2 * i] = w.cells[i]->pgid;
        pgids[2 * i + 1] = w.cells[i]->pgid2;
        sum[2 * i] = sum[2 * i + 1] = 0;
    }
    util_pgrp_rss_sum(pgids, 2 * w.n, sum);
    for (int i = 0; i < w.n; i++) {
        struct mem_cell *c = w.cells[i];
        int64_t rss = sum[2 * i] + sum[2 * i + 1];
        if (rss > c->peak)
            c->peak = rss;
        if (c->oom || (uint64_t)rss <= c->limit)
            continue;
        c->oom = true;
        if (c->pgid2 > 0)
            kill(-c->pgid2, SIGKILL);
        kill(-c->pgid, SIGKILL);
        log_warn("cell_oom_kill", "pgid=%d mechanism=watchdog rss_bytes=%lld limit_bytes=%llu",
                 (int)(c->pgid2 > 0 ? c->pgid2 : c->pgid), (long long)rss,
                 (unsigned long long)c->limit);
    }
}

void mem__watch_start(uv_loop_t *loop)
{
    if (w.have_timer)
        return;
    uv_timer_init(loop, &w.timer);
    /* Never what keeps the loop running: cells are. */
    uv_unref((uv_handle_t *)&w.timer);
    w.have_timer = true;
}

int mem__watch_add(struct mem_cell *c)
{
    if (w.n >= MEM_WATCH_CELLS) {
        log_error("cell_watch_full", "cells=%d max=%d", w.n, MEM_WATCH_CELLS);
        return -ENOSPC;
    }
    c->slot = w.n;
    w.cells[w.n++] = c;
    if (w.have_timer && !w.running) {
        uv_timer_start(&w.timer, on_tick, MEM_WATCH_MS, MEM_WATCH_MS);
        w.running = true;
    }
    return 0;
}

void mem__watch_remove(struct mem_cell *c)
{
    if (c->slot < 0 || c->slot >= w.n || w.cells[c->slot] != c)
        return;
    w.cells[c->slot] = w.cells[--w.n];
    w.cells[c->slot]->slot = c->slot;
    c->slot = -1;
    if (w.n == 0 && w.running) {
        uv_timer_stop(&w.timer);
        w.running = false;
    }
}
