/*
 * tests/helpers/fakecuda/cuda_runtime_api.h - a stand-in for the CUDA
 * runtime header, declaring exactly what gpu/hip_cuda_compat.h maps, with
 * CUDA's names, values and signatures. CI has no CUDA: building the probe
 * against this (capd-gpuinfo-fakecuda) tests the mapping header and the
 * probe's JSON on a runtime that reports no device, or the fake devices
 * fakecuda.c describes. The real header is checked on a GPU host
 * (docs/gpu.md).
 */
#ifndef CAPD_FAKECUDA_RUNTIME_API_H
#define CAPD_FAKECUDA_RUNTIME_API_H

#include <stddef.h>

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
} cudaError_t;

typedef struct CUuuid_st {
    char bytes[16];
} cudaUUID_t;

struct cudaDeviceProp {
    char name[256];
    cudaUUID_t uuid;
    size_t totalGlobalMem;
    int major, minor;
    int multiProcessorCount;
    int pciBusID, pciDeviceID, pciDomainID;
};

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaDeviceGetPCIBusId(char *bus_id, int len, int device);
cudaError_t cudaRuntimeGetVersion(int *version);
cudaError_t cudaDriverGetVersion(int *version);
const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);

#endif
