/*
 * api/api_options.c - a job's cell options against schema/options.json,
 * the one table of their defaults and ranges (the runner checks a cell spec
 * against the same file): integer options within [min, max], enum options
 * among their values (null for a nullable one is its default), every option the job leaves out
 * resolved to its default, so each stored job and each cell spec carries them all.
 */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "api/api_int.h"
#include "storage/embedded.h"
#include "util/log.h"

static json_t *table;
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void load_table(void)
{
    const struct embedded_file *f = embedded_find("options.json");
    json_error_t e;
    table = f ? json_loadb(f->data, f->size, 0, &e) : NULL;
    if (!table)
        log_error("options_table_unreadable", "reason=%s", log_q(f ? e.text : "not embedded"));
}

static json_t *options_table(void)
{
    pthread_once(&table_once, load_table);
    return table;
}

bool api_verr_set(struct api_verr *e, const char *code, const char *field, const char *fmt, ...)
{
    va_list ap;
    e->code = code;
    e->has_field = field != NULL;
    snprintf(e->field, sizeof e->field, "%s", field ? field : "");
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

/* The table's entry for option K that a job may set, or NULL. */
static json_t *entry(const char *k)
{
    static const char *const kinds[] = {"integer", "enum"};
    for (size_t i = 0; i < 2; i++) {
        size_t j;
        json_t *o;
        json_array_foreach(json_object_get(options_table(), kinds[i]), j, o)
        {
            if (strcmp(json_string_value(json_object_get(o, "name")), k) == 0 &&
                !json_is_false(json_object_get(o, "api")))
                return o;
        }
    }
    return NULL;
}

bool api_option_known(const char *k)
{
    return entry(k) != NULL;
}

static bool check_integer(json_t *spec, json_t *x, json_t *out, struct api_verr *err)
{
    const char *name = json_string_value(json_object_get(spec, "name"));
    json_int_t min = json_integer_value(json_object_get(spec, "min"));
    json_int_t max = json_integer_value(json_object_get(spec, "max"));
    char f[64];
    snprintf(f, sizeof f, "options.%s", name);
    if (x && (!json_is_integer(x) || json_integer_value(x) < min || json_integer_value(x) > max))
        return api_verr_set(err, "invalid_field", f, "%s must be an integer in [%lld, %lld]", f,
                            (long long)min, (long long)max);
    json_object_set(out, name, x ? x : json_object_get(spec, "default"));
    return true;
}

static bool check_enum(json_t *spec, json_t *x, json_t *out, struct api_verr *err)
{
    const char *name = json_string_value(json_object_get(spec, "name"));
    json_t *values = json_object_get(spec, "values");
    char f[64], list[256] = "";
    size_t i;
    json_t *v;
    snprintf(f, sizeof f, "options.%s", name);
    /* A nullable option (reference) reads null as its default, "none". */
    if (json_is_null(x) && json_is_true(json_object_get(spec, "nullable")))
        x = NULL;
    bool ok = x == NULL;
    json_array_foreach(values, i, v)
    {
        ok |= json_is_string(x) && strcmp(json_string_value(x), json_string_value(v)) == 0;
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                 json_string_value(v));
    }
    if (!ok)
        return api_verr_set(err, "invalid_field", f, "%s must be one of: %s", f, list);
    json_object_set(out, name, x ? x : json_object_get(spec, "default"));
    return true;
}

int api_options_resolve(json_t *o, json_t *out, struct api_verr *err)
{
    json_t *t = options_table();
    if (!t) {
        api_verr_set(err, "internal", NULL, "the cell options' table is unreadable");
        return -EIO;
    }
    size_t i;
    json_t *spec;
    json_array_foreach(json_object_get(t, "integer"), i, spec)
    {
        if (json_is_false(json_object_get(spec, "api")))
            continue;
        if (!check_integer(spec,
                           json_object_get(o, json_string_value(json_object_get(spec, "name"))),
                           out, err))
            return -EINVAL;
    }
    json_array_foreach(json_object_get(t, "enum"), i, spec)
    {
        if (!check_enum(spec, json_object_get(o, json_string_value(json_object_get(spec, "name"))),
                        out, err))
            return -EINVAL;
    }
    return 0;
}
