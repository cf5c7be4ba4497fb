/*
 * tests/test_api_widths_check.c - the width self-check, GET
 * /v1/jobs/{id}/widths (api/api_selfcheck.c), and `capctl widths check`,
 * through a real capd and the fake runner: a build whose records are the
 * same at every width passes; one perturbed at avx2 only
 * (FAKE_PERTURB_WIDTH) diverges there, at the layer (and op) it moved; the
 * refusals name what is wrong. The same check on real torch cells, with
 * the float64 reference: tests/test_widths_check_e2e.c.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/json_want.h"
#include "tests/helpers/common/testutil.h"
#include "tests/helpers/common/text_want.h"

TestSuite(widths_check, AF_SUITE);

#define PKEY   "layer1.0.forward.output.0"
#define OPSKEY "layer1.0.forward/op.aten::mul.0.output.0"

/* A job of MODELS at WIDTHS (JSON lists' contents), forward, on BUILD at
 * COMMIT with OPTIONS (or NULL). */
static struct af_job job_of(const char *build, const char *commit, const char *models,
                            const char *widths, const char *options)
{
    return (struct af_job){"p", commit, NULL, build, models, widths, "\"forward\"", options};
}

/* job_of() posted; waits for it and returns its id. */
static char *job_at(const char *build, const char *commit, const char *models, const char *widths,
                    const char *options)
{
    struct af_job j = job_of(build, commit, models, widths, options);
    char *id = af_submit_job(&af_capd, &j);
    json_decref(af_wait_done(id));
    return id;
}

/* The same at default and avx2. */
static char *job(const char *build, const char *commit, const char *models, const char *options)
{
    return job_at(build, commit, models, "\"default\",\"avx2\"", options);
}

static void builds(void)
{
    cr_assert_eq(tu_fake_build(&af_capd, "clean", "{}"), 201);
    cr_assert_eq(tu_fake_build(&af_capd, "pert",
                               "{\"FAKE_PERTURB_KEY\":\"" PKEY
                               "\",\"FAKE_PERTURB_WIDTH\":\"avx2\"}"),
                 201);
    cr_assert_eq(tu_fake_build(&af_capd, "pertop",
                               "{\"FAKE_PERTURB_KEY\":\"" OPSKEY
                               "\",\"FAKE_PERTURB_WIDTH\":\"avx2\"}"),
                 201);
}

/* The start of most tests: capd on the defaults, with the builds. */
static void start(void)
{
    af_start(NULL);
    builds();
}

/* GET /v1/jobs/REF/widths?QUERY, which must answer 200. */
static json_t *check(const char *ref, const char *query)
{
    char p[256];
    snprintf(p, sizeof p, "/v1/jobs/%s/widths%s%s", ref, *query ? "?" : "", query);
    return af_get_ok(p);
}

/* The same, rendered (format md or text); owned. */
static char *report(const char *ref, const char *format)
{
    char p[256];
    long st;
    struct tu_resp m;
    snprintf(p, sizeof p, "/v1/jobs/%s/widths?format=%s", ref, format);
    json_decref(af_raw("GET", p, NULL, 0, NULL, &st, &m));
    cr_assert_eq(st, 200, "GET %s: %s", p, m.body);
    char *text = strdup(m.body);
    tu_resp_free(&m);
    return text;
}

Test(widths_check, a_clean_build_passes_a_perturbed_width_diverges_at_its_layer, .init = start)
{
    char *clean = job("clean", "c1ea001", "\"fake:ok\"", NULL);
    char *pert = job("pert", "0e27001", "\"fake:ok\"", NULL);

    json_t *r = check(clean, "");
    const struct jw_want pass[] = {
        JW_S("job", clean),
        JW_S("commit", "c1ea001"),
        JW_S("baseline_width", "default"),
        JW_N("reference"),
        JW_S("verdict", "pass"),
        JW_S("widths.0.width", "avx2"),
        JW_S("widths.0.verdict", "pass"),
        JW_I("widths.0.counts.cells", 1),
        JW_I("widths.0.counts.compared", 1),
        JW_I("widths.0.counts.identical", 1),
        JW_I("widths.0.counts.diverged", 0),
        JW_N("widths.0.first_divergence"),
        JW_S("widths.0.cells.0.model", "fake:ok"),
        JW_S("widths.0.cells.0.pass", "forward"),
        JW_S("widths.0.cells.0.status", "identical"),
        JW_A("widths.1"),
    };
    jw_expect_all(r, pass);
    /* Without float64 records the tolerance rule judges, and the result says so. */
    cr_assert(strstr(jw_str(r, "note"), "\"reference\": \"float64\""), "%s", jw_str(r, "note"));
    json_decref(r);

    /* By commit as well as by id. */
    r = check("0e27001", "");
    const struct jw_want div[] = {
        JW_S("job", pert),
        JW_S("verdict", "diverged"),
        JW_S("widths.0.verdict", "diverged"),
        JW_I("widths.0.counts.diverged", 1),
        JW_S("widths.0.first_divergence.model", "fake:ok"),
        JW_S("widths.0.first_divergence.pass", "forward"),
        JW_S("widths.0.first_divergence.module", "layer1"),
        JW_S("widths.0.first_divergence.key", PKEY),
        JW_S("widths.0.first_divergence.reason", "stats"),
        JW_S("widths.0.first_divergence.rule", "tolerance"),
        JW_A("widths.0.first_divergence.op"),
        JW_S("widths.0.cells.0.status", "diverged"),
        JW_S("widths.0.cells.0.first_divergence.key", PKEY),
    };
    jw_expect_all(r, div);
    json_decref(r);

    char *text = report(pert, "text");
    tw_expect_has(text, "capd width self-check: diverged", "avx2      diverged",
                  "first divergence: fake:ok forward: layer layer1, key " PKEY, "note: job ", NULL);
    free(text);
    text = report(pert, "md");
    tw_expect_has(text, "## capd width self-check: diverged", "| `avx2` | **diverged** |",
                  "layer `layer1`", "> **Note:**", NULL);
    free(text);
    free(clean);
    free(pert);
}

/* At granularity op the first divergence names the op and its kernel; with
 * the job's option reference float64 the arbiter is asked (the fake runner
 * writes no float64 records, so it says why it could not judge). */
Test(widths_check, op_and_reference, .init = start)
{
    char *id = job("pertop", "0e27002", "\"fake:ops__3\"",
                   "{\"capture\":\"sample\",\"reference\":\"float64\",\"granularity\":\"op\"}");
    json_t *r = check(id, "");
    const struct jw_want want[] = {
        JW_S("reference", "float64"),
        JW_N("note"),
        JW_S("verdict", "diverged"),
        JW_S("widths.0.first_divergence.module", "layer1"),
        JW_S("widths.0.first_divergence.op", "aten::mul"),
        JW_S("widths.0.first_divergence.key", OPSKEY),
        JW_S("widths.0.first_divergence.rule", "tolerance"),
        JW_S("widths.0.first_divergence.reference.reason", "no_reference_record"),
        JW_S("widths.0.first_divergence.kernel.op", "aten::mul"),
    };
    jw_expect_all(r, want);
    json_decref(r);
    char *text = report(id, "text");
    tw_expect_has(text, "judged by the float64 reference", "op aten::mul",
                  "tolerance rule: reference no_reference_record", NULL);
    free(text);
    free(id);
}

Test(widths_check, refusals, .init = start)
{
    af_hang_build("hang");
    char *ok = job("clean", "c1ea001", "\"fake:ok\"", NULL);
    char *nd = job_at("clean", "aaaa001", "\"fake:ok\"", "\"avx2\"", NULL);
    char *od = job_at("clean", "aaaa002", "\"fake:ok\"", "\"default\"", NULL);
    struct af_job running = job_of("hang", "aaaa003", "\"mlp\"", "\"default\",\"avx2\"", NULL);
    char *run = af_submit_job(&af_capd, &running);
    json_decref(af_wait_cell(run, 0, "running", 20));
    static const struct {
        const char *ref, *query;
        long status;
        const char *code, *field, *says;
    } bad[] = {
        {"jnope", "", 404, "not_found", "id", "no job or commit 'jnope'"},
        {"abcdef9", "", 404, "not_found", "id", NULL},
        {"aaaa001", "", 409, "no_baseline", "id", "no cell at width default"},
        {"aaaa002", "", 409, "no_widths", "id", "no width but default"},
        {"aaaa003", "", 409, "pending", "id", "no finished job yet"},
        {"c1ea001", "format=xml", 400, "invalid_query", "format", "json, md or text"},
        {"c1ea001", "model=MLP", 400, "no_match", "model", "models: fake:ok"},
        {"c1ea001", "pass=backward", 400, "no_match", "pass", "passes: forward"},
    };
    char p[256];
    long st;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(p, sizeof p, "/v1/jobs/%s/widths%s%s", bad[i].ref, *bad[i].query ? "?" : "",
                 bad[i].query);
        json_t *r = af_get(p, &st);
        af_expect_error(r, st, bad[i].status, bad[i].code, bad[i].field);
        const char *msg = jw_str(r, "error.message");
        cr_assert(!bad[i].says || strstr(msg, bad[i].says), "%s: %s", p, msg);
        json_decref(r);
    }
    /* The unfinished job by id: 409 pending with the job's state. */
    snprintf(p, sizeof p, "/v1/jobs/%s/widths", run);
    json_t *r = af_get(p, &st);
    cr_assert_eq(st, 409);
    const struct jw_want pend[] = {JW_S("error.code", "pending"), JW_S("verdict", "pending"),
                                   JW_S("job.job", run), JW_S("job.state", "running")};
    jw_expect_all(r, pend);
    json_decref(r);
    /* A filter that matches is no typo; an unchanged result is a 304. */
    struct tu_resp m;
    snprintf(p, sizeof p, "/v1/jobs/%s/widths?model=fake:*&pass=forward", ok);
    json_decref(af_raw("GET", p, NULL, 0, NULL, &st, &m));
    cr_assert_eq(st, 200, "%s", m.body);
    char inm[128];
    snprintf(inm, sizeof inm, "If-None-Match: %s", af_header(m.headers, "ETag"));
    tu_resp_free(&m);
    const char *hdrs[] = {inm, NULL};
    json_decref(af_raw("GET", p, NULL, 0, hdrs, &st, &m));
    cr_assert_eq(st, 304);
    tu_resp_free(&m);
    /* A read like every job GET: without a token, 401. */
    tu_anonymous(&af_capd);
    r = af_get(p, &st);
    af_expect_error(r, st, 401, "unauthorized", NULL);
    json_decref(r);
    free(ok);
    free(nd);
    free(od);
    free(run);
}

/* capctl widths check: its exit status is the verdict's, like capctl diff. */
Test(widths_check, capctl_exit_status, .init = start)
{
    char *clean = job("clean", "c1ea001", "\"fake:ok\"", NULL);
    char *pert = job("pert", "0e27001", "\"fake:ok\"", NULL);
    static const struct af_capctl_run runs[] = {
        {"widths check c1ea001", 0, "capd width self-check: pass"},
        {"widths check 0e27001", 1, "avx2      diverged"},
        {"widths check 0e27001 --fail-on never", 0, "capd width self-check: diverged"},
        {"widths check 0e27001 --format md", 1, "| `avx2` | **diverged** |"},
        {"widths check 0e27001 --format json --model 'fake:*'", 1, "\"verdict\": \"diverged\""},
        {"widths check jnope", 2, "no job or commit 'jnope'"},
        {"widths check c1ea001 --pass backward", 2, "matches no cell"},
        {"widths check c1ea001 --fail-on sometimes", 2, "--fail-on must be"},
        {"widths check", 2, "missing argument"},
        {"widths --runnable", 0, "default\n"},
    };
    af_expect_capctl(runs);
    free(clean);
    free(pert);
}

/* A width this host cannot run (hidden from capd) and a cell that crashed
 * at default: nothing diverged, but not every cell could be judged. */
Test(widths_check, incomplete_when_cells_cannot_be_judged)
{
    const char *hide[] = {"--cpu-features-hide", "avx512f", NULL};
    af_start(hide);
    builds();
    char *id = job_at("clean", "1c0a001", "\"fake:ok\",\"fake:segv\"",
                      "\"default\",\"avx2\",\"avx512\"", NULL);
    json_t *r = check(id, "");
    const struct jw_want want[] = {
        JW_S("verdict", "incomplete"),
        JW_S("widths.0.width", "avx2"),
        JW_S("widths.0.verdict", "incomplete"),
        JW_I("widths.0.counts.compared", 1),
        JW_I("widths.0.counts.incomparable", 1),
        JW_S("widths.0.cells.1.status", "incomparable"),
        JW_S("widths.0.cells.1.status_reason", "control_outcome"),
        JW_S("widths.0.cells.1.control_outcome", "crashed"),
        JW_S("widths.1.width", "avx512"),
        JW_S("widths.1.verdict", "incomplete"),
        JW_I("widths.1.counts.not_run", 2),
        JW_I("widths.1.counts.compared", 0),
        JW_N("widths.1.first_divergence"),
    };
    jw_expect_all(r, want);
    json_decref(r);
    char *text = report(id, "text");
    tw_expect_has(text, "capd width self-check: incomplete",
                  "fake:segv forward: incomparable (the default cell ended crashed)",
                  "fake:ok forward: not_run (this host cannot run avx512)", NULL);
    free(text);
    char *out = NULL;
    cr_assert_eq(af_capctl(&af_capd, "widths check 1c0a001", &out), 0, "%s", out);
    free(out);
    cr_assert_eq(af_capctl(&af_capd, "widths check 1c0a001 --fail-on incomplete", &out), 1, "%s",
                 out);
    free(out);
    free(id);
}
