/*
 * tests/helpers/fakecuda/fakecuda.c - the fake CUDA runtime behind
 * capd-gpuinfo-fakecuda, steered by the environment:
 *
 *   FAKE_CUDA_DEVICES=N      N devices (default 0: cudaErrorNoDevice)
 *   FAKE_CUDA_NAME=S         every device's name (default "Fake GPU")
 *   FAKE_CUDA_NO_DRIVER=1    cudaGetDeviceCount and cudaDriverGetVersion
 *                            answer cudaErrorInsufficientDriver
 *   FAKE_CUDA_MEMINFO_FAILS=1  cudaMemGetInfo fails (a half-described device)
 *
 * Device i: compute capability 9.0, 132 multiprocessors, (i+1) GiB total
 * and i+1 MiB less free, PCI bus id 0000:(0x10+i):00.0, UUID bytes i, i+1...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_runtime_api.h"

static int ndev(void)
{
    const char *s = getenv("FAKE_CUDA_DEVICES");
    return s ? atoi(s) : 0;
}

static int flag(const char *name)
{
    const char *s = getenv(name);
    return s && strcmp(s, "1") == 0;
}

static int current = 0;

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = 0;
    if (flag("FAKE_CUDA_NO_DRIVER"))
        return cudaErrorInsufficientDriver;
    if (ndev() <= 0)
        return cudaErrorNoDevice;
    *count = ndev();
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
    if (d < 0 || d >= ndev())
        return cudaErrorInvalidDevice;
    memset(p, 0, sizeof *p);
    const char *name = getenv("FAKE_CUDA_NAME");
    snprintf(p->name, sizeof p->name, "%s", name ? name : "Fake GPU");
    for (int k = 0; k < 16; k++)
        p->uuid.bytes[k] = (char)(d + k);
    p->totalGlobalMem = (size_t)(d + 1) << 30;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->pciBusID = 0x10 + d;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
    if (d < 0 || d >= ndev())
        return cudaErrorInvalidDevice;
    current = d;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    if (flag("FAKE_CUDA_MEMINFO_FAILS"))
        return cudaErrorInvalidValue;
    *total_bytes = (size_t)(current + 1) << 30;
    *free_bytes = *total_bytes - ((size_t)(current + 1) << 20);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *bus_id, int len, int d)
{
    if (d < 0 || d >= ndev())
        return cudaErrorInvalidDevice;
    snprintf(bus_id, (size_t)len, "0000:%02x:00.0", 0x10 + d);
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    *v = 13000;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    *v = 0;
    if (flag("FAKE_CUDA_NO_DRIVER"))
        return cudaErrorInsufficientDriver;
    *v = 13000;
    return cudaSuccess;
}

/* The errors the fake answers with, by name and message; any other code
 * reads as cudaErrorInvalidDevice, and a code without a message of its own
 * reads as "fake error". */
static const struct {
    cudaError_t code;
    const char *name, *text;
} errors[] = {
    {cudaSuccess, "cudaSuccess", NULL},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", NULL},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
};

static int error_index(cudaError_t e)
{
    for (int i = 0; i < (int)(sizeof errors / sizeof errors[0]); i++)
        if (errors[i].code == e)
            return i;
    return -1;
}

const char *cudaGetErrorName(cudaError_t e)
{
    int i = error_index(e);
    return i < 0 ? "cudaErrorInvalidDevice" : errors[i].name;
}

const char *cudaGetErrorString(cudaError_t e)
{
    int i = error_index(e);
    return i < 0 || !errors[i].text ? "fake error" : errors[i].text;
}
