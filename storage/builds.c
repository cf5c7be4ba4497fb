/*
 * storage/builds.c - builds: registering (POST and PUT), reading and
 * listing them. Their prefork outcome is written by prefork.c.
 */
#include <errno.h>
#include <stdlib.h>

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
