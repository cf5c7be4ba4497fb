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

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return "cudaSuccess";
    case cudaErrorInvalidValue:
        return "cudaErrorInvalidValue";
    case cudaErrorInsufficientDriver:
        return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice:
        return "cudaErrorNoDevice";
    default:
        return "cudaErrorInvalidDevice";
    }
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient for CUDA runtime version";
    default:
        return "fake error";
    }
}
