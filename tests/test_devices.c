/*
 * tests/test_devices.c - GPU discovery and GPU scheduling without a GPU.
 *
 * The probe itself: capd-gpuinfo built against a fake CUDA runtime
 * (capd-gpuinfo-fakecuda, tests/helpers/fakecuda) checks the mapping
 * header and the JSON with no device, no driver, devices and a half-
 * described device; the real HIP build (when this host has the headers)
 * must answer "no device" with exit 0.
 *
 * The daemon: a real capd whose gpuinfo_bin is tests/helpers/fake_gpuinfo,
 * which prints whatever device list the test wrote to $FAKE_GPUINFO_FILE.
 * Cells run the fake runner: GPU cells must get their device's visibility
 * variables, hold a device exclusively, and leave CPU cells free to run.
 */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/testutil.h"

static void devices_fini(void);
TestSuite(devices, .timeout = 120, .fini = devices_fini);

/* ---- the probe ---- */

/* Runs PROBE with the shell variables VARS in front; returns its JSON. */
static json_t *run_probe(const char *vars, const char *probe, int *exit_out)
{
    char *dir = tu_tmpdir();
    cr_assert_not_null(dir);
    char out[512];
    snprintf(out, sizeof out, "%s/probe.json", dir);
    int rc = tu_sh("%s '%s' >'%s'", vars, probe, out);
    if (exit_out)
        *exit_out = rc;
    json_error_t je;
    json_t *j = json_load_file(out, JSON_REJECT_DUPLICATES, &je);
    cr_assert_not_null(j, "%s printed valid JSON: %s", probe, je.text);
    tu_sh("rm -rf '%s'", dir);
    free(dir);
    return j;
}

static const char *s_(json_t *o, const char *k)
{
    const char *v = json_string_value(json_object_get(o, k));
    return v ? v : "";
}

/* Runs the fake CUDA probe with the shell variables VARS; it must exit 0
 * (no device, or no driver, is an answer, not an error). Returns its JSON. */
static json_t *run_fakecuda(const char *vars)
{
    char *probe = tu_helper("capd-gpuinfo-fakecuda");
    int rc = -1;
    json_t *j = run_probe(vars, probe, &rc);
    cr_assert_eq(rc, 0, "capd-gpuinfo-fakecuda with '%s' exits 0", vars);
    free(probe);
    return j;
}

Test(devices, fakecuda_probe_without_device)
{
    json_t *j = run_fakecuda("");
    cr_assert_str_eq(s_(j, "probe"), "capd-gpuinfo");
    cr_assert_str_eq(s_(j, "runtime"), "cuda");
    cr_assert_str_eq(s_(j, "platform"), "nvidia");
    cr_assert_str_eq(s_(j, "runtime_version"), "13.0");
    cr_assert_eq(json_integer_value(json_object_get(j, "runtime_version_raw")), 13000);
    cr_assert_eq(json_array_size(json_object_get(j, "devices")), 0);
    cr_assert_str_eq(s_(j, "reason"), "cudaErrorNoDevice: no CUDA-capable device is detected");
    json_decref(j);
}

Test(devices, fakecuda_probe_without_driver)
{
    json_t *j = run_fakecuda("FAKE_CUDA_NO_DRIVER=1");
    cr_assert(json_is_null(json_object_get(j, "driver_version")));
    cr_assert(json_is_null(json_object_get(j, "driver_version_raw")));
    cr_assert_eq(json_array_size(json_object_get(j, "devices")), 0);
    cr_assert(strstr(s_(j, "reason"), "cudaErrorInsufficientDriver") != NULL, "%s",
              s_(j, "reason"));
    json_decref(j);
}

Test(devices, fakecuda_probe_lists_devices)
{
    /* A name with a quote, a backslash and a tab must still give JSON. */
    setenv("FAKE_CUDA_NAME", "Fake \"H\\200\t", 1);
    json_t *j = run_fakecuda("FAKE_CUDA_DEVICES=2");
    json_t *devs = json_object_get(j, "devices");
    cr_assert_eq(json_array_size(devs), 2);
    cr_assert(json_is_null(json_object_get(j, "reason")));
    for (int i = 0; i < 2; i++) {
        json_t *d = json_array_get(devs, (size_t)i);
        cr_assert_eq(json_integer_value(json_object_get(d, "index")), i);
        cr_assert_str_eq(s_(d, "name"), "Fake \"H\\200\t");
        cr_assert_str_eq(s_(d, "arch"), "sm_90");
        cr_assert_str_eq(s_(d, "compute_capability"), "9.0");
        cr_assert_eq(json_integer_value(json_object_get(d, "multiprocessors")), 132);
        json_int_t total = json_integer_value(json_object_get(d, "total_memory_bytes"));
        json_int_t freeb = json_integer_value(json_object_get(d, "free_memory_bytes"));
        cr_assert_eq(total, (json_int_t)(i + 1) << 30, "total of device %d", i);
        cr_assert_eq(freeb, total - ((json_int_t)(i + 1) << 20), "free of device %d", i);
        char bus[32];
        snprintf(bus, sizeof bus, "0000:%02x:00.0", 0x10 + i);
        cr_assert_str_eq(s_(d, "pci_bus_id"), bus);
        cr_assert_eq(strlen(s_(d, "uuid")), 40, "GPU-8-4-4-4-12: %s", s_(d, "uuid"));
        cr_assert(strncmp(s_(d, "uuid"), "GPU-", 4) == 0);
        cr_assert(json_is_null(json_object_get(d, "error")));
    }
    cr_assert_str_eq(s_(json_array_get(devs, 1), "uuid"),
                     "GPU-01020304-0506-0708-090a-0b0c0d0e0f10");
    json_decref(j);
}

Test(devices, fakecuda_probe_half_described_device)
{
    json_t *j = run_fakecuda("FAKE_CUDA_DEVICES=1 FAKE_CUDA_MEMINFO_FAILS=1");
    json_t *d = json_array_get(json_object_get(j, "devices"), 0);
    cr_assert_not_null(d, "the device is still listed");
    cr_assert(json_is_null(json_object_get(d, "free_memory_bytes")));
    cr_assert_eq(json_integer_value(json_object_get(d, "total_memory_bytes")), 1 << 30,
                 "total falls back to the properties");
    cr_assert(strstr(s_(d, "error"), "cudaErrorInvalidValue") != NULL, "%s", s_(d, "error"));
    json_decref(j);
}

/* The HIP build, when this host could build it (libamdhip64-dev). CI has
 * no AMD GPU: the runtime must say so, with exit 0. */
Test(devices, hip_probe_answers_without_gpu)
{
    char probe[1024];
    snprintf(probe, sizeof probe, "%s", tu_bin("CAPD_BIN"));
    char *slash = strrchr(probe, '/');
    cr_assert_not_null(slash);
    snprintf(slash, sizeof probe - (size_t)(slash - probe), "/capd-gpuinfo");
    if (access(probe, X_OK) != 0)
        cr_skip_test("capd-gpuinfo was not built (no HIP runtime found)");
    int rc = -1;
    json_t *j = run_probe("", probe, &rc);
    cr_assert_eq(rc, 0);
    cr_assert(json_is_array(json_object_get(j, "devices")));
    cr_assert(json_is_string(json_object_get(j, "runtime")));
    if (json_array_size(json_object_get(j, "devices")) == 0)
        cr_assert(s_(j, "reason")[0], "an empty list says why");
    json_decref(j);
}

/* ---- the daemon with the fake probe ---- */

/* A test's capd and its probe's file, and the ids of the jobs submit
 * gave it, which stop frees. */
#define ENV_MAX_JOBS 16
struct env {
    struct tu_capd c;
    char devfile[512];
    char *jobs[ENV_MAX_JOBS];
    int njobs;
};

static void write_file(const char *path, const char *text)
{
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    af_put_file(tmp, text);
    cr_assert_eq(rename(tmp, path), 0);
}

/* N fake NVIDIA (or AMD) devices of TOTAL bytes each (-1: the probe gives
 * no memory figure) as the probe would list them. */
static void write_devices_mem(struct env *e, int n, const char *platform, long long total)
{
    char buf[8192], mem[64] = "";
    if (total >= 0)
        snprintf(mem, sizeof mem, "\"total_memory_bytes\":%lld,", total);
    int o = snprintf(buf, sizeof buf,
                     "{\"probe\":\"capd-gpuinfo\",\"runtime\":\"fake\",\"platform\":\"%s\","
                     "\"devices\":[",
                     platform);
    for (int i = 0; i < n; i++)
        o += snprintf(buf + o, sizeof buf - (size_t)o,
                      "%s{\"index\":%d,\"name\":\"Fake GPU\",\"arch\":\"sm_90\","
                      "%s\"pci_bus_id\":\"0000:%02x:00.0\"}",
                      i ? "," : "", i, mem, 0x10 + i);
    snprintf(buf + o, sizeof buf - (size_t)o, "],\"reason\":%s}\n",
             n ? "null" : "\"fake: no device\"");
    write_file(e->devfile, buf);
}

/* N fake devices of 1 GiB each. */
static void write_devices(struct env *e, int n, const char *platform)
{
    write_devices_mem(e, n, platform, 1073741824);
}

/* Starts capd with the fake probe reading E->devfile, which holds DEVICES
 * devices (-1: no file; -2: garbage), and EXTRA_CONFIG (JSON members, may
 * be ""). */
static void start(struct env *e, int devices, const char *platform, const char *extra_config)
{
    char *dir = tu_tmpdir();
    cr_assert_not_null(dir);
    e->njobs = 0;
    snprintf(e->devfile, sizeof e->devfile, "%s/devices.json", dir);
    if (devices >= 0)
        write_devices(e, devices, platform);
    else if (devices == -2)
        write_file(e->devfile, "GARBAGE");
    setenv("FAKE_GPUINFO_FILE", e->devfile, 1);
    char *probe = tu_helper("fake_gpuinfo");
    char cfg[600], text[2048];
    snprintf(cfg, sizeof cfg, "%s/capd.json", dir);
    snprintf(text, sizeof text, "{\"gpuinfo_bin\":\"%s\",\"gpuinfo_timeout_ms\":500%s%s}", probe,
             extra_config[0] ? "," : "", extra_config);
    write_file(cfg, text);
    const char *extra[] = {"--config", cfg, NULL};
    cr_assert_eq(tu_capd_start(&e->c, dir, extra), 0, "capd starts");
    cr_assert_eq(tu_fake_build(&e->c, "fake", NULL), 201);
    free(probe);
    free(dir);
}

static void stop(struct env *e)
{
    cr_assert_eq(tu_capd_stop(&e->c), 0, "capd exits 0 on SIGTERM");
    while (e->njobs > 0)
        free(e->jobs[--e->njobs]);
}

/* The daemon tests' env: start fills it and each test stops it (checking
 * that capd exits 0); the suite's fini stops a capd a failed test left
 * running. */
static struct env dev;

static void devices_fini(void)
{
    if (dev.c.pid > 0)
        tu_capd_stop(&dev.c);
}

static json_t *get_devices(struct env *e)
{
    long st = 0;
    json_t *j = tu_json(&e->c, "GET", "/v1/devices", NULL, &st);
    cr_assert_eq(st, 200);
    return j;
}

static json_int_t jint(json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

/* start with DEVICES devices of PLATFORM and no extra config; returns the
 * device list capd serves (owned), which must count them all. */
static json_t *start_listed(struct env *e, int devices, const char *platform)
{
    start(e, devices, platform, "");
    json_t *d = get_devices(e);
    cr_assert_eq(jint(d, "count"), devices);
    return d;
}

/* POST /v1/devices/refresh, then waits for the list that probe gave. */
static json_t *refresh(struct env *e)
{
    long st = 0;
    json_t *r = tu_json(&e->c, "POST", "/v1/devices/refresh", NULL, &st);
    cr_assert_eq(st, 202);
    cr_assert(json_is_true(json_object_get(r, "refreshing")));
    json_int_t g = jint(r, "generation");
    json_decref(r);
    for (int i = 0; i < 200; i++) {
        json_t *d = get_devices(e);
        if (jint(d, "generation") > g && !json_is_true(json_object_get(d, "refreshing")))
            return d;
        json_decref(d);
        usleep(25 * 1000);
    }
    cr_assert_fail("the refresh never finished");
    return NULL;
}

/* POSTs a job of MODELS (a JSON array text) x avx2 x PASSES; returns its
 * id (valid until stop) or NULL, and the status. */
static char *submit(struct env *e, const char *models, const char *passes, const char *device,
                    long *status, json_t **reply)
{
    json_t *j = tu_jsonf(&e->c, "POST", "/v1/jobs", status,
                         "{\"project\":\"t\",\"commit\":\"abcdef1\",\"build\":\"fake\","
                         "\"matrix\":{\"models\":%s,\"widths\":[\"avx2\"],\"passes\":%s},"
                         "\"options\":{\"device\":\"%s\"}}",
                         models, passes, device);
    const char *id = json_string_value(json_object_get(j, "id"));
    char *r = *status == 201 && id ? strdup(id) : NULL;
    if (r) {
        cr_assert_lt(e->njobs, ENV_MAX_JOBS, "a test submits at most %d jobs", ENV_MAX_JOBS);
        e->jobs[e->njobs++] = r;
    }
    if (reply)
        *reply = j;
    else
        json_decref(j);
    return r;
}

/* submit, asserting that the job is accepted (201); returns its id (valid
 * until stop). */
static char *submit_ok(struct env *e, const char *models, const char *passes, const char *device)
{
    long st = 0;
    char *id = submit(e, models, passes, device, &st, NULL);
    cr_assert_eq(st, 201, "POST /v1/jobs %s %s on %s: %ld", models, passes, device, st);
    return id;
}

/* Waits up to a minute for job ID to end, asserting that it did. */
static json_t *wait_ended(struct env *e, const char *id)
{
    json_t *j = tu_wait_job(&e->c, id, 60);
    cr_assert_not_null(j, "job %s ended", id);
    return j;
}

/* Cell I of job J. */
static json_t *cell_of(json_t *j, size_t i)
{
    return json_array_get(json_object_get(j, "cells"), i);
}

static int64_t iso_ms(const char *s)
{
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *rest = s ? strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
    cr_assert_not_null(rest, "timestamp %s", s ? s : "(null)");
    int ms = 0;
    sscanf(rest, ".%3dZ", &ms);
    return (int64_t)timegm(&tm) * 1000 + ms;
}

/* What the fake runner saw in cell CELL (echo_env's note): environ,
 * rlimits... */
static json_t *cell_echo(struct env *e, const char *job, const char *cell)
{
    char path[200];
    snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s/records?kind=note", job, cell);
    json_t *notes = tu_json(&e->c, "GET", path, NULL, NULL);
    const char *msg = s_(json_array_get(json_object_get(notes, "records"), 0), "message");
    json_t *m = json_loads(msg, 0, NULL);
    cr_assert_not_null(m, "echo_env note: %s", msg);
    json_decref(notes);
    return m;
}

/* The environment the fake runner saw in cell CELL. */
static json_t *cell_environ(struct env *e, const char *job, const char *cell)
{
    json_t *m = cell_echo(e, job, cell);
    json_t *env = json_incref(json_object_get(m, "environ"));
    json_decref(m);
    return env;
}

Test(devices, no_probe_means_no_gpu_not_an_error)
{
    char *dir = tu_tmpdir();
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/capd.json", dir);
    write_file(cfg, "{\"gpuinfo_bin\":\"/nonexistent/capd-gpuinfo\"}");
    const char *extra[] = {"--config", cfg, NULL};
    cr_assert_eq(tu_capd_start(&dev.c, dir, extra), 0, "capd starts without a probe");
    free(dir);
    cr_assert_eq(tu_fake_build(&dev.c, "fake", NULL), 201);
    json_t *d = get_devices(&dev);
    cr_assert_eq(json_array_size(json_object_get(d, "devices")), 0);
    cr_assert_eq(jint(d, "count"), 0);
    cr_assert(strstr(s_(d, "reason"), "cannot run the GPU probe /nonexistent/capd-gpuinfo"), "%s",
              s_(d, "reason"));
    cr_assert_eq(jint(d, "generation"), 1);
    json_decref(d);

    long st = 0;
    json_t *r = NULL;
    char *job = submit(&dev, "[\"fake:ok\"]", "[\"forward\"]", "gpu", &st, &r);
    cr_assert_null(job);
    cr_assert_eq(st, 400);
    json_t *err = json_object_get(r, "error");
    cr_assert_str_eq(s_(err, "code"), "no_gpu");
    cr_assert_str_eq(s_(err, "field"), "options.device");
    cr_assert(strstr(s_(err, "message"), "cannot run the GPU probe"), "the reason is given: %s",
              s_(err, "message"));
    json_decref(r);
    job = submit(&dev, "[\"fake:ok\"]", "[\"forward\"]", "cpu", &st, NULL);
    cr_assert_eq(st, 201, "CPU jobs are unaffected");
    stop(&dev);
}

Test(devices, lists_what_the_probe_found)
{
    json_t *d = start_listed(&dev, 2, "nvidia");
    cr_assert_eq(jint(d, "free"), 2);
    cr_assert(json_is_null(json_object_get(d, "reason")));
    cr_assert(json_is_null(json_object_get(d, "probe_error")));
    cr_assert_str_eq(s_(d, "platform"), "nvidia");
    cr_assert(s_(d, "probed_at")[0]);
    json_t *d1 = json_array_get(json_object_get(d, "devices"), 1);
    cr_assert_eq(jint(d1, "index"), 1);
    cr_assert_str_eq(s_(d1, "pci_bus_id"), "0000:11:00.0");
    cr_assert(json_is_false(json_object_get(d1, "in_use")));
    cr_assert(json_is_null(json_object_get(d1, "cell")));
    json_decref(d);
    /* The probe ran once, with the device order pinned to PCI bus order. */
    char runs[600], line[256];
    snprintf(runs, sizeof runs, "%s.runs", dev.devfile);
    FILE *f = fopen(runs, "r");
    cr_assert_not_null(f);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        n++;
        cr_assert_str_eq(line, "run CUDA_DEVICE_ORDER=PCI_BUS_ID\n");
    }
    fclose(f);
    cr_assert_eq(n, 1, "one probe at start-up");
    stop(&dev);
}

Test(devices, refresh_finds_a_new_gpu_and_gpu_jobs_are_accepted)
{
    json_t *d = start_listed(&dev, 0, "nvidia");
    cr_assert_str_eq(s_(d, "reason"), "fake: no device");
    json_decref(d);
    long st = 0;
    char *job = submit(&dev, "[\"fake:ok\"]", "[\"forward\"]", "gpu", &st, NULL);
    cr_assert_eq(st, 400, "no GPU yet");

    write_devices(&dev, 1, "nvidia");
    d = refresh(&dev);
    cr_assert_eq(jint(d, "count"), 1);
    cr_assert(json_is_null(json_object_get(d, "reason")));
    json_decref(d);
    job = submit_ok(&dev, "[\"fake:ok\"]", "[\"forward\"]", "gpu");
    json_t *j = wait_ended(&dev, job);
    json_t *cell = cell_of(j, 0);
    cr_assert_str_eq(s_(cell, "state"), "ok", "%s", s_(cell, "reason"));
    json_decref(j);
    d = get_devices(&dev);
    cr_assert_eq(jint(d, "free"), 1, "the device was given back");
    json_decref(d);
    stop(&dev);
}

Test(devices, a_failed_refresh_keeps_the_list)
{
    start(&dev, 1, "nvidia", "");
    static const struct {
        const char *file, *want;
    } cases[] = {
        {"GARBAGE", "probe output is not JSON"},
        {"EXIT3", "exited with code 3"},
        {"HANG", "ran past gpuinfo_timeout_ms=500"},
        {"FLOOD", "wrote more than 262144 bytes"},
        {"CRASH", "killed by signal 6"},
        {"{\"devices\":[{\"index\":0},{\"index\":0}]}", "unique integer index"},
        {"{\"devices\":[{\"index\":64}]}", "unique integer index"},
        {"{\"devices\":{}}", "devices array"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_file(dev.devfile, cases[i].file);
        json_t *d = refresh(&dev);
        cr_assert(strstr(s_(d, "probe_error"), cases[i].want), "%s: probe_error is %s",
                  cases[i].file, s_(d, "probe_error"));
        cr_assert_eq(jint(d, "count"), 1, "%s: the last good list stays", cases[i].file);
        json_decref(d);
    }
    /* A good answer clears the error, and an empty one is an answer. */
    write_devices(&dev, 0, "nvidia");
    json_t *d = refresh(&dev);
    cr_assert(json_is_null(json_object_get(d, "probe_error")));
    cr_assert_eq(jint(d, "count"), 0);
    cr_assert_str_eq(s_(d, "reason"), "fake: no device");
    json_decref(d);
    stop(&dev);
}

Test(devices, a_broken_probe_at_start_up_is_the_reason)
{
    start(&dev, -2, "nvidia", "");
    json_t *d = get_devices(&dev);
    cr_assert_eq(jint(d, "count"), 0);
    cr_assert(strstr(s_(d, "reason"), "probe output is not JSON"), "%s", s_(d, "reason"));
    cr_assert(strstr(s_(d, "probe_error"), "probe output is not JSON"));
    json_decref(d);
    write_devices(&dev, 1, "nvidia");
    d = refresh(&dev);
    cr_assert_eq(jint(d, "count"), 1);
    cr_assert(json_is_null(json_object_get(d, "reason")));
    cr_assert(json_is_null(json_object_get(d, "probe_error")));
    json_decref(d);
    stop(&dev);
}

Test(devices, gpu_cell_sees_only_its_device)
{
    start(&dev, 1, "nvidia", "");
    /* A build variable must not move the cell to another device. */
    cr_assert_eq(tu_fake_build(&dev.c, "fake2", "{\"CUDA_VISIBLE_DEVICES\":\"7\"}"), 201);
    long st = 0;
    json_t *j = tu_jsonf(&dev.c, "POST", "/v1/jobs", &st,
                         "{\"project\":\"t\",\"commit\":\"abcdef1\",\"build\":\"fake2\","
                         "\"matrix\":{\"models\":[\"fake:echo_env\"],\"widths\":[\"avx2\"],"
                         "\"passes\":[\"forward\"]},\"options\":{\"device\":\"gpu\"}}");
    cr_assert_eq(st, 201);
    char *job = strdup(s_(j, "id"));
    json_decref(j);
    j = tu_wait_job(&dev.c, job, 60);
    json_t *cell = cell_of(j, 0);
    cr_assert_str_eq(s_(cell, "state"), "ok", "%s", s_(cell, "reason"));
    json_t *env = cell_environ(&dev, job, s_(cell, "id"));
    cr_assert_str_eq(s_(env, "CUDA_VISIBLE_DEVICES"), "0");
    cr_assert_str_eq(s_(env, "HIP_VISIBLE_DEVICES"), "0");
    cr_assert_str_eq(s_(env, "ROCR_VISIBLE_DEVICES"), "0");
    cr_assert_str_eq(s_(env, "CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
    cr_assert_str_eq(s_(env, "NCCL_NVLS_ENABLE"), "0");
    json_decref(env);
    /* GPU runtimes reserve address space for all memory: no RLIMIT_AS. */
    json_t *echo = cell_echo(&dev, job, s_(cell, "id"));
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(echo, "rlimits"), "as")), -1,
                 "a GPU cell has no address-space cap");
    json_decref(echo);
    json_decref(j);
    free(job);

    /* A CPU cell gets none of them from capd. */
    job = submit(&dev, "[\"fake:echo_env\"]", "[\"forward\"]", "cpu", &st, NULL);
    j = tu_wait_job(&dev.c, job, 60);
    cell = cell_of(j, 0);
    env = cell_environ(&dev, job, s_(cell, "id"));
    cr_assert_null(json_object_get(env, "CUDA_VISIBLE_DEVICES"));
    cr_assert_null(json_object_get(env, "ROCR_VISIBLE_DEVICES"));
    cr_assert_null(json_object_get(env, "NCCL_NVLS_ENABLE"));
    json_decref(env);
    echo = cell_echo(&dev, job, s_(cell, "id"));
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(echo, "rlimits"), "as")), -1,
                 "a CPU cell has no address-space cap by default (memory is limited as memory)");
    json_decref(echo);
    json_decref(j);
    stop(&dev);
}

/* On AMD the visibility layers stack: ROCr picks the device, and HIP and
 * CUDA then see it as device 0. */
Test(devices, amd_visibility_stacks)
{
    start(&dev, 2, "amd", "\"max_parallel\":2");
    char *job = submit_ok(&dev, "[\"fake:slow__800\",\"fake:echo_env\"]", "[\"forward\"]", "gpu");
    json_t *j = tu_wait_job(&dev.c, job, 60);
    json_t *cell = NULL;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(j, "cells"), i, c)
    {
        cr_assert_str_eq(s_(c, "state"), "ok", "%s", s_(c, "reason"));
        if (strcmp(s_(c, "model"), "fake:echo_env") == 0)
            cell = c;
    }
    json_t *env = cell_environ(&dev, job, s_(cell, "id"));
    json_decref(j);
    /* The slow cell took device 0 first, so echo_env ran on device 1. */
    cr_assert_str_eq(s_(env, "ROCR_VISIBLE_DEVICES"), "1");
    cr_assert_str_eq(s_(env, "HIP_VISIBLE_DEVICES"), "0");
    cr_assert_str_eq(s_(env, "CUDA_VISIBLE_DEVICES"), "0");
    cr_assert_str_eq(s_(env, "NCCL_NVLS_ENABLE"), "0");
    json_decref(env);
    stop(&dev);
}

/*
 * One device, three slots: the two GPU cells of job A must run one after
 * the other, and job B's CPU cell, queued behind them, must not wait for
 * the device.
 */
Test(devices, gpu_cells_hold_a_whole_device_and_cpu_cells_pass_them)
{
    start(&dev, 1, "nvidia", "\"max_parallel\":3");
    char *a = submit_ok(&dev, "[\"fake:slow__1000\"]", "[\"forward\",\"backward\"]", "gpu");
    char *b = submit_ok(&dev, "[\"fake:slow__300\"]", "[\"forward\"]", "cpu");

    /* While A runs, the device is in use by one of its cells. */
    bool seen_busy = false;
    for (int i = 0; i < 100 && !seen_busy; i++) {
        json_t *d = get_devices(&dev);
        json_t *d0 = json_array_get(json_object_get(d, "devices"), 0);
        if (json_is_true(json_object_get(d0, "in_use"))) {
            seen_busy = true;
            cr_assert_str_eq(s_(d0, "job"), a);
            cr_assert_eq(jint(d, "free"), 0);
        }
        json_decref(d);
        usleep(20 * 1000);
    }
    cr_assert(seen_busy, "the device was seen in use");

    json_t *ja = wait_ended(&dev, a), *jb = wait_ended(&dev, b);
    json_t *c0 = cell_of(ja, 0);
    json_t *c1 = cell_of(ja, 1);
    json_t *cb = cell_of(jb, 0);
    cr_assert_str_eq(s_(c0, "state"), "ok");
    cr_assert_str_eq(s_(c1, "state"), "ok");
    cr_assert_str_eq(s_(cb, "state"), "ok");
    int64_t s0 = iso_ms(s_(c0, "started_at")), f0 = iso_ms(s_(c0, "finished_at"));
    int64_t s1 = iso_ms(s_(c1, "started_at")), f1 = iso_ms(s_(c1, "finished_at"));
    int64_t sb = iso_ms(s_(cb, "started_at"));
    cr_assert(f0 <= s1 || f1 <= s0, "GPU cells never overlap: [%lld,%lld] [%lld,%lld]",
              (long long)s0, (long long)f0, (long long)s1, (long long)f1);
    int64_t second_end = f0 > f1 ? f0 : f1;
    int64_t first_end = f0 < f1 ? f0 : f1;
    cr_assert_lt(sb, first_end, "the CPU cell started while the first GPU cell held the device");
    cr_assert_lt(sb, second_end);
    json_decref(ja);
    json_decref(jb);
    json_t *d = get_devices(&dev);
    cr_assert_eq(jint(d, "free"), 1, "given back");
    json_decref(d);
    stop(&dev);
}

/* Two devices: two GPU cells run at once, each on its own device. */
Test(devices, two_devices_two_cells_at_once)
{
    start(&dev, 2, "nvidia", "\"max_parallel\":2");
    char *a = submit_ok(&dev, "[\"fake:slow__1200\"]", "[\"forward\",\"backward\"]", "gpu");
    bool both = false;
    for (int i = 0; i < 100 && !both; i++) {
        json_t *d = get_devices(&dev);
        both = jint(d, "free") == 0;
        if (both) {
            json_t *d0 = json_array_get(json_object_get(d, "devices"), 0);
            json_t *d1 = json_array_get(json_object_get(d, "devices"), 1);
            cr_assert_str_neq(s_(d0, "cell"), s_(d1, "cell"), "one cell per device");
        }
        json_decref(d);
        usleep(20 * 1000);
    }
    cr_assert(both, "both devices were in use at once");
    json_decref(wait_ended(&dev, a));
    stop(&dev);
}

/* A GPU job accepted while a device existed, whose device is gone when its
 * cell's turn comes: the cell fails with the reason instead of waiting
 * forever. */
Test(devices, gpu_cell_fails_when_the_devices_went_away)
{
    start(&dev, 1, "nvidia", "");
    char *cpu = submit_ok(&dev, "[\"fake:slow__1500\"]", "[\"forward\"]", "cpu");
    char *gpu = submit_ok(&dev, "[\"fake:ok\"]", "[\"forward\"]", "gpu");
    write_devices(&dev, 0, "nvidia");
    json_t *d = refresh(&dev);
    cr_assert_eq(jint(d, "count"), 0);
    json_decref(d);
    json_t *j = wait_ended(&dev, gpu);
    json_t *cell = cell_of(j, 0);
    cr_assert_str_eq(s_(cell, "state"), "failed");
    cr_assert(strstr(s_(cell, "reason"), "no GPU device (fake: no device)"), "%s",
              s_(cell, "reason"));
    json_decref(j);
    j = tu_wait_job(&dev.c, cpu, 60);
    cr_assert_str_eq(s_(cell_of(j, 0), "state"), "ok");
    json_decref(j);
    stop(&dev);
}

/* Writes one reply as a sample for tests/check_openapi.py validate. */
static void sample(const char *dir, int n, const char *method, const char *route, long status,
                   json_t *body)
{
    char p[700];
    snprintf(p, sizeof p, "%s/sample%d.json", dir, n);
    json_t *s = json_pack("{s:s,s:s,s:I,s:O}", "method", method, "path", route, "status",
                          (json_int_t)status, "body", body);
    cr_assert_eq(json_dump_file(s, p, 0), 0);
    json_decref(s);
}

/* The replies of /v1/devices (empty, listed, busy, refresh) match
 * schema/openapi.yaml. */
Test(devices, replies_match_the_openapi_spec)
{
    start(&dev, 0, "nvidia", "");
    char *dir = tu_tmpdir();
    int n = 0;
    json_t *d = get_devices(&dev);
    sample(dir, n++, "GET", "/v1/devices", 200, d);
    json_decref(d);
    write_devices(&dev, 1, "amd");
    long st = 0;
    json_t *r = tu_json(&dev.c, "POST", "/v1/devices/refresh", NULL, &st);
    cr_assert_eq(st, 202);
    sample(dir, n++, "POST", "/v1/devices/refresh", st, r);
    json_decref(r);
    d = refresh(&dev);
    sample(dir, n++, "GET", "/v1/devices", 200, d);
    json_decref(d);
    char *job = submit_ok(&dev, "[\"fake:slow__1000\"]", "[\"forward\"]", "gpu");
    bool busy = false;
    for (int i = 0; i < 100 && !busy; i++) {
        d = get_devices(&dev);
        busy = jint(d, "free") == 0;
        if (busy)
            sample(dir, n++, "GET", "/v1/devices", 200, d);
        json_decref(d);
        usleep(20 * 1000);
    }
    cr_assert(busy);
    json_decref(tu_wait_job(&dev.c, job, 60));
    char out[700];
    snprintf(out, sizeof out, "%s/checker.out", dir);
    int rc = tu_sh("/usr/bin/python3 '%s/tests/check_openapi.py' validate "
                   "'%s/schema/openapi.yaml' '%s' >'%s' 2>&1",
                   tu_bin("CAPD_SOURCE_DIR"), tu_bin("CAPD_SOURCE_DIR"), dir, out);
    if (rc != 0)
        tu_sh("cat '%s' >&2", out);
    cr_assert_eq(rc, 0, "replies of /v1/devices that do not match schema/openapi.yaml");
    tu_sh("rm -rf '%s'", dir);
    free(dir);
    stop(&dev);
}

/* ---- sharing a device (numerics-only cells) and keeping it alone ---- */

/* POSTs a job of build BUILD, MODELS (a JSON array text) x avx2 x forward
 * with OPTIONS (a JSON object text); asserts 201 and returns its id (valid
 * until stop). */
static char *submit_with(struct env *e, const char *build, const char *models, const char *options)
{
    long st = 0;
    json_t *j = tu_jsonf(&e->c, "POST", "/v1/jobs", &st,
                         "{\"project\":\"t\",\"commit\":\"abcdef1\",\"build\":\"%s\","
                         "\"matrix\":{\"models\":%s,\"widths\":[\"avx2\"],"
                         "\"passes\":[\"forward\"]},\"options\":%s}",
                         build, models, options);
    cr_assert_eq(st, 201, "POST /v1/jobs %s %s: %ld", models, options, st);
    cr_assert_lt(e->njobs, ENV_MAX_JOBS, "a test submits at most %d jobs", ENV_MAX_JOBS);
    char *id = strdup(s_(j, "id"));
    e->jobs[e->njobs++] = id;
    json_decref(j);
    return id;
}

/* start with N devices of TOTAL bytes each (-1: no memory figure). */
static void start_mem(struct env *e, int n, long long total, const char *extra_config)
{
    start(e, 0, "nvidia", extra_config);
    write_devices_mem(e, n, "nvidia", total);
    json_t *d = refresh(e);
    cr_assert_eq(jint(d, "count"), n);
    json_decref(d);
}

#define NUMERICS_GPU "{\"device\":\"gpu\",\"iterations\":0}"
#define TIMING_GPU   "{\"device\":\"gpu\",\"iterations\":2,\"warmup\":0,\"timing_processes\":1}"

/* What polling GET /v1/devices saw while jobs ran. */
struct seen {
    int max_holders[2];  /* the most cells on devices 0 and 1 at once */
    int max_busy;        /* the most devices in use at once */
    bool alone_shared;   /* a device held alone had more than one holder */
    bool alone_seen;     /* a device was seen held alone */
    long long reserved1; /* a holder's reserved_bytes (the last seen) */
    bool sums_wrong;     /* reserved_bytes was not the holders' sum */
};

/* Whether every job of E has ended. */
static bool all_ended(struct env *e)
{
    for (int i = 0; i < e->njobs; i++) {
        char path[128];
        snprintf(path, sizeof path, "/v1/jobs/%s", e->jobs[i]);
        json_t *j = tu_json(&e->c, "GET", path, NULL, NULL);
        const char *st = s_(j, "state");
        bool ended = strcmp(st, "done") == 0 || strcmp(st, "cancelled") == 0;
        json_decref(j);
        if (!ended)
            return false;
    }
    return true;
}

/* One look at GET /v1/devices into SEEN. */
static void look(struct env *e, struct seen *seen)
{
    json_t *d = get_devices(e);
    size_t i;
    json_t *dj;
    int busy = 0;
    json_array_foreach(json_object_get(d, "devices"), i, dj)
    {
        json_t *hs = json_object_get(dj, "holders");
        int n = (int)json_array_size(hs);
        long long sum = 0;
        for (int k = 0; k < n; k++)
            sum += jint(json_array_get(hs, (size_t)k), "reserved_bytes");
        if (n > 0)
            seen->reserved1 = jint(json_array_get(hs, 0), "reserved_bytes");
        seen->sums_wrong |= sum != jint(dj, "reserved_bytes");
        busy += json_is_true(json_object_get(dj, "in_use"));
        cr_assert_eq(json_is_true(json_object_get(dj, "in_use")), n > 0);
        if (i < 2 && n > seen->max_holders[i])
            seen->max_holders[i] = n;
        if (json_is_true(json_object_get(dj, "alone"))) {
            seen->alone_seen = true;
            seen->alone_shared |= n > 1;
        }
    }
    if (busy > seen->max_busy)
        seen->max_busy = busy;
    json_decref(d);
}

/* Polls GET /v1/devices every 20 ms until every job of E has ended (at
 * most a minute). */
static struct seen watch(struct env *e)
{
    struct seen seen;
    memset(&seen, 0, sizeof seen);
    for (int i = 0; i < 3000; i++) {
        look(e, &seen);
        if (i % 10 == 9 && all_ended(e))
            return seen;
        usleep(20 * 1000);
    }
    cr_assert_fail("the jobs did not end within a minute");
    return seen;
}

/* A cell's [started_at, finished_at] in ms. */
struct span {
    int64_t s, f;
};

/* The spans of every cell of job ID into OUT (at most MAX); their count.
 * Every cell must have ended ok. */
static int spans_of(struct env *e, const char *id, struct span *out, int max)
{
    json_t *j = wait_ended(e, id);
    size_t i;
    json_t *c;
    int n = 0;
    json_array_foreach(json_object_get(j, "cells"), i, c)
    {
        cr_assert_str_eq(s_(c, "state"), "ok", "%s: %s", s_(c, "model"), s_(c, "reason"));
        cr_assert_lt(n, max);
        out[n].s = iso_ms(s_(c, "started_at"));
        out[n].f = iso_ms(s_(c, "finished_at"));
        n++;
    }
    json_decref(j);
    return n;
}

/* The most spans of SP[0..N) that held at once. A cell claimed when
 * another ended starts at or after that one's finish, so touching spans
 * do not count. */
static int max_overlap(const struct span *sp, int n)
{
    int best = 0;
    for (int i = 0; i < n; i++) {
        int k = 0;
        for (int j = 0; j < n; j++)
            k += sp[j].s <= sp[i].s && sp[i].s < sp[j].f;
        if (k > best)
            best = k;
    }
    return best;
}

/*
 * Six numerics-only GPU cells, one device without a memory figure (so the
 * count is the only limit), six slots and gpu_cells_per_device 3: three
 * share the device at once, never four.
 */
Test(devices, numerics_cells_share_a_device_up_to_the_count)
{
    start_mem(&dev, 1, -1, "\"max_parallel\":6,\"gpu_cells_per_device\":3");
    char *a = submit_with(&dev, "fake",
                          "[\"fake:slow__1500\",\"fake:slow__1501\",\"fake:slow__1502\","
                          "\"fake:slow__1503\",\"fake:slow__1504\",\"fake:slow__1505\"]",
                          NUMERICS_GPU);
    struct seen seen = watch(&dev);
    struct span sp[8];
    int n = spans_of(&dev, a, sp, 8);
    cr_assert_eq(n, 6);
    cr_assert_eq(max_overlap(sp, n), 3, "three cells share the device, never more: %d",
                 max_overlap(sp, n));
    cr_assert_eq(seen.max_holders[0], 3, "GET /v1/devices showed %d holders at most",
                 seen.max_holders[0]);
    cr_assert_not(seen.alone_seen, "numerics-only cells share");
    cr_assert_not(seen.sums_wrong, "reserved_bytes is the holders' sum");
    cr_assert_eq(seen.reserved1, 0, "no budget, nothing reserved: %lld", seen.reserved1);
    json_t *d = get_devices(&dev);
    json_t *d0 = json_array_get(json_object_get(d, "devices"), 0);
    cr_assert(json_is_null(json_object_get(d0, "budget_bytes")));
    cr_assert_eq(json_array_size(json_object_get(d0, "holders")), 0, "all given back");
    cr_assert_eq(jint(d0, "reserved_bytes"), 0);
    cr_assert_eq(jint(d, "cells_per_device"), 3);
    json_decref(d);
    stop(&dev);
}

/*
 * A timing GPU cell between numerics-only ones: it starts only once the
 * device is empty, nothing joins it, and the numerics-only cells queued
 * behind it do not start on the device before it (no starvation).
 */
Test(devices, a_timing_cell_holds_its_device_alone)
{
    start(&dev, 1, "nvidia", "\"max_parallel\":4");
    char *a = submit_with(&dev, "fake", "[\"fake:slow__1200\",\"fake:slow__1201\"]", NUMERICS_GPU);
    char *b = submit_with(&dev, "fake", "[\"fake:slow__800\"]", TIMING_GPU);
    char *c = submit_with(&dev, "fake", "[\"fake:slow__600\",\"fake:slow__601\"]", NUMERICS_GPU);
    struct seen seen = watch(&dev);
    struct span sa[4], sb[2], sc[4];
    int na = spans_of(&dev, a, sa, 4), nb = spans_of(&dev, b, sb, 2), nc = spans_of(&dev, c, sc, 4);
    cr_assert_eq(na + nb + nc, 5);
    cr_assert_eq(max_overlap(sa, na), 2, "job A's cells shared the device");
    for (int i = 0; i < na; i++)
        cr_assert_geq(sb[0].s, sa[i].f, "the timing cell waited for A's cell %d to end", i);
    for (int i = 0; i < nc; i++)
        cr_assert_geq(sc[i].s, sb[0].f, "C's cell %d did not join or pass the timing cell", i);
    cr_assert(seen.alone_seen, "GET /v1/devices showed the device held alone");
    cr_assert_not(seen.alone_shared, "nothing joined a device held alone");
    stop(&dev);
}

/*
 * Two devices, four numerics-only cells, room for four on each: they
 * spread two and two, each cell sees only its own device, and each is
 * told it shares.
 */
Test(devices, cells_spread_over_two_devices)
{
    start(&dev, 2, "nvidia", "\"max_parallel\":4");
    char *a = submit_with(&dev, "fake",
                          "[\"fake:echo_env__1500\",\"fake:echo_env__1501\","
                          "\"fake:echo_env__1502\",\"fake:echo_env__1503\"]",
                          NUMERICS_GPU);
    struct seen seen = watch(&dev);
    cr_assert_eq(seen.max_busy, 2, "both devices were in use at once");
    cr_assert_eq(seen.max_holders[0], 2, "device 0 had %d", seen.max_holders[0]);
    cr_assert_eq(seen.max_holders[1], 2, "device 1 had %d", seen.max_holders[1]);
    json_t *j = wait_ended(&dev, a);
    int on[2] = {0, 0};
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(j, "cells"), i, c)
    {
        cr_assert_str_eq(s_(c, "state"), "ok", "%s", s_(c, "reason"));
        json_t *m = cell_echo(&dev, a, s_(c, "id"));
        json_t *env = json_object_get(m, "environ");
        const char *v = s_(env, "CUDA_VISIBLE_DEVICES");
        cr_assert(strcmp(v, "0") == 0 || strcmp(v, "1") == 0, "CUDA_VISIBLE_DEVICES=%s", v);
        on[v[0] - '0']++;
        cr_assert_str_eq(s_(env, "HIP_VISIBLE_DEVICES"), v);
        cr_assert_str_eq(s_(env, "ROCR_VISIBLE_DEVICES"), v);
        cr_assert_str_eq(s_(env, "NCCL_NVLS_ENABLE"), "0");
        cr_assert_str_eq(s_(m, "device_share"), "shared");
        json_decref(m);
    }
    cr_assert_eq(on[0], 2, "two cells saw device 0 only");
    cr_assert_eq(on[1], 2, "two cells saw device 1 only");
    json_decref(j);
    stop(&dev);
}

/*
 * The memory budget: an 8 GiB device (budget 0.9 of it), a cell whose
 * earlier run recorded a 3 GiB device peak. Each later run reserves
 * 3 GiB + DEVICES_CONTEXT_BYTES (512 MiB), so two fit and the third waits
 * although gpu_cells_per_device (4) would take it. With no memory figure
 * from the probe only the count limits: all three run at once.
 */
Test(devices, the_memory_budget_refuses_the_next_cell)
{
    start_mem(&dev, 1, 8589934592LL, "\"max_parallel\":4");
    cr_assert_eq(tu_fake_build(&dev.c, "peaky", "{\"FAKE_DEVICE_PEAK_BYTES\":\"3221225472\"}"),
                 201);
    const char *model = "[\"fake:slow__1500\"]";
    struct span sp[4];
    /* Nothing recorded yet: an even share of the budget, 8 GiB x 0.9 / 4. */
    char *first = submit_with(&dev, "peaky", model, NUMERICS_GPU);
    struct seen seen = watch(&dev);
    cr_assert_eq(seen.reserved1, (long long)(8589934592.0 * 0.9) / 4, "%lld", seen.reserved1);
    spans_of(&dev, first, sp, 1);
    char *ids[3];
    for (int i = 0; i < 3; i++)
        ids[i] = submit_with(&dev, "peaky", model, NUMERICS_GPU);
    seen = watch(&dev);
    for (int i = 0; i < 3; i++)
        spans_of(&dev, ids[i], &sp[i], 1);
    cr_assert_eq(max_overlap(sp, 3), 2, "two 3.5 GiB reservations fit 7.2 GiB, three do not: %d",
                 max_overlap(sp, 3));
    cr_assert_eq(seen.reserved1, 3221225472LL + (512LL << 20), "%lld", seen.reserved1);
    cr_assert_not(seen.sums_wrong);

    write_devices_mem(&dev, 1, "nvidia", -1);
    json_t *d = refresh(&dev);
    cr_assert(json_is_null(
        json_object_get(json_array_get(json_object_get(d, "devices"), 0), "budget_bytes")));
    json_decref(d);
    for (int i = 0; i < 3; i++)
        ids[i] = submit_with(&dev, "peaky", model, NUMERICS_GPU);
    for (int i = 0; i < 3; i++)
        spans_of(&dev, ids[i], &sp[i], 1);
    cr_assert_eq(max_overlap(sp, 3), 3, "without a memory figure only the count limits");
    stop(&dev);
}

/*
 * A numerics-only cell that runs out of device memory while it shares the
 * device runs again alone, once: then it is fine (its neighbours had the
 * memory), or it ends oom (it needs more than the device has).
 */
Test(devices, out_of_device_memory_while_sharing_runs_again_alone)
{
    start(&dev, 1, "nvidia", "\"max_parallel\":3");
    char *a = submit_with(&dev, "fake", "[\"fake:devoom\",\"fake:slow__1500\",\"fake:slow__1501\"]",
                          NUMERICS_GPU);
    struct seen seen = watch(&dev);
    cr_assert(seen.alone_seen, "the second attempt held the device alone");
    cr_assert_not(seen.alone_shared);
    json_t *j = wait_ended(&dev, a);
    json_t *oomer = NULL;
    int64_t others_end = 0;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(j, "cells"), i, c)
    {
        cr_assert_str_eq(s_(c, "state"), "ok", "%s: %s", s_(c, "model"), s_(c, "reason"));
        if (strcmp(s_(c, "model"), "fake:devoom") == 0)
            oomer = c;
        else if (iso_ms(s_(c, "finished_at")) > others_end)
            others_end = iso_ms(s_(c, "finished_at"));
    }
    cr_assert_not_null(oomer);
    cr_assert_eq(jint(oomer, "attempts"), 2, "shared once, then alone");
    cr_assert_geq(iso_ms(s_(oomer, "started_at")), others_end,
                  "the second attempt waited for the device to be empty");
    json_decref(j);

    char *b = submit_with(&dev, "fake", "[\"fake:devoom__always\"]", NUMERICS_GPU);
    j = wait_ended(&dev, b);
    c = cell_of(j, 0);
    cr_assert_str_eq(s_(c, "state"), "oom", "%s", s_(c, "reason"));
    cr_assert_eq(jint(c, "attempts"), 2, "retried alone once, not more");
    cr_assert(strstr(s_(c, "reason"), "CUDA out of memory"), "%s", s_(c, "reason"));
    json_decref(j);
    stop(&dev);
}

/* The body of GET /v1/metrics (owned). */
static char *metrics_text(struct env *e)
{
    struct tu_resp r;
    cr_assert_eq(tu_http(&e->c, "GET", "/metrics", NULL, 0, NULL, &r), 0);
    cr_assert_eq(r.status, 200);
    char *t = strdup(r.body ? r.body : "");
    tu_resp_free(&r);
    return t;
}

/*
 * A device error (the runtime says the device failed) takes the device out
 * of the pool with the reason, in GET /v1/devices and /metrics, and the
 * cell runs again once on another device; later cells go to the devices
 * left; when none is left a GPU cell fails at once; a refresh puts every
 * device back.
 */
Test(devices, a_failing_device_leaves_the_pool)
{
    start(&dev, 2, "nvidia", "\"max_parallel\":2");
    char *a = submit_with(&dev, "fake", "[\"fake:devfail__0\"]", NUMERICS_GPU);
    json_t *j = wait_ended(&dev, a);
    json_t *c = cell_of(j, 0);
    cr_assert_str_eq(s_(c, "state"), "ok", "moved to device 1: %s", s_(c, "reason"));
    cr_assert_eq(jint(c, "attempts"), 2);
    json_decref(j);
    json_t *d = get_devices(&dev);
    json_t *d0 = json_array_get(json_object_get(d, "devices"), 0);
    json_t *d1 = json_array_get(json_object_get(d, "devices"), 1);
    cr_assert(strstr(s_(d0, "failed"), "uncorrectable ECC error"), "%s", s_(d0, "failed"));
    cr_assert(json_is_null(json_object_get(d1, "failed")));
    cr_assert_eq(jint(d, "free"), 1, "a device out of the pool is not free");
    json_decref(d);
    char *m = metrics_text(&dev);
    char *f0 = strstr(m, "capd_gpu_device_failed{device=\"0\",reason=\"");
    cr_assert_not_null(f0, "%s", m);
    cr_assert(strstr(f0, "uncorrectable ECC error encountered\"} 1\n") < strchr(f0, '\n') + 1 &&
                  strstr(f0, "uncorrectable ECC error encountered\"} 1\n"),
              "%s", m);
    cr_assert(strstr(m, "capd_gpu_device_failed{device=\"1\",reason=\"\"} 0"));
    cr_assert(strstr(m, "capd_gpu_device_holders{device=\"1\"} 0"));
    free(m);

    char *b = submit_with(&dev, "fake", "[\"fake:echo_env\"]", NUMERICS_GPU);
    j = wait_ended(&dev, b);
    json_t *env = cell_environ(&dev, b, s_(cell_of(j, 0), "id"));
    cr_assert_str_eq(s_(env, "CUDA_VISIBLE_DEVICES"), "1", "device 0 is out of the pool");
    json_decref(env);
    json_decref(j);

    char *f = submit_with(&dev, "fake", "[\"fake:devfail\"]", NUMERICS_GPU);
    j = wait_ended(&dev, f);
    c = cell_of(j, 0);
    cr_assert_str_eq(s_(c, "state"), "failed");
    cr_assert(strstr(s_(c, "reason"), "every GPU device is out of the pool"), "%s",
              s_(c, "reason"));
    json_decref(j);

    d = refresh(&dev);
    cr_assert_eq(jint(d, "free"), 2, "a refresh puts the devices back");
    json_decref(d);
    stop(&dev);
}
