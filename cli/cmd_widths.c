/*
 * cli/cmd_widths.c - capctl widths: the width table and what this capd's
 * host can run (GET /v1/widths, GET /v1/host).
 */
#include <stdlib.h>
#include <string.h>

#include "cli/capctl.h"

/* "avx512f,avx512bw" from a JSON array of names; "-" when empty. */
static void join(json_t *arr, char *buf, size_t cap)
{
    size_t i, used = 0;
    json_t *v;
    buf[0] = 0;
    json_array_foreach(arr, i, v)
    {
        int n = snprintf(buf + used, cap - used, "%s%s", i ? "," : "", json_string_value(v));
        if (n < 0 || (size_t)n >= cap - used)
            break;
        used += (size_t)n;
    }
    if (!buf[0])
        snprintf(buf, cap, "-");
}

static int print_host(struct ctl_client *c)
{
    json_t *h;
    if (ctl_call(c, "GET", "/v1/host", NULL, 200, &h) != 0)
        return CTL_EXIT_ERROR;
    char hidden[256], model[128];
    join(json_object_get(h, "hidden"), hidden, sizeof hidden);
    printf("host: %s, %s, %lld cores usable; hidden features: %s\n\n",
           json_string_value(json_object_get(h, "arch")),
           ctl_clean(json_string_value(json_object_get(h, "model")), model, sizeof model),
           (long long)json_integer_value(json_object_get(h, "cores_usable")), hidden);
    json_decref(h);
    return 0;
}

static int print_table(json_t *arr)
{
    static const char *const hdr[] = {"WIDTH", "ARCH", "REQUIRES", "HERE", "MISSING"};
    struct ctl_table *t = ctl_table_new(5, hdr);
    size_t i;
    json_t *w;
    json_array_foreach(arr, i, w)
    {
        char req[256];
        const char *missing = json_string_value(json_object_get(w, "missing"));
        join(json_object_get(w, "requires"), req, sizeof req);
        const char *row[] = {json_string_value(json_object_get(w, "name")),
                             json_string_value(json_object_get(w, "arch")), req,
                             json_is_true(json_object_get(w, "runnable_here")) ? "yes" : "no",
                             missing ? missing : "-"};
        ctl_table_row(t, row);
    }
    return ctl_table_emit(t, stdout);
}

/* --runnable: the names of the widths this host runs, for scripts; else
 * the host line and the table. */
static int print_widths(struct ctl_client *c, const struct ctl_args *a, json_t *arr)
{
    int rc = 0;
    if (ctl_has(a, "runnable")) {
        size_t i;
        json_t *w;
        json_array_foreach(arr, i, w)
        {
            if (json_is_true(json_object_get(w, "runnable_here")))
                printf("%s\n", json_string_value(json_object_get(w, "name")));
        }
    } else if ((rc = print_host(c)) == 0) {
        rc = print_table(arr);
    }
    return rc;
}

static const struct ctl_opt widths_opts[] = {
    CTL_OPT_JSON_HELP("print the server's JSON (GET /v1/widths)"),
    {"runnable", CTL_FLAG, NULL, "print only the names of the widths this host runs, one a line"},
    CTL_OPT_END,
};

const struct ctl_cmd ctl_cmd_widths = {
    .name = "widths",
    .usage = "[--json | --runnable]",
    .summary = "List the CPU dispatch widths: arch, the host CPU features each needs, and whether\n"
               "capd's host can run it (a width it cannot run ends its cells 'unsupported').",
    .details = "The host line names the CPU capd read at start and the features hidden by its\n"
               "cpu_features_hide setting (docs/widths.md).",
    .opts = widths_opts,
    .list = {"/v1/widths", "widths", print_widths},
};
