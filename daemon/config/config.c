/*
 * daemon/config/config.c - defaults, the JSON config file and command-line flags.
 *
 * One table describes every setting, so the file parser, the flag parser
 * and the docs cannot drift apart: a key is either in the table or rejected.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/config/config.h"
#include "daemon/config/executor.h"
#include "daemon/frame/frame.h"
#include "daemon/child/runas.h"
#include "util/err.h"

#ifndef CAPD_SOURCE_DIR
#define CAPD_SOURCE_DIR ""
#endif

enum ctype { T_STR, T_INT, T_U64, T_SIZE, T_BOOL, T_LIST, T_FRAC };

/*
 * One row a key: its name is its field's (F), and DEF (SDEF for a string)
 * is its default, which config_defaults() applies, so that a key's type,
 * range and default stand in one place. listen and the two lists have no
 * field of their own (size 0) and are set by their own code. A fraction
 * (T_FRAC, a double) lies in (0, 1] and its default is DDEF.
 */
struct ckey {
    const char *name;
    size_t off;
    size_t size; /* for strings */
    enum ctype type;
    int64_t min, max;
    int64_t def;
    const char *sdef;
    double ddef;
};

#define F(f)                                                                                       \
    .name = #f, .off = offsetof(struct capd_config, f), .size = sizeof(((struct capd_config *)0)->f)
static const struct ckey keys[] = {
    {.name = "listen", .type = T_STR}, /* special: ADDR:PORT */
    {F(data_dir), .type = T_STR, .sdef = "/var/lib/capd"},
    {F(log_level), .type = T_STR, .sdef = "info"},
    {F(http_threads), .type = T_INT, .min = 1, .max = 256, .def = 4},
    {F(max_body_bytes), .type = T_SIZE, .min = 1024, .max = INT64_C(1) << 32, .def = 1 << 20},
    {F(max_cells_per_job), .type = T_INT, .min = 1, .max = 100000, .def = 256},
    {F(max_queued_jobs), .type = T_INT, .min = 0, .max = 1000000, .def = 1000},
    {F(max_parallel), .type = T_INT, .min = 1, .max = 1024, .def = 1},
    {F(max_parallel_numerics), .type = T_INT, .min = 0, .max = 1024},
    {F(max_attempts), .type = T_INT, .min = 1, .max = 100, .def = 3},
    {F(shutdown_deadline_ms), .type = T_INT, .min = 0, .max = 3600000, .def = 10000},
    {F(kill_grace_ms), .type = T_INT, .min = 0, .max = 600000, .def = 5000},
    {F(keep_scratch), .type = T_BOOL},
    {F(unshare_net), .type = T_BOOL},
    {F(cell_log_max_bytes), .type = T_U64, .min = 1024, .max = INT64_MAX, .def = 4 << 20},
    {F(repro_max_bytes), .type = T_U64, .min = 4096, .max = INT64_C(1) << 32, .def = 256 << 20},
    /* Address space is not memory (docs/configuration.md): no cap unless
     * asked for; cells' memory is limited by daemon/memlimit.h. */
    {F(rlimit_as_bytes), .type = T_U64, .min = 0, .max = INT64_MAX, .def = 0},
    {F(cell_memory_mechanism), .type = T_STR, .sdef = "auto"},
    {F(cell_memory_max_bytes), .type = T_U64, .min = 0, .max = INT64_MAX},
    {F(rlimit_cpu_s), .type = T_U64, .min = 0, .max = INT64_MAX, .def = 3600},
    {F(rlimit_nofile), .type = T_U64, .min = 0, .max = 1 << 20, .def = 1024},
    {F(rlimit_nproc), .type = T_U64, .min = 0, .max = 1 << 22, .def = 4096},
    /* The frame parser's own defaults: one source (daemon/frame/frame.h). */
    {F(frame_max_header), .type = T_U64, .min = 256, .max = 1 << 24,
     .def = FRAME_DEFAULT_MAX_HEADER},
    {F(frame_max_payload), .type = T_U64, .min = 0, .max = INT64_C(1) << 34,
     .def = FRAME_DEFAULT_MAX_PAYLOAD},
    {F(frame_max_frames), .type = T_U64, .min = 1, .max = INT64_MAX,
     .def = FRAME_DEFAULT_MAX_FRAMES},
    {F(frame_max_total_payload), .type = T_U64, .min = 0, .max = INT64_MAX,
     .def = FRAME_DEFAULT_MAX_TOTAL_PAYLOAD},
    {F(runner_dir), .type = T_STR},
    {F(exec_bin), .type = T_STR},
    {F(gpuinfo_bin), .type = T_STR},
    {F(analysis_lib), .type = T_STR},
    {F(gpuinfo_timeout_ms), .type = T_INT, .min = 100, .max = 600000, .def = 30000},
    {F(gpu_cells_per_device), .type = T_INT, .min = 1, .max = CAPD_MAX_GPU_CELLS_PER_DEVICE,
     .def = 4},
    {F(gpu_memory_fraction), .type = T_FRAC, .ddef = 0.9},
    {.name = "env_allow", .type = T_LIST},
    {F(cpu_features_hide), .type = T_STR},
    /* Secure by default (docs/security.md): tokens are needed unless the
     * operator turns them off on purpose, on loopback only. */
    {F(auth_required), .type = T_BOOL, .def = true},
    {F(public_reads), .type = T_BOOL},
    {F(metrics_public), .type = T_BOOL},
    {F(max_connections), .type = T_INT, .min = 1, .max = 65536, .def = 1024},
    {F(max_connections_per_ip), .type = T_INT, .min = 1, .max = 65536, .def = 256},
    {F(request_timeout_s), .type = T_INT, .min = 1, .max = 86400, .def = 30},
    {F(connection_memory_bytes), .type = T_SIZE, .min = 8192, .max = 64 << 20, .def = 64 * 1024},
    {F(max_queued_jobs_per_token), .type = T_INT, .min = 0, .max = 1000000, .def = 100},
    {F(max_event_streams), .type = T_INT, .min = 0, .max = 1000000, .def = 256},
    {F(event_heartbeat_s), .type = T_INT, .min = 1, .max = 3600, .def = 15},
    {F(tls_cert), .type = T_STR},
    {F(tls_key), .type = T_STR},
    {F(run_as_user), .type = T_STR, .sdef = "nobody"},
    {F(allow_root_cells), .type = T_BOOL},
    {.name = "allowed_hosts", .type = T_LIST},
    {F(executor), .type = T_STR, .sdef = "local"},
    {F(remote_url), .type = T_STR},
    {F(remote_launch), .type = T_STR},
    {F(remote_start_timeout_s), .type = T_INT, .min = 1, .max = 30 * 86400, .def = 3600},
    {F(slurm_bin_dir), .type = T_STR},
    {F(slurm_conf), .type = T_STR},
    {F(slurm_partition), .type = T_STR},
    {F(slurm_account), .type = T_STR},
    {F(slurm_qos), .type = T_STR},
    {F(slurm_workdir), .type = T_STR, .sdef = "/tmp"},
    {F(slurm_worker), .type = T_STR},
    {F(slurm_poll_ms), .type = T_INT, .min = 100, .max = 600000, .def = 2000},
    {F(slurm_exclusive_timing), .type = T_BOOL, .def = true},
    {F(retention_keep_heads_per_branch), .type = T_INT, .min = 0, .max = 1000000},
    {F(retention_interval_s), .type = T_INT, .min = 0, .max = 30 * 86400},
};
#undef F

const char *config_key_name(size_t i)
{
    return i < sizeof keys / sizeof keys[0] ? keys[i].name : NULL;
}

/* N into the integer, size or boolean field of K. */
static void put_number(struct capd_config *c, const struct ckey *k, int64_t n)
{
    char *base = (char *)c;
    if (k->type == T_INT)
        *(int *)(base + k->off) = (int)n;
    else if (k->type == T_SIZE)
        *(size_t *)(base + k->off) = (size_t)n;
    else if (k->type == T_U64)
        *(uint64_t *)(base + k->off) = (uint64_t)n;
    else if (k->type == T_BOOL)
        *(bool *)(base + k->off) = n != 0;
}

void config_defaults(struct capd_config *c)
{
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const struct ckey *k = &keys[i];
        if (k->type == T_STR && k->sdef)
            snprintf((char *)c + k->off, k->size, "%s", k->sdef);
        else if (k->type == T_FRAC)
            *(double *)((char *)c + k->off) = k->ddef;
        else if (k->size)
            put_number(c, k, k->def);
    }
    snprintf(c->listen_addr, sizeof c->listen_addr, "127.0.0.1");
    c->listen_port = 8470;
    c->run_uid = c->run_gid = -1;
    static const char *allow[] = {"PATH", "LANG", "LC_*", "TZ", "HOME", "OPENBLAS_*"};
    for (size_t i = 0; i < sizeof allow / sizeof allow[0]; i++)
        snprintf(c->env_allow[c->env_allow_n++], 64, "%s", allow[i]);
}

static int set_listen(struct capd_config *c, const char *v, char **err)
{
    const char *colon = strrchr(v, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || colon == v || colon[1] == 0 || *end || port < 0 || port > 65535 ||
        (size_t)(colon - v) >= sizeof c->listen_addr)
        return util_errf(err, -EINVAL,
                         "listen: expected ADDR:PORT (port 0..65535, 0 picks a free one), got '%s'",
                         v);
    snprintf(c->listen_addr, sizeof c->listen_addr, "%.*s", (int)(colon - v), v);
    c->listen_port = (int)port;
    return 0;
}

/* A list key: an array of at most MAX strings of 1..WIDTH-1 bytes, copied
 * into the WIDTH-wide rows at DST. Returns NULL, or what the value must be. */
static const char *set_list(json_t *v, int max, size_t width, char *dst, int *n, const char *what)
{
    size_t i;
    json_t *e;
    if (!json_is_array(v) || json_array_size(v) > (size_t)max)
        return what;
    json_array_foreach(v, i, e)
    {
        if (!json_is_string(e) || json_string_length(e) == 0 || json_string_length(e) >= width)
            return what;
    }
    *n = 0;
    json_array_foreach(v, i, e)
    {
        snprintf(dst + (size_t)(*n)++ * width, width, "%s", json_string_value(e));
    }
    return NULL;
}

static int set_key(struct capd_config *c, const struct ckey *k, json_t *v, char **err)
{
    char *base = (char *)c;
    const char *what = NULL;
    if (strcmp(k->name, "listen") == 0) {
        if (!json_is_string(v))
            what = "a string ADDR:PORT";
        else
            return set_listen(c, json_string_value(v), err);
    } else if (strcmp(k->name, "env_allow") == 0) {
        what = set_list(v, CAPD_MAX_ENV_ALLOW, 64, &c->env_allow[0][0], &c->env_allow_n,
                        "an array of at most 64 variable names of 1..63 characters (a "
                        "trailing * matches a prefix)");
    } else if (strcmp(k->name, "allowed_hosts") == 0) {
        what = set_list(v, CAPD_MAX_ALLOWED_HOST, 256, &c->allowed_hosts[0][0], &c->allowed_hosts_n,
                        "an array of at most 32 host names (NAME or NAME:PORT, 1..255 "
                        "characters; \"*\" accepts any Host)");
    } else if (k->type == T_STR) {
        if (!json_is_string(v) || json_string_length(v) >= k->size)
            what = "a string";
        else
            snprintf(base + k->off, k->size, "%s", json_string_value(v));
    } else if (k->type == T_BOOL) {
        if (!json_is_boolean(v))
            what = "true or false";
        else
            put_number(c, k, json_is_true(v));
    } else if (k->type == T_FRAC) {
        double x = json_number_value(v);
        if (!json_is_number(v) || !(x > 0.0 && x <= 1.0))
            return util_errf(err, -EINVAL, "config key '%s' must be a number in (0, 1]", k->name);
        *(double *)(base + k->off) = x;
    } else {
        json_int_t n = json_is_integer(v) ? json_integer_value(v) : -1;
        if (!json_is_integer(v) || n < k->min || n > k->max)
            what = "an integer in range";
        else
            put_number(c, k, n);
    }
    if (what) {
        if (k->type != T_STR && k->type != T_BOOL && k->type != T_LIST &&
            strcmp(k->name, "listen") != 0)
            return util_errf(err, -EINVAL, "config key '%s' must be an integer in [%lld, %lld]",
                             k->name, (long long)k->min, (long long)k->max);
        return util_errf(err, -EINVAL, "config key '%s' must be %s", k->name, what);
    }
    return 0;
}

static const struct ckey *find_key(const char *name)
{
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strcmp(keys[i].name, name) == 0)
            return &keys[i];
    return NULL;
}

int config_load_file(struct capd_config *c, const char *path, char **err)
{
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    const char *name;
    json_t *v;
    int rc = -EINVAL;
    if (!root)
        return util_errf(err, -EINVAL, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    if (!json_is_object(root)) {
        util_errf(err, rc, "%s: the config must be a JSON object", path);
        goto out;
    }
    json_object_foreach(root, name, v)
    {
        const struct ckey *k = find_key(name);
        if (!k) {
            util_errf(err, rc, "%s: unknown config key '%s'", path, name);
            goto out;
        }
        if (set_key(c, k, v, err))
            goto out;
    }
    rc = 0;
out:
    json_decref(root);
    return rc;
}

void config_usage(FILE *f)
{
    fprintf(f,
            "usage: capd --listen ADDR:PORT --data-dir DIR [--config FILE] [options]\n"
            "       capd --help | --version\n"
            "       capd db backup|vacuum|prune ...   (database care; capd db --help)\n"
            "       capd token create|list|revoke ... (API tokens; capd token --help)\n"
            "\n"
            "capd runs model x width x pass capture jobs for ML framework builds, each cell in\n"
            "its own child process, stores what every layer computed in SQLite and compares a\n"
            "control against a branch head.\n"
            "\n"
            "options (every one is also a key of the JSON config file; flags win):\n"
            "  --listen ADDR:PORT        address to serve HTTP on (default 127.0.0.1:8470;\n"
            "                            port 0 picks a free port, printed on stdout)\n"
            "  --data-dir DIR            database, cell logs and scratch (default /var/lib/capd)\n"
            "  --config FILE             JSON config file (see docs/configuration.md)\n"
            "  --max-parallel N          cells running at once, of every kind (default 1: timings\n"
            "                            need the CPU)\n"
            "  --max-parallel-numerics N numerics-only cells (iterations 0) running at once\n"
            "                            while nothing timed runs (default 0: max_parallel)\n"
            "  --max-attempts N          runs of an interrupted cell before it gives up (3)\n"
            "  --runner-dir DIR          directory holding the capd_runner package\n"
            "  --cpu-features-hide LIST  CPU features capd treats as absent, comma-separated\n"
            "                            (e.g. avx512f: widths needing them end unsupported)\n"
            "  --log-level LEVEL         debug, info, warn or error (default info)\n"
            "  --tls-cert FILE           serve HTTPS with this PEM certificate (chain); needs\n"
            "                            --tls-key (default: plain HTTP, docs/security.md)\n"
            "  --tls-key FILE            the PEM private key of --tls-cert (unencrypted)\n"
            "  --help                    this text\n"
            "  --version                 print the version\n");
}

/* capd's flags, in the order --help lists them. Each but --config, --help
 * and --version sets the config key KEY, an integer or a string (a flag
 * value that is not a number is passed on as a string, so set_key refuses
 * it with the key's range). */
static const struct {
    const char *name, *key;
    int has_arg;
    bool integer;
} flags[] = {
    {"listen", "listen", required_argument, false},
    {"data-dir", "data_dir", required_argument, false},
    {"config", NULL, required_argument, false},
    {"max-parallel", "max_parallel", required_argument, true},
    {"max-attempts", "max_attempts", required_argument, true},
    {"max-parallel-numerics", "max_parallel_numerics", required_argument, true},
    {"runner-dir", "runner_dir", required_argument, false},
    {"cpu-features-hide", "cpu_features_hide", required_argument, false},
    {"log-level", "log_level", required_argument, false},
    {"tls-cert", "tls_cert", required_argument, false},
    {"tls-key", "tls_key", required_argument, false},
    {"help", NULL, no_argument, false},
    {"version", NULL, no_argument, false},
};

#define N_FLAGS (sizeof flags / sizeof flags[0])

/* ARG as the JSON value of the key flags[I] sets. */
static json_t *flag_value(size_t i, const char *arg)
{
    char *end;
    long n;

    if (!flags[i].integer)
        return json_string(arg);
    n = strtol(arg, &end, 10);
    return *end || end == arg ? json_string(arg) : json_integer(n);
}

/* The command line over the config file's values (flags win); 1 when
 * --help or --version has answered. */
int config_parse_args(struct capd_config *c, int argc, char **argv, const char **config_path,
                      char **err)
{
    struct option opts[N_FLAGS + 1] = {{0}};
    int o;

    for (size_t i = 0; i < N_FLAGS; i++)
        opts[i] = (struct option){flags[i].name, flags[i].has_arg, NULL, (int)i + 1};
    optind = 1;
    opterr = 0;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (o < 1 || (size_t)o > N_FLAGS) {
            return util_errf(err, -EINVAL, "unknown or incomplete option '%s' (see capd --help)",
                             argv[optind - 1]);
        }
        const char *name = flags[o - 1].name, *key = flags[o - 1].key;
        if (!key && strcmp(name, "help") == 0) {
            config_usage(stdout);
            return 1;
        }
        if (!key && strcmp(name, "version") == 0) {
            printf("capd %s\n", CAPD_VERSION);
            return 1;
        }
        if (!key) {
            *config_path = optarg;
            continue;
        }
        json_t *v = flag_value((size_t)o - 1, optarg);
        int rc = set_key(c, find_key(key), v, err);
        json_decref(v);
        if (rc)
            return rc;
    }
    if (optind < argc)
        return util_errf(err, -EINVAL, "unexpected argument '%s' (see capd --help)", argv[optind]);
    return 0;
}

/* EXE/INSTALLED into OUT (LEN bytes) when EXE/INSTALLED PROBE is there
 * with access MODE, as an installed capd finds it; else BASE/BUILT, where
 * the build tree has it. */
static void installed_or_built(char *out, size_t len, const char *exe, const char *installed,
                               const char *probe, int mode, const char *base, const char *built)
{
    char cand[PATH_MAX + 64];

    snprintf(cand, sizeof cand, "%s/%s%s", exe, installed, probe);
    if (access(cand, mode) == 0)
        snprintf(out, len, "%.460s/%s", exe, installed);
    else
        snprintf(out, len, "%.480s/%s", base, built);
}

/* NAME in the folder of C's exec shim (".", when its path has none) into
 * OUT (LEN bytes). */
static void beside_shim(const struct capd_config *c, char *out, size_t len, const char *name)
{
    const char *slash = strrchr(c->exec_bin, '/');
    int dir = slash ? (int)(slash - c->exec_bin) : 1;

    snprintf(out, len, "%.*s/%s", dir, slash ? c->exec_bin : ".", name);
}

/* An installed capd finds its runner and exec shim from its own location
 * (PREFIX/bin/capd -> PREFIX/share/capd/runner, PREFIX/libexec/capd/capd-exec);
 * a capd run from the build tree finds capd-exec next to itself and falls
 * back to the source tree's runner/. Only the paths left empty are set. */
static void default_paths(struct capd_config *c)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = 0;
    } else {
        snprintf(exe, sizeof exe, ".");
    }
    /* Installed, the shim is a helper no user runs (FHS: libexec). */
    if (!c->exec_bin[0])
        installed_or_built(c->exec_bin, sizeof c->exec_bin, exe, "../libexec/capd/capd-exec", "",
                           X_OK, exe, "capd-exec");
    /* The GPU probe and the runner's native statistics library sit next
     * to the exec shim, installed or not. */
    if (!c->gpuinfo_bin[0])
        beside_shim(c, c->gpuinfo_bin, sizeof c->gpuinfo_bin, "capd-gpuinfo");
    if (!c->analysis_lib[0])
        beside_shim(c, c->analysis_lib, sizeof c->analysis_lib, "libcapd_analysis.so");
    if (!c->runner_dir[0])
        installed_or_built(c->runner_dir, sizeof c->runner_dir, exe, "../share/capd/runner",
                           "/capd_runner", R_OK, CAPD_SOURCE_DIR, "runner");
}

/* TLS is all or nothing: both files given, and both readable now rather
 * than at the first handshake. */
static int check_tls(const struct capd_config *c, char **err)
{
    if (!c->tls_cert[0] != !c->tls_key[0]) {
        return util_errf(err, -EINVAL,
                         "TLS needs both tls_cert and tls_key (--tls-cert, --tls-key); got only %s",
                         c->tls_cert[0] ? "tls_cert" : "tls_key");
    }
    for (int i = 0; i < 2 && c->tls_cert[0]; i++) {
        const char *path = i ? c->tls_key : c->tls_cert;
        if (access(path, R_OK) != 0) {
            return util_errf(err, -EINVAL, "%s '%s' is not readable: %s",
                             i ? "tls_key" : "tls_cert", path, strerror(errno));
        }
    }
    return 0;
}

/* The executor is one of daemon/config/executor.h's table, with what it needs. */
static int check_executor(const struct capd_config *c, char **err)
{
    const struct executor *e = executor_find(c->executor);
    const char *problem = e && e->config_problem ? e->config_problem(c) : NULL;
    if (!e) {
        char names[128];
        executor_names(names, sizeof names);
        return util_errf(err, -EINVAL, "executor must be %s, not \"%s\"", names, c->executor);
    }
    if (problem)
        return util_errf(err, -EINVAL, "%s", problem);
    if (c->remote_url[0] && strncmp(c->remote_url, "http://", 7) != 0 &&
        strncmp(c->remote_url, "https://", 8) != 0)
        return util_errf(err, -EINVAL, "remote_url must start with http:// or https://: %s",
                         c->remote_url);
    return 0;
}

/* Once the file and the flags are in: the paths left empty, the checks
 * that span several keys, and run_as_user's ids (runas_resolve). */
int config_finish(struct capd_config *c, const char *argv0, char **err)
{
    (void)argv0;
    default_paths(c);
    if (c->data_dir[0] == 0) {
        return util_errf(err, -EINVAL, "data_dir must not be empty");
    }
    if (c->max_connections_per_ip > c->max_connections) {
        return util_errf(err, -EINVAL,
                         "max_connections_per_ip (%d) must not exceed max_connections (%d)",
                         c->max_connections_per_ip, c->max_connections);
    }
    int rc = check_tls(c, err);
    if (rc || (rc = check_executor(c, err)) != 0)
        return rc;
    if (!c->auth_required && !config_listen_is_loopback(c)) {
        return util_errf(err, -EINVAL,
                         "auth_required is false but capd would listen on %s, which is not a "
                         "loopback address: anybody who reaches it could run code; keep "
                         "auth_required true (docs/security.md) or listen on 127.0.0.1",
                         c->listen_addr);
    }
    return runas_resolve(c, err);
}

bool config_listen_is_loopback(const struct capd_config *c)
{
    /* capd listens on IPv4 only (api_start): loopback is 127.0.0.0/8. */
    return strncmp(c->listen_addr, "127.", 4) == 0;
}
