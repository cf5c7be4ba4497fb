/*
 * tests/test_auth.c - who may do what: SHA-256 and the token store, bearer
 * tokens and scopes over HTTP against a real capd with auth_required, the
 * `capd token` subcommands, secrets kept out of logs and error bodies, and
 * the user cells run as (run_as_user, PR_SET_NO_NEW_PRIVS).
 *
 * Tokens are made the way an operator makes the first one: `capd token
 * create --data-dir DIR` on the database, before or while capd runs.
 */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <dirent.h>
#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/store.h"
#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/testutil.h"
#include "util/clock.h"

/* ---- helpers ---- */

static void env_init(struct af_env *e)
{
    af_env_init(e);
}

/* Starts capd on E's dir with CONFIG_JSON (may be NULL) and EXTRA flags. */
static void env_start(struct af_env *e, const char *config_json, const char *extra_flag)
{
    const char *extra[5] = {NULL};
    int a = 0;
    char cfg[400];
    if (config_json) {
        snprintf(cfg, sizeof cfg, "%s/capd.json", e->dir);
        af_put_file(cfg, config_json);
        extra[a++] = "--config";
        extra[a++] = cfg;
    }
    if (extra_flag) {
        extra[a++] = "--log-level";
        extra[a++] = extra_flag;
    }
    af_start_capd(&e->c, e->dir, extra);
}

/* Every token make_token hands out in the running test, freed by
 * env_stop: a test reads its tokens until its capd stops. */
#define MAX_TEST_TOKENS 8
static char *tokens[MAX_TEST_TOKENS];
static int ntokens;

static void env_stop(struct af_env *e)
{
    if (e->c.pid > 0)
        cr_assert_eq(tu_capd_stop(&e->c), 0, "capd exits 0 on SIGTERM");
    tu_sh("rm -rf '%s'", e->dir);
    e->dir[0] = '\0';
    while (ntokens > 0)
        free(tokens[--ntokens]);
}

/* The test's env: env_init fills it and each test ends with env_stop
 * (which checks that capd exits 0); the suites' fini stops and removes
 * what a failed test left. */
static struct af_env ae;

static void env_fini(void)
{
    if (ae.c.pid > 0)
        tu_capd_stop(&ae.c);
    if (ae.dir[0])
        env_stop(&ae);
}

TestSuite(tokens, .fini = env_fini);
TestSuite(auth, .fini = env_fini);
TestSuite(runas, .fini = env_fini);

/* `capd token create`; returns the token, valid until env_stop. */
static char *make_token(const struct af_env *e, const char *scope, const char *expires)
{
    cr_assert_lt(ntokens, MAX_TEST_TOKENS, "a test makes at most %d tokens", MAX_TEST_TOKENS);
    char out[400];
    snprintf(out, sizeof out, "%s/token.%s.out", e->dir, scope);
    int rc = tu_sh("'%s' token create --data-dir '%s' --scope %s --name t-%s%s%s >'%s' 2>/dev/null",
                   tu_bin("CAPD_BIN"), e->data, scope, scope, expires ? " --expires " : "",
                   expires ? expires : "", out);
    cr_assert_eq(rc, 0, "capd token create --scope %s", scope);
    char *t = tu_slurp(out);
    unlink(out);
    char *nl = strchr(t, '\n');
    cr_assert_not_null(nl, "one line: %s", t);
    *nl = 0;
    cr_assert_eq(strlen(t), STORE_TOKEN_LEN, "token shape: %s", t);
    tokens[ntokens++] = t;
    return t;
}

/* Initialises E, makes one token per SCOPE of the NULL-terminated pairs
 * (scope, char **token: valid until env_stop) that follow, then starts capd
 * with CONFIG_JSON and LOG_LEVEL (may be NULL) as env_start does. */
static void start_with_tokens(struct af_env *e, const char *config_json, const char *log_level, ...)
{
    env_init(e);
    va_list ap;
    va_start(ap, log_level);
    const char *scope;
    while ((scope = va_arg(ap, const char *)) != NULL)
        *va_arg(ap, char **) = make_token(e, scope, NULL);
    va_end(ap);
    env_start(e, config_json, log_level);
}

/* One request with an optional token and JSON body. */
static long req(const struct af_env *e, const char *method, const char *path, const char *token,
                const char *body, struct tu_resp *out)
{
    char auth[256];
    const char *hdr[4];
    int h = 0;
    /* No token means none at all: an empty header keeps tu_http from
     * sending the first admin token capd may have written. */
    if (token)
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    hdr[h++] = token ? auth : "Authorization:";
    if (body)
        hdr[h++] = "Content-Type: application/json";
    hdr[h] = NULL;
    tu_http(&e->c, method, path, body, body ? strlen(body) : 0, hdr, out);
    return out->status;
}

/* Status only; checks the error code when the reply is an error. */
static long call(const struct af_env *e, const char *method, const char *path, const char *token,
                 const char *body, const char *want_code)
{
    struct tu_resp r;
    long st = req(e, method, path, token, body, &r);
    if (want_code) {
        json_t *j = json_loadb(r.body, r.len, 0, NULL);
        const char *code = json_string_value(json_object_get(json_object_get(j, "error"), "code"));
        cr_assert(code && strcmp(code, want_code) == 0, "%s %s: want error %s, got %ld %s", method,
                  path, want_code, st, r.body);
        json_decref(j);
    }
    tu_resp_free(&r);
    return st;
}

static char *build_body(const struct af_env *e, const char *name)
{
    char *fake = tu_helper("fake_runner"), *b;
    cr_assert(asprintf(&b, "{\"name\":\"%s\",\"python\":\"%s\",\"model_roots\":[\"%s\"]}", name,
                       fake, e->c.dir) > 0);
    free(fake);
    return b;
}

static const char job_hang[] =
    "{\"project\":\"t\",\"commit\":\"abcdef1\",\"build\":\"fake\","
    "\"matrix\":{\"models\":[\"fake:hang\"],\"widths\":[\"avx2\"],\"passes\":[\"forward\"]}}";

/* Posts a job as TOKEN; returns its id (malloc'd) or fails the test. */
static char *post_job(const struct af_env *e, const char *token, const char *body)
{
    struct tu_resp r;
    long st = req(e, "POST", "/v1/jobs", token, body, &r);
    cr_assert_eq(st, 201, "POST /v1/jobs: %ld %s", st, r.body);
    json_t *j = json_loadb(r.body, r.len, 0, NULL);
    char *id = strdup(json_string_value(json_object_get(j, "id")));
    json_decref(j);
    tu_resp_free(&r);
    return id;
}

static json_int_t count_of(const struct af_env *e, const char *path, const char *key,
                           const char *token)
{
    struct tu_resp r;
    req(e, "GET", path, token, NULL, &r);
    json_t *j = json_loadb(r.body, r.len, 0, NULL);
    json_int_t n = (json_int_t)json_array_size(json_object_get(j, key));
    json_decref(j);
    tu_resp_free(&r);
    return n;
}

/* ===================================================== SHA-256 */

static void hex(const unsigned char *d, char out[65])
{
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

Test(sha256, fips_180_examples_and_padding_boundaries)
{
    unsigned char d[32];
    char h[65];
    store_sha256("", 0, d);
    hex(d, h);
    cr_assert_str_eq(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    store_sha256("abc", 3, d);
    hex(d, h);
    cr_assert_str_eq(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    store_sha256(m, strlen(m), d);
    hex(d, h);
    cr_assert_str_eq(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    store_sha256(a, 1000000, d);
    free(a);
    hex(d, h);
    cr_assert_str_eq(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    /* Lengths around the one-or-two padding blocks boundary; expected
     * values from Python's hashlib over bytes (i*7+3) & 0xff. */
    static const struct {
        size_t n;
        const char *want;
    } v[] = {
        {55, "e7313d333c272e639f790978283f9eb392e843d0f29b7016828bb1daa4aac70b"},
        {56, "4324d65f3c103567f5589c710bc08f8523f929a9272e3af36fc968e52abc6c27"},
        {63, "81c80242132f230c3bd41b3e63bbcff16107339549214a99614ff26664625055"},
        {64, "39e3d7b6b5d075d37d053ad89b24b41bef4f3c29760c84447cab3f3be1882241"},
        {119, "9ce7368e4daf32341631b492e80359dc9f594b48453cd0dd5bf0b19279cc177e"},
        {120, "7836b787757e95e58b3ca5aec90b1b004e8deba1e50e9675af9cabf1a13a04b5"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        unsigned char buf[128];
        for (size_t j = 0; j < v[i].n; j++)
            buf[j] = (unsigned char)((j * 7 + 3) & 0xff);
        store_sha256(buf, v[i].n, d);
        hex(d, h);
        cr_assert_str_eq(h, v[i].want, "length %zu", v[i].n);
    }
}

/* ===================================================== the token store */

Test(tokens, create_check_revoke_expire_in_the_store)
{
    env_init(&ae);
    mkdir(ae.data, 0700);
    struct store *s = NULL;
    char *err = NULL;
    cr_assert_eq(store_open(ae.data, true, &s, &err), 0, "%s", err ? err : "");
    char tok[STORE_TOKEN_LEN + 1], id[16];
    int scope = -1;
    json_t *info = NULL;
    cr_assert_eq(store_token_create(s, STORE_SCOPE_SUBMIT, "ci", 0, tok, &info), 0);
    cr_assert_eq(strncmp(tok, "capd_t", 6), 0);
    cr_assert_str_eq(json_string_value(json_object_get(info, "scope")), "submit");
    cr_assert_null(json_object_get(info, "hash"), "the hash is not part of a description");
    cr_assert_eq(store_token_check(s, tok, id, &scope), 0);
    cr_assert_eq(scope, STORE_SCOPE_SUBMIT);
    cr_assert_str_eq(id, json_string_value(json_object_get(info, "id")));

    /* Every single-character change of the secret is refused, as are
     * other shapes. */
    char bad[STORE_TOKEN_LEN + 2];
    for (size_t i = 19; i < STORE_TOKEN_LEN; i += 7) {
        snprintf(bad, sizeof bad, "%s", tok);
        bad[i] = bad[i] == '0' ? '1' : '0';
        cr_assert_eq(store_token_check(s, bad, id, &scope), -ENOENT, "flipped byte %zu", i);
    }
    snprintf(bad, sizeof bad, "%sa", tok);
    cr_assert_eq(store_token_check(s, bad, id, &scope), -ENOENT, "longer");
    cr_assert_eq(store_token_check(s, "", id, &scope), -ENOENT);
    cr_assert_eq(store_token_check(s, "capd_", id, &scope), -ENOENT);
    snprintf(bad, sizeof bad, "%s", tok);
    bad[6] = 'X';
    cr_assert_eq(store_token_check(s, bad, id, &scope), -ENOENT, "non-hex id");

    /* Two tokens never share a secret. */
    char tok2[STORE_TOKEN_LEN + 1];
    cr_assert_eq(store_token_create(s, STORE_SCOPE_READ, "", 0, tok2, NULL), 0);
    cr_assert_neq(strcmp(tok + 19, tok2 + 19), 0);

    const char *tid = json_string_value(json_object_get(info, "id"));
    cr_assert_eq(store_token_revoke(s, tid), 0);
    cr_assert_eq(store_token_check(s, tok, id, &scope), -EKEYREVOKED);
    cr_assert_eq(store_token_revoke(s, tid), -EALREADY);
    cr_assert_eq(store_token_revoke(s, "t000000000000"), -ENOENT);

    char tok3[STORE_TOKEN_LEN + 1];
    cr_assert_eq(store_token_create(s, STORE_SCOPE_ADMIN, "old", util_wall_ms() - 1000, tok3, NULL),
                 0);
    cr_assert_eq(store_token_check(s, tok3, id, &scope), -EKEYEXPIRED);
    cr_assert_eq(store_token_create(s, 7, "x", 0, tok3, NULL), -EINVAL);
    json_t *list = NULL;
    cr_assert_eq(store_token_list(s, &list), 0);
    cr_assert_eq(json_array_size(json_object_get(list, "tokens")), 3);
    json_decref(list);
    json_decref(info);
    store_close(s);

    /* Only hashes reach the disk: no file of the database holds a secret,
     * and the stored hash is SHA-256 of the whole token. */
    cr_assert_neq(tu_sh("cat '%s'/capd.db* | grep -q -a '%s'", ae.data, tok2 + 19), 0,
                  "a secret is stored in clear");
    unsigned char d[32];
    char h[65], out[400];
    store_sha256(tok2, strlen(tok2), d);
    hex(d, h);
    snprintf(out, sizeof out, "%s/hash.out", ae.dir);
    cr_assert_eq(tu_sh("sqlite3 '%s/capd.db' \"SELECT hash FROM tokens WHERE scope='read'\" >'%s'",
                       ae.data, out),
                 0);
    char *got = tu_slurp(out);
    cr_assert(strncmp(got, h, 64) == 0, "stored %s, want %s", got, h);
    free(got);
    env_stop(&ae);
}

/* ===================================================== the CLI */

Test(tokens, capd_token_cli)
{
    env_init(&ae);
    const char *capd = tu_bin("CAPD_BIN");
    cr_assert_eq(
        tu_sh("'%s' token create --data-dir '%s' --scope root >/dev/null 2>&1", capd, ae.data), 2,
        "unknown scope is a usage error");
    cr_assert_eq(tu_sh("'%s' token create --data-dir '%s' --scope read --expires 5x "
                       ">/dev/null 2>&1",
                       capd, ae.data),
                 2, "bad duration");
    cr_assert_eq(tu_sh("'%s' token frobnicate --data-dir '%s' >/dev/null 2>&1", capd, ae.data), 2);
    char *t = make_token(&ae, "admin", "30d");
    char out[400];
    snprintf(out, sizeof out, "%s/list.out", ae.dir);
    cr_assert_eq(tu_sh("'%s' token list --data-dir '%s' >'%s'", capd, ae.data, out), 0);
    char *list = tu_slurp(out);
    char id[14];
    memcpy(id, t + 5, 13);
    id[13] = 0;
    cr_assert(strstr(list, id), "list shows the id: %s", list);
    cr_assert(strstr(list, "admin") && strstr(list, "active"), "%s", list);
    cr_assert_null(strstr(list, t + 19), "list must never show a secret");
    free(list);
    cr_assert_eq(
        tu_sh("'%s' token revoke --data-dir '%s' t000000000000 2>/dev/null", capd, ae.data), 1,
        "unknown id");
    cr_assert_eq(tu_sh("'%s' token revoke --data-dir '%s' %s 2>/dev/null", capd, ae.data, id), 0);
    cr_assert_eq(tu_sh("'%s' token list --data-dir '%s' --json >'%s'", capd, ae.data, out), 0);
    json_t *j = json_load_file(out, 0, NULL);
    json_t *t0 = json_array_get(json_object_get(j, "tokens"), 0);
    cr_assert(json_is_string(json_object_get(t0, "revoked_at")), "revoked_at is set");
    json_decref(j);

    /* The revoked token no longer opens anything on a running capd. */
    env_start(&ae, "{\"auth_required\": true}", NULL);
    cr_assert_eq(call(&ae, "GET", "/v1/builds", t, NULL, "unauthorized"), 401);
    char *t2 = make_token(&ae, "read", NULL); /* while capd runs */
    cr_assert_eq(call(&ae, "GET", "/v1/builds", t2, NULL, NULL), 200);
    env_stop(&ae);
}

/* ===================================================== scopes over HTTP */

Test(auth, scopes_gate_every_route)
{
    char *rd, *sb, *ad;
    start_with_tokens(&ae, "{\"auth_required\": true}", NULL, "read", &rd, "submit", &sb, "admin",
                      &ad, NULL);

    /* /healthz is always open, even with a bad token. */
    cr_assert_eq(call(&ae, "GET", "/healthz", NULL, NULL, NULL), 200);
    cr_assert_eq(call(&ae, "GET", "/healthz", "nonsense", NULL, NULL), 200);

    /* No token: 401 with the challenge. */
    struct tu_resp r;
    cr_assert_eq(req(&ae, "GET", "/v1/builds", NULL, NULL, &r), 401);
    cr_assert(strcasestr(r.headers, "WWW-Authenticate: Bearer realm=\"capd\""), "%s", r.headers);
    json_t *j = json_loadb(r.body, r.len, 0, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                     "unauthorized");
    json_decref(j);
    tu_resp_free(&r);
    /* A refused token names the error (RFC 6750), a wrong scheme too. */
    char wrong[STORE_TOKEN_LEN + 1];
    snprintf(wrong, sizeof wrong, "%s", ad);
    wrong[STORE_TOKEN_LEN - 1] = wrong[STORE_TOKEN_LEN - 1] == 'a' ? 'b' : 'a';
    cr_assert_eq(req(&ae, "GET", "/v1/builds", wrong, NULL, &r), 401);
    cr_assert(strcasestr(r.headers, "error=\"invalid_token\""), "%s", r.headers);
    tu_resp_free(&r);
    const char *basic[] = {"Authorization: Basic YWRtaW46YWRtaW4=", NULL};
    tu_http(&ae.c, "GET", "/v1/builds", NULL, 0, basic, &r);
    cr_assert_eq(r.status, 401);
    cr_assert(strcasestr(r.headers, "error=\"invalid_request\""), "%s", r.headers);
    tu_resp_free(&r);

    /* Reads need read. */
    cr_assert_eq(call(&ae, "GET", "/v1/builds", rd, NULL, NULL), 200);
    cr_assert_eq(call(&ae, "GET", "/v1/jobs", sb, NULL, NULL), 200);
    cr_assert_eq(call(&ae, "GET", "/v1/models", ad, NULL, NULL), 200);

    /* Builds are admin's; refused writes store nothing. */
    char *bb = build_body(&ae, "fake");
    cr_assert_eq(call(&ae, "POST", "/v1/builds", NULL, bb, "unauthorized"), 401);
    cr_assert_eq(call(&ae, "POST", "/v1/builds", rd, bb, "forbidden"), 403);
    cr_assert_eq(call(&ae, "POST", "/v1/builds", sb, bb, "forbidden"), 403);
    cr_assert_eq(call(&ae, "PUT", "/v1/builds/fake", sb, bb, "forbidden"), 403);
    cr_assert_eq(count_of(&ae, "/v1/builds", "builds", rd), 0, "refused writes stored a build");
    cr_assert_eq(call(&ae, "POST", "/v1/builds", ad, bb, NULL), 201);

    /* Branches are admin's. */
    const char *br = "{\"control_commit\":\"abcdef1\"}";
    cr_assert_eq(call(&ae, "PUT", "/v1/branches/main", sb, br, "forbidden"), 403);
    cr_assert_eq(call(&ae, "GET", "/v1/branches/main", rd, NULL, "not_found"), 404);
    cr_assert_eq(call(&ae, "PUT", "/v1/branches/main", ad, br, NULL), 200);

    /* Jobs need submit. */
    cr_assert_eq(call(&ae, "POST", "/v1/jobs", NULL, job_hang, "unauthorized"), 401);
    cr_assert_eq(call(&ae, "POST", "/v1/jobs", wrong, job_hang, "unauthorized"), 401);
    cr_assert_eq(call(&ae, "POST", "/v1/jobs", rd, job_hang, "forbidden"), 403);
    cr_assert_eq(count_of(&ae, "/v1/jobs", "jobs", rd), 0, "refused posts stored a job");
    char *job = post_job(&ae, sb, job_hang);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", job);
    cr_assert_eq(call(&ae, "POST", path, rd, NULL, "forbidden"), 403);
    cr_assert_eq(call(&ae, "POST", path, sb, NULL, NULL), 202);

    /* Tokens are admin's, reads included. */
    cr_assert_eq(call(&ae, "GET", "/v1/tokens", sb, NULL, "forbidden"), 403);
    cr_assert_eq(call(&ae, "GET", "/v1/tokens", rd, NULL, "forbidden"), 403);
    cr_assert_eq(req(&ae, "GET", "/v1/tokens", ad, NULL, &r), 200);
    cr_assert_null(strstr(r.body, "hash"), "token list leaks hashes: %s", r.body);
    cr_assert_null(strstr(r.body, ad + 19), "token list leaks a secret");
    tu_resp_free(&r);
    free(bb);
    free(job);
    env_stop(&ae);
}

Test(auth, tokens_api_create_use_revoke)
{
    char *ad;
    start_with_tokens(&ae, "{\"auth_required\": true}", NULL, "admin", &ad, NULL);
    struct tu_resp r;
    cr_assert_eq(call(&ae, "POST", "/v1/tokens", ad, "{\"scope\":\"root\"}", "invalid_field"), 400);
    cr_assert_eq(call(&ae, "POST", "/v1/tokens", ad, "{\"scope\":\"read\",\"expires_in_s\":0}",
                      "invalid_field"),
                 400);
    cr_assert_eq(
        call(&ae, "POST", "/v1/tokens", ad, "{\"scope\":\"read\",\"x\":1}", "unknown_field"), 400);
    cr_assert_eq(req(&ae, "POST", "/v1/tokens", ad, "{\"scope\":\"read\",\"name\":\"dash\"}", &r),
                 201);
    cr_assert(strstr(r.headers, "no-store"), "the secret must not be cached: %s", r.headers);
    json_t *j = json_loadb(r.body, r.len, 0, NULL);
    tu_resp_free(&r);
    const char *tok = json_string_value(json_object_get(j, "token"));
    const char *id = json_string_value(json_object_get(j, "id"));
    cr_assert(tok && id);
    cr_assert_eq(call(&ae, "GET", "/v1/jobs", tok, NULL, NULL), 200);
    cr_assert_eq(call(&ae, "POST", "/v1/tokens", tok, "{\"scope\":\"admin\"}", "forbidden"), 403,
                 "a read token cannot mint an admin one");
    char path[64];
    snprintf(path, sizeof path, "/v1/tokens/%s", id);
    cr_assert_eq(call(&ae, "DELETE", path, tok, NULL, "forbidden"), 403);
    cr_assert_eq(call(&ae, "DELETE", path, ad, NULL, NULL), 200);
    cr_assert_eq(req(&ae, "GET", "/v1/jobs", tok, NULL, &r), 401);
    cr_assert(strstr(r.body, "revoked"), "%s", r.body);
    tu_resp_free(&r);
    cr_assert_eq(call(&ae, "DELETE", "/v1/tokens/t000000000000", ad, NULL, "not_found"), 404);
    json_decref(j);
    env_stop(&ae);
}

Test(auth, expired_token_is_refused)
{
    env_init(&ae);
    char *t = make_token(&ae, "admin", "1s");
    env_start(&ae, "{\"auth_required\": true}", NULL);
    usleep(1300 * 1000);
    struct tu_resp r;
    cr_assert_eq(req(&ae, "GET", "/v1/builds", t, NULL, &r), 401);
    cr_assert(strstr(r.body, "expired"), "%s", r.body);
    tu_resp_free(&r);
    env_stop(&ae);
}

/* A submit token cancels its own jobs only; admin cancels any. */
Test(auth, submit_token_cancels_only_its_own_jobs)
{
    char *a, *b, *ad;
    start_with_tokens(&ae, "{\"auth_required\": true}", NULL, "submit", &a, "submit", &b, "admin",
                      &ad, NULL);
    char *bb = build_body(&ae, "fake");
    cr_assert_eq(call(&ae, "POST", "/v1/builds", ad, bb, NULL), 201);
    char *ja = post_job(&ae, a, job_hang), *jb = post_job(&ae, b, job_hang);
    char pa[128], pb[128];
    snprintf(pa, sizeof pa, "/v1/jobs/%s/cancel", ja);
    snprintf(pb, sizeof pb, "/v1/jobs/%s/cancel", jb);
    cr_assert_eq(call(&ae, "POST", pa, b, NULL, "forbidden"), 403);
    cr_assert_eq(call(&ae, "POST", pb, a, NULL, "forbidden"), 403);
    char p[128];
    snprintf(p, sizeof p, "/v1/jobs/%s", ja);
    struct tu_resp r;
    req(&ae, "GET", p, a, NULL, &r);
    cr_assert_null(strstr(r.body, "\"cancelled\""), "a refused cancel changed the job: %s", r.body);
    tu_resp_free(&r);
    cr_assert_eq(call(&ae, "POST", pa, a, NULL, NULL), 202);
    cr_assert_eq(call(&ae, "POST", pb, ad, NULL, NULL), 202);
    cr_assert_eq(call(&ae, "POST", "/v1/jobs/j000000000000/cancel", a, NULL, "not_found"), 404);
    free(bb);
    free(ja);
    free(jb);
    env_stop(&ae);
}

Test(auth, public_reads_and_disabled_auth)
{
    char *ad;
    start_with_tokens(&ae, "{\"auth_required\": true, \"public_reads\": true}", NULL, "admin", &ad,
                      NULL);
    cr_assert_eq(call(&ae, "GET", "/v1/builds", NULL, NULL, NULL), 200);
    cr_assert_eq(call(&ae, "GET", "/v1/jobs", NULL, NULL, NULL), 200);
    cr_assert_eq(call(&ae, "GET", "/v1/tokens", NULL, NULL, "unauthorized"), 401,
                 "token lists are never public");
    char *bb = build_body(&ae, "fake");
    cr_assert_eq(call(&ae, "POST", "/v1/builds", NULL, bb, "unauthorized"), 401);
    cr_assert_eq(tu_capd_stop(&ae.c), 0);

    /* auth_required false, chosen explicitly: no token needed, and a bad
     * Authorization header is ignored rather than refused. */
    env_start(&ae, "{\"auth_required\": false}", NULL);
    cr_assert_eq(call(&ae, "POST", "/v1/builds", NULL, bb, NULL), 201);
    cr_assert_eq(call(&ae, "GET", "/v1/builds", "garbage", NULL, NULL), 200);
    free(bb);
    env_stop(&ae);
}

/* A write without a token is refused before its body is read: a 512 KiB
 * anonymous upload gets its 401 and nothing is stored. */
Test(auth, anonymous_upload_refused_before_the_body)
{
    char *ad;
    start_with_tokens(&ae, "{\"auth_required\": true}", NULL, "admin", &ad, NULL);
    size_t n = 512 * 1024;
    char *body = malloc(n + 1);
    memset(body, ' ', n);
    body[0] = '{';
    body[n - 1] = '}';
    body[n] = 0;
    const char *hdr[] = {"Content-Type: application/json", NULL};
    struct tu_resp r;
    tu_http(&ae.c, "POST", "/v1/builds", body, n, hdr, &r);
    cr_assert_eq(r.status, 401, "got %ld", r.status);
    tu_resp_free(&r);
    cr_assert_eq(count_of(&ae, "/v1/builds", "builds", ad), 0);
    cr_assert_eq(call(&ae, "GET", "/healthz", NULL, NULL, NULL), 200, "still serving");
    free(body);
    env_stop(&ae);
}

/* ===================================================== secrets */

/* Neither the tokens nor the Authorization header reach the log, even at
 * debug level, whether the request was let in or refused; error bodies
 * never echo a presented token. */
Test(auth, secrets_never_logged_or_echoed)
{
    char *ad, *sb;
    start_with_tokens(&ae, "{\"auth_required\": true}", "debug", "admin", &ad, "submit", &sb, NULL);
    char *bb = build_body(&ae, "fake");
    cr_assert_eq(call(&ae, "POST", "/v1/builds", ad, bb, NULL), 201);
    char *job = post_job(&ae, sb, job_hang);
    char wrong[STORE_TOKEN_LEN + 1];
    snprintf(wrong, sizeof wrong, "%s", sb);
    memcpy(wrong + 19, "deadbeefdeadbeef", 16);
    const char *junk = "capd_not-a-token-SECRETJUNK0123456789";
    const char *presented[] = {wrong, junk, sb};
    for (int i = 0; i < 3; i++) {
        struct tu_resp r;
        req(&ae, "POST", "/v1/builds", presented[i], bb, &r);
        cr_assert(r.status == 401 || r.status == 403, "status %ld", r.status);
        cr_assert_null(strstr(r.body, presented[i] + 19), "error body echoes a token: %s", r.body);
        tu_resp_free(&r);
        req(&ae, "GET", "/v1/jobs/jnothere/cells/cnothere", presented[i], NULL, &r);
        cr_assert_null(strstr(r.body, presented[i] + 19), "error body echoes a token: %s", r.body);
        tu_resp_free(&r);
    }
    /* A POST /v1/tokens reply carries a secret; it must not be logged. */
    struct tu_resp r;
    cr_assert_eq(req(&ae, "POST", "/v1/tokens", ad, "{\"scope\":\"read\"}", &r), 201);
    json_t *j = json_loadb(r.body, r.len, 0, NULL);
    char *minted = strdup(json_string_value(json_object_get(j, "token")));
    json_decref(j);
    tu_resp_free(&r);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", job);
    cr_assert_eq(call(&ae, "POST", path, sb, NULL, NULL), 202);
    cr_assert_eq(tu_capd_stop(&ae.c), 0);

    char *log = tu_slurp(ae.c.errlog);
    cr_assert(strstr(log, "auth_refused"), "refusals are logged: %s", log);
    cr_assert(strstr(log, "http_reply"), "debug logging was on");
    const char *secrets[] = {ad + 19, sb + 19, wrong + 19, "SECRETJUNK", minted + 19};
    for (int i = 0; i < 5; i++)
        cr_assert_null(strstr(log, secrets[i]), "secret %d in the log", i);
    cr_assert_null(strstr(log, "Bearer "), "an Authorization header value in the log");
    cr_assert_null(strcasestr(log, "bearer capd"), "an Authorization header value in the log");
    cr_assert_null(strcasestr(log, "Authorization:"), "an Authorization header in the log");
    free(log);
    free(minted);
    free(bb);
    free(job);
    env_stop(&ae);
}

/* ===================================================== what a job runs as */

/* The pid of the runner: a fresh-exec cell is capd's own child; one that
 * has exec'd the fake runner, not the GPU probe or any other child. */
static pid_t find_runner(pid_t capd)
{
    DIR *d = opendir("/proc");
    struct dirent *de;
    pid_t found = 0;
    while (d && !found && (de = readdir(d)) != NULL) {
        char p[300], buf[512];
        snprintf(p, sizeof p, "/proc/%s/stat", de->d_name);
        FILE *f = fopen(p, "r");
        if (!f)
            continue;
        int pp = 0;
        if (fgets(buf, sizeof buf, f)) {
            char *rp = strrchr(buf, ')');
            char st;
            if (rp)
                sscanf(rp + 2, "%c %d", &st, &pp);
        }
        fclose(f);
        if (pp != capd)
            continue;
        snprintf(p, sizeof p, "/proc/%s/comm", de->d_name);
        f = fopen(p, "r");
        if (f && fgets(buf, sizeof buf, f) && strncmp(buf, "fake_runner", 11) == 0)
            found = (pid_t)atoi(de->d_name);
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
    return found;
}

static long status_field(pid_t pid, const char *name, char *rest, size_t n)
{
    char p[64], line[512];
    snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
    FILE *f = fopen(p, "r");
    long v = -1;
    rest[0] = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, name, strlen(name)) == 0 && line[strlen(name)] == ':') {
            v = strtol(line + strlen(name) + 1, NULL, 10);
            snprintf(rest, n, "%s", line + strlen(name) + 1);
        }
    if (f)
        fclose(f);
    return v;
}

Test(runas, cells_run_unprivileged_with_no_new_privs, .timeout = 60)
{
    env_init(&ae);
    /* No address-space limit: an ASan-built fake runner needs its shadow. */
    env_start(&ae, "{\"rlimit_as_bytes\": 0}", NULL);
    cr_assert_eq(tu_fake_build(&ae.c, "fake", NULL), 201);
    struct passwd *pw = getpwnam("nobody");
    bool root = geteuid() == 0;
    cr_assert(!root || pw, "this test needs a 'nobody' user when run as root");
    long want_uid = root ? (long)pw->pw_uid : (long)geteuid();
    long want_gid = root ? (long)pw->pw_gid : (long)getegid();

    char *job = tu_submit(&ae.c, "fake", "fake:hang", NULL);
    cr_assert_not_null(job);
    pid_t runner = 0;
    for (int i = 0; i < 200 && !runner; i++) {
        usleep(50 * 1000);
        runner = find_runner(ae.c.pid);
    }
    cr_assert_gt(runner, 0, "the runner process appears");
    /* Wait until the child has exec'd the runner (final credentials). */
    for (int i = 0; i < 100; i++) {
        char p[64];
        snprintf(p, sizeof p, "/proc/%d/comm", (int)runner);
        char *comm = tu_slurp(p);
        bool execd = strncmp(comm, "fake_runner", 11) == 0;
        free(comm);
        if (execd)
            break;
        usleep(50 * 1000);
    }
    char rest[256];
    cr_assert_eq(status_field(runner, "Uid", rest, sizeof rest), want_uid, "Uid:%s", rest);
    char want[64];
    snprintf(want, sizeof want, "\t%ld\t%ld\t%ld\t%ld", want_uid, want_uid, want_uid, want_uid);
    cr_assert(strncmp(rest, want, strlen(want)) == 0, "real, effective, saved, fs uid: %s", rest);
    cr_assert_eq(status_field(runner, "Gid", rest, sizeof rest), want_gid, "Gid:%s", rest);
    cr_assert_eq(status_field(runner, "NoNewPrivs", rest, sizeof rest), 1, "NoNewPrivs");
    if (root) {
        status_field(runner, "Groups", rest, sizeof rest);
        cr_assert(strspn(rest, " \t\n") == strlen(rest), "no supplementary groups: '%s'", rest);
        /* The scratch dir belongs to the user, the database does not. */
        char scratch[600];
        snprintf(scratch, sizeof scratch, "%s/scratch", ae.data);
        DIR *d = opendir(scratch);
        struct dirent *de;
        int checked = 0;
        while (d && (de = readdir(d)) != NULL) {
            if (de->d_name[0] == '.')
                continue;
            char p[900];
            struct stat sb;
            snprintf(p, sizeof p, "%s/%s", scratch, de->d_name);
            cr_assert_eq(stat(p, &sb), 0);
            cr_assert_eq((long)sb.st_uid, want_uid, "scratch dir owner");
            cr_assert_eq(sb.st_mode & 077, 0, "scratch dir is private");
            checked++;
        }
        if (d)
            closedir(d);
        cr_assert_eq(checked, 1);
        char db[400];
        struct stat sb;
        snprintf(db, sizeof db, "%s/capd.db", ae.data);
        cr_assert_eq(stat(db, &sb), 0);
        cr_assert_eq(sb.st_mode & 07, 0, "capd.db must not be readable by other users");
    }
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", job);
    long st;
    json_decref(tu_json(&ae.c, "POST", path, NULL, &st));
    cr_assert_eq(st, 202);
    json_decref(tu_wait_job(&ae.c, job, 30));
    free(job);

    /* A whole cell still works as that user: spec read, frames written,
     * HOME pointing at its scratch dir. */
    job = tu_submit(&ae.c, "fake", "fake:echo_env", NULL);
    json_t *j = tu_wait_job(&ae.c, job, 60);
    cr_assert_not_null(j);
    json_t *c0 = json_array_get(json_object_get(j, "cells"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(c0, "state")), "ok", "%s",
                     json_string_value(json_object_get(c0, "reason")));
    if (root) {
        snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s/records?kind=note", job,
                 json_string_value(json_object_get(c0, "id")));
        json_t *notes = tu_json(&ae.c, "GET", path, NULL, NULL);
        const char *msg = json_string_value(
            json_object_get(json_array_get(json_object_get(notes, "records"), 0), "message"));
        json_t *rep = msg ? json_loads(msg, 0, NULL) : NULL;
        const char *home =
            json_string_value(json_object_get(json_object_get(rep, "environ"), "HOME"));
        cr_assert(home && strstr(home, "/scratch/"), "HOME is the scratch dir: %s",
                  home ? home : "(unset)");
        json_decref(rep);
        json_decref(notes);
    }
    json_decref(j);
    free(job);
    env_stop(&ae);
}

Test(runas, unknown_user_refused_at_start)
{
    env_init(&ae);
    char cfg[400], out[400];
    snprintf(cfg, sizeof cfg, "%s/capd.json", ae.dir);
    snprintf(out, sizeof out, "%s/err", ae.dir);
    FILE *f = fopen(cfg, "w");
    fputs("{\"run_as_user\": \"no-such-user-capd\"}", f);
    fclose(f);
    int rc = tu_sh("timeout 10 '%s' --listen 127.0.0.1:0 --data-dir '%s' --config '%s' "
                   ">/dev/null 2>'%s' & sleep 1; kill $! 2>/dev/null; wait $!",
                   tu_bin("CAPD_BIN"), ae.data, cfg, out);
    char *err = tu_slurp(out);
    if (geteuid() == 0) {
        cr_assert(rc != 0 && rc < 128, "capd started with an unknown run_as_user (rc %d)", rc);
        cr_assert(strstr(err, "no-such-user-capd"), "the message names the user: %s", err);
    } else {
        cr_assert(strstr(err, "listening"), "ignored when not root: %s", err);
    }
    free(err);
    env_stop(&ae);
}
