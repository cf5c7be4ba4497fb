/*
 * tests/test_openapi.c - schema/openapi.yaml is the API's contract: it must
 * parse, document every route of api/server.c's routes[] table (so adding a
 * route without documenting it fails here), and describe the replies a real
 * capd sends. The checks live in tests/check_openapi.py (PyYAML); this file
 * runs it against the source tree, against deliberately broken inputs (so
 * the checker is known to fail when it should), and against replies
 * recorded from a running capd.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/testutil.h"
#include "tests/helpers/common/text_want.h"

static struct tu_capd g_capd;
static char *g_dir;

static void teardown(void)
{
    af_stop_capd(&g_capd, &g_dir);
}

TestSuite(openapi, .fini = teardown, .timeout = 120);

/* Starts capd in the test's temp dir; on failure shows its stderr. */
static void start(const char *const *extra)
{
    af_start_capd(&g_capd, g_dir, extra);
}

static const char *src(const char *rel)
{
    static char p[4][1024];
    static int slot;
    char *s = p[slot++ % 4];
    snprintf(s, 1024, "%s/%s", tu_bin("CAPD_SOURCE_DIR"), rel);
    return s;
}

/* Runs the checker; returns its exit status and its output (owned). */
static int checker(const char *mode, const char *a, const char *b, char **out)
{
    if (!g_dir)
        g_dir = tu_tmpdir();
    cr_assert_not_null(g_dir);
    cr_assert_eq(tu_sh("/usr/bin/python3 -c 'import yaml' 2>/dev/null"), 0,
                 "/usr/bin/python3 with PyYAML is required (apt-get install python3-yaml; "
                 "scripts/install-deps.sh should list it)");
    char o[512];
    snprintf(o, sizeof o, "%s/checker.out", g_dir);
    int rc = tu_sh("/usr/bin/python3 '%s' %s '%s' '%s' >'%s' 2>&1", src("tests/check_openapi.py"),
                   mode, a, b, o);
    *out = tu_slurp(o);
    return rc;
}

Test(openapi, spec_parses_and_documents_every_route)
{
    char *out;
    int rc = checker("routes", src("schema/openapi.yaml"), src("api/server.c"), &out);
    cr_assert_eq(rc, 0, "schema/openapi.yaml does not match api/server.c:\n%s", out);
    free(out);
}

/* A route added to the table without documentation, and a route whose
 * method changed, must both be reported. */
Test(openapi, checker_catches_undocumented_routes)
{
    g_dir = tu_tmpdir();
    char *server = tu_slurp(src("api/server.c"));
    const char *anchor =
        "{\"GET\", \"/v1/widths\", api_widths, false, API_READ, BODY_NONE, false},";
    char *at = strstr(server, anchor);
    cr_assert_not_null(at, "the routes table changed shape; update this test");
    char path[512];
    snprintf(path, sizeof path, "%s/server.c", g_dir);
    FILE *f = fopen(path, "w");
    fwrite(server, 1, (size_t)(at - server), f);
    fputs("{\"POST\", \"/v1/widths\", api_widths, false, API_ADMIN, BODY_NONE, false},\n"
          "    {\"GET\", \"/v1/undocumented/:thing\", api_widths, false, API_READ, BODY_NONE, "
          "false},",
          f);
    fputs(at + strlen(anchor), f);
    fclose(f);
    free(server);
    char *out;
    int rc = checker("routes", src("schema/openapi.yaml"), path, &out);
    cr_assert_eq(rc, 1, "the checker missed the change (rc %d):\n%s", rc, out);
    tw_expect_has(out, "GET /v1/undocumented/{thing} is not in openapi",
                  "route POST /v1/widths: method missing",
                  "documents GET /v1/widths, which api/server.c does not route", NULL);
    free(out);
}

/* ---- real replies against the spec ---- */

static int g_nsample;

/* Sends one request and records the reply as a sample for TEMPLATE. */
static long sample(const char *method, const char *path, const char *tmpl, const char *body,
                   const char *const *extra_hdrs, json_t **reply)
{
    const char *hdrs[8] = {NULL};
    int h = 0;
    if (body)
        hdrs[h++] = "Content-Type: application/json";
    for (int i = 0; extra_hdrs && extra_hdrs[i] && h < 7; i++)
        hdrs[h++] = extra_hdrs[i];
    struct tu_resp r;
    tu_http(&g_capd, method, path, body, body ? strlen(body) : 0, hdrs, &r);
    char ctype[128] = "application/json";
    const char *ct = strcasestr(r.headers, "\r\ncontent-type:");
    if (ct) {
        ct += 15;
        while (*ct == ' ')
            ct++;
        size_t n = strcspn(ct, ";\r\n");
        snprintf(ctype, sizeof ctype, "%.*s", (int)n, ct);
    }
    json_t *j = strcmp(ctype, "application/json") == 0 ? json_loadb(r.body, r.len, 0, NULL)
                                                       : json_string(r.body);
    cr_assert_not_null(j, "%s %s: reply is not JSON: %s", method, path, r.body);
    json_t *s = json_pack("{s:s,s:s,s:i,s:s,s:O}", "method", method, "path", tmpl, "status",
                          (int)r.status, "content_type", ctype, "body", j);
    char file[600];
    snprintf(file, sizeof file, "%s/samples/%03d.json", g_dir, g_nsample++);
    cr_assert_eq(json_dump_file(s, file, JSON_INDENT(1)), 0);
    json_decref(s);
    long status = r.status;
    tu_resp_free(&r);
    if (reply)
        *reply = j;
    else
        json_decref(j);
    return status;
}

static json_t *wait_state(const char *id, const char *want)
{
    char p[128];
    snprintf(p, sizeof p, "/v1/jobs/%s", id);
    for (int i = 0; i < 1000; i++) {
        json_t *j = tu_json(&g_capd, "GET", p, NULL, NULL);
        const char *st = tu_jstr(j, "state");
        if (st && strcmp(st, want) == 0)
            return j;
        json_decref(j);
        usleep(20 * 1000);
    }
    cr_assert_fail("job %s never became %s", id, want);
    return NULL;
}

static const char OK_SH[] =
    "#!/bin/sh\n"
    "echo hi\n"
    "printf '%s\\n' '{\"kind\":\"hello\",\"protocol\":1,\"runner\":\"sh\"}' >&3\n"
    "printf '%s\\n' '{\"kind\":\"env\",\"fingerprint\":{},\"effective_width\":\"avx2\"}' >&3\n"
    "printf '%s\\n' '{\"kind\":\"tensor\",\"seq\":0,\"key\":\"model.0.forward.output.0\","
    "\"dtype\":\"float32\",\"shape\":[2],\"numel\":2,\"stats\":{\"min\":0,\"max\":1,"
    "\"mean\":0.5,\"std\":0.5,\"l2\":1,\"nan\":0,\"pinf\":0,\"ninf\":0,\"zeros\":1},"
    "\"hash\":\"00112233445566778899aabbccddeeff\",\"capture\":\"stats\"}' >&3\n"
    "printf '%s\\n' '{\"kind\":\"timing\",\"phase\":\"forward\",\"samples_ns\":[1,2,3],"
    "\"warmup\":1,\"iterations\":3,\"threads\":1}' >&3\n"
    "printf '%s\\n' '{\"kind\":\"memory\",\"peak_rss_bytes\":1}' >&3\n"
    "printf '%s\\n' '{\"kind\":\"end\",\"status\":\"ok\"}' >&3\n";

static void write_exec(const char *path, const char *text)
{
    af_put_file(path, text);
    chmod(path, 0755);
}

/* POST /v1/jobs with BODY and HDRS, checked against the spec as 201;
 * returns the new job's id (owned). */
static char *sample_job(const char *body, const char *const *hdrs)
{
    json_t *j;
    cr_assert_eq(sample("POST", "/v1/jobs", "/v1/jobs", body, hdrs, &j), 201);
    return af_job_id(j);
}

/* Two fake_runner jobs of fake:ops (tests/helpers/fake_runner.c), the head's
 * first op result moved; their comparison, checked against the spec. */
static void ops_samples(void)
{
    char *fake = tu_helper("fake_runner");
    char body[2048], q[256];
    const char *env[] = {"{}", "{\"FAKE_PERTURB_KEY\":"
                               "\"layer0.0.forward/op.aten::hardswish.0.output.0\"}"};
    char *ids[2];
    for (int i = 0; i < 2; i++) {
        snprintf(body, sizeof body,
                 "{\"name\":\"ops%d\",\"python\":\"%s\",\"model_roots\":[\"%s\"],\"env\":%s}", i,
                 fake, g_dir, env[i]);
        cr_assert_eq(sample("POST", "/v1/builds", "/v1/builds", body, NULL, NULL), 201);
        snprintf(body, sizeof body,
                 "{\"project\":\"ops\",\"commit\":\"0b5%04d\",\"build\":\"ops%d\","
                 "\"matrix\":{\"models\":[\"fake:ops__3\"],\"widths\":[\"avx2\"],"
                 "\"passes\":[\"forward\"]},\"options\":{\"capture\":\"sample\","
                 "\"granularity\":\"op\",\"iterations\":3}}",
                 i, i);
        ids[i] = sample_job(body, NULL);
        json_decref(wait_state(ids[i], "done"));
    }
    json_t *r;
    snprintf(q, sizeof q, "/v1/compare?control=%s&head=%s", ids[0], ids[1]);
    cr_assert_eq(sample("GET", q, "/v1/compare", NULL, NULL, &r), 200);
    json_t *cell = json_array_get(json_object_get(r, "cells"), 0);
    cr_assert(json_is_object(json_object_get(cell, "max_amplification")));
    cr_assert(json_is_object(json_object_get(cell, "first_divergence_growth")));
    cr_assert(json_is_object(json_object_get(json_object_get(cell, "first_divergence"), "kernel")));
    json_decref(r);
    free(ids[0]);
    free(ids[1]);
    free(fake);
}

/* The width self-check of a fake_runner job perturbed at avx2 only: the
 * result, its text, and the refusals, checked against the spec. CTL is a
 * finished job of avx2 alone (no default cell). */
static void widths_samples(const char *ctl)
{
    char *fake = tu_helper("fake_runner");
    char body[2048], p[256];
    snprintf(body, sizeof body,
             "{\"name\":\"wc\",\"python\":\"%s\",\"model_roots\":[\"%s\"],\"env\":"
             "{\"FAKE_PERTURB_KEY\":\"layer1.0.forward.output.0\",\"FAKE_PERTURB_WIDTH\":"
             "\"avx2\"}}",
             fake, g_dir);
    cr_assert_eq(sample("POST", "/v1/builds", "/v1/builds", body, NULL, NULL), 201);
    char *id = sample_job("{\"project\":\"wc\",\"commit\":\"0c0ffee\",\"build\":\"wc\","
                          "\"matrix\":{\"models\":[\"fake:ok\"],\"widths\":[\"default\","
                          "\"avx2\"],\"passes\":[\"forward\",\"backward\"]},"
                          "\"options\":{\"capture\":\"sample\",\"iterations\":1}}",
                          NULL);
    json_decref(wait_state(id, "done"));
    static const struct {
        const char *query;
        long status;
    } q[] = {{"", 200},
             {"?format=text", 200},
             {"?pass=forward&format=md", 200},
             {"?format=xml", 400},
             {"?model=nope", 400}};
    json_t *r;
    const char *tmpl = "/v1/jobs/{id}/widths";
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
        snprintf(p, sizeof p, "/v1/jobs/%s/widths%s", id, q[i].query);
        cr_assert_eq(sample("GET", p, tmpl, NULL, NULL, &r), q[i].status, "GET %s", p);
        if (i == 0)
            cr_assert_str_eq(tu_jstr(r, "verdict"), "diverged");
        json_decref(r);
    }
    snprintf(p, sizeof p, "/v1/jobs/%s/widths", ctl);
    cr_assert_eq(sample("GET", p, tmpl, NULL, NULL, NULL), 409);
    cr_assert_eq(sample("GET", "/v1/jobs/jnope/widths", tmpl, NULL, NULL, NULL), 404);
    free(id);
    free(fake);
}

Test(openapi, real_replies_match_the_spec)
{
    g_dir = tu_tmpdir();
    start(NULL);
    char p[1024], q[2048], body[2048];
    snprintf(p, sizeof p, "%s/samples", g_dir);
    mkdir(p, 0755);
    char ok[512], hang[512];
    snprintf(ok, sizeof ok, "%s/ok.sh", g_dir);
    snprintf(hang, sizeof hang, "%s/hang.sh", g_dir);
    write_exec(ok, OK_SH);
    write_exec(hang, "#!/bin/sh\nexec sleep 1000\n");

    sample("GET", "/healthz", "/healthz", NULL, NULL, NULL);
    sample("GET", "/v1/models", "/v1/models", NULL, NULL, NULL);
    sample("GET", "/v1/widths", "/v1/widths", NULL, NULL, NULL);
    snprintf(body, sizeof body,
             "{\"name\":\"ok\",\"python\":\"%s\",\"env\":{\"A\":\"1\"},\"model_roots\":[\"%s\"],"
             "\"description\":\"d\"}",
             ok, g_dir);
    cr_assert_eq(sample("POST", "/v1/builds", "/v1/builds", body, NULL, NULL), 201);
    cr_assert_eq(sample("POST", "/v1/builds", "/v1/builds", body, NULL, NULL), 409);
    cr_assert_eq(sample("POST", "/v1/builds", "/v1/builds", "{\"name\":1}", NULL, NULL), 400);
    snprintf(body, sizeof body, "{\"python\":\"%s\"}", hang);
    cr_assert_eq(sample("PUT", "/v1/builds/hang", "/v1/builds/{name}", body, NULL, NULL), 200);
    sample("GET", "/v1/builds", "/v1/builds", NULL, NULL, NULL);
    cr_assert_eq(sample("GET", "/v1/builds/ok", "/v1/builds/{name}", NULL, NULL, NULL), 200);
    cr_assert_eq(sample("GET", "/v1/builds/no", "/v1/builds/{name}", NULL, NULL, NULL), 404);

    const char *job_ok = "{\"project\":\"p\",\"commit\":\"1b0e7d2\",\"build\":\"ok\","
                         "\"matrix\":{\"models\":[\"mlp\"],\"widths\":[\"avx2\"],"
                         "\"passes\":[\"forward\"]},\"labels\":{\"k\":\"v\"},"
                         "\"provenance\":{\"findings\":[]}}";
    const char *idem[] = {"Idempotency-Key: k1", NULL};
    char *ctl = sample_job(job_ok, idem);
    cr_assert_eq(sample("POST", "/v1/jobs", "/v1/jobs", job_ok, idem, NULL), 200);
    cr_assert_eq(sample("POST", "/v1/jobs", "/v1/jobs", "{\"project\":\"p\"}", idem, NULL), 400);
    const char *job_head = "{\"project\":\"p\",\"commit\":\"3f2a9c1\",\"branch\":\"main\","
                           "\"build\":\"ok\",\"matrix\":{\"models\":[\"mlp\"],"
                           "\"widths\":[\"avx2\"],\"passes\":[\"forward\"]}}";
    char *head = sample_job(job_head, NULL);
    json_decref(wait_state(ctl, "done"));
    json_t *done = wait_state(head, "done");
    const char *cell = tu_jstr(json_array_get(json_object_get(done, "cells"), 0), "id");

    snprintf(p, sizeof p, "/v1/jobs/%s", head);
    cr_assert_eq(sample("GET", p, "/v1/jobs/{id}", NULL, NULL, NULL), 200);
    cr_assert_eq(sample("GET", "/v1/jobs/jnope", "/v1/jobs/{id}", NULL, NULL, NULL), 404);
    snprintf(p, sizeof p, "/v1/jobs/%s/cells/%s", head, cell);
    cr_assert_eq(sample("GET", p, "/v1/jobs/{id}/cells/{cell}", NULL, NULL, NULL), 200);
    snprintf(p, sizeof p, "/v1/jobs/%s/cells/%s/records?limit=2", head, cell);
    cr_assert_eq(sample("GET", p, "/v1/jobs/{id}/cells/{cell}/records", NULL, NULL, NULL), 200);
    snprintf(p, sizeof p, "/v1/jobs/%s/cells/%s/records?kind=x", head, cell);
    cr_assert_eq(sample("GET", p, "/v1/jobs/{id}/cells/{cell}/records", NULL, NULL, NULL), 400);
    snprintf(p, sizeof p, "/v1/jobs/%s/cells/%s/log", head, cell);
    cr_assert_eq(sample("GET", p, "/v1/jobs/{id}/cells/{cell}/log", NULL, NULL, NULL), 200);
    snprintf(p, sizeof p, "/v1/jobs/%s/cancel", head);
    cr_assert_eq(sample("POST", p, "/v1/jobs/{id}/cancel", NULL, NULL, NULL), 409);

    cr_assert_eq(
        sample("GET", "/v1/compare?control=1b0e7d2&head=3f2a9c1", "/v1/compare", NULL, NULL, NULL),
        200);
    cr_assert_eq(sample("GET", "/v1/compare?head=3f2a9c1", "/v1/compare", NULL, NULL, NULL), 400);
    cr_assert_eq(sample("GET", "/v1/compare?control=1b0e7d2&head=3f2a9c1&format=md", "/v1/compare",
                        NULL, NULL, NULL),
                 200);
    cr_assert_eq(
        sample("GET", "/v1/commits/3f2a9c1/diff", "/v1/commits/{sha}/diff", NULL, NULL, NULL), 404);
    cr_assert_eq(sample("PUT", "/v1/branches/main", "/v1/branches/{name}",
                        "{\"control_commit\":\"1b0e7d2\"}", NULL, NULL),
                 200);
    cr_assert_eq(sample("GET", "/v1/branches/main", "/v1/branches/{name}", NULL, NULL, NULL), 200);
    cr_assert_eq(
        sample("GET", "/v1/commits/3f2a9c1/diff", "/v1/commits/{sha}/diff", NULL, NULL, NULL), 200);
    cr_assert_eq(sample("GET", "/v1/commits/3f2a9c1", "/v1/commits/{sha}", NULL, NULL, NULL), 200);

    /* A running job: list it, compare against it (pending), cancel it. */
    const char *job_hang = "{\"project\":\"p\",\"commit\":\"aaaaaaa\",\"build\":\"hang\","
                           "\"matrix\":{\"models\":[\"mlp\"],\"widths\":[\"default\"],"
                           "\"passes\":[\"forward\",\"backward\"]}}";
    char *run = sample_job(job_hang, NULL);
    json_decref(wait_state(run, "running"));
    cr_assert_eq(sample("GET", "/v1/jobs?limit=2", "/v1/jobs", NULL, NULL, NULL), 200);
    snprintf(q, sizeof q, "/v1/compare?control=%s&head=%s", ctl, run);
    cr_assert_eq(sample("GET", q, "/v1/compare", NULL, NULL, NULL), 409);
    snprintf(q, sizeof q, "/v1/jobs/%s/widths", run);
    cr_assert_eq(sample("GET", q, "/v1/jobs/{id}/widths", NULL, NULL, NULL), 409);
    snprintf(p, sizeof p, "/v1/jobs/%s/cancel", run);
    cr_assert_eq(sample("POST", p, "/v1/jobs/{id}/cancel", NULL, NULL, NULL), 202);

    /* An op-granularity comparison whose head perturbs an op: a kernel, a
     * first_divergence_growth and a max_amplification object; the width
     * self-check of a job perturbed at one width. */
    ops_samples();
    widths_samples(ctl);

    /* API tokens (auth_required is off: every request is admin). */
    json_t *tk;
    cr_assert_eq(sample("POST", "/v1/tokens", "/v1/tokens",
                        "{\"scope\":\"submit\",\"name\":\"ci\",\"expires_in_s\":3600}", NULL, &tk),
                 201);
    snprintf(p, sizeof p, "/v1/tokens/%s", tu_jstr(tk, "id"));
    json_decref(tk);
    cr_assert_eq(sample("POST", "/v1/tokens", "/v1/tokens", "{\"scope\":\"root\"}", NULL, NULL),
                 400);
    cr_assert_eq(sample("GET", "/v1/tokens", "/v1/tokens", NULL, NULL, NULL), 200);
    cr_assert_eq(sample("DELETE", p, "/v1/tokens/{id}", NULL, NULL, NULL), 200);
    cr_assert_eq(sample("DELETE", "/v1/tokens/tnope", "/v1/tokens/{id}", NULL, NULL, NULL), 404);

    /* Errors from the server itself. */
    cr_assert_eq(sample("DELETE", "/v1/jobs", "/v1/jobs", NULL, NULL, NULL), 405);
    const char *tp[] = {"Content-Type: text/plain", NULL};
    struct tu_resp r;
    tu_http(&g_capd, "POST", "/v1/jobs", "{}", 2, tp, &r);
    cr_assert_eq(r.status, 415);
    tu_resp_free(&r);

    char *out;
    snprintf(p, sizeof p, "%s/samples", g_dir);
    cr_assert(g_nsample >= 30, "only %d samples recorded", g_nsample);
    /* A 405 is documented on the operations of its path; check it there. */
    snprintf(q, sizeof q,
             "cd '%s' && for f in $(grep -l '\"status\": 405' *.json); do sed -i "
             "'s/\"method\": \"DELETE\"/\"method\": \"GET\"/' \"$f\"; done",
             p);
    cr_assert_eq(tu_sh("%s", q), 0);
    int rc = checker("validate", src("schema/openapi.yaml"), p, &out);
    cr_assert_eq(rc, 0, "replies that do not match schema/openapi.yaml:\n%s", out);
    free(out);

    /* The validator does fail: a job reply with a bad state and no id. */
    snprintf(q, sizeof q, "%s/bad", g_dir);
    mkdir(q, 0755);
    json_t *bad = json_deep_copy(done);
    json_object_set_new(bad, "state", json_string("exploded"));
    json_object_del(bad, "id");
    json_object_set_new(json_array_get(json_object_get(bad, "cells"), 0), "state",
                        json_string("weird"));
    json_t *s = json_pack("{s:s,s:s,s:i,s:o}", "method", "GET", "path", "/v1/jobs/{id}", "status",
                          200, "body", bad);
    snprintf(p, sizeof p, "%s/bad/000.json", g_dir);
    json_dump_file(s, p, 0);
    json_decref(s);
    rc = checker("validate", src("schema/openapi.yaml"), q, &out);
    cr_assert_eq(rc, 1, "the validator accepted a broken job (rc %d):\n%s", rc, out);
    tw_expect_has(out, "missing required id", "'exploded'", "'weird'", NULL);
    free(out);

    json_decref(done);
    free(ctl);
    free(head);
    free(run);
}

/* With auth_required on: the 401 and 403 replies, and what a read token
 * may do, match the spec. */
Test(openapi, auth_replies_match_the_spec)
{
    g_dir = tu_tmpdir();
    char cfg[512], p[1024], tokf[600];
    snprintf(cfg, sizeof cfg, "%s/auth.json", g_dir);
    af_put_file(cfg, "{\"auth_required\":true}");
    const char *extra[] = {"--config", cfg, NULL};
    start(extra);
    tu_anonymous(&g_capd); /* every request below names its own token */
    snprintf(p, sizeof p, "%s/samples", g_dir);
    mkdir(p, 0755);
    snprintf(tokf, sizeof tokf, "%s/token", g_dir);
    cr_assert_eq(tu_sh("'%s' token create --data-dir '%s/data' --scope read --name t >'%s' "
                       "2>/dev/null",
                       tu_bin("CAPD_BIN"), g_dir, tokf),
                 0);
    char *tok = tu_slurp(tokf);
    tok[strcspn(tok, "\n")] = 0;
    cr_assert(strncmp(tok, "capd_", 5) == 0, "token '%s'", tok);
    char auth[256];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", tok);
    const char *rd[] = {auth, NULL};
    const char *bad[] = {"Authorization: Bearer capd_nope", NULL};

    cr_assert_eq(sample("GET", "/healthz", "/healthz", NULL, NULL, NULL), 200);
    cr_assert_eq(sample("GET", "/v1/jobs", "/v1/jobs", NULL, NULL, NULL), 401);
    cr_assert_eq(sample("GET", "/v1/jobs", "/v1/jobs", NULL, bad, NULL), 401);
    cr_assert_eq(sample("GET", "/v1/jobs", "/v1/jobs", NULL, rd, NULL), 200);
    cr_assert_eq(sample("GET", "/v1/builds", "/v1/builds", NULL, rd, NULL), 200);
    cr_assert_eq(sample("POST", "/v1/builds", "/v1/builds", "{}", NULL, NULL), 401);
    cr_assert_eq(sample("POST", "/v1/jobs", "/v1/jobs", "{}", rd, NULL), 403);
    cr_assert_eq(sample("GET", "/v1/tokens", "/v1/tokens", NULL, rd, NULL), 403);
    cr_assert_eq(sample("DELETE", "/v1/tokens/tx", "/v1/tokens/{id}", NULL, rd, NULL), 403);
    char evil[128];
    snprintf(evil, sizeof evil, "Host: evil.example:%d", g_capd.port);
    const char *rebind[] = {evil, auth, NULL};
    cr_assert_eq(sample("GET", "/v1/jobs", "/v1/jobs", NULL, rebind, NULL), 421);
    cr_assert_eq(sample("POST", "/v1/builds", "/v1/builds", "{}", rebind, NULL), 421);
    cr_assert_eq(sample("GET", "/healthz", "/healthz", NULL, rebind, NULL), 421);
    const char *origin[] = {"Origin: http://evil.example", auth, NULL};
    cr_assert_eq(sample("POST", "/v1/jobs", "/v1/jobs", "{}", origin, NULL), 403);
    free(tok);
    char *out;
    int rc = checker("validate", src("schema/openapi.yaml"), p, &out);
    cr_assert_eq(rc, 0, "replies that do not match schema/openapi.yaml:\n%s", out);
    free(out);
}
