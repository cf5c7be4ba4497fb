#include <errno.h>
#include <string.h>

#include "daemon/cpu/hostcpu.h"
#include "daemon/cpu/widths.h"
#include "storage/embedded.h"

static json_t *widths, *models;

int widths_init(void)
{
    if (widths)
        return 0;
    const struct embedded_file *w = embedded_find("widths.json");
    const struct embedded_file *m = embedded_find("models.json");
    if (!w || !m)
        return -ENOENT;
    widths = json_loadb(w->data, w->size, 0, NULL);
    models = json_loadb(m->data, m->size, 0, NULL);
    return widths && models ? 0 : -EINVAL;
}

json_t *widths_table(void)
{
    return widths;
}

json_t *models_table(void)
{
    return models;
}

static json_t *width_row(const char *name)
{
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(widths, "widths"), i, w)
    {
        if (strcmp(json_string_value(json_object_get(w, "name")), name) == 0)
            return w;
    }
    return NULL;
}

json_t *width_env(const char *name)
{
    return json_object_get(width_row(name), "env");
}

json_t *width_field(const char *name, const char *field)
{
    return json_object_get(width_row(name), field);
}

json_t *width_requires(const char *name)
{
    return json_object_get(width_row(name), "requires");
}

bool model_in_zoo(const char *name)
{
    size_t i;
    json_t *m;
    json_array_foreach(models, i, m)
    {
        if (strcmp(json_string_value(json_object_get(m, "name")), name) == 0)
            return true;
    }
    return false;
}

bool width_runnable(const char *name, char *why, size_t wlen, char *missing, size_t mlen)
{
    char buf[256];
    json_t *w = name ? width_row(name) : NULL;
    const char *arch = json_string_value(json_object_get(w, "arch"));
    if (!w || !arch) {
        snprintf(why, wlen, "unknown width '%s'", name ? name : "");
        snprintf(missing, mlen, "width:%s", name ? name : "");
        return false;
    }
    if (strcmp(arch, "any") != 0 && strcmp(arch, hostcpu_arch()) != 0) {
        snprintf(why, wlen, "this host is %s; width %s runs on %s CPUs only", hostcpu_arch(), name,
                 arch);
        snprintf(missing, mlen, "arch:%s", arch);
        return false;
    }
    if (hostcpu_missing(json_object_get(w, "requires"), buf, sizeof buf) > 0) {
        snprintf(why, wlen, "this host's CPU lacks %s (needed by width %s)", buf, name);
        snprintf(missing, mlen, "%s", buf);
        return false;
    }
    if (wlen)
        why[0] = 0;
    if (mlen)
        missing[0] = 0;
    return true;
}

json_t *widths_table_here(void)
{
    json_t *out = json_array();
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(widths, "widths"), i, w)
    {
        char why[300], missing[256];
        json_t *row = json_deep_copy(w);
        bool ok = width_runnable(json_string_value(json_object_get(w, "name")), why, sizeof why,
                                 missing, sizeof missing);
        json_object_set_new(row, "runnable_here", json_boolean(ok));
        json_object_set_new(row, "missing", ok ? json_null() : json_string(missing));
        json_object_set_new(row, "reason", ok ? json_null() : json_string(why));
        json_array_append_new(out, row);
    }
    return out;
}
