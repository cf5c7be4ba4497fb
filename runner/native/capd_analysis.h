/*
 * runner/native/capd_analysis.h - the ABI of libcapd_analysis.so, the
 * runner's native statistics and capture pipe, as runner/capd_runner/native.py
 * loads it with ctypes: every name and code here is mirrored there, and
 * CAPD_ANALYSIS_ABI changes whenever one of them does.
 *
 * capd_analysis.c owns the statistics of one tensor (capd_stats);
 * capd_pipe.c owns the capture pipe (capd_pipe_*), whose analysis threads
 * call capd_stats. The library depends on nothing but libc, libm and
 * pthreads and knows nothing of Python or torch.
 */
#ifndef CAPD_RUNNER_NATIVE_CAPD_ANALYSIS_H
#define CAPD_RUNNER_NATIVE_CAPD_ANALYSIS_H

#include <stdint.h>

#define CAPD_ANALYSIS_ABI 3

/* dtype codes (native.py's _CODES). */
enum {
    CAPD_DT_F32 = 0,
    CAPD_DT_F64 = 1,
    CAPD_DT_F16 = 2,
    CAPD_DT_BF16 = 3,
    CAPD_DT_I64 = 4,
    CAPD_DT_I32 = 5,
    CAPD_DT_I16 = 6,
    CAPD_DT_I8 = 7,
    CAPD_DT_U8 = 8,
    CAPD_DT_BOOL = 9,
};

/* out[]: what capd_stats fills (doubles; counts are exact below 2^53). */
enum {
    CAPD_OUT_MIN,
    CAPD_OUT_MAX,
    CAPD_OUT_MEAN,
    CAPD_OUT_STD,
    CAPD_OUT_L2,
    CAPD_OUT_NAN,
    CAPD_OUT_PINF,
    CAPD_OUT_NINF,
    CAPD_OUT_ZEROS,
    CAPD_OUT_NFINITE,
    CAPD_OUT_N
};

int capd_analysis_abi(void);
int capd_stats(const void *data, int64_t n, int dtype, double *out);

/* The capture pipe (capd_pipe.c): made with its analysis threads and its
 * writer on frame fd FD; snapshots in, tensor frames out, in order. */
void *capd_pipe_new(int fd, int threads);
int64_t capd_pipe_analyze(void *pipe, const void *data, int64_t n, int dtype, int want_stats,
                          int64_t sample_k);
/* capd_pipe_analyze, run on the caller's thread before it returns. */
int64_t capd_pipe_analyze_now(void *pipe, const void *data, int64_t n, int dtype, int want_stats,
                              int64_t sample_k);
int capd_pipe_emit(void *pipe, int64_t aid, const char *prefix, int64_t len, int capture);
/* capd_pipe_analyze_now and capd_pipe_emit (unless PREFIX is NULL) in one call. */
int64_t capd_pipe_record(void *pipe, const void *data, int64_t n, int dtype, int want_stats,
                         int64_t sample_k, const char *prefix, int64_t len, int capture);
int64_t capd_pipe_analyzed(void *pipe);
int capd_pipe_wait_analyzed(void *pipe, int64_t count);
int capd_pipe_drain(void *pipe);
int capd_pipe_hashes(void *pipe, int64_t first, int64_t n, char *out);
int capd_pipe_reset(void *pipe);
void capd_pipe_counts(void *pipe, int64_t *out);
void capd_pipe_free(void *pipe);

#endif
