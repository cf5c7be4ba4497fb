/*
 * cli/cmd_history.c - capctl history (one cell's series along a branch,
 * GET /v1/history) and capctl alerts (GET /v1/alerts, and feedback with
 * POST /v1/alerts/{id}). docs/history.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/capctl.h"

static void short_sha(const char *s, char out[13])
{
    snprintf(out, 13, "%.12s", s);
}

/* "+30.1% [+29.0, +31.2] p=0" for a change point, the key for numerics. */
static void alert_what(json_t *a, char *buf, size_t cap)
{
    json_t *d = json_object_get(a, "detail");
    const char *kind = ctl_jstr(a, "kind");
    if (strcmp(kind, "numerics") == 0) {
        snprintf(buf, cap, "first divergent: %s", ctl_jstr(d, "first_divergent_key"));
    } else if (strcmp(kind, "outcome") == 0) {
        snprintf(buf, cap, "%s -> %s", ctl_jstr(d, "before"), ctl_jstr(d, "after"));
    } else {
        json_t *ci = json_object_get(d, "magnitude_ci");
        snprintf(buf, cap, "%+.1f%% [%+.1f, %+.1f] p=%.2g",
                 100 * json_number_value(json_object_get(d, "magnitude")),
                 100 * json_number_value(json_array_get(ci, 0)),
                 100 * json_number_value(json_array_get(ci, 1)),
                 json_number_value(json_object_get(d, "p_value")));
    }
}

/* The cells of one alert's row, in the order of the header. */
struct alert_row {
    char cell[400], bad[13], good[13], what[256];
    const char *v[9];
};

static void alert_row(json_t *a, struct alert_row *r)
{
    snprintf(r->cell, sizeof r->cell, "%s/%s/%s", ctl_jstr(a, "model"), ctl_jstr(a, "width"),
             ctl_jstr(a, "pass"));
    short_sha(ctl_jstr(a, "first_bad"), r->bad);
    short_sha(ctl_jstr(a, "last_good"), r->good);
    alert_what(a, r->what, sizeof r->what);
    const char *v[] = {ctl_jstr(a, "id"),
                       ctl_jstr(a, "kind"),
                       ctl_jstr(a, "label"),
                       ctl_jstr(a, "status"),
                       ctl_jstr(a, "branch"),
                       r->cell,
                       r->bad,
                       r->good,
                       r->what};
    memcpy(r->v, v, sizeof v);
}

/* A Markdown table for a pull-request comment, else a padded one. */
static int print_alerts(json_t *list, bool md)
{
    static const char *const hdr[] = {"ID",   "KIND",      "LABEL",     "STATUS", "BRANCH",
                                      "CELL", "FIRST_BAD", "LAST_GOOD", "WHAT"};
    struct ctl_table *t = md ? NULL : ctl_table_new(9, hdr);
    struct alert_row row;
    size_t i;
    json_t *a;
    if (md)
        printf("| id | kind | label | status | branch | cell | first bad | last good | what |\n"
               "|---|---|---|---|---|---|---|---|---|\n");
    json_array_foreach(list, i, a)
    {
        alert_row(a, &row);
        if (md) {
            for (int k = 0; k < 9; k++)
                printf("| %s ", row.v[k]);
            printf("|\n");
        } else {
            ctl_table_row(t, row.v);
        }
    }
    return md ? 0 : ctl_table_emit(t, stdout);
}

/* POST /v1/alerts/{id} with the new status. */
static int set_alert(struct ctl_client *c, const struct ctl_args *a, const char *id)
{
    struct ctl_url u;
    ctl_url_init(&u, "/v1/alerts");
    ctl_url_seg(c, &u, id);
    if (u.overflow)
        return ctl_usage_error(a->cmd, "the alert id is too long");
    json_t *body = json_pack("{s:s}", "status", ctl_arg(a, "set"));
    if (ctl_arg(a, "note"))
        json_object_set_new(body, "note", json_string(ctl_arg(a, "note")));
    json_t *j;
    int rc = ctl_call(c, "POST", u.buf, body, 200, &j);
    if (rc == 0)
        printf("%s %s\n", ctl_jstr(j, "id"), ctl_jstr(j, "status"));
    json_decref(j);
    json_decref(body);
    return rc;
}

static int alerts_print(struct ctl_client *c, const struct ctl_args *a, json_t *list)
{
    (void)c;
    return print_alerts(list, ctl_has(a, "markdown"));
}

static int list_alerts(struct ctl_client *c, const struct ctl_args *a)
{
    static const char *const keys[] = {"project", "branch", "kind", "status", "limit", NULL};
    struct ctl_url u;
    ctl_url_init(&u, "/v1/alerts");
    ctl_url_query_args(c, &u, a, keys);
    if (u.overflow)
        return ctl_usage_error(a->cmd, "the filters are too long");
    return ctl_show_list(c, a, u.buf, "alerts", alerts_print);
}

/* An alert ID goes with --set, and --note with --set. */
static int alerts_check(const struct ctl_args *a, void *ctx)
{
    (void)ctx;
    if ((a->npos == 1) != ctl_has(a, "set"))
        return ctl_usage_error(a->cmd, "an alert ID and --set go together");
    if (ctl_has(a, "note") && !ctl_has(a, "set"))
        return ctl_usage_error(a->cmd, "--note needs --set");
    return 0;
}

static int alerts_run(struct ctl_client *c, const struct ctl_args *a, void *ctx)
{
    (void)ctx;
    return a->npos == 1 ? set_alert(c, a, a->pos[0]) : list_alerts(c, a);
}

static const struct ctl_opt alerts_opts[] = {
    CTL_OPTS_BRANCH(CTL_VALUE, "only this project", "only this branch"),
    {"kind", CTL_VALUE, "K", "only perf, memory, numerics or outcome"},
    {"status", CTL_VALUE, "S", "open (default), acknowledged, false_positive, expected or all"},
    {"limit", CTL_VALUE, "N", "at most N alerts (1..1000, default 100)"},
    {"set", CTL_VALUE, "S",
     "with an alert ID: set its status (acknowledged, false_positive, "
     "expected, open)"},
    {"note", CTL_VALUE, "TEXT", "with --set: a note kept with the alert"},
    CTL_OPT_JSON,
    {"markdown", CTL_FLAG, NULL, "print a Markdown table"},
    CTL_OPT_END,
};

const struct ctl_cmd ctl_cmd_alerts = {
    .name = "alerts",
    .usage =
        "[--project P] [--branch B] [--kind K] [--status S] [--json | --markdown] | ID --set S "
        "[--note TEXT]",
    .summary = "List the alerts along branches (change points of perf and memory, numerics and\n"
               "outcome changes), newest first, or give feedback on one.",
    .details =
        "Each alert names its first bad and last good commit. Feedback needs an admin token.",
    .opts = alerts_opts,
    .max_pos = 1,
    .check = alerts_check,
    .run = alerts_run,
};

/* The alert (change point or event) at COMMIT, as "perf regression". */
static void mark_of(json_t *doc, const char *commit, char *buf, size_t cap)
{
    static const char *const lists[] = {"change_points", "events"};
    buf[0] = 0;
    for (int l = 0; l < 2; l++) {
        size_t i;
        json_t *a;
        json_array_foreach(json_object_get(doc, lists[l]), i, a)
        {
            if (strcmp(ctl_jstr(a, "first_bad"), commit) == 0) {
                size_t n = strlen(buf);
                snprintf(buf + n, cap - n, "%s%s %s", n ? ", " : "", ctl_jstr(a, "kind"),
                         ctl_jstr(a, "label"));
            }
        }
    }
}

static int print_history(json_t *doc)
{
    static const char *const hdr[] = {"COMMIT",   "OUTCOME",  "PERF_MS",
                                      "PEAK_MIB", "NUMERICS", "ALERT"};
    struct ctl_table *t = ctl_table_new(6, hdr);
    size_t i;
    json_t *p;
    printf("status: %s\n", ctl_jstr(doc, "status"));
    json_array_foreach(json_object_get(doc, "points"), i, p)
    {
        char c[16], perf[32] = "-", rss[32] = "-", mark[256], num[300];
        snprintf(c, sizeof c, "%.12s%s", ctl_jstr(p, "commit"),
                 strcmp(ctl_jstr(p, "ordered_by"), "submission") == 0 ? "~" : "");
        json_t *pf = json_object_get(p, "perf_ns"), *m = json_object_get(p, "peak_rss_bytes");
        if (json_is_number(pf))
            snprintf(perf, sizeof perf, "%.3f", json_number_value(pf) / 1e6);
        if (json_is_integer(m))
            snprintf(rss, sizeof rss, "%.1f", (double)json_integer_value(m) / 1048576.0);
        snprintf(num, sizeof num, "%s%s%s", ctl_jstr(p, "numerics"),
                 json_is_string(json_object_get(p, "first_divergent_key")) ? " at " : "",
                 json_is_string(json_object_get(p, "first_divergent_key"))
                     ? ctl_jstr(p, "first_divergent_key")
                     : "");
        mark_of(doc, ctl_jstr(p, "commit"), mark, sizeof mark);
        const char *row[] = {c, ctl_jstr(p, "outcome"), perf, rss, num, mark[0] ? mark : ""};
        ctl_table_row(t, row);
    }
    return ctl_table_emit(t, stdout);
}

static const char *const history_keys[] = {"project", "branch", "model", "width",
                                           "pass",    "limit",  NULL};

/* The cell and the branch must be named (an empty name is the server's
 * to refuse). */
static int history_check(const struct ctl_args *a, void *ctx)
{
    (void)ctx;
    return ctl_required(a, false);
}

static int history_print(struct ctl_client *c, const struct ctl_args *a, json_t *doc)
{
    (void)c;
    (void)a;
    return print_history(doc);
}

static int history_run(struct ctl_client *c, const struct ctl_args *a, void *ctx)
{
    (void)ctx;
    struct ctl_url u;
    ctl_url_init(&u, "/v1/history");
    ctl_url_query_args(c, &u, a, history_keys);
    if (u.overflow)
        return ctl_usage_error(a->cmd, "the cell names are too long");
    return ctl_show_list(c, a, u.buf, NULL, history_print);
}

static const struct ctl_opt history_opts[] = {
    CTL_OPTS_BRANCH(CTL_REQUIRED, "the project (required)", "the branch (required)"),
    CTL_OPTS_CELL(CTL_REQUIRED, "the cell's model (required)", "the cell's width (required)",
                  "the cell's pass (required)"),
    {"limit", CTL_VALUE, "N", "the newest N points (1..10000, default 200)"},
    CTL_OPT_JSON,
    CTL_OPT_END,
};

const struct ctl_cmd ctl_cmd_history = {
    .name = "history",
    .usage = "--project P --branch B --model M --width W --pass P [--limit N] [--json]",
    .summary =
        "Show one cell's series along a branch, oldest first: outcome, perf observation\n"
        "(median of the timing samples), peak memory and numerics against the previous commit,\n"
        "with the change points and events found in it.",
    .details = "A commit ordered by submission time (the job had no commit_time) is marked '~'.",
    .opts = history_opts,
    .check = history_check,
    .run = history_run,
};
