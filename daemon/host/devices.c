/*
 * daemon/host/devices.c - GPU discovery through the probe child, and the
 * list GET /v1/devices shows (which cells hold each device is
 * daemon/host/devplace.c's).
 *
 * The probe is capd-gpuinfo (config key gpuinfo_bin): it prints one JSON
 * object and exits. It runs in its own session like a cell, with capd's
 * environment plus CUDA_DEVICE_ORDER=PCI_BUS_ID, so the indices it prints
 * are the ones the cells' runtimes will use (see visibility below). Its
 * output is capped at DEVICES_MAX_OUTPUT and its run at gpuinfo_timeout_ms;
 * past either it is killed and the attempt reported as failed.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/child/cellenv.h"
#include "daemon/host/devices_int.h"
#include "util/clock.h"
#include "util/log.h"

extern char **environ;

/* One run of the probe. Freed when its last handle is closed. */
struct probe {
    struct devices *dv;
    uv_process_t proc;
    uv_pipe_t out;
    uv_timer_t timer;
    int handles;
    pid_t pid;
    char *buf;
    size_t len;
    bool exited, eof, timed_out, too_big, done, detached;
    int64_t exit_status;
    int term_signal;
};

int devices_new(const struct capd_config *cfg, struct devices **out)
{
    struct devices *dv = calloc(1, sizeof *dv);
    if (!dv)
        return -ENOMEM;
    dv->cfg = cfg;
    pthread_mutex_init(&dv->mu, NULL);
    snprintf(dv->reason, sizeof dv->reason, "not probed yet");
    *out = dv;
    return 0;
}

/* ---- reading the answer ---- */

/*
 * Checks the probe's output and, when it is usable, makes it the list.
 * Returns false with WHY filled when it is not: the caller then keeps the
 * previous list. Every device needs a unique integer index below
 * DEVICES_MAX; everything else the probe says is passed through as it is.
 */
static bool take_answer(struct devices *dv, const char *buf, size_t len, char *why, size_t wn)
{
    json_error_t je;
    json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    json_t *devs = json_object_get(j, "devices");
    json_t *r = json_object_get(j, "reason");
    int idx[DEVICES_MAX], n = 0;
    int64_t total[DEVICES_MAX];
    bool seen[DEVICES_MAX] = {false};
    size_t i;
    json_t *d;
    if (!j) {
        snprintf(why, wn, "probe output is not JSON: %s (byte %d)", je.text, je.position);
        return false;
    }
    if (!json_is_object(j) || !json_is_array(devs) ||
        (r && !json_is_null(r) && !json_is_string(r))) {
        snprintf(why, wn, "probe output is not an object with a devices array");
        goto bad;
    }
    if (json_array_size(devs) > DEVICES_MAX) {
        snprintf(why, wn, "probe listed %zu devices; at most %d are supported",
                 json_array_size(devs), DEVICES_MAX);
        goto bad;
    }
    json_array_foreach(devs, i, d)
    {
        json_t *x = json_object_get(d, "index");
        json_int_t v = json_integer_value(x);
        json_t *name = json_object_get(d, "name");
        if (!json_is_object(d) || !json_is_integer(x) || v < 0 || v >= DEVICES_MAX || seen[v] ||
            (name && !json_is_null(name) && !json_is_string(name))) {
            snprintf(why, wn,
                     "probe output: devices[%zu] needs a unique integer index in "
                     "[0, %d) and a string name",
                     i, DEVICES_MAX);
            goto bad;
        }
        seen[v] = true;
        /* No memory figure (or a nonsense one): only the count limits. */
        json_t *mem = json_object_get(d, "total_memory_bytes");
        total[v] =
            json_is_integer(mem) && json_integer_value(mem) > 0 ? json_integer_value(mem) : -1;
        idx[n++] = (int)v;
    }
    pthread_mutex_lock(&dv->mu);
    json_decref(dv->answer);
    dv->answer = j;
    dv->ndev = n;
    memcpy(dv->index, idx, sizeof idx[0] * (size_t)n);
    for (int k = 0; k < n; k++)
        dv->total[idx[k]] = total[idx[k]];
    memset(dv->failed, 0, sizeof dv->failed);
    const char *plat = json_string_value(json_object_get(j, "platform"));
    dv->amd = plat && strcmp(plat, "amd") == 0;
    if (n > 0)
        dv->reason[0] = 0;
    else
        snprintf(dv->reason, sizeof dv->reason, "%s",
                 json_string_value(r) ? json_string_value(r) : "the probe found no device");
    dv->probe_error[0] = 0;
    pthread_mutex_unlock(&dv->mu);
    return true;
bad:
    json_decref(j);
    return false;
}

/* Ends a probe attempt: WHY (empty when the probe answered) is kept as the
 * last error, and as the reason there is no device while no probe ever
 * answered; the attempt is counted, timed and logged. */
static void attempt_over(struct devices *dv, const char *why)
{
    pthread_mutex_lock(&dv->mu);
    if (why[0]) {
        snprintf(dv->probe_error, sizeof dv->probe_error, "%s", why);
        if (!dv->answer)
            snprintf(dv->reason, sizeof dv->reason, "%s", why);
    }
    dv->generation++;
    dv->probed_at_ms = util_wall_ms();
    dv->probing = false;
    pthread_mutex_unlock(&dv->mu);
    if (why[0])
        log_warn("gpu_probe_failed", "probe=%s reason=%s", log_q(dv->cfg->gpuinfo_bin), log_q(why));
    else
        log_info("gpu_probe", "devices=%d reason=%s", dv->ndev,
                 log_q(dv->reason[0] ? dv->reason : NULL));
}

/* The attempt is over (exited, output read or abandoned): keep what it
 * said, or record why it failed. */
static void conclude(struct probe *p)
{
    struct devices *dv = p->dv;
    char why[1024] = "";
    const char *bin = dv->cfg->gpuinfo_bin;
    if (p->timed_out)
        snprintf(why, sizeof why, "probe %.400s ran past gpuinfo_timeout_ms=%d and was killed", bin,
                 dv->cfg->gpuinfo_timeout_ms);
    else if (p->too_big)
        snprintf(why, sizeof why, "probe %.400s wrote more than %d bytes and was killed", bin,
                 DEVICES_MAX_OUTPUT);
    else if (p->term_signal)
        snprintf(why, sizeof why, "probe %.400s was killed by signal %d", bin, p->term_signal);
    else if (p->exit_status != 0)
        snprintf(why, sizeof why, "probe %.400s exited with code %lld", bin,
                 (long long)p->exit_status);
    if (!why[0] && take_answer(dv, p->buf ? p->buf : "", p->len, why, sizeof why))
        why[0] = 0;
    attempt_over(dv, why);
}

/* ---- the probe child ---- */

static void probe_on_close(uv_handle_t *h)
{
    struct probe *p = h->data;
    if (--p->handles > 0)
        return;
    free(p->buf);
    free(p);
}

static void probe_close(struct probe *p)
{
    uv_handle_t *hs[3] = {(uv_handle_t *)&p->proc, (uv_handle_t *)&p->out,
                          (uv_handle_t *)&p->timer};
    for (int i = 0; i < 3; i++)
        if (hs[i]->data && !uv_is_closing(hs[i]))
            uv_close(hs[i], probe_on_close);
}

static void refresh_start(struct devices *dv);

/* Both the exit and the end of output have been seen. */
static void probe_maybe_done(struct probe *p)
{
    if (p->done || !p->exited || !p->eof)
        return;
    p->done = true;
    uv_timer_stop(&p->timer);
    struct devices *dv = p->dv;
    if (!p->detached) {
        conclude(p);
        if (dv->p == p)
            dv->p = NULL;
    }
    probe_close(p);
    if (p->detached)
        return;
    if (dv->again && dv->loop) {
        dv->again = false;
        refresh_start(dv);
    }
    if (dv->changed)
        dv->changed(dv->ud);
}

static void probe_on_exit(uv_process_t *proc, int64_t status, int sig)
{
    struct probe *p = proc->data;
    p->exited = true;
    p->exit_status = status;
    p->term_signal = sig;
    /* Whatever the probe left in its session goes with it. */
    if (p->pid > 0)
        kill(-p->pid, SIGKILL);
    p->pid = 0;
    probe_maybe_done(p);
}

/* Kills the probe's process group and stops reading its pipe, which a
 * grandchild may still hold open. */
static void probe_kill(struct probe *p)
{
    if (p->pid > 0)
        kill(-p->pid, SIGKILL);
    if (!p->eof) {
        uv_read_stop((uv_stream_t *)&p->out);
        p->eof = true;
    }
}

static void probe_on_timeout(uv_timer_t *t)
{
    struct probe *p = t->data;
    p->timed_out = true;
    probe_kill(p);
    probe_maybe_done(p);
}

static void probe_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    struct probe *p = h->data;
    (void)suggested;
    if (!p->buf)
        p->buf = malloc(DEVICES_MAX_OUTPUT + 1);
    b->base = p->buf ? p->buf + p->len : NULL;
    b->len = p->buf ? DEVICES_MAX_OUTPUT + 1 - p->len : 0;
}

static void probe_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    struct probe *p = s->data;
    (void)b;
    if (n > 0) {
        p->len += (size_t)n;
        if (p->len > DEVICES_MAX_OUTPUT) {
            p->too_big = true;
            probe_kill(p);
            probe_maybe_done(p);
        }
        return;
    }
    if (n == 0)
        return;
    if (n == UV_ENOBUFS) /* could not allocate the buffer */
        p->too_big = true;
    uv_read_stop(s);
    p->eof = true;
    probe_maybe_done(p);
}

/* The probe's environment: capd's own (the runtime may need
 * LD_LIBRARY_PATH, ROCm's or CUDA's variables) with the device order
 * pinned to PCI bus order, the order the cells are told to use too. The
 * caller frees the array, not the strings; NULL when out of memory. */
static bool is_device_order(const char *kv)
{
    return strncmp(kv, "CUDA_DEVICE_ORDER=", 18) == 0;
}

static char **probe_env(void)
{
    size_t k;
    char **env = cellenv_without(environ, is_device_order, 1, &k);
    if (env)
        env[k] = "CUDA_DEVICE_ORDER=PCI_BUS_ID";
    return env;
}

/* Concludes an attempt whose probe could not be started (uv_spawn's RC):
 * the error is kept, and becomes the reason there is no device when no
 * probe ever answered. */
static void probe_spawn_failed(struct devices *dv, int rc)
{
    char why[1024];
    snprintf(why, sizeof why,
             "cannot run the GPU probe %.400s: %s (capd-gpuinfo is built "
             "when the HIP or CUDA runtime is found: docs/gpu.md)",
             dv->cfg->gpuinfo_bin, uv_strerror(rc));
    attempt_over(dv, why);
}

/*
 * Starts the probe on LOOP. On a spawn failure (typically: no probe built
 * or installed) the attempt is concluded at once and NULL returned.
 */
static struct probe *probe_spawn(struct devices *dv, uv_loop_t *loop)
{
    struct probe *p = calloc(1, sizeof *p);
    char **env = NULL;
    int fds[2] = {-1, -1};
    if (!p)
        return NULL;
    p->dv = dv;
    pthread_mutex_lock(&dv->mu);
    dv->probing = true;
    pthread_mutex_unlock(&dv->mu);

    if (!(env = probe_env()) || uv_pipe(fds, 0, 0) != 0)
        goto fail;
    char *args[] = {(char *)dv->cfg->gpuinfo_bin, NULL};
    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_INHERIT_FD;
    stdio[1].data.fd = fds[1];
    stdio[2].flags = UV_INHERIT_FD; /* runtime warnings go to capd's log */
    stdio[2].data.fd = 2;
    uv_process_options_t po = {
        .exit_cb = probe_on_exit,
        .file = dv->cfg->gpuinfo_bin,
        .args = args,
        .env = env,
        .flags = UV_PROCESS_DETACHED,
        .stdio_count = 3,
        .stdio = stdio,
    };
    uv_pipe_init(loop, &p->out, 0);
    uv_timer_init(loop, &p->timer);
    p->out.data = p->timer.data = p->proc.data = p;
    p->handles = 2;
    uv_pipe_open(&p->out, fds[0]);
    fds[0] = -1;
    int rc = uv_spawn(loop, &p->proc, &po);
    close(fds[1]);
    fds[1] = -1;
    free(env);
    env = NULL;
    p->handles++; /* the process handle must be closed even when spawn failed */
    if (rc != 0) {
        probe_spawn_failed(dv, rc);
        p->done = true;
        probe_close(p);
        return NULL;
    }
    p->pid = p->proc.pid;
    uv_read_start((uv_stream_t *)&p->out, probe_alloc, probe_read);
    uv_timer_start(&p->timer, probe_on_timeout, (uint64_t)dv->cfg->gpuinfo_timeout_ms, 0);
    return p;
fail:
    if (fds[0] >= 0)
        close(fds[0]);
    if (fds[1] >= 0)
        close(fds[1]);
    free(env);
    free(p);
    pthread_mutex_lock(&dv->mu);
    dv->probing = false;
    pthread_mutex_unlock(&dv->mu);
    return NULL;
}

int devices_probe_now(struct devices *dv)
{
    uv_loop_t loop;
    int rc = uv_loop_init(&loop);
    if (rc)
        return rc;
    probe_spawn(dv, &loop);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    return 0;
}

static void refresh_start(struct devices *dv)
{
    dv->p = probe_spawn(dv, dv->loop);
}

void devices_refresh(struct devices *dv, uv_loop_t *loop, void (*changed)(void *ud), void *ud)
{
    dv->loop = loop;
    dv->changed = changed;
    dv->ud = ud;
    if (dv->p) {
        dv->again = true;
        return;
    }
    refresh_start(dv);
    /* A probe that could not start has already concluded. */
    if (!dv->p && changed)
        changed(ud);
}

void devices_stop(struct devices *dv)
{
    struct probe *p = dv ? dv->p : NULL;
    if (!p)
        return;
    dv->p = NULL;
    dv->again = false;
    p->detached = true;
    probe_kill(p);
    /* The exit callback still comes (SIGKILL) and closes the handles. */
    probe_maybe_done(p);
    pthread_mutex_lock(&dv->mu);
    dv->probing = false;
    pthread_mutex_unlock(&dv->mu);
}

void devices_free(struct devices *dv)
{
    if (!dv)
        return;
    json_decref(dv->answer);
    pthread_mutex_destroy(&dv->mu);
    free(dv);
}

/* ---- reading the list (any thread) ---- */

static json_t *time_json(int64_t ms)
{
    if (ms <= 0)
        return json_null();
    char buf[UTIL_TIME_TEXT_MAX];

    util_time_text(ms, buf);
    return json_string(buf);
}

static json_t *str_or_null(const char *s)
{
    return s && s[0] ? json_string(s) : json_null();
}

json_t *devices_json(struct devices *dv)
{
    pthread_mutex_lock(&dv->mu);
    json_t *list = json_array();
    int nfree = 0;
    size_t i;
    json_t *d;
    json_array_foreach(json_object_get(dv->answer, "devices"), i, d)
    {
        json_t *c = json_deep_copy(d);
        int x = (int)json_integer_value(json_object_get(d, "index"));
        nfree += devices__slot_json(dv, x, c);
        json_array_append_new(list, c);
    }
    json_t *a = dv->answer;
    json_t *out = json_pack(
        "{s:o,s:i,s:i,s:o,s:O,s:O,s:O,s:O,s:s,s:o,s:I,s:b,s:o}", "devices", list, "count", dv->ndev,
        "free", nfree, "reason", str_or_null(dv->reason), "runtime",
        json_object_get(a, "runtime") ? json_object_get(a, "runtime") : json_null(), "platform",
        json_object_get(a, "platform") ? json_object_get(a, "platform") : json_null(),
        "runtime_version",
        json_object_get(a, "runtime_version") ? json_object_get(a, "runtime_version") : json_null(),
        "driver_version",
        json_object_get(a, "driver_version") ? json_object_get(a, "driver_version") : json_null(),
        "probe", dv->cfg->gpuinfo_bin, "probed_at", time_json(dv->probed_at_ms), "generation",
        (json_int_t)dv->generation, "refreshing", dv->probing, "probe_error",
        str_or_null(dv->probe_error));
    json_object_set_new(out, "cells_per_device", json_integer(dv->cfg->gpu_cells_per_device));
    json_object_set_new(out, "memory_fraction", json_real(dv->cfg->gpu_memory_fraction));
    pthread_mutex_unlock(&dv->mu);
    return out;
}

int devices_count(struct devices *dv)
{
    pthread_mutex_lock(&dv->mu);
    int n = dv->ndev;
    pthread_mutex_unlock(&dv->mu);
    return n;
}
