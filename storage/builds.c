/*
 * storage/builds.c - builds: registering (POST and PUT), reading and
 * listing them. Their prefork outcome is written by prefork.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "storage/store_int.h"
#include "util/clock.h"

static json_t *build_row(sqlite3_stmt *st)
{
    json_t *b = json_pack("{s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:b}", "name", store_col_str(st, 0),
                          "python", store_col_str(st, 1), "env", store_col_json(st, 2),
                          "model_roots", store_col_json(st, 3), "description", store_col_str(st, 4),
                          "created_at", store_col_time(st, 5), "updated_at", store_col_time(st, 6),
                          "prefork", sqlite3_column_int(st, 7) != 0);
    /* Prefork's verification outcome (docs/prefork.md), for builds that opted in. */
    if (b && sqlite3_column_int(st, 7)) {
        json_object_set_new(b, "prefork_state", store_col_str(st, 8));
        json_object_set_new(b, "prefork_reason", store_col_str(st, 9));
        json_object_set_new(b, "prefork_checked_at", store_col_time(st, 10));
    }
    return b;
}

#define BUILD_COLS                                                                                 \
    "name, python, env_json, model_roots, description, created_at, updated_at, prefork, "          \
    "prefork_state, prefork_reason, prefork_checked_at"

int store_build_rev(struct store *s, const char *name, int64_t *rev)
{
    sqlite3_stmt *st = NULL;
    int rc = store_query(s, &st, "SELECT updated_at FROM builds WHERE name = ?", "t", name);
    if (rc == 0 && (rc = store_step(s, st)) == 0)
        *rev = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return rc;
}

int store_build_get(struct store *s, const char *name, json_t **out)
{
    return store_get_row(s, "SELECT " BUILD_COLS " FROM builds WHERE name = ?", build_row, out, "t",
                         name);
}

int store_build_list(struct store *s, json_t **out)
{
    return store_list_all(s, "SELECT " BUILD_COLS " FROM builds ORDER BY name", build_row, "builds",
                          out);
}

int store_build_put(struct store *s, const char *name, json_t *b, bool replace, json_t **out)
{
    char *env = json_dumps(json_object_get(b, "env"), JSON_COMPACT | JSON_SORT_KEYS);
    char *roots = json_dumps(json_object_get(b, "model_roots"), JSON_COMPACT);
    int64_t now = util_wall_ms();
    int rc = store_run(s,
                       replace ? "INSERT INTO builds(name, python, env_json, model_roots, "
                                 "description, created_at, updated_at, prefork) "
                                 "VALUES (?,?,?,?,?,?,?,?) "
                                 "ON CONFLICT(name) DO UPDATE SET python=excluded.python, "
                                 "env_json=excluded.env_json, model_roots=excluded.model_roots, "
                                 "description=excluded.description, "
                                 "updated_at=excluded.updated_at, "
                                 "prefork=excluded.prefork, prefork_state='unverified', "
                                 "prefork_reason=NULL, prefork_checked_at=NULL"
                               : "INSERT INTO builds(name, python, env_json, model_roots, "
                                 "description, created_at, updated_at, prefork) "
                                 "VALUES (?,?,?,?,?,?,?,?)",
                       "tttttIIi", name, json_string_value(json_object_get(b, "python")),
                       env ? env : "{}", roots ? roots : "[]",
                       json_string_value(json_object_get(b, "description")), now, now,
                       json_is_true(json_object_get(b, "prefork")) ? 1 : 0);
    if (rc == 0)
        rc = store_build_get(s, name, out);
    free(env);
    free(roots);
    return rc;
}

/* A copy of TEXT with every STORE_BUILD_COMMIT replaced by COMMIT
 * (malloc'd), or NULL for want of memory. */
static char *expand_text(const char *text, const char *commit)
{
    static const char tok[] = STORE_BUILD_COMMIT;
    size_t tl = sizeof tok - 1, cl = strlen(commit), n = 0;
    for (const char *p = strstr(text, tok); p; p = strstr(p + tl, tok))
        n++;
    char *out = malloc(strlen(text) - n * tl + n * cl + 1);
    if (!out)
        return NULL;
    char *o = out;
    for (const char *p = text;;) {
        const char *q = strstr(p, tok);
        size_t k = q ? (size_t)(q - p) : strlen(p);
        memcpy(o, p, k);
        o += k;
        if (!q)
            break;
        memcpy(o, commit, cl);
        o += cl;
        p = q + tl;
    }
    *o = 0;
    return out;
}

bool store_build_is_template(json_t *build)
{
    const char *k;
    json_t *v;
    const char *py = json_string_value(json_object_get(build, "python"));
    if (py && strstr(py, STORE_BUILD_COMMIT))
        return true;
    json_object_foreach(json_object_get(build, "env"), k, v)
    {
        if (json_is_string(v) && strstr(json_string_value(v), STORE_BUILD_COMMIT))
            return true;
    }
    return false;
}

int store_build_expand(json_t *build, const char *commit)
{
    const char *k;
    json_t *v;
    if (!commit || !store_build_is_template(build))
        return 0;
    const char *py = json_string_value(json_object_get(build, "python"));
    if (py) {
        char *x = expand_text(py, commit);
        if (!x || json_object_set_new(build, "python", json_string(x)) != 0) {
            free(x);
            return -ENOMEM;
        }
        free(x);
    }
    json_t *env = json_object_get(build, "env");
    json_t *copy = json_is_object(env) ? json_object() : NULL;
    json_object_foreach(env, k, v)
    {
        char *x = json_is_string(v) ? expand_text(json_string_value(v), commit) : NULL;
        int rc = x ? json_object_set_new(copy, k, json_string(x)) : -1;
        free(x);
        if (rc != 0) {
            json_decref(copy);
            return -ENOMEM;
        }
    }
    if (copy && json_object_set_new(build, "env", copy) != 0)
        return -ENOMEM;
    return 0;
}
