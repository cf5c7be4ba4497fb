/*
 * daemon/host/devplace.c - which cells hold which GPU: the placement rule
 * of daemon/host/devices.h (timing cells alone, numerics-only cells
 * shared within a count and a memory budget, spread over the devices),
 * the visibility variables that confine a cell to its device, and the
 * holders GET /v1/devices shows.
 *
 * Everything but devices__slot_json runs on the daemon loop; the slots
 * are written under the module's lock so that HTTP threads reading the
 * list see a consistent picture.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "daemon/host/devices_int.h"
#include "util/log.h"

static bool wants_gpu(const struct store_cell_run *run)
{
    return strcmp(run->opts.device, "gpu") == 0;
}

/* Device INDEX's budget: gpu_memory_fraction of its memory, or -1 when the
 * probe gave no memory figure. */
static int64_t budget(const struct devices *dv, int index)
{
    if (dv->total[index] <= 0)
        return -1;
    return (int64_t)((double)dv->total[index] * dv->cfg->gpu_memory_fraction);
}

/* What shared cell C reserves on device INDEX: its recorded peak plus the
 * context's allowance, else an even share of the budget (0 with no
 * budget: only the count limits). */
static int64_t estimate(const struct devices *dv, int index, const struct store_gpu_cell *c)
{
    if (c->peak_bytes >= 0)
        return c->peak_bytes + DEVICES_CONTEXT_BYTES;
    int64_t b = budget(dv, index);
    return b < 0 ? 0 : b / dv->cfg->gpu_cells_per_device;
}

/* Whether cell C would hold device INDEX alone: it times, was sent back
 * to run alone, or its reservation is above the whole budget (it would
 * otherwise wait forever). */
static bool goes_alone(const struct devices *dv, int index, const struct store_gpu_cell *c)
{
    int64_t b = budget(dv, index);
    return c->alone || (b >= 0 && estimate(dv, index, c) > b);
}

/* Whether device INDEX can take cell C now. */
static bool fits(const struct devices *dv, int index, const struct store_gpu_cell *c)
{
    const struct devices_slot *sl = &dv->slot[index];
    if (dv->failed[index][0])
        return false;
    if (goes_alone(dv, index, c))
        return sl->n == 0;
    int64_t b = budget(dv, index);
    return !sl->alone && sl->n < dv->cfg->gpu_cells_per_device &&
           sl->n < CAPD_MAX_GPU_CELLS_PER_DEVICE &&
           (b < 0 || sl->reserved + estimate(dv, index, c) <= b);
}

/* The budget device INDEX has left (no figure: as if unlimited). */
static int64_t room_left(const struct devices *dv, int index)
{
    int64_t b = budget(dv, index);
    return b < 0 ? INT64_MAX : b - dv->slot[index].reserved;
}

/* The device cell C goes to now, or -1: of those it fits, the one with
 * the fewest holders, then the most budget left, then the first listed. */
static int pick(const struct devices *dv, const struct store_gpu_cell *c)
{
    int best = -1;
    for (int i = 0; i < dv->ndev; i++) {
        int x = dv->index[i];
        if (!fits(dv, x, c))
            continue;
        if (best < 0 || dv->slot[x].n < dv->slot[best].n ||
            (dv->slot[x].n == dv->slot[best].n && room_left(dv, x) > room_left(dv, best)))
            best = x;
    }
    return best;
}

/* The first device still in the pool, or -1 when every one left it. */
static int first_in_pool(const struct devices *dv)
{
    for (int i = 0; i < dv->ndev; i++)
        if (!dv->failed[dv->index[i]][0])
            return dv->index[i];
    return -1;
}

bool devices_room(struct devices *dv, const struct store_gpu_cell *c)
{
    return dv->ndev == 0 || first_in_pool(dv) < 0 || pick(dv, c) >= 0;
}

/*
 * Which variables make device INDEX the child's only device, and its
 * cuda:0. CUDA reads CUDA_VISIBLE_DEVICES (in CUDA_DEVICE_ORDER, pinned to
 * PCI bus order as for the probe). On AMD the layers stack: ROCr filters
 * first (ROCR_VISIBLE_DEVICES), and HIP_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES
 * then index what ROCr left, so after ROCR_VISIBLE_DEVICES=i the device is
 * 0 for them; the same i in all three would hide it. NCCL_NVLS_ENABLE=0
 * keeps NCCL (RCCL reads the same name) off NVLink multicast, which a
 * device shared with other cells, or a host whose fabric manager does not
 * offer it, cannot give every process.
 */
static json_t *visibility_env(bool amd, int index)
{
    char i[16];
    snprintf(i, sizeof i, "%d", index);
    if (amd)
        return json_pack("{s:s,s:s,s:s,s:s,s:s}", "ROCR_VISIBLE_DEVICES", i, "HIP_VISIBLE_DEVICES",
                         "0", "CUDA_VISIBLE_DEVICES", "0", "CUDA_DEVICE_ORDER", "PCI_BUS_ID",
                         "NCCL_NVLS_ENABLE", "0");
    return json_pack("{s:s,s:s,s:s,s:s,s:s}", "CUDA_VISIBLE_DEVICES", i, "HIP_VISIBLE_DEVICES", i,
                     "ROCR_VISIBLE_DEVICES", i, "CUDA_DEVICE_ORDER", "PCI_BUS_ID",
                     "NCCL_NVLS_ENABLE", "0");
}

/* Why no device takes the cell, into REASON. */
static void no_device(const struct devices *dv, char *reason, size_t rlen)
{
    if (dv->ndev == 0)
        snprintf(reason, rlen, "options.device is gpu but this host has no GPU device (%s)",
                 dv->reason[0] ? dv->reason : "see GET /v1/devices");
    else if (first_in_pool(dv) < 0)
        snprintf(reason, rlen,
                 "every GPU device is out of the pool (device %d: %.400s); POST "
                 "/v1/devices/refresh puts them back",
                 dv->index[0], dv->failed[dv->index[0]]);
    else
        snprintf(reason, rlen,
                 "no GPU device can take this cell now (gpu_cells_per_device %d, "
                 "gpu_memory_fraction %g)",
                 dv->cfg->gpu_cells_per_device, dv->cfg->gpu_memory_fraction);
}

int devices_acquire(struct devices *dv, struct store_cell_run *run, const struct store_gpu_cell *c,
                    int *index, char *reason, size_t rlen)
{
    *index = -1;
    if (!wants_gpu(run))
        return 0;
    int x = c && dv->ndev > 0 ? pick(dv, c) : -1;
    if (x < 0) {
        no_device(dv, reason, rlen);
        return -ENODEV;
    }
    bool alone = goes_alone(dv, x, c);
    int64_t b = budget(dv, x);
    int64_t reserve = alone ? (b < 0 ? 0 : b) : estimate(dv, x, c);
    json_t *env = visibility_env(dv->amd, x);
    if (!env || json_object_set_new(run->spec, "device_env", env) != 0 ||
        json_object_set_new(run->spec, "device_share", json_string(alone ? "alone" : "shared"))) {
        snprintf(reason, rlen, "capd ran out of memory assigning a GPU device");
        return -ENOMEM;
    }
    pthread_mutex_lock(&dv->mu);
    struct devices_slot *sl = &dv->slot[x];
    struct devices_holder *h = &sl->h[sl->n++];
    snprintf(h->job, sizeof h->job, "%s", run->job_id);
    snprintf(h->cell, sizeof h->cell, "%s", run->cell_id);
    h->reserved = reserve;
    sl->alone = alone;
    sl->reserved += reserve;
    pthread_mutex_unlock(&dv->mu);
    log_info("cell_device", "job=%s cell=%s device=%d share=%s reserved_bytes=%lld holders=%d",
             run->job_id, run->cell_id, x, alone ? "alone" : "shared", (long long)reserve, sl->n);
    *index = x;
    return 0;
}

void devices_release(struct devices *dv, int index, const char *cell_id)
{
    if (!dv || index < 0 || index >= DEVICES_MAX)
        return;
    pthread_mutex_lock(&dv->mu);
    struct devices_slot *sl = &dv->slot[index];
    for (int i = 0; i < sl->n; i++)
        if (strcmp(sl->h[i].cell, cell_id) == 0) {
            sl->reserved -= sl->h[i].reserved;
            sl->h[i] = sl->h[--sl->n];
            break;
        }
    if (sl->n == 0) {
        sl->alone = false;
        sl->reserved = 0;
    }
    pthread_mutex_unlock(&dv->mu);
}

void devices_fail(struct devices *dv, int index, const char *why)
{
    if (!dv || index < 0 || index >= DEVICES_MAX)
        return;
    pthread_mutex_lock(&dv->mu);
    snprintf(dv->failed[index], sizeof dv->failed[index], "%s", why && why[0] ? why : "failed");
    pthread_mutex_unlock(&dv->mu);
    log_warn("gpu_device_out", "device=%d reason=%s", index, log_q(why));
}

/* S as a Prometheus label value (backslash, quote and newline escaped),
 * into OUT; cut to fit. */
static void label_value(const char *s, char *out, size_t len)
{
    size_t o = 0;
    for (; *s && o + 3 < len; s++) {
        if (*s == '\\' || *s == '"')
            out[o++] = '\\';
        if (*s == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
            continue;
        }
        out[o++] = *s;
    }
    out[o] = 0;
}

void devices_metrics(struct devices *dv, FILE *f)
{
    char why[1100];
    pthread_mutex_lock(&dv->mu);
    fputs("# HELP capd_gpu_device_holders Cells holding each GPU device.\n"
          "# TYPE capd_gpu_device_holders gauge\n",
          f);
    for (int i = 0; i < dv->ndev; i++)
        fprintf(f, "capd_gpu_device_holders{device=\"%d\"} %d\n", dv->index[i],
                dv->slot[dv->index[i]].n);
    fputs("# HELP capd_gpu_device_failed Whether a GPU device is out of the pool after a "
          "device error, and why (until POST /v1/devices/refresh).\n"
          "# TYPE capd_gpu_device_failed gauge\n",
          f);
    for (int i = 0; i < dv->ndev; i++) {
        int x = dv->index[i];
        label_value(dv->failed[x], why, sizeof why);
        fprintf(f, "capd_gpu_device_failed{device=\"%d\",reason=\"%s\"} %d\n", x, why,
                dv->failed[x][0] != 0);
    }
    pthread_mutex_unlock(&dv->mu);
}

bool devices__slot_json(const struct devices *dv, int index, json_t *c)
{
    const struct devices_slot *sl = &dv->slot[index];
    json_t *holders = json_array();
    for (int i = 0; i < sl->n; i++)
        json_array_append_new(holders,
                              json_pack("{s:s,s:s,s:I}", "job", sl->h[i].job, "cell", sl->h[i].cell,
                                        "reserved_bytes", (json_int_t)sl->h[i].reserved));
    int64_t b = budget(dv, index);
    json_object_set_new(c, "in_use", json_boolean(sl->n > 0));
    json_object_set_new(c, "job", sl->n ? json_string(sl->h[0].job) : json_null());
    json_object_set_new(c, "cell", sl->n ? json_string(sl->h[0].cell) : json_null());
    json_object_set_new(c, "holders", holders);
    json_object_set_new(c, "alone", json_boolean(sl->alone));
    json_object_set_new(c, "reserved_bytes", json_integer(sl->reserved));
    json_object_set_new(c, "budget_bytes", b < 0 ? json_null() : json_integer(b));
    json_object_set_new(c, "failed",
                        dv->failed[index][0] ? json_string(dv->failed[index]) : json_null());
    return sl->n == 0 && !dv->failed[index][0];
}
