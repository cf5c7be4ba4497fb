/*
 * storage/layout.c - the paths of storage/layout.h.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

#include "storage/layout.h"

static int __attribute__((format(printf, 3, 4))) fit(char *out, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(out, n, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= n) {
        if (n)
            out[0] = 0;
        return -ENAMETOOLONG;
    }
    return 0;
}

int layout_dir(char *out, size_t n, const char *data_dir, const char *sub)
{
    return fit(out, n, "%s/%s", data_dir, sub);
}

/* A hash is "b" and 64 hex digits: the directory is its first two digits. */
int layout_blob(char *out, size_t n, const char *data_dir, const char *hash)
{
    return fit(out, n, "%s/blobs/%.2s/%s", data_dir, hash[0] ? hash + 1 : hash, hash);
}

int layout_job_logs(char *out, size_t n, const char *data_dir, const char *job)
{
    return fit(out, n, "%s/logs/%s", data_dir, job);
}

int layout_cell_log(char *out, size_t n, const char *data_dir, const char *job, const char *cell)
{
    return fit(out, n, "%s/logs/%s/%s.log", data_dir, job, cell);
}

int layout_zygote_log(char *out, size_t n, const char *data_dir, const char *build)
{
    return fit(out, n, "%s/logs/zygote-%s.log", data_dir, build);
}

int layout_cell_scratch(char *out, size_t n, const char *data_dir, const char *cell, int attempt)
{
    return fit(out, n, "%s/scratch/%s-%d", data_dir, cell, attempt);
}

int layout_cell_spec(char *out, size_t n, const char *data_dir, const char *cell, int attempt)
{
    return fit(out, n, "%s/scratch/%s-%d/cell.json", data_dir, cell, attempt);
}

int layout_zygote_scratch(char *out, size_t n, const char *data_dir, unsigned gen)
{
    return fit(out, n, "%s/scratch/zygote-%u", data_dir, gen);
}

int layout_slurm_script(char *out, size_t n, const char *data_dir, unsigned seq)
{
    return fit(out, n, "%s/scratch/slurm-array-%u.sh", data_dir, seq);
}
