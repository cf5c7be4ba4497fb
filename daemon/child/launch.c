/*
 * daemon/child/launch.c - the limits of cells and zygotes and the capd-exec
 * command line (see launch.h). It owns the order of capd-exec's flags and
 * the GPU cell's missing address-space cap.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "daemon/child/launch.h"

static void limits_from(const struct capd_config *cfg, struct launch_limits *out)
{
    *out = (struct launch_limits){
        .rl = {.as = cfg->rlimit_as_bytes,
               .cpu = cfg->rlimit_cpu_s,
               .nofile = cfg->rlimit_nofile,
               .nproc = cfg->rlimit_nproc},
        .unshare_net = cfg->unshare_net,
        .uid = cfg->run_uid,
        .gid = cfg->run_gid,
    };
}

void launch_cell_limits(const struct capd_config *cfg, const json_t *spec,
                        struct launch_limits *out)
{
    limits_from(cfg, out);
    if (json_object_get(spec, "device_env"))
        out->rl.as = 0;
}

void launch_zygote_limits(const struct capd_config *cfg, struct launch_limits *out)
{
    limits_from(cfg, out);
    out->rl.cpu = 0;
}

/* The command line being built: N entries so far, K numbers formatted. */
struct builder {
    struct launch_argv *out;
    int n, k;
    bool full;
};

static void add(struct builder *b, const char *arg)
{
    if (b->n + 1 >= LAUNCH_ARGV_MAX) {
        b->full = true;
        return;
    }
    b->out->argv[b->n++] = (char *)arg;
}

/* FLAG and its value, formatted into the command line's own storage. */
static void add_u(struct builder *b, const char *flag, unsigned long long v)
{
    char *num = b->out->num[b->k++];
    snprintf(num, sizeof b->out->num[0], "%llu", v);
    add(b, flag);
    add(b, num);
}

static void add_l(struct builder *b, const char *flag, long v)
{
    char *num = b->out->num[b->k++];
    snprintf(num, sizeof b->out->num[0], "%ld", v);
    add(b, flag);
    add(b, num);
}

int launch_exec_argv(const char *exec_bin, const struct launch_exec *e, char *const *prog,
                     struct launch_argv *out)
{
    struct builder b = {.out = out};
    const struct launch_limits *l = &e->lim;
    memset(out, 0, sizeof *out);
    add(&b, exec_bin);
    if (l->rl.as)
        add_u(&b, "--as", l->rl.as);
    if (l->rl.cpu)
        add_u(&b, "--cpu", l->rl.cpu);
    if (l->rl.nofile)
        add_u(&b, "--nofile", l->rl.nofile);
    if (l->rl.nproc)
        add_u(&b, "--nproc", l->rl.nproc);
    if (l->unshare_net)
        add(&b, "--unshare-net");
    if (l->uid >= 0) {
        add_l(&b, "--uid", l->uid);
        add_l(&b, "--gid", l->gid);
    }
    if (e->rusage_fd >= 0)
        add_l(&b, "--rusage-fd", e->rusage_fd);
    if (e->zygote) {
        add(&b, "--zygote");
        add(&b, e->zygote);
        if (e->cgroup && e->cgroup[0]) {
            add(&b, "--cgroup");
            add(&b, e->cgroup);
        }
    }
    add(&b, "--");
    for (char *const *p = prog; *p; p++)
        add(&b, *p);
    out->argv[b.n] = NULL;
    return b.full ? -E2BIG : 0;
}
