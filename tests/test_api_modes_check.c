/*
 * tests/test_api_modes_check.c - the mode self-check, GET
 * /v1/jobs/{id}/modes (api/api_selfcheck.c), through a real capd and the
 * fake runner, whose compiled cells record only the model's last output
 * (as the real runner records a compiled model at its boundary): a build
 * whose compiled cells compute what its eager ones do passes, the eager
 * cells' inner records left out rather than missing; one whose inductor
 * cells move the output (FAKE_PERTURB_MODE) diverges there, at every
 * width, while aot_eager passes; the refusals name what the matrix lacks;
 * `capctl modes check` exits with the verdict; a diverged compiled cell is
 * followed by a compiler bisection job (the fake runner's bisector names
 * the perturbed key), which stands for no commit.
 * On real torch cells, judged by the float64 arbiter:
 * tests/test_official.c, compiled_cells_name_their_isa.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/json_want.h"
#include "tests/helpers/common/testutil.h"
#include "tests/helpers/common/text_want.h"

/* fake:ok's last layer: a compiled cell's one record. */
#define OUTKEY "layer2.0.forward.output.0"

/* Every test's capd: the defaults, with the builds clean and badind (its
 * inductor cells move fake:ok's output). */
static void start(void)
{
    af_start(NULL);
    cr_assert_eq(tu_fake_build(&af_capd, "clean", "{}"), 201);
    cr_assert_eq(tu_fake_build(&af_capd, "badind",
                               "{\"FAKE_PERTURB_KEY\":\"" OUTKEY
                               "\",\"FAKE_PERTURB_MODE\":\"inductor\"}"),
                 201);
}

TestSuite(modes_check, .init = start, AF_SUITE);

/* A job of fake:ok at WIDTHS in MODES (JSON lists' contents), forward, of
 * BUILD at COMMIT; waited for, its id (owned). */
static char *job(const char *build, const char *commit, const char *widths, const char *modes)
{
    json_t *j = af_post_job(201,
                            "{'project':'p','commit':'%s','build':'%s','matrix':{"
                            "'models':['fake:ok'],'widths':[%s],'passes':['forward']%s%s%s}}",
                            commit, build, widths, modes ? ",'modes':[" : "", modes ? modes : "",
                            modes ? "]" : "");
    char *id = af_job_id(j);
    json_decref(af_wait_done(id));
    return id;
}

/* The path of GET /v1/jobs/REF/modes?QUERY (static). */
static const char *modes_path(const char *ref, const char *query)
{
    static char p[256];
    snprintf(p, sizeof p, "/v1/jobs/%s/modes%s%s", ref, *query ? "?" : "", query);
    return p;
}

/* GET /v1/jobs/REF/modes?QUERY: the reply and its status in *ST. */
static json_t *modes(const char *ref, const char *query, long *st)
{
    return af_get(modes_path(ref, query), st);
}

/* The same without a query, which must answer 200. */
static json_t *check(const char *ref)
{
    return af_get_ok(modes_path(ref, ""));
}

Test(modes_check, compiled_cells_against_eager_at_each_width)
{
    static const char *const w = "'default','avx2'", *const m = "'eager','inductor','aot_eager'";
    char *clean = job("clean", "c1ea001", w, m);
    char *bad = job("badind", "bad0001", w, m);

    json_t *r = check(clean);
    const struct jw_want pass[] = {
        JW_S("job", clean),
        JW_S("baseline_mode", "eager"),
        JW_N("reference"),
        JW_S("verdict", "pass"),
        JW_S("modes.0.mode", "inductor"),
        JW_S("modes.1.mode", "aot_eager"),
        JW_A("modes.2"),
        JW_S("modes.0.verdict", "pass"),
        JW_I("modes.0.counts.cells", 2),
        JW_I("modes.0.counts.identical", 2),
        JW_S("modes.0.cells.0.width", "default"),
        JW_S("modes.0.cells.1.width", "avx2"),
        JW_S("modes.0.cells.0.status", "identical"),
    };
    jw_expect_all(r, pass);
    cr_assert(strstr(jw_str(r, "note"), "\"reference\": \"float64\""), "%s", jw_str(r, "note"));
    json_decref(r);

    /* the eager cells' inner layers are not missing keys: compared, the
     * compiled cell's one record */
    char p[256];
    snprintf(p, sizeof p, "/v1/jobs/%s/modes", bad);
    r = check(bad);
    const struct jw_want div[] = {
        JW_S("verdict", "diverged"),
        JW_S("modes.0.mode", "inductor"),
        JW_S("modes.0.verdict", "diverged"),
        JW_I("modes.0.counts.diverged", 2),
        JW_S("modes.0.first_divergence.model", "fake:ok"),
        JW_S("modes.0.first_divergence.width", "default"),
        JW_S("modes.0.first_divergence.key", OUTKEY),
        JW_S("modes.0.first_divergence.rule", "tolerance"),
        JW_S("modes.0.cells.1.width", "avx2"),
        JW_S("modes.0.cells.1.status", "diverged"),
        JW_S("modes.1.mode", "aot_eager"),
        JW_S("modes.1.verdict", "pass"),
    };
    jw_expect_all(r, div);
    json_decref(r);

    long st;
    struct tu_resp t;
    snprintf(p, sizeof p, "/v1/jobs/%s/modes?format=text", bad);
    json_decref(af_raw("GET", p, NULL, 0, NULL, &st, &t));
    cr_assert_eq(st, 200, "%s", t.body);
    tw_expect_has(t.body, "capd mode self-check: diverged",
                  "every compiled mode against eager at the same width", "inductor  diverged",
                  "aot_eager pass", "first divergence: fake:ok forward at default: layer layer2",
                  "fake:ok forward at avx2: diverged", NULL);
    tu_resp_free(&t);
    snprintf(p, sizeof p, "/v1/jobs/%s/modes?format=md", bad);
    json_decref(af_raw("GET", p, NULL, 0, NULL, &st, &t));
    cr_assert_eq(st, 200, "%s", t.body);
    tw_expect_has(t.body, "## capd mode self-check: diverged", "| mode | verdict |",
                  "| `inductor` | **diverged** |", NULL);
    tu_resp_free(&t);
    free(clean);
    free(bad);
}

/* A job with no eager cell, or no compiled mode, has nothing to check;
 * the refusals say what to add, and no job is created. */
Test(modes_check, refusals)
{
    char *eager = job("clean", "aaaa001", "'avx2'", NULL);
    char *ind = job("clean", "aaaa002", "'avx2'", "'inductor'");
    int jobs = af_count_jobs();
    static const struct {
        const char *ref;
        long status;
        const char *code, *says;
    } bad[] = {
        {"aaaa001", 409, "no_modes", "add aot_eager or inductor to matrix.modes"},
        {"aaaa002", 409, "no_baseline", "include \"eager\""},
        {"jnope", 404, "not_found", "no job or commit 'jnope'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        long st;
        json_t *r = modes(bad[i].ref, "", &st);
        af_expect_error(r, st, bad[i].status, bad[i].code, "id");
        const char *msg = jw_str(r, "error.message");
        cr_assert(strstr(msg, bad[i].says), "%s: %s", bad[i].ref, msg);
        json_decref(r);
    }
    cr_assert_eq(af_count_jobs(), jobs, "no job was created");
    free(eager);
    free(ind);
}

/* capctl modes check: its exit status is the verdict's, like widths check. */
Test(modes_check, capctl_exit_status)
{
    static const char *const w = "'avx2'", *const m = "'eager','inductor'";
    char *clean = job("clean", "c1ea001", w, m);
    char *bad = job("badind", "bad0001", w, m);
    char *eager = job("clean", "aaaa001", w, NULL);
    static const struct af_capctl_run runs[] = {
        {"modes check c1ea001", 0, "capd mode self-check: pass"},
        {"modes check bad0001", 1, "inductor  diverged"},
        {"modes check bad0001 --fail-on never", 0, "capd mode self-check: diverged"},
        {"modes check bad0001 --format md", 1, "| `inductor` | **diverged** |"},
        {"modes check bad0001 --format json", 1, "\"verdict\": \"diverged\""},
        {"modes check aaaa001", 2, "no compiled mode"},
        {"modes check c1ea001 --pass backward", 2, "matches no cell"},
        {"modes check", 2, "missing argument"},
    };
    af_expect_capctl(runs);
    free(clean);
    free(bad);
    free(eager);
}

/* MODE's cell of job ID (owned). */
static json_t *cell_of(const char *id, const char *mode)
{
    json_t *j = af_get_job(id), *c, *out = NULL;
    size_t i;
    json_array_foreach(json_object_get(j, "cells"), i, c)
    {
        if (!out && strcmp(tu_jstr(c, "mode"), mode) == 0)
            out = json_incref(c);
    }
    cr_assert_not_null(out, "no %s cell: %s", mode, af_dump(j));
    json_decref(j);
    return out;
}

/* ".../cells/<MODE's cell of ID>/compiler-bisect" (static). */
static const char *bisect_path(const char *id, const char *mode)
{
    static char p[200];
    json_t *c = cell_of(id, mode);
    snprintf(p, sizeof p, "/v1/jobs/%s/cells/%s/compiler-bisect", id, tu_jstr(c, "id"));
    json_decref(c);
    return p;
}

/* With the defaults (option compiler_bisect auto) the inductor cell that
 * left eager is followed by a bisection job of that cell alone, whose
 * result names the perturbed record; the aot_eager cell, identical to
 * eager, is not; jobs with nothing compiled, nothing diverged, or the
 * option off are labelled so (or left alone); the follow-up job stands
 * for no commit. */
Test(modes_check, a_diverged_compiled_cell_is_bisected)
{
    static const char *const w = "'avx2'", *const m = "'eager','inductor','aot_eager'";
    json_t *j =
        af_post_job(201, "{'project':'p','commit':'0ff0001','build':'badind','matrix':{"
                         "'models':['fake:ok'],'widths':['avx2'],'passes':['forward'],"
                         "'modes':['eager','inductor']},'options':{'compiler_bisect':'off'}}");
    char *off = af_job_id(j);
    json_decref(af_wait_done(off));
    char *eager = job("badind", "aaaa001", w, NULL);
    char *clean = job("clean", "c1ea001", w, m);
    char *bad = job("badind", "bad0001", w, m);
    char *l = af_wait_label(&af_capd, bad, "compiler_bisect_auto", 60);
    cr_assert_str_eq(l, "bisecting 1");
    free(l);
    l = af_wait_label(&af_capd, clean, "compiler_bisect_auto", 10);
    cr_assert_str_eq(l, "nothing diverged");
    free(l);
    l = af_wait_label(&af_capd, eager, "compiler_bisect_auto", 10);
    cr_assert_str_eq(l, "no compiled mode");
    free(l);
    json_t *oj = af_get_job(off);
    cr_assert_null(json_object_get(json_object_get(oj, "labels"), "compiler_bisect_auto"), "%s",
                   af_dump(oj));
    json_decref(oj);

    json_t *r = af_get_settled(&af_capd, bisect_path(bad, "inductor"), 120);
    const struct jw_want want[] = {
        JW_S("job", bad),
        JW_S("state", "ok"),
        JW_T("result.narrowed"),
        JW_S("result.backend", "inductor"),
        JW_S("result.subsystem", "lowerings"),
        JW_S("result.debug_info", OUTKEY),
    };
    jw_expect_all(r, want);
    cr_assert(strstr(jw_str(r, "result.command"), "fake:ok avx2 forward inductor"), "%s",
              af_dump(r));
    /* the follow-up: the one cell, labelled with what it follows */
    json_t *fj = af_get_job(jw_str(r, "bisect.job"));
    json_t *ind = cell_of(bad, "inductor");
    char of[64];
    snprintf(of, sizeof of, "%s/%s", bad, tu_jstr(ind, "id"));
    const struct jw_want fw[] = {JW_S("labels.compiler_bisect_of", of),
                                 JW_S("options.compiler_bisect", "run"),
                                 JW_S("cells.0.mode", "inductor"), JW_A("cells.1")};
    jw_expect_all(fj, fw);
    json_decref(fj);
    json_decref(ind);
    json_decref(r);

    af_expect_get_error(bisect_path(bad, "aot_eager"), 404, "no_compiler_bisect");
    af_expect_get_error(bisect_path(bad, "eager"), 409, "eager_cell");
    /* the commit still names the job, not its follow-up */
    long st;
    r = modes("bad0001", "", &st);
    cr_assert_eq(st, 200);
    cr_assert_str_eq(jw_str(r, "job"), bad);
    json_decref(r);
    free(off);
    free(eager);
    free(clean);
    free(bad);
}
