/*
 * daemon/config/config.h - every setting of capd, its default, and how it is read:
 * a JSON config file (--config FILE) first, then command-line flags, which
 * win. docs/configuration.md lists every key.
 */
#ifndef CAPD_CONFIG_H
#define CAPD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CAPD_MAX_ENV_ALLOW    64
#define CAPD_MAX_ALLOWED_HOST 32 /* allowed_hosts entries */
/* gpu_cells_per_device's ceiling: the holders one device keeps. */
#define CAPD_MAX_GPU_CELLS_PER_DEVICE 64

struct capd_config {
    char listen_addr[64];
    int listen_port;
    char data_dir[512];
    char log_level[16];
    int http_threads;
    size_t max_body_bytes;
    int max_cells_per_job;
    int max_queued_jobs;
    int max_parallel;
    int max_parallel_numerics; /* 0: numerics-only cells count like any other */
    int max_attempts;
    int shutdown_deadline_ms;
    int kill_grace_ms;
    bool keep_scratch;
    bool unshare_net;
    uint64_t cell_log_max_bytes;
    uint64_t repro_max_bytes; /* largest reproducer archive served (api/repro.h) */
    uint64_t rlimit_as_bytes; /* 0 (default): no address-space cap; memory is limited below */
    /* Each cell's resident memory (daemon/host/memlimit.h): the mechanism
     * ("auto", "cgroup2", "cgroup1" or "watchdog") and the limit (0: 3/4 of
     * the host's RAM / max_parallel, resolved by mem_init). */
    char cell_memory_mechanism[16];
    uint64_t cell_memory_max_bytes;
    uint64_t rlimit_cpu_s;
    uint64_t rlimit_nofile;
    uint64_t rlimit_nproc;
    uint64_t frame_max_header;
    uint64_t frame_max_payload;
    uint64_t frame_max_frames;
    uint64_t frame_max_total_payload;
    char runner_dir[512];
    char exec_bin[512];
    char gpuinfo_bin[512];  /* the GPU probe (docs/gpu.md); default: next to capd-exec */
    char analysis_lib[512]; /* the runner's native stats (docs/runner.md); next to capd-exec */
    int gpuinfo_timeout_ms; /* the probe is killed past this */
    /* Numerics-only GPU cells sharing one device, at most, and the share
     * of its memory they may reserve (daemon/host/devices.h). */
    int gpu_cells_per_device;
    double gpu_memory_fraction;
    /* Features removed from capd's view of the host CPU, comma-separated
     * (daemon/cpu/hostcpu.h): caps what the host offers; tests use it. */
    char cpu_features_hide[256];
    int env_allow_n;
    char env_allow[CAPD_MAX_ENV_ALLOW][64];

    /* Trust (docs/security.md). */
    bool auth_required;             /* bearer tokens needed (default); false: all are admin */
    bool public_reads;              /* GETs need no token even when auth_required */
    bool metrics_public;            /* /metrics needs no token */
    int max_connections;            /* MHD_OPTION_CONNECTION_LIMIT */
    int max_connections_per_ip;     /* MHD_OPTION_PER_IP_CONNECTION_LIMIT */
    int request_timeout_s;          /* MHD_OPTION_CONNECTION_TIMEOUT (idle seconds) */
    size_t connection_memory_bytes; /* MHD_OPTION_CONNECTION_MEMORY_LIMIT: caps headers */
    int max_queued_jobs_per_token;  /* queued+running jobs of one token; 0 = unlimited */
    int max_event_streams;          /* concurrent GET /v1/events streams; past it 503 */
    int event_heartbeat_s;          /* comment line on idle event streams every N s */
    char tls_cert[512];             /* PEM certificate chain; with tls_key, serve HTTPS */
    char tls_key[512];              /* PEM private key (unencrypted) */
    char run_as_user[64];           /* children's user when capd runs as root; "" = keep root */
    bool allow_root_cells;          /* run_as_user "" while root is refused unless set */
    int allowed_hosts_n;            /* Host names accepted besides the defaults (api/host.c) */
    char allowed_hosts[CAPD_MAX_ALLOWED_HOST][256];
    long run_uid, run_gid; /* resolved by config_finish; -1 = do not switch */

    /* Where cells run (docs/scale.md): "local" (children of capd) or
     * "remote" (remote_launch starts capd-cell, which streams back over
     * HTTP to remote_url; "" = this daemon's own listen address). */
    char executor[16];
    char remote_url[512];
    char remote_launch[1024];
    int remote_start_timeout_s; /* a worker must fetch its spec within this */
    /* executor "slurm" (docs/scale.md): each remote attempt is one sbatch
     * job running slurm_worker (capd-cell) on a node. */
    char slurm_bin_dir[512];   /* sbatch & co; "" = PATH */
    char slurm_conf[512];      /* SLURM_CONF for them; "" = the environment's */
    char slurm_partition[128]; /* "" = the cluster's default */
    char slurm_account[128];
    char slurm_qos[128];
    char slurm_workdir[512];     /* the job's working directory on the node */
    char slurm_worker[512];      /* capd-cell's path on the nodes; "" = next to capd-exec */
    int slurm_poll_ms;           /* one squeue (and scontrol) for all jobs this often */
    bool slurm_exclusive_timing; /* a cell that times gets a whole node */

    /* Retention (docs/operations.md): 0 = keep everything / no timer. */
    int retention_keep_heads_per_branch;
    int retention_interval_s;
};

void config_defaults(struct capd_config *c);

/* The keys of the config file, in the key table's order: NULL past the
 * last (for tests and docs checks, which iterate them). */
const char *config_key_name(size_t i);

/* Loads FILE over the current values; unknown keys and wrong types are
 * errors naming the key. *err is malloc'd on failure. */
int config_load_file(struct capd_config *c, const char *path, char **err);

/* Parses argv over the current values. Returns 0, 1 when --help/--version
 * was handled, or -EINVAL with *err set. */
int config_parse_args(struct capd_config *c, int argc, char **argv, const char **config_path,
                      char **err);

/* Checks cross-field rules and fills paths that default from others. */
int config_finish(struct capd_config *c, const char *argv0, char **err);

/* Whether listen_addr is a loopback address (127.0.0.0/8). */
bool config_listen_is_loopback(const struct capd_config *c);

void config_usage(FILE *f);
#endif
