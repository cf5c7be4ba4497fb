/*
 * storage/options.c - a stored job's options into struct cell_options
 * (storage/options.h), with the defaults of schema/options.json.
 */
#include <stdio.h>
#include <string.h>

#include "storage/options.h"

void cell_options_defaults(struct cell_options *out)
{
    memset(out, 0, sizeof *out);
#define X(name, lo, hi, def, text) out->name = def;
    CAPD_OPTIONS_INT(X)
#undef X
#define X(name, def, values) snprintf(out->name, sizeof out->name, "%s", def);
    CAPD_OPTIONS_ENUM(X)
#undef X
}

/* OPTIONS' string KEY into OUT (N bytes), if it is one that fits. */
static void read_enum(const json_t *options, const char *key, char *out, size_t n)
{
    const char *v = json_string_value(json_object_get(options, key));
    if (v && strlen(v) < n)
        snprintf(out, n, "%s", v);
}

void cell_options_read(const json_t *options, struct cell_options *out)
{
    cell_options_defaults(out);
    const json_t *v;
#define X(name, lo, hi, def, text)                                                                 \
    if (json_is_integer(v = json_object_get(options, #name)))                                      \
        out->name = json_integer_value(v);
    CAPD_OPTIONS_INT(X)
#undef X
#define X(name, def, values) read_enum(options, #name, out->name, sizeof out->name);
    CAPD_OPTIONS_ENUM(X)
#undef X
    if (json_is_integer(v = json_object_get(options, "memory_max_bytes")) &&
        json_integer_value(v) > 0)
        out->memory_max_bytes = json_integer_value(v);
}
