/*
 * daemon/child/launch.h - what a cell or a zygote runs under, in one place: the
 * rlimits, the network namespace and the user from the configuration (with
 * the rule that a GPU cell has no address-space cap), and the capd-exec
 * command line that applies them (daemon/prefork/exec_shim.c's usage). A
 * fresh-exec cell hands the same limits to spawn_cell (daemon/child/spawn.h);
 * a prefork cell and a zygote get them as capd-exec flags.
 *
 * Usage:
 *
 *     struct launch_exec e = {.rusage_fd = 4, .zygote = sock};
 *     launch_cell_limits(cfg, spec, &e.lim);
 *     struct launch_argv a;
 *     char *prog[] = {python, "-m", "capd_runner", NULL};
 *     if (launch_exec_argv(cfg->exec_bin, &e, prog, &a) == 0)
 *         posix_spawn(..., cfg->exec_bin, ..., a.argv, env);
 *
 * Conventions: 0 or -errno; no state, any thread.
 */
#ifndef CAPD_LAUNCH_H
#define CAPD_LAUNCH_H

#include <jansson.h>
#include <stdbool.h>

#include "daemon/config/config.h"
#include "util/child.h"

/* The most entries of a capd-exec command line, its NULL included. */
#define LAUNCH_ARGV_MAX 48

struct launch_limits {
    struct util_child_rlimits rl;
    bool unshare_net;
    long uid, gid; /* -1 (both): capd's own */
};

/*
 * A cell's limits: the configured ones, except that a GPU cell (its spec
 * has "device_env") gets no address-space cap: the CUDA and HIP runtimes
 * reserve virtual address space for all host and device memory at
 * initialization (hundreds of GiB on a large GPU), far past any cap that
 * would mean something for a CPU cell (docs/gpu.md).
 */
void launch_cell_limits(const struct capd_config *cfg, const json_t *spec,
                        struct launch_limits *out);

/* A zygote's limits: the cells' own but CPU seconds, which each child sets
 * for itself (the zygote lives long). Zygotes serve CPU cells only. */
void launch_zygote_limits(const struct capd_config *cfg, struct launch_limits *out);

/* How capd-exec is to start PROGRAM, besides the limits. */
struct launch_exec {
    struct launch_limits lim;
    int rusage_fd;      /* --rusage-fd; -1 for none */
    const char *zygote; /* --zygote SOCKET; NULL for a fork+exec */
    const char *cgroup; /* --cgroup DIR with a zygote; NULL or "" for none */
};

/* A built command line: ARGV points into the struct and at the caller's
 * strings, so it lives no longer than either. */
struct launch_argv {
    char *argv[LAUNCH_ARGV_MAX];
    char num[8][24];
};

/*
 * Fills OUT with "EXEC_BIN [flags] -- PROG..." (PROG NULL-terminated).
 * -E2BIG when it would not fit LAUNCH_ARGV_MAX.
 */
int launch_exec_argv(const char *exec_bin, const struct launch_exec *e, char *const *prog,
                     struct launch_argv *out);

#endif
