/*
 * gpu/hip_cuda_compat.h - the handful of HIP runtime calls capd-gpuinfo
 * uses, mapped onto the CUDA runtime (CMake option CAPD_GPU_CUDA=ON).
 *
 * Why not HIP's own NVIDIA headers: the HIP 5.2 headers Debian ships
 * (hip/nvidia_detail/) wrap the whole CUDA runtime, and some wrappers no
 * longer compile against CUDA 13 (hipMemAdvise passes an int where CUDA 13
 * wants a cudaMemLocation). The probe needs a dozen calls, so mapping those
 * is smaller and keeps one probe source for both vendors.
 *
 * Only what gpu/gpuinfo.c uses is here; every mapping keeps HIP's signature
 * so the probe source does not know which runtime it was built against,
 * except through CAPD_GPU_PLATFORM_NVIDIA (for the architecture string and
 * the version format, which differ between the vendors).
 */
#ifndef CAPD_GPU_HIP_CUDA_COMPAT_H
#define CAPD_GPU_HIP_CUDA_COMPAT_H

#include <stddef.h>
#include <string.h>

#include <cuda_runtime_api.h>

#define CAPD_GPU_PLATFORM_NVIDIA 1
#define CAPD_GPU_RUNTIME_NAME    "cuda"

typedef cudaError_t hipError_t;
typedef struct cudaDeviceProp hipDeviceProp_t;
typedef int hipDevice_t;
typedef struct {
    char bytes[16];
} hipUUID;

#define hipSuccess       cudaSuccess
#define hipErrorNoDevice cudaErrorNoDevice

static inline hipError_t hipGetDeviceCount(int *count)
{
    return cudaGetDeviceCount(count);
}

static inline hipError_t hipGetDeviceProperties(hipDeviceProp_t *prop, int device)
{
    return cudaGetDeviceProperties(prop, device);
}

static inline hipError_t hipSetDevice(int device)
{
    return cudaSetDevice(device);
}

static inline hipError_t hipMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    return cudaMemGetInfo(free_bytes, total_bytes);
}

static inline hipError_t hipDeviceGetPCIBusId(char *bus_id, int len, int device)
{
    return cudaDeviceGetPCIBusId(bus_id, len, device);
}

static inline hipError_t hipRuntimeGetVersion(int *version)
{
    return cudaRuntimeGetVersion(version);
}

static inline hipError_t hipDriverGetVersion(int *version)
{
    return cudaDriverGetVersion(version);
}

static inline const char *hipGetErrorName(hipError_t e)
{
    return cudaGetErrorName(e);
}

static inline const char *hipGetErrorString(hipError_t e)
{
    return cudaGetErrorString(e);
}

/* The CUDA runtime names devices by ordinal; a hipDevice_t is that ordinal. */
static inline hipError_t hipDeviceGet(hipDevice_t *device, int ordinal)
{
    *device = ordinal;
    return cudaSuccess;
}

/* CUDA keeps the UUID in the device properties rather than behind a call. */
static inline hipError_t hipDeviceGetUuid(hipUUID *uuid, hipDevice_t device)
{
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e == cudaSuccess)
        memcpy(uuid->bytes, p.uuid.bytes, sizeof uuid->bytes);
    return e;
}

#endif
