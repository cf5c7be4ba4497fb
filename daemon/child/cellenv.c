/* daemon/child/cellenv.c - the environment a cell of a build gets (cellenv.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/child/cellenv.h"
#include "daemon/cpu/widths.h"

extern char **environ;

static bool env_allowed(const struct capd_config *cfg, const char *kv)
{
    const char *eq = strchr(kv, '=');
    size_t klen = eq ? (size_t)(eq - kv) : strlen(kv);
    for (int i = 0; i < cfg->env_allow_n; i++) {
        const char *p = cfg->env_allow[i];
        size_t pl = strlen(p);
        if (pl > 0 && p[pl - 1] == '*') {
            if (klen >= pl - 1 && strncmp(kv, p, pl - 1) == 0)
                return true;
        } else if (pl == klen && strncmp(kv, p, klen) == 0) {
            return true;
        }
    }
    return false;
}

/* The allow-listed part of capd's environment, then capd's defaults that a
 * build may override. */
static void base_env(const struct capd_config *cfg, json_t *env, const char *scratch)
{
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq || !env_allowed(cfg, *e))
            continue;
        char key[256];
        if ((size_t)(eq - *e) >= sizeof key)
            continue; /* no allow-list pattern names a variable that long */
        snprintf(key, sizeof key, "%.*s", (int)(eq - *e), *e);
        json_object_set_new(env, key, json_string(eq + 1));
    }
    /* A cell running as run_as_user cannot use capd's HOME (caches, config
     * files); its scratch dir is its home unless the build says otherwise. */
    if (cfg->run_uid >= 0)
        json_object_set_new(env, "HOME", json_string(scratch));
    /* The runner's native statistics, when built: below the build's
     * variables, so a build can turn it off (CAPD_RUNNER_NATIVE=""). */
    if (cfg->analysis_lib[0] && access(cfg->analysis_lib, R_OK) == 0)
        json_object_set_new(env, "CAPD_RUNNER_NATIVE", json_string(cfg->analysis_lib));
}

json_t *cellenv_object(const struct capd_config *cfg, json_t *build, json_t *spec,
                       const char *scratch, const char *spec_path)
{
    json_t *env = json_object();
    const char *k;
    json_t *v;
    if (!env)
        return NULL;
    base_env(cfg, env, scratch);
    json_object_foreach(json_object_get(build, "env"), k, v)
    {
        json_object_set(env, k, v);
    }
    json_object_foreach(width_env(json_string_value(json_object_get(spec, "width"))), k, v)
    {
        json_object_set(env, k, v);
    }
    const char *pp = json_string_value(json_object_get(env, "PYTHONPATH"));
    char *path = NULL;
    if (asprintf(&path, "%s%s%s", pp ? pp : "", pp ? ":" : "", cfg->runner_dir) >= 0) {
        json_object_set_new(env, "PYTHONPATH", json_string(path));
        free(path);
    }
    json_int_t threads =
        json_integer_value(json_object_get(json_object_get(spec, "options"), "threads"));
    /* The framework's pools follow options.threads unless the build says
     * otherwise: OpenMP (intra-op), MKL, OpenBLAS; the runner sets torch's
     * inter-op pool from the same number. */
    static const char *const pools[] = {"OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                        "OPENBLAS_NUM_THREADS"};
    for (size_t i = 0; threads > 0 && i < sizeof pools / sizeof pools[0]; i++) {
        char t[32];
        snprintf(t, sizeof t, "%lld", (long long)threads);
        if (!json_object_get(env, pools[i]))
            json_object_set_new(env, pools[i], json_string(t));
    }
    /* A GPU cell's device (daemon/host/devices.c): set last, so no build
     * variable can point the cell at a device another cell holds. */
    json_object_foreach(json_object_get(spec, "device_env"), k, v)
    {
        json_object_set(env, k, v);
    }
    json_object_set_new(env, "PYTHONDONTWRITEBYTECODE", json_string("1"));
    json_object_set_new(env, "PYTHONUNBUFFERED", json_string("1"));
    json_object_set_new(env, "CAPD_CELL_SPEC", json_string(spec_path));
    /* The width's name: several widths may share ATEN_CPU_CAPABILITY
     * (avx512 and amx), and a factory or a test build may ask which. */
    const char *wname = json_string_value(json_object_get(spec, "width"));
    if (wname)
        json_object_set_new(env, "CAPD_WIDTH", json_string(wname));
    return env;
}

char **cellenv_strv(json_t *env)
{
    const char *k;
    json_t *v;
    size_t n = json_object_size(env), i = 0;
    char **out = calloc(n + 1, sizeof *out);
    if (!out)
        return NULL;
    json_object_foreach(env, k, v)
    {
        if (asprintf(&out[i], "%s=%s", k, json_string_value(v)) < 0) {
            out[i] = NULL;
            cellenv_free(out);
            return NULL;
        }
        i++;
    }
    return out;
}

void cellenv_free(char **v)
{
    for (size_t i = 0; v && v[i]; i++)
        free(v[i]);
    free(v);
}

char **cellenv_without(char *const *env, bool (*drop)(const char *kv), size_t spare, size_t *kept)
{
    size_t n = 0, k = 0;
    while (env[n])
        n++;
    char **out = calloc(n + spare + 1, sizeof *out);
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (!drop(env[i]))
            out[k++] = env[i];
    *kept = k;
    return out;
}
