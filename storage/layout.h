/*
 * storage/layout.h - the data dir's layout, in one place: every path below
 * DATA is asked for here, by storage (blobs, logs in a backup and a prune),
 * the daemon (a cell's log and scratch dir, a zygote's) and the API (a
 * cell's log), so no two parts can disagree about where a file lives.
 *
 *   DATA/capd.db                      the database (WAL beside it)
 *   DATA/blobs/<h1h2>/<hash>          content-addressed payloads
 *   DATA/logs/<job>/<cell>.log        a cell's captured stdout and stderr
 *   DATA/logs/zygote-<build>.log      a prefork zygote's
 *   DATA/scratch/<cell>-<attempt>     a cell attempt's working directory
 *   DATA/scratch/zygote-<gen>         a zygote's
 *   DATA/scratch/slurm-array-<n>.sh   a Slurm job array's script, until sbatch read it
 *
 * Each function writes the path into OUT (N bytes) and returns 0, or
 * -ENAMETOOLONG when it does not fit (OUT then holds "").
 */
#ifndef CAPD_LAYOUT_H
#define CAPD_LAYOUT_H

#include <stddef.h>

/* Paths capd builds fit this: a data dir of up to ~3.5 KiB and its ids. */
#define LAYOUT_PATH_MAX 4096

int layout_dir(char *out, size_t n, const char *data_dir, const char *sub); /* DATA/SUB */
int layout_blob(char *out, size_t n, const char *data_dir, const char *hash);
int layout_job_logs(char *out, size_t n, const char *data_dir, const char *job);
int layout_cell_log(char *out, size_t n, const char *data_dir, const char *job, const char *cell);
int layout_zygote_log(char *out, size_t n, const char *data_dir, const char *build);
int layout_cell_scratch(char *out, size_t n, const char *data_dir, const char *cell, int attempt);
/* The cell spec in that scratch dir: .../scratch/CELL-ATTEMPT/cell.json */
int layout_cell_spec(char *out, size_t n, const char *data_dir, const char *cell, int attempt);
int layout_zygote_scratch(char *out, size_t n, const char *data_dir, unsigned gen);
int layout_slurm_script(char *out, size_t n, const char *data_dir, unsigned seq);

#endif
