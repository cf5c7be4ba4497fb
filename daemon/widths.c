#include <errno.h>
#include <string.h>

#include "daemon/widths.h"
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

json_t *width_env(const char *name)
{
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(widths, "widths"), i, w)
    {
        if (strcmp(json_string_value(json_object_get(w, "name")), name) == 0)
            return json_object_get(w, "env");
    }
    return NULL;
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
