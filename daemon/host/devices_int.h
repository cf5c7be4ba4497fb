/*
 * daemon/host/devices_int.h - what daemon/host/devices.c (the probe and the
 * list) and daemon/host/devplace.c (which cells hold which device) share;
 * nothing else includes it.
 */
#ifndef CAPD_DEVICES_INT_H
#define CAPD_DEVICES_INT_H

#include <pthread.h>

#include "daemon/host/devices.h"

struct probe;

/* One cell on a device: who, and the device memory it reserved. */
struct devices_holder {
    char job[16], cell[16];
    int64_t reserved;
};

/* What one device index carries: the cells on it, whether the one there
 * holds it alone, and the bytes they reserved together. */
struct devices_slot {
    int n;
    bool alone;
    int64_t reserved;
    struct devices_holder h[CAPD_MAX_GPU_CELLS_PER_DEVICE];
};

struct devices {
    const struct capd_config *cfg;
    pthread_mutex_t mu;

    /* The list, guarded by mu (HTTP threads read it). */
    json_t *answer;             /* the last good probe output; NULL before one */
    int ndev;                   /* devices in answer */
    int index[DEVICES_MAX];     /* their indices, in list order */
    int64_t total[DEVICES_MAX]; /* total_memory_bytes by index; -1 when not given */
    bool amd;                   /* answer's platform is "amd" */
    char reason[1024];          /* why there is no device ("" when there are) */
    char probe_error[1024];     /* why the last attempt failed ("" when it did not) */
    int64_t generation;         /* attempts finished */
    int64_t probed_at_ms;       /* when the last attempt finished */
    bool probing;

    /* Which cells hold which device index (mu held while writing, so
     * devices_json sees a consistent picture). */
    struct devices_slot slot[DEVICES_MAX];
    /* Why a device left the pool ("" while it is in), by index: a cell's
     * device error; a probe that answers puts every device back. */
    char failed[DEVICES_MAX][512];

    /* Loop-only state of the asynchronous refresh. */
    struct probe *p;
    bool again;
    uv_loop_t *loop;
    void (*changed)(void *ud);
    void *ud;
};

/* Adds device INDEX's holders, in_use, job, cell, alone, reserved_bytes,
 * budget_bytes and failed to C (its copy of the probe's object); mu is
 * held. Returns whether the device is free (in the pool, no holder). */
bool devices__slot_json(const struct devices *dv, int index, json_t *c);

#endif
