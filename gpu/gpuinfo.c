/*
 * gpu/gpuinfo.c - capd-gpuinfo: lists the GPUs this host has, as JSON on
 * stdout, through the HIP runtime API (or the CUDA runtime, through
 * gpu/hip_cuda_compat.h, when built with CAPD_GPU_CUDA).
 *
 * The daemon never initializes a GPU runtime itself: a runtime context
 * holds device memory and is not fork-safe, and capd forks a child per
 * cell. It runs this probe as a child instead (daemon/host/devices.c) and reads
 * its output, so whatever the runtime does at initialization happens in a
 * process that exits right after.
 *
 * Output (docs/gpu.md is the contract):
 *
 *   {"probe":"capd-gpuinfo","probe_version":1,"runtime":"hip","platform":"amd",
 *    "runtime_version":"5.2.21153","runtime_version_raw":50221153,
 *    "driver_version":...,"driver_version_raw":...,
 *    "devices":[{"index":0,"name":"...","arch":"gfx90a:sramecc+:xnack-",
 *                "compute_capability":"9.0","total_memory_bytes":...,
 *                "free_memory_bytes":...,"pci_bus_id":"0000:c1:00.0",
 *                "uuid":"...","multiprocessors":104}],
 *    "reason":null}
 *
 * No GPU (or no driver) is not an error: "devices" is empty, "reason" says
 * what the runtime answered, and the exit code is 0. Only a failure to
 * write the output gives a non-zero exit.
 *
 * This file depends on nothing but the runtime and libc, so it can be
 * built alone on a GPU host that has no capd build dependencies.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(CAPD_GPU_CUDA)
#include "gpu/hip_cuda_compat.h"
#else
#include <hip/hip_runtime_api.h>
#define CAPD_GPU_RUNTIME_NAME "hip"
#if defined(__HIP_PLATFORM_NVIDIA__) || defined(__HIP_PLATFORM_NVCC__)
#define CAPD_GPU_PLATFORM_NVIDIA 1
#endif
#endif

#define GPUINFO_PROBE_VERSION 1
#define GPUINFO_MAX_DEVICES   64 /* the daemon's limit too (daemon/host/devices.h) */

/* Writes S as a JSON string: quotes, backslashes and control bytes escaped;
 * bytes >= 0x80 pass through (device names are ASCII in practice, and the
 * daemon rejects output that is not UTF-8). */
static void put_str(const char *s)
{
    if (!s) {
        fputs("null", stdout);
        return;
    }
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

/* "name: description" of a runtime error, for the reason fields. */
static const char *err_text(hipError_t e, char *buf, size_t n)
{
    const char *name = hipGetErrorName(e), *desc = hipGetErrorString(e);
    if (!name)
        name = "unknown error";
    /* HIP 5.2's description of an error is its name again. */
    if (!desc || !desc[0] || strcmp(desc, name) == 0)
        snprintf(buf, n, "%s", name);
    else
        snprintf(buf, n, "%s: %s", name, desc);
    return buf;
}

/*
 * Versions as people write them. CUDA encodes 1000*major + 10*minor
 * (13000 is "13.0"); HIP encodes major*10^7 + minor*10^5 + patch
 * (50221153 is "5.2.21153").
 */
static void version_text(int v, char *buf, size_t n)
{
#if defined(CAPD_GPU_PLATFORM_NVIDIA)
    snprintf(buf, n, "%d.%d", v / 1000, (v % 1000) / 10);
#else
    snprintf(buf, n, "%d.%d.%d", v / 10000000, (v / 100000) % 100, v % 100000);
#endif
}

static void put_version(const char *key, hipError_t e, int v)
{
    char buf[64];
    printf("\"%s\":", key);
    if (e == hipSuccess) {
        version_text(v, buf, sizeof buf);
        put_str(buf);
        printf(",\"%s_raw\":%d", key, v);
    } else {
        printf("null,\"%s_raw\":null", key);
    }
}

/* One device. Anything the runtime refuses becomes null, with the first
 * refusal in the device's "error" field: a half-described device is still
 * worth listing, and the daemon schedules it like any other. */
static void put_device(int i)
{
    char buf[320], first_err[320] = "";
    hipDeviceProp_t prop;
    memset(&prop, 0, sizeof prop);
    hipError_t pe = hipGetDeviceProperties(&prop, i);
    if (pe != hipSuccess)
        err_text(pe, first_err, sizeof first_err);
    printf("{\"index\":%d,\"name\":", i);
    put_str(pe == hipSuccess ? prop.name : NULL);
    fputs(",\"arch\":", stdout);
    if (pe != hipSuccess) {
        fputs("null", stdout);
    } else {
#if defined(CAPD_GPU_PLATFORM_NVIDIA)
        snprintf(buf, sizeof buf, "sm_%d%d", prop.major, prop.minor);
        put_str(buf);
#else
        put_str(prop.gcnArchName);
#endif
    }
    fputs(",\"compute_capability\":", stdout);
    if (pe == hipSuccess) {
        snprintf(buf, sizeof buf, "%d.%d", prop.major, prop.minor);
        put_str(buf);
        printf(",\"multiprocessors\":%d", prop.multiProcessorCount);
    } else {
        fputs("null,\"multiprocessors\":null", stdout);
    }

    /* Free memory needs a context on the device; the probe exits right
     * after, which releases it. */
    size_t free_b = 0, total_b = 0;
    hipError_t me = hipSetDevice(i);
    if (me == hipSuccess)
        me = hipMemGetInfo(&free_b, &total_b);
    if (me != hipSuccess && !first_err[0])
        err_text(me, first_err, sizeof first_err);
    if (me == hipSuccess)
        printf(",\"total_memory_bytes\":%zu,\"free_memory_bytes\":%zu", total_b, free_b);
    else if (pe == hipSuccess)
        printf(",\"total_memory_bytes\":%zu,\"free_memory_bytes\":null",
               (size_t)prop.totalGlobalMem);
    else
        fputs(",\"total_memory_bytes\":null,\"free_memory_bytes\":null", stdout);

    char bus[64] = "";
    hipError_t be = hipDeviceGetPCIBusId(bus, (int)sizeof bus, i);
    if (be != hipSuccess && !first_err[0])
        err_text(be, first_err, sizeof first_err);
    fputs(",\"pci_bus_id\":", stdout);
    put_str(be == hipSuccess ? bus : NULL);

    hipDevice_t dev;
    hipUUID uuid;
    memset(&uuid, 0, sizeof uuid);
    hipError_t ue = hipDeviceGet(&dev, i);
    if (ue == hipSuccess)
        ue = hipDeviceGetUuid(&uuid, dev);
    fputs(",\"uuid\":", stdout);
    if (ue == hipSuccess) {
        const unsigned char *u = (const unsigned char *)uuid.bytes;
        int o = 0;
#if defined(CAPD_GPU_PLATFORM_NVIDIA)
        o += snprintf(buf + o, sizeof buf - (size_t)o, "GPU-"); /* as nvidia-smi -L */
#endif
        for (int k = 0; k < 16; k++)
            o += snprintf(buf + o, sizeof buf - (size_t)o, "%s%02x",
                          (k == 4 || k == 6 || k == 8 || k == 10) ? "-" : "", u[k]);
        put_str(buf);
    } else {
        fputs("null", stdout);
    }
    fputs(",\"error\":", stdout);
    put_str(first_err[0] ? first_err : NULL);
    putchar('}');
}

int main(void)
{
    char reason[320] = "";
    int rt = 0, drv = 0, n = 0;
    hipError_t rte = hipRuntimeGetVersion(&rt);
    hipError_t dve = hipDriverGetVersion(&drv);
    hipError_t ce = hipGetDeviceCount(&n);
    if (ce != hipSuccess) {
        err_text(ce, reason, sizeof reason);
        n = 0;
    } else if (n <= 0) {
        snprintf(reason, sizeof reason, "the runtime reports no device");
        n = 0;
    } else if (n > GPUINFO_MAX_DEVICES) {
        snprintf(reason, sizeof reason, "%d devices; only the first %d are listed", n,
                 GPUINFO_MAX_DEVICES);
        n = GPUINFO_MAX_DEVICES;
    }
    printf("{\"probe\":\"capd-gpuinfo\",\"probe_version\":%d,\"runtime\":\"%s\","
           "\"platform\":\"%s\",",
           GPUINFO_PROBE_VERSION, CAPD_GPU_RUNTIME_NAME,
#if defined(CAPD_GPU_PLATFORM_NVIDIA)
           "nvidia"
#else
           "amd"
#endif
    );
    put_version("runtime_version", rte, rt);
    putchar(',');
    put_version("driver_version", dve, drv);
    fputs(",\"devices\":[", stdout);
    for (int i = 0; i < n; i++) {
        if (i)
            putchar(',');
        put_device(i);
    }
    fputs("],\"reason\":", stdout);
    put_str(reason[0] ? reason : NULL);
    fputs("}\n", stdout);
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}
