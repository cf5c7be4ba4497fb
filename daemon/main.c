/*
 * daemon/main.c - capd's entry point: configuration, the daemon loop and
 * the HTTP front end, wired together.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/api.h"
#include "daemon/admin/admin_token.h"
#include "daemon/capd.h"
#include "daemon/admin/cmd_db.h"
#include "daemon/admin/cmd_token.h"
#include "daemon/cpu/hostcpu.h"
#include "daemon/host/memlimit.h"
#include "util/log.h"
#include "daemon/child/runas.h"

static void hook_quiesce(void *ud)
{
    api_quiesce(ud);
}

static unsigned hook_inflight(void *ud)
{
    return api_inflight(ud);
}

static void hook_stop(void *ud)
{
    api_stop(ud);
}

static int fail(const char *what, char *err)
{
    fprintf(stderr, "capd: %s: %s\n", what, err ? err : "unknown error");
    log_error("startup_failed", "what=%s err=%s", what, log_q(err));
    free(err);
    return 1;
}

int main(int argc, char **argv)
{
    struct capd_config cfg, scratch;
    const char *config_path = NULL;
    char *err = NULL;
    struct capd *d = NULL;
    struct api *a = NULL;
    int port = 0, rc;

    /* Nothing capd creates (database, logs) is for other users: cells may
     * run as one of them (run_as_user). */
    umask(027);
    if (argc > 1 && strcmp(argv[1], "token") == 0)
        return cmd_token(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "db") == 0)
        return cmd_db(argc - 1, argv + 1);
    /* Flags win over the file, so find --config first, load it, then apply
     * the flags over it. */
    config_defaults(&scratch);
    rc = config_parse_args(&scratch, argc, argv, &config_path, &err);
    if (rc == 1)
        return 0;
    if (rc)
        return fprintf(stderr, "capd: %s\n", err ? err : "bad arguments"), free(err), 2;
    config_defaults(&cfg);
    if (config_path && config_load_file(&cfg, config_path, &err) != 0)
        return fail("config", err) + 1;
    if (config_parse_args(&cfg, argc, argv, &config_path, &err) != 0 ||
        config_finish(&cfg, argv[0], &err) != 0)
        return fail("config", err) + 1;
    enum log_level lvl;
    if (log_parse_level(cfg.log_level, &lvl) != 0)
        return fail("config", strdup("log_level must be debug, info, warn or error")) + 1;
    log_set_level(lvl);
    /* Which widths this host can run is known before any job is taken. */
    if (hostcpu_init(cfg.cpu_features_hide, &err) != 0)
        return fail("config", err) + 1;
    /* How cells' memory is limited, chosen while capd is one thread: the
     * cgroup2 path moves the whole process into a leaf of its subtree. */
    if (mem_init(&cfg, &err) != 0)
        return fail("config", err) + 1;
    if (mkdir(cfg.data_dir, 0750) != 0 && errno != EEXIST) {
        char *m = NULL;
        if (asprintf(&m, "cannot create data dir %s: %s", cfg.data_dir, strerror(errno)) < 0)
            m = NULL;
        return fail("data_dir", m);
    }
    if (runas_check(&cfg, &err) != 0)
        return fail("run_as_user", err);
    if (capd_new(&cfg, &d, &err) != 0)
        return fail("storage", err);
    if (admin_token_bootstrap(&cfg, &err) != 0) {
        capd_free(d);
        return fail("admin_token", err);
    }
    if (!cfg.auth_required)
        log_warn("auth_disabled", "reason=%s",
                 log_q("auth_required is false: every request that reaches the port may do "
                       "everything, registering builds included (docs/security.md)"));
    if (api_start(d, &a, &port, &err) != 0) {
        capd_free(d);
        return fail("listen", err);
    }
    capd_set_bound_port(d, port);
    struct capd_http_hooks hooks = {a, hook_quiesce, hook_inflight, hook_stop};
    capd_set_http_hooks(d, &hooks);
    /* Tests and scripts read the bound port from this line (the text after
     * the last ':'); with TLS the address is a URL, so nobody mistakes the
     * port for a plain-HTTP one. */
    bool tls = api_tls(a);
    printf("capd listening on %s%s:%d\n", tls ? "https://" : "", cfg.listen_addr, port);
    fflush(stdout);
    log_info("listening",
             "addr=%s port=%d scheme=%s data_dir=%s version=%s max_parallel=%d runner_dir=%s",
             cfg.listen_addr, port, tls ? "https" : "http", log_q(cfg.data_dir), CAPD_VERSION,
             cfg.max_parallel, log_q(cfg.runner_dir));
    capd_run(d);
    capd_free(d);
    return 0;
}
