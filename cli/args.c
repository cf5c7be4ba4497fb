/*
 * cli/args.c - capctl's flag parser: table-driven, long flags only
 * (--name V or --name=V), so every error can name the flag it is about.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli/capctl.h"

const struct ctl_opt ctl_global_opts[] = {
    {"server", CTL_VALUE, "URL",
     "capd to talk to (default: $CAPD_SERVER, else " CTL_DEFAULT_SERVER ")"},
    {"token", CTL_VALUE, "T",
     "bearer token (default: $CAPD_TOKEN, which keeps it out of ps, else DIR/admin.token of "
     "--data-dir)"},
    {"data-dir", CTL_VALUE, "DIR",
     "capd's data dir, whose admin.token is used when no token is given (default: "
     "$CAPD_DATA_DIR, else " CTL_DEFAULT_DATA_DIR " for a server on this machine)"},
    {"cacert", CTL_VALUE, "FILE",
     "PEM CA certificate(s) to verify an https:// server against, e.g. a self-signed capd "
     "certificate (default: $CAPD_CACERT, else the system's CAs)"},
    {"help", CTL_FLAG, NULL, "show this help"},
    CTL_OPT_END,
};

const struct ctl_opt ctl_json_opts[] = {
    CTL_OPT_JSON,
    CTL_OPT_END,
};

const struct ctl_opt *ctl_opts_of(const struct ctl_cmd *cmd)
{
    return cmd->show.print ? ctl_json_opts : cmd->opts;
}

static const struct ctl_opt *find_opt(const struct ctl_cmd *cmd, const char *name, size_t n)
{
    for (const struct ctl_opt *o = ctl_opts_of(cmd); o && o->name; o++)
        if (strlen(o->name) == n && strncmp(o->name, name, n) == 0)
            return o;
    for (const struct ctl_opt *o = ctl_global_opts; o->name; o++)
        if (strlen(o->name) == n && strncmp(o->name, name, n) == 0)
            return o;
    return NULL;
}

int ctl_usage_error(const struct ctl_cmd *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "capctl %s: ", cmd->name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(see 'capctl %s --help')\n", cmd->name);
    return CTL_EXIT_ERROR;
}

static void help_opts(const struct ctl_opt *opts, FILE *f)
{
    for (const struct ctl_opt *o = opts; o && o->name; o++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s%s", o->name, o->metavar ? " " : "",
                 o->metavar ? o->metavar : "", o->kind == CTL_MULTI ? "..." : "");
        if (strlen(left) > 24)
            fprintf(f, "  %s\n  %-24s  %s\n", left, "", o->help);
        else
            fprintf(f, "  %-24s  %s\n", left, o->help);
    }
}

void ctl_help(const struct ctl_cmd *cmd, FILE *f)
{
    fprintf(f, "usage: capctl %s %s\n\n%s\n", cmd->name, cmd->usage, cmd->summary);
    if (cmd->details)
        fprintf(f, "\n%s\n", cmd->details);
    const struct ctl_opt *opts = ctl_opts_of(cmd);
    if (opts && opts->name) {
        fprintf(f, "\noptions:\n");
        help_opts(opts, f);
    }
    fprintf(f, "\nglobal options:\n");
    help_opts(ctl_global_opts, f);
}

int ctl_parse(const struct ctl_cmd *cmd, int argc, char **argv, struct ctl_args *a)
{
    memset(a, 0, sizeof *a);
    a->cmd = cmd;
    a->items = calloc((size_t)argc + 1, sizeof *a->items);
    a->pos = calloc((size_t)argc + 1, sizeof *a->pos);
    if (!a->items || !a->pos) {
        fprintf(stderr, "capctl: out of memory\n");
        return CTL_EXIT_ERROR;
    }
    bool flags_done = false;
    for (int i = 0; i < argc; i++) {
        const char *w = argv[i];
        if (flags_done || w[0] != '-' || strcmp(w, "-") == 0) {
            a->pos[a->npos++] = w;
            continue;
        }
        if (strcmp(w, "--") == 0) {
            flags_done = true;
            continue;
        }
        if (strcmp(w, "-h") == 0) {
            ctl_help(cmd, stdout);
            return 1;
        }
        if (w[1] != '-')
            return ctl_usage_error(cmd, "unknown flag '%s' (flags are long: --name)", w);
        const char *name = w + 2;
        const char *eq = strchr(name, '=');
        size_t n = eq ? (size_t)(eq - name) : strlen(name);
        const struct ctl_opt *o = find_opt(cmd, name, n);
        if (!o)
            return ctl_usage_error(cmd, "unknown flag '--%.*s'", (int)n, name);
        const char *val = NULL;
        if (o->kind == CTL_FLAG) {
            if (eq)
                return ctl_usage_error(cmd, "flag --%s takes no value", o->name);
            if (strcmp(o->name, "help") == 0) {
                ctl_help(cmd, stdout);
                return 1;
            }
        } else if (eq) {
            val = eq + 1;
        } else {
            /* A value that looks like a flag is almost always a forgotten
             * value; --name=--x still passes one on purpose. */
            if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)
                return ctl_usage_error(cmd, "flag --%s needs a value (%s)", o->name,
                                       o->metavar ? o->metavar : "VALUE");
            val = argv[++i];
        }
        if (o->kind != CTL_MULTI) {
            for (int k = 0; k < a->nitems; k++)
                if (a->items[k].opt == o)
                    return ctl_usage_error(cmd, "flag --%s given more than once", o->name);
        }
        a->items[a->nitems].opt = o;
        a->items[a->nitems].val = val;
        a->nitems++;
    }
    /* A SHOW command takes exactly its one ID. */
    int min_pos = cmd->show.print ? 1 : cmd->min_pos, max_pos = cmd->show.print ? 1 : cmd->max_pos;
    if (a->npos < min_pos)
        return ctl_usage_error(cmd, "missing argument: usage: capctl %s %s", cmd->name, cmd->usage);
    if (a->npos > max_pos)
        return ctl_usage_error(cmd, "unexpected argument '%s'", a->pos[max_pos]);
    return 0;
}

void ctl_args_free(struct ctl_args *a)
{
    free(a->items);
    free(a->pos);
    a->items = NULL;
    a->pos = NULL;
}

const char *ctl_arg(const struct ctl_args *a, const char *name)
{
    for (int i = a->nitems - 1; i >= 0; i--)
        if (strcmp(a->items[i].opt->name, name) == 0)
            return a->items[i].val ? a->items[i].val : "";
    return NULL;
}

bool ctl_has(const struct ctl_args *a, const char *name)
{
    return ctl_arg(a, name) != NULL;
}

const char *ctl_arg_next(const struct ctl_args *a, const char *name, int *it)
{
    for (; *it < a->nitems; (*it)++) {
        if (strcmp(a->items[*it].opt->name, name) == 0)
            return a->items[(*it)++].val;
    }
    return NULL;
}

int ctl_required(const struct ctl_args *a, bool nonempty)
{
    for (const struct ctl_opt *o = ctl_opts_of(a->cmd); o && o->name; o++) {
        const char *v = ctl_arg(a, o->name);
        if (o->kind == CTL_REQUIRED && (!v || (nonempty && !*v)))
            return ctl_usage_error(a->cmd, "--%s is required", o->name);
    }
    return 0;
}

int ctl_int_arg(const struct ctl_cmd *cmd, const char *flag, const char *s, long long min,
                long long max, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno == ERANGE)
        return ctl_usage_error(cmd, "--%s expects an integer, got '%s'", flag, s);
    if (v < min || v > max)
        return ctl_usage_error(cmd, "--%s must be in [%lld, %lld], got %lld", flag, min, max, v);
    *out = v;
    return 0;
}

int ctl_seconds_arg(const struct ctl_cmd *cmd, const char *flag, const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (!*s || *end || !isfinite(v) || v < 0 || v > 30 * 86400.0)
        return ctl_usage_error(cmd, "--%s expects a number of seconds (0 to 2592000), got '%s'",
                               flag, s);
    *out = v;
    return 0;
}

int ctl_pairs_arg(const struct ctl_args *a, const char *flag, const char *form, size_t key_cap,
                  bool name_long, json_t *obj)
{
    const char *v;
    int it = 0;
    char key[256];
    if (key_cap > sizeof key)
        key_cap = sizeof key;
    while ((v = ctl_arg_next(a, flag, &it)) != NULL) {
        const char *eq = strchr(v, '=');
        size_t n = eq ? (size_t)(eq - v) : 0;
        if (!eq || n == 0 || (n >= key_cap && !name_long))
            return ctl_usage_error(a->cmd, "--%s expects %s, got '%s'", flag, form, v);
        if (n >= key_cap)
            return ctl_usage_error(a->cmd, "--%s name is too long in '%.40s...'", flag, v);
        memcpy(key, v, n);
        key[n] = 0;
        if (json_object_get(obj, key))
            return ctl_usage_error(a->cmd, "--%s %s given more than once", flag, key);
        json_t *s = json_string(eq + 1);
        if (!s)
            return ctl_usage_error(a->cmd, "--%s %s: the value is not valid UTF-8", flag, key);
        json_object_set_new(obj, key, s);
    }
    return 0;
}
