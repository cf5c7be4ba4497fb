/*
 * runner/native/capd_xxh3_avx2.c - XXH3-128 built for AVX2.
 *
 * This file alone is compiled with -mavx2 (CMakeLists.txt, on x86-64), so
 * libxxhash's header picks its AVX2 code; capd_pipe.c calls it only on a CPU
 * that has AVX2 and the SSE2 build elsewhere. xxHash's vector paths give the
 * same hash bit for bit, so a record's hash does not depend on the CPU. The
 * hash is on the hook's path (the analysis runs in the hook) and AVX2 reads
 * about 1.7 times as fast as SSE2 on this code.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

XXH128_hash_t capd__xxh3_128_avx2(const void *data, size_t len);

XXH128_hash_t capd__xxh3_128_avx2(const void *data, size_t len)
{
    return XXH3_128bits(data, len);
}
