/*
 * tests/test_options.c - a job's cell options against schema/options.json,
 * their one source of defaults and ranges, through a real capd: each
 * integer option just past either end of its range and each enum option
 * outside its values is a 400 naming the option and what it accepts, an
 * option capd sets itself is unknown to a job, a job that gives none is
 * stored with every default, and docs/api.md's table shows them; and the
 * typed options capd's C reads (storage/options.h, generated from the same
 * table) hold its defaults and read back each value.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/options.h"
#include "tests/helpers/common/testutil.h"

static struct tu_capd capd;
static json_t *table;

static void start(void)
{
    char *dir = tu_tmpdir();
    cr_assert_not_null(dir);
    cr_assert_eq(tu_capd_start(&capd, dir, NULL), 0, "capd starts");
    free(dir);
    cr_assert_eq(tu_fake_build(&capd, "fake", NULL), 201);
    char path[512];
    snprintf(path, sizeof path, "%s/schema/options.json", tu_bin("CAPD_SOURCE_DIR"));
    json_error_t e;
    table = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    cr_assert_not_null(table, "%s: %s", path, e.text);
}

static void stop(void)
{
    json_decref(table);
    tu_capd_stop(&capd);
}

static const char *or_empty(const char *s)
{
    return s ? s : "";
}

/* POSTs a one-cell job whose options are OPTIONS; the status, and the
 * error's field and message when it is one. */
static long post(const char *options, char *field, char *message)
{
    long st = 0;
    json_t *j = tu_jsonf(&capd, "POST", "/v1/jobs", &st,
                         "{\"project\":\"t\",\"commit\":\"abcdef1\",\"build\":\"fake\","
                         "\"matrix\":{\"models\":[\"fake:ok\"],\"widths\":[\"default\"],"
                         "\"passes\":[\"forward\"]},\"options\":%s}",
                         options);
    json_t *err = json_object_get(j, "error");
    snprintf(field, 128, "%s", or_empty(json_string_value(json_object_get(err, "field"))));
    snprintf(message, 512, "%s", or_empty(json_string_value(json_object_get(err, "message"))));
    json_decref(j);
    return st;
}

static bool settable(json_t *o)
{
    return !json_is_false(json_object_get(o, "api"));
}

Test(options, integer_ranges_crossed_at_both_ends, .init = start, .fini = stop)
{
    size_t i;
    json_t *o;
    int checked = 0;
    json_array_foreach(json_object_get(table, "integer"), i, o)
    {
        const char *name = json_string_value(json_object_get(o, "name"));
        json_int_t min = json_integer_value(json_object_get(o, "min"));
        json_int_t max = json_integer_value(json_object_get(o, "max"));
        char opts[256], field[128], msg[512], want[256];
        snprintf(want, sizeof want, "options.%s must be an integer in [%lld, %lld]", name,
                 (long long)min, (long long)max);
        if (!settable(o)) {
            snprintf(opts, sizeof opts, "{\"%s\":%lld}", name, (long long)min);
            cr_assert_eq(post(opts, field, msg), 400, "%s is capd's to set", name);
            cr_assert(strstr(msg, "unknown option"), "%s: %s", name, msg);
            continue;
        }
        snprintf(opts, sizeof opts, "{\"%s\":%lld}", name, (long long)min - 1);
        cr_assert_eq(post(opts, field, msg), 400, "%s below its minimum", name);
        cr_assert(strstr(field, name) && strstr(msg, want), "%s: %s (%s)", opts, msg, field);
        if (max < INT64_MAX) {
            snprintf(opts, sizeof opts, "{\"%s\":%lld}", name, (long long)max + 1);
            cr_assert_eq(post(opts, field, msg), 400, "%s above its maximum", name);
            cr_assert(strstr(msg, want), "%s: %s", opts, msg);
        }
        snprintf(opts, sizeof opts, "{\"%s\":\"1\"}", name);
        cr_assert_eq(post(opts, field, msg), 400, "%s as a string", name);
        checked++;
    }
    cr_assert_geq(checked, 8, "the table's integer options (%d)", checked);
}

Test(options, enum_values_only, .init = start, .fini = stop)
{
    size_t i;
    json_t *o;
    json_array_foreach(json_object_get(table, "enum"), i, o)
    {
        const char *name = json_string_value(json_object_get(o, "name"));
        char opts[256], field[128], msg[512];
        snprintf(opts, sizeof opts, "{\"%s\":\"no-such-value\"}", name);
        cr_assert_eq(post(opts, field, msg), 400, "%s", opts);
        cr_assert(strstr(msg, "must be one of: "), "%s: %s", opts, msg);
        size_t k;
        json_t *v;
        json_array_foreach(json_object_get(o, "values"), k, v)
        {
            cr_assert(strstr(msg, json_string_value(v)), "%s lists %s: %s", name,
                      json_string_value(v), msg);
        }
    }
}

/* The reference arbiter's option: a value it does not know is a 400 naming
 * options.reference; null is its default, none; float64 is stored as is. */
Test(options, reference_values, .init = start, .fini = stop)
{
    char field[128], msg[512];
    cr_assert_eq(post("{\"reference\":\"float32\"}", field, msg), 400);
    cr_assert_str_eq(field, "options.reference");
    cr_assert(strstr(msg, "none, float64, default-width"), "%s", msg);
    cr_assert_eq(post("{\"reference\":7}", field, msg), 400);
    cr_assert_str_eq(field, "options.reference");
    cr_assert_eq(post("{\"capture\":null}", field, msg), 400, "null only for a nullable option");
    cr_assert_str_eq(field, "options.capture");
    static const char *const cases[][2] = {
        {"null", "none"}, {"\"float64\"", "float64"}, {"\"default-width\"", "default-width"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char opts[64], path[128];
        snprintf(opts, sizeof opts, "{\"reference\":%s}", cases[i][0]);
        char *id = tu_submit(&capd, "fake", "fake:ok", opts);
        cr_assert_not_null(id, "%s", opts);
        snprintf(path, sizeof path, "/v1/jobs/%s", id);
        long st = 0;
        json_t *job = tu_json(&capd, "GET", path, NULL, &st);
        cr_assert_eq(st, 200);
        cr_assert_str_eq(tu_jstr(json_object_get(job, "options"), "reference"), cases[i][1], "%s",
                         opts);
        json_decref(job);
        free(id);
    }
}

Test(options, job_stored_with_every_default, .init = start, .fini = stop)
{
    char *id = tu_submit(&capd, "fake", "fake:ok", "{}");
    cr_assert_not_null(id);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    long st = 0;
    json_t *job = tu_json(&capd, "GET", path, NULL, &st);
    cr_assert_eq(st, 200);
    json_t *opts = json_object_get(job, "options");
    char *docs_path = NULL;
    cr_assert(asprintf(&docs_path, "%s/docs/api.md", tu_bin("CAPD_SOURCE_DIR")) > 0);
    char *docs = tu_slurp(docs_path);
    cr_assert_not_null(docs, "%s", docs_path);
    static const char *const kinds[] = {"integer", "enum"};
    for (size_t k = 0; k < 2; k++) {
        size_t i;
        json_t *o;
        json_array_foreach(json_object_get(table, kinds[k]), i, o)
        {
            if (!settable(o))
                continue;
            const char *name = json_string_value(json_object_get(o, "name"));
            json_t *def = json_object_get(o, "default");
            cr_assert(json_equal(json_object_get(opts, name), def),
                      "options.%s stored at its default", name);
            char row[160];
            if (json_is_string(def))
                snprintf(row, sizeof row, "| `%s` | `%s` |", name, json_string_value(def));
            else
                snprintf(row, sizeof row, "| `%s` | %lld |", name,
                         (long long)json_integer_value(def));
            cr_assert(strstr(docs, row), "docs/api.md's options table has %s", row);
        }
    }
    free(docs);
    free(docs_path);
    json_decref(job);
    free(id);
}

/* The typed option NAME of O, if struct cell_options has it. */
static bool typed_int(const struct cell_options *o, const char *name, int64_t *v)
{
#define X(n, lo, hi, def, text)                                                                    \
    if (strcmp(name, #n) == 0) {                                                                   \
        *v = o->n;                                                                                 \
        return true;                                                                               \
    }
    CAPD_OPTIONS_INT(X)
#undef X
    return false;
}

static const char *typed_enum(const struct cell_options *o, const char *name)
{
#define X(n, def, values)                                                                          \
    if (strcmp(name, #n) == 0)                                                                     \
        return o->n;
    CAPD_OPTIONS_ENUM(X)
#undef X
    return NULL;
}

/* Every row of the table is a typed field holding its default when the
 * job's options lack it (or give the wrong type), and the value the job
 * gives otherwise; the struct has no field the table lacks. */
Test(options, typed_options_follow_the_table)
{
    char path[512];
    snprintf(path, sizeof path, "%s/schema/options.json", tu_bin("CAPD_SOURCE_DIR"));
    json_error_t e;
    json_t *t = json_load_file(path, JSON_REJECT_DUPLICATES, &e), *row;
    cr_assert_not_null(t, "%s: %s", path, e.text);
    struct cell_options none, some;
    cell_options_read(NULL, &none);
    size_t i, n = 0;
    json_array_foreach(json_object_get(t, "integer"), i, row)
    {
        const char *name = json_string_value(json_object_get(row, "name"));
        int64_t v = -1, max = json_integer_value(json_object_get(row, "max"));
        cr_assert(typed_int(&none, name, &v), "struct cell_options lacks %s", name);
        cr_assert_eq(v, json_integer_value(json_object_get(row, "default")), "%s", name);
        json_t *o = json_pack("{s:I}", name, (json_int_t)max);
        cell_options_read(o, &some);
        typed_int(&some, name, &v);
        cr_assert_eq(v, max, "%s read back", name);
        json_object_set_new(o, name, json_string("x"));
        cell_options_read(o, &some);
        typed_int(&some, name, &v);
        cr_assert_eq(v, json_integer_value(json_object_get(row, "default")), "%s: a string", name);
        json_decref(o);
        n++;
    }
    json_array_foreach(json_object_get(t, "enum"), i, row)
    {
        const char *name = json_string_value(json_object_get(row, "name"));
        const char *v = typed_enum(&none, name);
        cr_assert_not_null(v, "struct cell_options lacks %s", name);
        cr_assert_str_eq(v, json_string_value(json_object_get(row, "default")), "%s", name);
        size_t j;
        json_t *val;
        json_array_foreach(json_object_get(row, "values"), j, val)
        {
            json_t *o = json_pack("{s:O}", name, val);
            cell_options_read(o, &some);
            cr_assert_str_eq(typed_enum(&some, name), json_string_value(val), "%s", name);
            json_decref(o);
        }
        n++;
    }
    size_t fields = 0;
#define X(...) fields++;
    CAPD_OPTIONS_INT(X)
    CAPD_OPTIONS_ENUM(X)
#undef X
    cr_assert_eq(fields, n, "struct cell_options has %zu fields, the table %zu rows", fields, n);
    cr_assert_eq(none.memory_max_bytes, 0, "no memory limit unless the job sets one");
    json_decref(t);
}
