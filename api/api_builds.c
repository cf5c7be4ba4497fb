/*
 * api/api_builds.c - /v1/builds: how the framework under test is run.
 * A build names an interpreter that must exist and be executable by the
 * cell user, its environment, and the directories user models may be
 * imported from (each one a directory the cell user can read). A template
 * build has {commit} in its python or env values (storage/store.h): its
 * interpreter is checked per job instead.
 */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/api_int.h"
#include "daemon/child/runas.h"

#define BUILD_MAX_ENV   128
#define BUILD_MAX_ROOTS 32

/* True when a path has a component that is exactly "." or "..". */
static bool has_dot_component(const char *p)
{
    while (*p) {
        while (*p == '/')
            p++;
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
            return true;
        p += n;
    }
    return false;
}

/*
 * Variables that make the dynamic loader, the Python interpreter or a shell
 * run code of the value's choosing in the runner's own process, before the
 * runner (and so any check of capd's) gets control. A build may set one
 * only when the admin also names it in allow_env, so a value pasted from
 * elsewhere cannot do it by accident. PYTHONPATH and LD_LIBRARY_PATH stay
 * allowed: builds need them, and they only say where code is looked for.
 * docs/security.md lists the reasons one by one.
 */
static const char *const env_hooks[] = {
    "LD_PRELOAD", "LD_AUDIT",         "GCONV_PATH",     "PYTHONSTARTUP",    "PYTHONINSPECT",
    "PYTHONHOME", "PYTHONPLATLIBDIR", "PYTHONUSERBASE", "PYTHONBREAKPOINT", "BASH_ENV",
    "ENV",
};

static bool env_name_ok(const char *k)
{
    if (!k[0] || strlen(k) > 128)
        return false;
    for (const char *c = k; *c; c++)
        if (!((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') ||
              *c == '_'))
            return false;
    return true;
}

/* The build's env (names, values, limits, the hooks above) and allow_env:
 * replies and returns false on bad input. */
static bool validate_env(struct api_req *r, json_t *env, json_t *allow, enum MHD_Result *ret)
{
    const char *k;
    json_t *v;
    size_t i;
    if (env && !json_is_object(env)) {
        *ret = api_error(r, 400, "invalid_field", "env", "env must be an object of strings");
        return false;
    }
    if (json_object_size(env) > BUILD_MAX_ENV) {
        *ret =
            api_error(r, 400, "too_many", "env", "env has more than %d variables", BUILD_MAX_ENV);
        return false;
    }
    bool allow_ok = !allow || (json_is_array(allow) && json_array_size(allow) <= BUILD_MAX_ENV);
    json_array_foreach(allow, i, v)
    {
        allow_ok = allow_ok && json_is_string(v) && env_name_ok(json_string_value(v));
    }
    if (!allow_ok) {
        *ret = api_error(r, 400, "invalid_field", "allow_env",
                         "allow_env must be an array of at most %d variable names", BUILD_MAX_ENV);
        return false;
    }
    json_object_foreach(env, k, v)
    {
        if (!env_name_ok(k) || !json_is_string(v) || json_string_length(v) > 8192 ||
            memchr(json_string_value(v), 0, json_string_length(v)) ||
            strcmp(k, "CAPD_CELL_SPEC") == 0 || strcmp(k, "CAPD_WIDTH") == 0) {
            *ret = api_error(r, 400, "invalid_field", "env",
                             "env entry '%s' must be NAME=[A-Za-z0-9_]+ with a string value "
                             "(CAPD_CELL_SPEC and CAPD_WIDTH are reserved)",
                             k);
            return false;
        }
        for (size_t h = 0; h < sizeof env_hooks / sizeof env_hooks[0]; h++) {
            if (strcmp(k, env_hooks[h]) == 0 && !api_in_list(allow, k)) {
                *ret = api_error(r, 400, "forbidden_env", "env",
                                 "env sets %s, which makes the loader or interpreter run code "
                                 "before the runner starts; list it in allow_env to set it on "
                                 "purpose (docs/security.md)",
                                 k);
                return false;
            }
        }
    }
    return true;
}

/*
 * A build that registers fine but whose every cell dies at exec was the
 * worst first experience capd had: the interpreter or a model root that
 * capd (root) reaches but the cell user (nobody) does not. Registration
 * checks as the cell user (daemon/child/runas.h) and names the path, the user
 * and what is missing. 400 cell_user_denied for permissions, invalid_field
 * for a path that does not exist or is of the wrong type.
 */
static bool cell_user_can(struct api_req *r, const char *path, enum runas_need need,
                          const char *field, enum MHD_Result *ret)
{
    char why[1024];
    int rc = runas_can_use(api_cfg(r), path, need, why, sizeof why);
    if (rc == 0)
        return true;
    *ret = api_error(r, 400, rc == -EACCES ? "cell_user_denied" : "invalid_field", field, "%s %s",
                     need == RUNAS_EXEC ? "interpreter" : "model root", why);
    return false;
}

/*
 * A template interpreter (docs/history.md, "Bisection"): every brace in it
 * opens STORE_BUILD_COMMIT, and no component is "." or "..", so the
 * expanded path stays where it was written whatever the commit.
 */
static bool python_template_ok(struct api_req *r, const char *py, enum MHD_Result *ret)
{
    const char *p = py;
    while ((p = strpbrk(p, "{}")) != NULL) {
        if (strncmp(p, STORE_BUILD_COMMIT, strlen(STORE_BUILD_COMMIT)) != 0)
            break;
        p += strlen(STORE_BUILD_COMMIT);
    }
    if (!p && !(strstr(py, STORE_BUILD_COMMIT) && has_dot_component(py)))
        return true;
    *ret = api_error(r, 400, "invalid_field", "python",
                     "python may hold no placeholder but %s, and a template path no . or .. "
                     "component",
                     STORE_BUILD_COMMIT);
    return false;
}

/* Validates a build body; replies and returns NULL on bad input. The
 * result is normalized (env and model_roots always present). */
static json_t *validate_build(struct api_req *r, json_t *b, const char *name, enum MHD_Result *ret)
{
    const char *k;
    json_t *v;
    json_object_foreach(b, k, v)
    {
        if (strcmp(k, "name") && strcmp(k, "python") && strcmp(k, "env") &&
            strcmp(k, "description") && strcmp(k, "model_roots") && strcmp(k, "prefork") &&
            strcmp(k, "allow_env")) {
            *ret = api_error(r, 400, "unknown_field", k, "unknown field '%s'", k);
            return NULL;
        }
    }
    if (!api_valid_name(name, 64)) {
        *ret = api_error(r, 400, "invalid_field", "name", "name must match ^[A-Za-z0-9._-]{1,64}$");
        return NULL;
    }
    json_t *py = json_object_get(b, "python");
    const char *pys = json_string_value(py);
    if (!json_is_string(py) || !api_valid_text(pys, 4096) || pys[0] != '/') {
        *ret = api_error(r, 400, "invalid_field", "python",
                         "python must be an absolute path to an interpreter");
        return NULL;
    }
    if (!python_template_ok(r, pys, ret))
        return NULL;
    /* A template's interpreter exists per commit, not as written: each job
     * checks its own (a missing one fails its cells before they start). */
    if (!strstr(pys, STORE_BUILD_COMMIT) && !cell_user_can(r, pys, RUNAS_EXEC, "python", ret))
        return NULL;
    json_t *env = json_object_get(b, "env");
    json_t *allow = json_object_get(b, "allow_env");
    if (!validate_env(r, env, allow, ret))
        return NULL;
    json_t *desc = json_object_get(b, "description");
    if (desc && (!json_is_string(desc) || json_string_length(desc) > 1024)) {
        *ret = api_error(r, 400, "invalid_field", "description",
                         "description must be a string of at most 1024 bytes");
        return NULL;
    }
    json_t *roots = json_object_get(b, "model_roots");
    size_t i;
    if (roots && (!json_is_array(roots) || json_array_size(roots) > BUILD_MAX_ROOTS)) {
        *ret = api_error(r, 400, "invalid_field", "model_roots",
                         "model_roots must be an array of at most %d absolute directories",
                         BUILD_MAX_ROOTS);
        return NULL;
    }
    json_array_foreach(roots, i, v)
    {
        const char *p = json_string_value(v);
        if (!p || p[0] != '/' || !api_valid_text(p, 4096) || has_dot_component(p)) {
            *ret = api_error(r, 400, "invalid_field", "model_roots",
                             "model_roots[%zu] must be an absolute path without . or ..", i);
            return NULL;
        }
        if (!cell_user_can(r, p, RUNAS_DIR, "model_roots", ret))
            return NULL;
    }
    /* Opt-in to prefork runners (docs/prefork.md). */
    json_t *prefork = json_object_get(b, "prefork");
    if (prefork && !json_is_boolean(prefork)) {
        *ret = api_error(r, 400, "invalid_field", "prefork", "prefork must be true or false");
        return NULL;
    }
    if (json_is_true(prefork) && store_build_is_template(b)) {
        *ret = api_error(r, 400, "invalid_field", "prefork",
                         "a template build (%s in python or env) cannot prefork: its zygote "
                         "would be one commit's build",
                         STORE_BUILD_COMMIT);
        return NULL;
    }
    /* allow_env is a check of this request, not part of the build: a
     * replacement names the hooks it keeps again. */
    return json_pack("{s:s,s:O,s:o,s:o,s:s,s:b}", "name", name, "python", py, "env",
                     env ? json_incref(env) : json_object(), "model_roots",
                     roots ? json_incref(roots) : json_array(), "description",
                     desc ? json_string_value(desc) : "", "prefork", json_is_true(prefork));
}

static enum MHD_Result put_build(struct api_req *r, const char *name, bool replace)
{
    enum MHD_Result ret;
    json_t *body = api_body_object(r, &ret);
    if (!body)
        return ret;
    json_t *bn = json_object_get(body, "name");
    if (replace && bn && (!json_is_string(bn) || strcmp(json_string_value(bn), name) != 0)) {
        json_decref(body);
        return api_error(r, 400, "invalid_field", "name", "name in the body differs from the URL");
    }
    if (!name)
        name = json_string_value(bn);
    json_t *b = validate_build(r, body, name, &ret);
    json_decref(body);
    if (!b)
        return ret;
    /* NAME may have pointed into BODY: from here on use the copy in B. */
    name = json_string_value(json_object_get(b, "name"));
    struct store *s = api_store(r);
    json_t *out = NULL;
    int rc = store_build_put(s, name, b, replace, &out);
    if (rc == -EEXIST)
        ret = api_error(r, 409, "conflict", "name",
                        "build '%s' already exists; use PUT to replace it", name);
    else if (rc)
        ret = api_store_error(r, rc, "build");
    else
        ret = api_json(r, replace ? 200 : 201, out);
    json_decref(b);
    return ret;
}

enum MHD_Result api_builds_create(struct api_req *r)
{
    return put_build(r, NULL, false);
}

enum MHD_Result api_builds_put(struct api_req *r)
{
    return put_build(r, api_param(r, "name"), true);
}

enum MHD_Result api_builds_get(struct api_req *r)
{
    return api_store_get(r, store_build_get, "name", "build");
}

enum MHD_Result api_builds_list(struct api_req *r)
{
    enum MHD_Result ret;
    if (api_not_modified_counter(r, "builds", &ret))
        return ret;
    json_t *out = NULL;
    struct store *s = api_store(r);
    int rc = store_build_list(s, &out);
    return api_store_reply(r, rc, "builds", out);
}
