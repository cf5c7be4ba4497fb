/*
 * cli/gate.c - the commands whose exit code is a verdict, for a CI gate:
 * diff (a comparison) and widths check (a job's self-check).
 *
 * Both take the same three flags (CTL_OPTS_GATE: --format, --fail-on with
 * the command's own words, --wait-timeout) and run the same way: GET the
 * JSON result, waiting out 409 pending; refuse a result a gate cannot
 * trust (no verdict, nothing compared); print it, as the server's JSON or
 * as the md or text report fetched afterwards pinned to the jobs the JSON
 * named (so a commit that gains a newer job between the two requests
 * cannot make the printed report and the exit code disagree); then exit
 * with what the verdict means under --fail-on. What differs is the
 * command's: its URLs, its verdicts, how it counts the cells compared and
 * what its verdicts mean (struct ctl_gate_kind).
 */
#include <stdio.h>
#include <string.h>

#include "cli/capctl.h"

/* Whether S is one of WORDS (NULL-terminated). */
static bool one_of(const char *s, const char *const *words)
{
    for (; *words; words++)
        if (strcmp(s, *words) == 0)
            return true;
    return false;
}

int ctl_gate_check(const struct ctl_args *a, const char *const *fail_on, struct ctl_gate *g)
{
    static const char *const formats[] = {"md", "json", "text", NULL};
    char words[256];
    g->wait_timeout = -1;
    g->format = ctl_arg(a, "format") ? ctl_arg(a, "format") : "text";
    if (!one_of(g->format, formats))
        return ctl_usage_error(a->cmd, "--format must be md, json or text, got '%s'", g->format);
    g->fail_on = ctl_arg(a, "fail-on") ? ctl_arg(a, "fail-on") : fail_on[0];
    if (!one_of(g->fail_on, fail_on)) {
        ctl_or_list(fail_on, words, sizeof words);
        return ctl_usage_error(a->cmd, "--fail-on must be %s, got '%s'", words, g->fail_on);
    }
    const char *wt = ctl_arg(a, "wait-timeout");
    return wt ? ctl_seconds_arg(a->cmd, "wait-timeout", wt, &g->wait_timeout) : 0;
}

/* A verdict a gate can trust: one of K's, and some cell compared (a
 * server that predates a refusal of zero cells may still answer 200; a
 * gate never passes on nothing). NULL having said why not. */
static const char *trusted_verdict(const struct ctl_gate_kind *k, json_t *result)
{
    const char *v = json_string_value(json_object_get(result, "verdict"));
    char words[128];
    if (!v || !one_of(v, k->verdicts)) {
        ctl_or_list(k->verdicts, words, sizeof words);
        fprintf(stderr, "capctl: the %s has no verdict (%s)\n", k->what, words);
        return NULL;
    }
    if (k->compared(result) == 0) {
        fprintf(stderr, "capctl: the %s compared no cell%s\n", k->what, k->none_hint);
        return NULL;
    }
    return v;
}

/* The reply's body is freed once parsed: the report that may be fetched
 * next need not share memory with it. */
int ctl_gate_run(struct ctl_client *c, const struct ctl_args *a, const struct ctl_gate *g,
                 const struct ctl_url *u, const struct ctl_gate_kind *k, const void *ctx)
{
    struct ctl_resp r = {0};
    struct ctl_url report;
    json_t *result = NULL;
    const char *verdict;
    int rc = CTL_EXIT_ERROR;
    if (u->overflow)
        return ctl_usage_error(a->cmd, "the arguments are too long for a URL");
    if (ctl_fetch_settled(c, a->cmd, u->buf, g->wait_timeout, &r) != 0)
        goto out;
    result = ctl_resp_json(&r);
    ctl_resp_free(&r);
    if (!(verdict = trusted_verdict(k, result)))
        goto out;
    if (strcmp(g->format, "json") == 0)
        ctl_print_json(stdout, result);
    else if (k->report_url(c, a, ctx, result, g->format, &report) != 0 ||
             ctl_print_url(c, report.buf, report.overflow) != 0)
        goto out;
    fflush(stdout);
    rc = k->exit_code(g, verdict, result);
out:
    json_decref(result);
    ctl_resp_free(&r);
    return rc;
}
