/*
 * tests/test_secure.c - capd is safe with its defaults (issue 16,
 * docs/security.md): tokens are needed and the first admin token lands in
 * DATA/admin.token; auth off is an explicit, loopback-only choice; a Host
 * capd was not told about is 421 and a write from a foreign Origin is 403,
 * with nothing stored; only admin changes builds; a build's env cannot set
 * loader or interpreter hooks without allow_env; cells as root need
 * allow_root_cells. Every check runs against the real capd binary.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/store.h"
#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/testutil.h"

/* A fresh directory with capd.json holding CONFIG (NULL: no config). */
static char *fresh_dir(const char *config)
{
    char *d = tu_tmpdir();
    cr_assert_not_null(d);
    if (config) {
        char p[400];
        snprintf(p, sizeof p, "%s/capd.json", d);
        af_put_file(p, config);
    }
    return d;
}

/* Starts capd on DIR, with DIR/capd.json when WITH_CONFIG; fails the test
 * with capd's stderr when it does not start. */
static void start(struct tu_capd *c, const char *dir, bool with_config)
{
    char cfg[400];
    snprintf(cfg, sizeof cfg, "%s/capd.json", dir);
    const char *extra[] = {"--config", cfg, NULL};
    af_start_capd(c, dir, with_config ? extra : NULL);
}

/* A fresh_dir(CONFIG) with capd started on it (reading its capd.json when
 * CONFIG is given); returns the directory, for stop_and_remove. */
static char *start_fresh(struct tu_capd *c, const char *config)
{
    char *dir = fresh_dir(config);
    start(c, dir, config != NULL);
    return dir;
}

/* Runs capd on DIR with DIR/capd.json and EXTRA_FLAGS, expecting it to
 * refuse to start; returns its stderr (malloc'd). */
static char *refused_start(const char *dir, const char *extra_flags)
{
    char out[400];
    snprintf(out, sizeof out, "%s/refused.err", dir);
    int rc = tu_sh("timeout 10 '%s' --listen 127.0.0.1:0 --data-dir '%s/data' --config "
                   "'%s/capd.json' %s >/dev/null 2>'%s' & sleep 1; kill $! 2>/dev/null; wait $!",
                   tu_bin("CAPD_BIN"), dir, dir, extra_flags ? extra_flags : "", out);
    char *err = tu_slurp(out);
    cr_assert(rc != 0 && rc < 128, "capd started although it should refuse (rc %d): %s", rc, err);
    return err;
}

static long status_of(const struct tu_capd *c, const char *method, const char *path,
                      const char *body, const char *const *headers, char **body_out,
                      char **headers_out)
{
    struct tu_resp r;
    const char *hdr[8];
    int h = 0;
    if (body)
        hdr[h++] = "Content-Type: application/json";
    for (int i = 0; headers && headers[i] && h < 7; i++)
        hdr[h++] = headers[i];
    hdr[h] = NULL;
    tu_http(c, method, path, body, body ? strlen(body) : 0, hdr, &r);
    long st = r.status;
    if (body_out)
        *body_out = strdup(r.body);
    if (headers_out)
        *headers_out = strdup(r.headers);
    tu_resp_free(&r);
    return st;
}

static const char *err_code(json_t *j)
{
    return json_string_value(json_object_get(json_object_get(j, "error"), "code"));
}

static size_t nbuilds(const struct tu_capd *c)
{
    json_t *j = tu_json(c, "GET", "/v1/builds", NULL, NULL);
    size_t n = json_array_size(json_object_get(j, "builds"));
    cr_assert(json_is_array(json_object_get(j, "builds")), "GET /v1/builds answers");
    json_decref(j);
    return n;
}

static char *build_body(const struct tu_capd *c, const char *name, const char *env)
{
    char *fake = tu_helper("fake_runner"), *b;
    cr_assert(asprintf(&b, "{\"name\":\"%s\",\"python\":\"%s\",\"model_roots\":[\"%s\"]%s%s}", name,
                       fake, c->dir, env ? "," : "", env ? env : "") > 0);
    free(fake);
    return b;
}

/* ===================================================== tokens on by default */

/* Stops C (it must exit 0) and removes DIR, a fresh_dir(). */
static void stop_and_remove(struct tu_capd *c, char *dir)
{
    cr_assert_eq(tu_capd_stop(c), 0);
    tu_sh("rm -rf '%s'", dir);
    free(dir);
}

/* Whether capd wrote DIR/data/admin.token. */
static bool has_token_file(const char *dir)
{
    char path[400];
    snprintf(path, sizeof path, "%s/data/admin.token", dir);
    return access(path, F_OK) == 0;
}

Test(defaults, first_start_writes_an_admin_token_and_anonymous_writes_are_401)
{
    struct tu_capd c;
    char *dir = start_fresh(&c, NULL);
    char path[400];
    snprintf(path, sizeof path, "%s/data/admin.token", dir);
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0, "capd wrote %s", path);
    cr_assert_eq(sb.st_mode & 07777, 0600, "admin.token is mode %04o", sb.st_mode & 07777);
    cr_assert_eq(sb.st_uid, geteuid(), "owned by capd's user");
    cr_assert_eq(strlen(c.token), STORE_TOKEN_LEN, "one token on its line: '%s'", c.token);
    char token[128];
    snprintf(token, sizeof token, "%s", c.token);

    /* The log names the file, never the secret. */
    char *log = tu_slurp(c.errlog);
    cr_assert(strstr(log, "admin_token_created") && strstr(log, "admin.token"), "%s", log);
    cr_assert_null(strstr(log, token + 19), "the secret is in the log");
    free(log);

    json_t *h = tu_json(&c, "GET", "/healthz", NULL, NULL);
    cr_assert(json_is_true(json_object_get(h, "auth_required")), "healthz says auth is on");
    cr_assert(json_is_false(json_object_get(h, "cells_run_as_root")));
    json_decref(h);

    /* Anonymous: every write and read of data is 401; nothing is stored. */
    tu_anonymous(&c);
    char *bb = build_body(&c, "fake", NULL);
    cr_assert_eq(status_of(&c, "POST", "/v1/builds", bb, NULL, NULL, NULL), 401);
    cr_assert_eq(status_of(&c, "POST", "/v1/jobs", "{}", NULL, NULL, NULL), 401);
    cr_assert_eq(status_of(&c, "GET", "/v1/builds", NULL, NULL, NULL, NULL), 401);
    cr_assert_eq(status_of(&c, "GET", "/healthz", NULL, NULL, NULL, NULL), 200);
    snprintf(c.token, sizeof c.token, "%s", token);
    cr_assert_eq(nbuilds(&c), 0);
    cr_assert_eq(status_of(&c, "POST", "/v1/builds", bb, NULL, NULL, NULL), 201);
    cr_assert_eq(tu_capd_stop(&c), 0);

    /* A restart keeps the token; once a token exists, a deleted file is
     * not made again. */
    start(&c, dir, false);
    cr_assert_str_eq(c.token, token, "the same token after a restart");
    cr_assert_eq(nbuilds(&c), 1);
    cr_assert_eq(tu_capd_stop(&c), 0);
    cr_assert_eq(unlink(path), 0);
    start(&c, dir, false);
    cr_assert_eq(access(path, F_OK), -1, "admin.token came back after it was deleted");
    free(bb);
    stop_and_remove(&c, dir);
}

Test(defaults, a_token_made_before_the_first_start_means_no_file)
{
    char *dir = fresh_dir(NULL);
    cr_assert_eq(tu_sh("'%s' token create --data-dir '%s/data' --scope admin >/dev/null 2>&1",
                       tu_bin("CAPD_BIN"), dir),
                 0);
    struct tu_capd c;
    start(&c, dir, false);
    cr_assert(!has_token_file(dir), "capd made a second admin token");
    cr_assert_eq(status_of(&c, "GET", "/v1/builds", NULL, NULL, NULL, NULL), 401);
    stop_and_remove(&c, dir);
}

Test(defaults, auth_off_is_explicit_warned_and_loopback_only)
{
    char *dir = fresh_dir("{\"auth_required\": false}");
    char *err = refused_start(dir, "--listen 0.0.0.0:0");
    cr_assert(strstr(err, "auth_required") && strstr(err, "loopback"), "%s", err);
    free(err);
    struct tu_capd c;
    start(&c, dir, true);
    cr_assert(!has_token_file(dir), "no admin token while auth is off");
    cr_assert_eq(status_of(&c, "GET", "/v1/builds", NULL, NULL, NULL, NULL), 200);
    cr_assert_eq(tu_capd_stop(&c), 0);
    char *log = tu_slurp(c.errlog);
    cr_assert(strstr(log, "auth_disabled"), "a warning at start: %s", log);
    free(log);
    tu_sh("rm -rf '%s'", dir);
    free(dir);
}

/* ===================================================== Host and Origin */

Test(host, rebinding_host_is_421_and_touches_nothing)
{
    struct tu_capd c;
    char *dir = start_fresh(&c, "{\"allowed_hosts\": [\"capd.example\", \"ci.example:9\"]}");
    char *bb = build_body(&c, "fake", NULL), *body = NULL;
    char evil[128], other_port[128], ok[3][128];
    snprintf(evil, sizeof evil, "Host: evil.example:%d", c.port);
    snprintf(other_port, sizeof other_port, "Host: 127.0.0.1:%d", c.port == 1 ? 2 : c.port - 1);
    const char *bad[] = {evil, other_port, "Host: ci.example:10", "Host: localhost",
                         "Host: capd.example.evil.example"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *hdr[] = {bad[i], NULL};
        cr_assert_eq(status_of(&c, "POST", "/v1/builds", bb, hdr, &body, NULL), 421, "%s: %s",
                     bad[i], body);
        json_t *j = json_loads(body, 0, NULL);
        cr_assert_str_eq(err_code(j), "misdirected_request", "the standard error body");
        json_decref(j);
        free(body);
        cr_assert_eq(status_of(&c, "GET", "/v1/builds", NULL, hdr, NULL, NULL), 421, "%s", bad[i]);
        cr_assert_eq(status_of(&c, "GET", "/healthz", NULL, hdr, NULL, NULL), 421, "%s", bad[i]);
    }
    cr_assert_eq(nbuilds(&c), 0, "a request by a foreign name stored a build");
    snprintf(ok[0], sizeof ok[0], "Host: localhost:%d", c.port);
    snprintf(ok[1], sizeof ok[1], "Host: [::1]:%d", c.port);
    snprintf(ok[2], sizeof ok[2], "Host: CAPD.example:%d", c.port + 1);
    for (int i = 0; i < 3; i++) {
        const char *hdr[] = {ok[i], NULL};
        cr_assert_eq(status_of(&c, "GET", "/v1/builds", NULL, hdr, NULL, NULL), 200, "%s", ok[i]);
    }
    const char *ci[] = {"Host: ci.example:9", NULL};
    cr_assert_eq(status_of(&c, "GET", "/v1/builds", NULL, ci, NULL, NULL), 200);
    free(bb);
    stop_and_remove(&c, dir);
}

Test(origin, foreign_origin_writes_are_403_and_no_cors_headers)
{
    struct tu_capd c;
    char *dir = start_fresh(&c, NULL);
    char *bb = build_body(&c, "fake", NULL), *body = NULL, *hdrs = NULL;
    char same[128];
    snprintf(same, sizeof same, "Origin: http://127.0.0.1:%d", c.port);
    const char *foreign[] = {"Origin: http://evil.example", "Origin: null",
                             "Origin: http://127.0.0.1:1", "Origin: file://"};
    for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++) {
        const char *hdr[] = {foreign[i], NULL};
        cr_assert_eq(status_of(&c, "POST", "/v1/builds", bb, hdr, &body, &hdrs), 403, "%s: %s",
                     foreign[i], body);
        json_t *j = json_loads(body, 0, NULL);
        cr_assert_str_eq(err_code(j), "forbidden_origin");
        json_decref(j);
        cr_assert_null(strcasestr(hdrs, "Access-Control-"), "CORS headers: %s", hdrs);
        free(body);
        free(hdrs);
        cr_assert_eq(status_of(&c, "POST", "/v1/jobs", "{}", hdr, NULL, NULL), 403);
    }
    cr_assert_eq(nbuilds(&c), 0, "a foreign page stored a build");
    /* Reads carry no data to a foreign page (no CORS headers); the
     * dashboard's own origin may write. */
    const char *evil[] = {"Origin: http://evil.example", NULL};
    cr_assert_eq(status_of(&c, "GET", "/v1/builds", NULL, evil, NULL, &hdrs), 200);
    cr_assert_null(strcasestr(hdrs, "Access-Control-"), "CORS headers: %s", hdrs);
    free(hdrs);
    const char *own[] = {same, NULL};
    cr_assert_eq(status_of(&c, "POST", "/v1/builds", bb, own, NULL, NULL), 201);
    cr_assert_eq(nbuilds(&c), 1);
    free(bb);
    stop_and_remove(&c, dir);
}

/* ===================================================== builds */

static char *token_of(const char *dir, const char *scope)
{
    char out[400];
    snprintf(out, sizeof out, "%s/tok.%s", dir, scope);
    cr_assert_eq(tu_sh("'%s' token create --data-dir '%s/data' --scope %s >'%s' 2>/dev/null",
                       tu_bin("CAPD_BIN"), dir, scope, out),
                 0);
    char *t = tu_slurp(out);
    t[strcspn(t, "\n")] = 0;
    return t;
}

Test(builds, only_admin_changes_builds_and_submit_names_registered_ones)
{
    struct tu_capd c;
    char *dir = start_fresh(&c, "{\"public_reads\": true}");
    char *sub = token_of(dir, "submit"), *rd = token_of(dir, "read");
    char *bb = build_body(&c, "fake", NULL);
    char as_sub[200], as_rd[200];
    snprintf(as_sub, sizeof as_sub, "Authorization: Bearer %s", sub);
    snprintf(as_rd, sizeof as_rd, "Authorization: Bearer %s", rd);
    const char *who[][2] = {{as_sub, NULL}, {as_rd, NULL}, {"Authorization:", NULL}};
    long want[] = {403, 403, 401};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(status_of(&c, "POST", "/v1/builds", bb, who[i], NULL, NULL), want[i]);
        cr_assert_eq(status_of(&c, "PUT", "/v1/builds/fake", bb, who[i], NULL, NULL), want[i]);
    }
    cr_assert_eq(nbuilds(&c), 0);
    cr_assert_eq(status_of(&c, "POST", "/v1/builds", bb, NULL, NULL, NULL), 201, "admin may");
    cr_assert_eq(status_of(&c, "PUT", "/v1/builds/fake", bb, who[0], NULL, NULL), 403);

    /* A submit token names a registered build, never an executable. */
    const char *job = "{\"project\":\"t\",\"commit\":\"abcdef1\",\"build\":\"%s\",\"matrix\":"
                      "{\"models\":[\"fake:ok\"],\"widths\":[\"avx2\"],\"passes\":[\"forward\"]}}";
    char body[400], *reply = NULL;
    snprintf(body, sizeof body, job, "nosuch");
    cr_assert_eq(status_of(&c, "POST", "/v1/jobs", body, who[0], &reply, NULL), 400);
    json_t *j = json_loads(reply, 0, NULL);
    cr_assert_str_eq(err_code(j), "unknown_build", "%s", reply);
    json_decref(j);
    free(reply);
    snprintf(body, sizeof body, job, "fake");
    cr_assert_eq(status_of(&c, "POST", "/v1/jobs", body, who[0], NULL, NULL), 201);
    free(bb);
    free(sub);
    free(rd);
    stop_and_remove(&c, dir);
}

Test(builds, loader_and_interpreter_hooks_need_allow_env)
{
    struct tu_capd c;
    char *dir = start_fresh(&c, NULL);
    const char *hooks[] = {
        "LD_PRELOAD", "LD_AUDIT",   "PYTHONSTARTUP", "PYTHONINSPECT",  "BASH_ENV",
        "ENV",        "PYTHONHOME", "GCONV_PATH",    "PYTHONUSERBASE", "PYTHONBREAKPOINT"};
    for (size_t i = 0; i < sizeof hooks / sizeof hooks[0]; i++) {
        char env[200], name[32], *reply = NULL;
        snprintf(env, sizeof env, "\"env\":{\"PYTHONPATH\":\"/x\",\"%s\":\"/tmp/x\"}", hooks[i]);
        snprintf(name, sizeof name, "b%zu", i);
        char *bb = build_body(&c, name, env);
        cr_assert_eq(status_of(&c, "POST", "/v1/builds", bb, NULL, &reply, NULL), 400, "%s: %s",
                     hooks[i], reply);
        json_t *j = json_loads(reply, 0, NULL);
        cr_assert_str_eq(err_code(j), "forbidden_env");
        const char *msg =
            json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        cr_assert(msg && strstr(msg, hooks[i]), "the message names %s: %s", hooks[i], reply);
        json_decref(j);
        free(reply);
        free(bb);
        /* Named in allow_env, the admin's explicit choice is accepted. */
        snprintf(env, sizeof env, "\"env\":{\"%s\":\"/tmp/x\"},\"allow_env\":[\"%s\"]", hooks[i],
                 hooks[i]);
        bb = build_body(&c, name, env);
        cr_assert_eq(status_of(&c, "POST", "/v1/builds", bb, NULL, &reply, NULL), 201, "%s: %s",
                     hooks[i], reply);
        free(reply);
        free(bb);
    }
    cr_assert_eq(nbuilds(&c), sizeof hooks / sizeof hooks[0]);
    json_t *b = tu_json(&c, "GET", "/v1/builds/b0", NULL, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(b, "env"), "LD_PRELOAD")),
                     "/tmp/x");
    json_decref(b);
    char *bb =
        build_body(&c, "paths", "\"env\":{\"PYTHONPATH\":\"/x\",\"LD_LIBRARY_PATH\":\"/y\"}");
    cr_assert_eq(status_of(&c, "POST", "/v1/builds", bb, NULL, NULL, NULL), 201,
                 "PYTHONPATH and LD_LIBRARY_PATH stay allowed");
    free(bb);
    bb = build_body(&c, "bad", "\"allow_env\":[\"A=B\"]");
    cr_assert_eq(status_of(&c, "POST", "/v1/builds", bb, NULL, NULL, NULL), 400);
    free(bb);
    stop_and_remove(&c, dir);
}

/* ===================================================== root cells */

Test(runas, root_cells_need_allow_root_cells)
{
    if (geteuid() != 0)
        cr_skip_test("run_as_user only matters when capd runs as root");
    char *dir = fresh_dir("{\"run_as_user\": \"\"}");
    char *err = refused_start(dir, NULL);
    cr_assert(strstr(err, "run_as_user") && strstr(err, "allow_root_cells"), "%s", err);
    free(err);
    char p[400];
    snprintf(p, sizeof p, "%s/capd.json", dir);
    FILE *f = fopen(p, "w");
    fputs("{\"run_as_user\": \"\", \"allow_root_cells\": true}", f);
    fclose(f);
    struct tu_capd c;
    start(&c, dir, true);
    json_t *h = tu_json(&c, "GET", "/healthz", NULL, NULL);
    cr_assert(json_is_true(json_object_get(h, "cells_run_as_root")), "healthz shows it");
    json_decref(h);
    cr_assert_eq(tu_capd_stop(&c), 0);
    char *log = tu_slurp(c.errlog);
    cr_assert(strstr(log, "WARNING") && strstr(log, "cells_run_as_root"), "said loudly: %s", log);
    free(log);
    tu_sh("rm -rf '%s'", dir);
    free(dir);
}
