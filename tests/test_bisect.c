/*
 * tests/test_bisect.c - build templates and bisection end to end: a real
 * capd, the fake runner, real HTTP.
 *
 * The branch has 30 commits. One template build runs DIR/<commit>/python
 * (a link to the fake runner) with FAKE_ENV_FILE=DIR/<commit>/env: from
 * commit K on, that file perturbs one tensor. Commit S has no directory,
 * so its build does not start. Only the two ends are captured before the
 * bisection, which must name K, skip S and say why, in at most
 * ceil(log2(30)) + 1 rounds.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/testutil.h"

TestSuite(bisect, AF_CAPD_SUITE);

#define N_COMMITS 30
#define K         12 /* the first commit whose numerics differ */
#define S         8  /* the commit whose build directory is missing */
#define PKEY      "layer1.0.forward.output.0"
#define MATRIX                                                                                     \
    "\"matrix\":{\"models\":[\"fake:ok\"],\"widths\":[\"default\"],\"passes\":[\"forward\"]}"

static void sha(int i, char out[41])
{
    snprintf(out, 41, "b15ec7%02x%032x", i, 0xbeef + i);
}

/* DIR/<commit>/python and DIR/<commit>/env for every commit but SKIP;
 * the env of commit K and later holds LINE. */
static void make_builds_env(int n, int k, int skip, const char *line)
{
    char *fake = tu_helper("fake_runner");
    for (int i = 0; i < n; i++) {
        char c[41];
        sha(i, c);
        if (i == skip)
            continue;
        cr_assert_eq(tu_sh("mkdir -p '%s/b/%s' && ln -s '%s' '%s/b/%s/python' && "
                           "printf '%s' > '%s/b/%s/env'",
                           af_capd.dir, c, fake, af_capd.dir, c, i >= k ? line : "", af_capd.dir,
                           c),
                     0);
    }
    free(fake);
}

static void make_builds(int n, int k, int skip)
{
    make_builds_env(n, k, skip, "FAKE_PERTURB_KEY=" PKEY "\\n");
}

static long template_build(const char *name)
{
    long st = 0;
    json_t *j = tu_jsonf(&af_capd, "POST", "/v1/builds", &st,
                         "{\"name\":\"%s\",\"python\":\"%s/b/{commit}/python\","
                         "\"env\":{\"FAKE_ENV_FILE\":\"%s/b/{commit}/env\"},"
                         "\"model_roots\":[\"%s\"]}",
                         name, af_capd.dir, af_capd.dir, af_capd.dir);
    json_decref(j);
    return st;
}

/* Submits and waits for the job of commit I. */
static void capture(int i, const char *model)
{
    char c[41];
    sha(i, c);
    long st = 0;
    json_t *j = tu_jsonf(&af_capd, "POST", "/v1/jobs", &st,
                         "{\"project\":\"h\",\"commit\":\"%s\",\"branch\":\"main\","
                         "\"build\":\"tmpl\",\"matrix\":{\"models\":[\"%s\"],\"widths\":"
                         "[\"default\"],\"passes\":[\"forward\"]},\"options\":{\"iterations\":0}}",
                         c, model);
    cr_assert_eq(st, 201, "%s", json_dumps(j, 0));
    json_t *done = tu_wait_job(&af_capd, json_string_value(json_object_get(j, "id")), 60);
    cr_assert_not_null(done);
    json_decref(done);
    json_decref(j);
}

static json_t *post_bisect(const char *body, long *st)
{
    return tu_json(&af_capd, "POST", "/v1/bisect", body, st);
}

static json_t *probe_of(json_t *b, int idx)
{
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(b, "probes"), i, p)
    {
        if (json_integer_value(json_object_get(p, "index")) == idx)
            return p;
    }
    return NULL;
}

Test(bisect, finds_the_first_bad_commit_and_skips_a_missing_build, .timeout = 300)
{
    make_builds(N_COMMITS, K, S);
    /* A template's interpreter need not exist as written. */
    cr_assert_eq(template_build("tmpl"), 201);
    capture(0, "fake:ok");
    capture(N_COMMITS - 1, "fake:ok");
    char *commits = af_commit_list(N_COMMITS, sha), good[41], bad[41], ck[41], ck1[41], cs[41];
    sha(0, good);
    sha(N_COMMITS - 1, bad);
    sha(K, ck);
    sha(K - 1, ck1);
    sha(S, cs);
    char body[4096];
    snprintf(body, sizeof body,
             "{\"project\":\"h\",\"build\":\"tmpl\",\"commits\":%s,\"good\":\"%s\",\"bad\":\"%"
             "s\"," MATRIX ",\"options\":{\"iterations\":0},\"predicate\":\"numerics\"}",
             commits, good, bad);
    free(commits);
    char *dump = NULL;
    json_t *b = af_bisect_run(&af_capd, body, 240, &dump);
    json_t *res = json_object_get(b, "result");
    cr_expect_str_eq(tu_str(res, "first_bad"), ck, "%s", dump);
    cr_expect_str_eq(tu_str(res, "last_good"), ck1, "%s", dump);
    cr_expect(json_is_true(json_object_get(res, "exact")), "%s", dump);
    /* ceil(log2(30)) + 1 = 6. */
    cr_expect_leq(json_integer_value(json_object_get(b, "round")), 6, "%s", dump);
    /* The evidence is the comparison of K against its parent. */
    json_t *ev = json_object_get(res, "evidence");
    cr_expect_str_eq(tu_str(ev, "verdict"), "regression", "%s", dump);
    json_t *cell = json_array_get(json_object_get(ev, "cells"), 0);
    cr_expect_str_eq(tu_str(json_object_get(cell, "first_divergence"), "key"), PKEY);
    /* The ends were reused, S was probed and skipped, with the reason. */
    cr_expect(json_is_true(json_object_get(probe_of(b, 0), "reused")), "%s", dump);
    cr_expect(json_is_true(json_object_get(probe_of(b, N_COMMITS - 1), "reused")), "%s", dump);
    json_t *ps = probe_of(b, S);
    cr_assert_not_null(ps, "S was not probed: %s", dump);
    cr_expect_str_eq(tu_str(ps, "state"), "skipped", "%s", dump);
    cr_expect(strstr(tu_str(ps, "skipped_reason"), "did not start") &&
                  strstr(tu_str(ps, "skipped_reason"), cs),
              "%s", dump);
    cr_expect_str_eq(tu_str(probe_of(b, K), "state"), "bad", "%s", dump);
    free(dump);
    json_decref(b);
}

/* A bisection of three commits, then GOOD and BAD. */
#define THREE_COMMITS                                                                              \
    "{\"project\":\"h\",\"build\":\"tmpl\",\"commits\":[\"%s\",\"%s\",\"%s\"],\"good\":\"%s\","    \
    "\"bad\":\"%s\"," MATRIX ",\"predicate\":\"numerics\"}"

/* POST BODY to PATH must be refused with 400 naming FIELD and CODE (NULL:
 * either is not checked). */
static void expect_refused(const char *path, const char *body, const char *field, const char *code)
{
    long st = 0;
    json_t *r = tu_json(&af_capd, "POST", path, body, &st);
    json_t *e = json_object_get(r, "error");
    char *s = json_dumps(r, 0);
    cr_expect_eq(st, 400, "%s: %ld %s", body, st, s);
    if (field)
        cr_expect_str_eq(tu_str(e, "field"), field, "%s: %s", body, s);
    if (code)
        cr_expect_str_eq(tu_str(e, "code"), code, "%s: %s", body, s);
    free(s);
    json_decref(r);
}

Test(bisect, refuses_bad_input)
{
    make_builds(3, 1, -1);
    cr_assert_eq(template_build("tmpl"), 201);
    char c0[41], c1[41], c2[41];
    sha(0, c0);
    sha(1, c1);
    sha(2, c2);
    struct {
        const char *body_fmt, *field, *code;
    } cases[] = {
        {"{\"project\":\"h\",\"build\":\"nope\",\"commits\":[],\"good\":\"%s\",\"bad\":\"%"
         "s\"," MATRIX ",\"predicate\":\"numerics\"}",
         "build", "unknown_build"},
        {"{\"project\":\"h\",\"build\":\"tmpl\",\"commits\":[],\"good\":\"%s\",\"bad\":\"%"
         "s\"," MATRIX ",\"predicate\":\"speed\"}",
         "predicate", "invalid_field"},
        {"{\"project\":\"h\",\"build\":\"tmpl\",\"good\":\"%s\",\"bad\":\"%s\"," MATRIX
         ",\"predicate\":\"numerics\"}",
         "commits", "missing_field"},
        {"{\"project\":\"h\",\"build\":\"tmpl\",\"commits\":[],\"good\":\"%s\",\"bad\":\"%s\","
         "\"matrix\":{\"models\":[\"fake:ok\"]},\"predicate\":\"numerics\"}",
         "matrix.widths", NULL},
        {"{\"project\":\"h\",\"build\":\"tmpl\",\"commits\":[],\"good\":\"%s\",\"bad\":\"%"
         "s\"," MATRIX ",\"predicate\":\"perf\",\"threshold\":0}",
         "threshold", "invalid_field"},
        {"{\"project\":\"h\",\"build\":\"tmpl\",\"commits\":[],\"good\":\"%s\",\"bad\":\"%"
         "s\"," MATRIX ",\"predicate\":\"numerics\",\"colour\":1}",
         "colour", "unknown_field"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[2048];
        snprintf(body, sizeof body, cases[i].body_fmt, c0, c2);
        expect_refused("/v1/bisect", body, cases[i].field, cases[i].code);
    }
    /* good == bad; good after bad; a commit listed twice. */
    char body[2048];
    snprintf(body, sizeof body,
             "{\"project\":\"h\",\"build\":\"tmpl\",\"commits\":[],\"good\":\"%s\",\"bad\":\"%"
             "s\"," MATRIX ",\"predicate\":\"numerics\"}",
             c1, c1);
    expect_refused("/v1/bisect", body, "bad", NULL);
    snprintf(body, sizeof body, THREE_COMMITS, c0, c1, c2, c2, c0);
    expect_refused("/v1/bisect", body, NULL, "good_not_before_bad");
    snprintf(body, sizeof body, THREE_COMMITS, c0, c1, c1, c0, c2);
    expect_refused("/v1/bisect", body, "commits", NULL);
    long st = 0;
    json_t *r = tu_json(&af_capd, "GET", "/v1/bisect/b000000000000", NULL, &st);
    cr_expect_eq(st, 404);
    json_decref(r);
}

/* STORE_BISECT_MAX_COMMITS (4096) commits are taken; one more is not. */
Test(bisect, too_many_commits)
{
    cr_assert_eq(tu_fake_build(&af_capd, "plain", "{}"), 201);
    for (int n = 4096; n <= 4097; n++) {
        size_t cap = (size_t)n * 20 + 1024;
        char *body = malloc(cap), *p = body;
        p += sprintf(p, "{\"project\":\"h\",\"build\":\"plain\",\"commits\":[");
        for (int i = 0; i < n; i++)
            p += sprintf(p, "%s\"%012x\"", i ? "," : "", 0xa00000 + i);
        sprintf(p,
                "],\"good\":\"%012x\",\"bad\":\"%012x\"," MATRIX
                ",\"options\":{\"iterations\":0},\"predicate\":\"outcome\"}",
                0xa00000, 0xa00000 + n - 1);
        long st = 0;
        json_t *r = post_bisect(body, &st);
        free(body);
        if (n == 4096) {
            cr_expect_eq(st, 201, "%s", json_dumps(r, 0));
            cr_expect_eq(json_integer_value(json_object_get(r, "commit_count")), 4096);
            char path[64];
            snprintf(path, sizeof path, "/v1/bisect/%s/cancel", tu_str(r, "id"));
            json_t *c = tu_json(&af_capd, "POST", path, NULL, &st);
            cr_expect_eq(st, 202);
            json_decref(c);
        } else {
            cr_expect_eq(st, 400);
            cr_expect_str_eq(tu_str(json_object_get(r, "error"), "code"), "too_many_commits");
            cr_expect_str_eq(tu_str(json_object_get(r, "error"), "field"), "commits");
        }
        json_decref(r);
    }
}

/* Cancelling stops the jobs the bisection submitted; a second cancel is a
 * 409. The ends hang, so the bisection is mid-way when it is cancelled. */
Test(bisect, cancel_stops_its_jobs, .timeout = 120)
{
    make_builds(4, 2, -1);
    cr_assert_eq(template_build("tmpl"), 201);
    char *commits = af_commit_list(4, sha), c0[41], c3[41], body[2048];
    sha(0, c0);
    sha(3, c3);
    snprintf(body, sizeof body,
             "{\"project\":\"h\",\"build\":\"tmpl\",\"commits\":%s,\"good\":\"%s\",\"bad\":\"%s\","
             "\"matrix\":{\"models\":[\"fake:hang\"],\"widths\":[\"default\"],\"passes\":"
             "[\"forward\"]},\"predicate\":\"outcome\"}",
             commits, c0, c3);
    free(commits);
    long st = 0;
    json_t *b = NULL;
    char id[16], path[80];
    af_post_bisect(&af_capd, body, id, NULL);
    /* Wait until its probes have their jobs. */
    snprintf(path, sizeof path, "/v1/bisect/%s", id);
    json_t *jobs = NULL;
    for (int i = 0; i < 200 && !jobs; i++) {
        b = tu_json(&af_capd, "GET", path, NULL, &st);
        json_t *p0 = probe_of(b, 0), *p3 = probe_of(b, 3);
        if (p0 && p3 && tu_jstr(p0, "job") && tu_jstr(p3, "job"))
            jobs = json_pack("[s,s]", tu_str(p0, "job"), tu_str(p3, "job"));
        json_decref(b);
        if (!jobs)
            usleep(50000);
    }
    cr_assert_not_null(jobs, "the probes never got jobs");
    snprintf(path, sizeof path, "/v1/bisect/%s/cancel", id);
    b = tu_json(&af_capd, "POST", path, NULL, &st);
    cr_expect_eq(st, 202, "%s", json_dumps(b, 0));
    cr_expect_str_eq(tu_str(b, "state"), "cancelled");
    json_decref(b);
    for (size_t i = 0; i < 2; i++) {
        json_t *j = tu_wait_job(&af_capd, json_string_value(json_array_get(jobs, i)), 60);
        cr_assert_not_null(j);
        cr_expect_str_eq(tu_str(j, "state"), "cancelled");
        json_decref(j);
    }
    json_decref(jobs);
    b = tu_json(&af_capd, "POST", path, NULL, &st);
    cr_expect_eq(st, 409);
    cr_expect_str_eq(tu_str(json_object_get(b, "error"), "code"), "bisect_finished");
    json_decref(b);
}

/* A template build: its interpreter is not checked as written, a stray
 * placeholder or a dot component is refused, and it cannot prefork. */
Test(bisect, template_builds)
{
    char body[1024];
    snprintf(body, sizeof body, "{\"name\":\"t1\",\"python\":\"%s/b/{branch}/python\"}",
             af_capd.dir);
    expect_refused("/v1/builds", body, "python", NULL);
    snprintf(body, sizeof body, "{\"name\":\"t2\",\"python\":\"%s/b/../{commit}/python\"}",
             af_capd.dir);
    expect_refused("/v1/builds", body, "python", NULL);
    snprintf(body, sizeof body,
             "{\"name\":\"t3\",\"python\":\"%s/b/{commit}/python\",\"prefork\":true}", af_capd.dir);
    expect_refused("/v1/builds", body, "prefork", NULL);
    /* A plain build's interpreter must still exist. */
    snprintf(body, sizeof body, "{\"name\":\"t4\",\"python\":\"%s/b/nothing/python\"}",
             af_capd.dir);
    expect_refused("/v1/builds", body, NULL, NULL);
    /* A job of a commit without its build fails its cells before they
     * start, and says which interpreter is missing. */
    cr_assert_eq(template_build("tmpl"), 201);
    long s2 = 0;
    json_t *j =
        tu_jsonf(&af_capd, "POST", "/v1/jobs", &s2,
                 "{\"project\":\"h\",\"commit\":\"abcdef12\",\"build\":\"tmpl\"," MATRIX "}");
    cr_assert_eq(s2, 201);
    json_t *done = tu_wait_job(&af_capd, tu_str(j, "id"), 60);
    cr_assert_not_null(done);
    json_t *cell = json_array_get(json_object_get(done, "cells"), 0);
    cr_expect_str_eq(tu_str(cell, "state"), "failed", "%s", json_dumps(done, 0));
    cr_expect(strstr(tu_str(cell, "reason"), "/b/abcdef12/python"), "%s", json_dumps(done, 0));
    json_decref(done);
    json_decref(j);
}

/* A capd stopped mid-bisection carries it on when it starts again, and
 * the event stream tells its progress (filtered by the bisection's id). */
Test(bisect, survives_a_restart_and_streams_progress, .timeout = 180)
{
    make_builds(6, 3, -1);
    cr_assert_eq(template_build("tmpl"), 201);
    char *commits = af_commit_list(6, sha), c0[41], c5[41], c3[41], body[2048];
    sha(0, c0);
    sha(5, c5);
    sha(3, c3);
    snprintf(body, sizeof body,
             "{\"project\":\"h\",\"build\":\"tmpl\",\"commits\":%s,\"good\":\"%s\",\"bad\":\"%s\","
             "\"matrix\":{\"models\":[\"fake:slow__300\"],\"widths\":[\"default\"],\"passes\":"
             "[\"forward\"]},\"options\":{\"iterations\":0},\"predicate\":\"numerics\"}",
             commits, c0, c5);
    free(commits);
    char id[16], dir[256], path[80], *dump = NULL;
    af_post_bisect(&af_capd, body, id, NULL);
    snprintf(dir, sizeof dir, "%s", af_capd.dir);
    cr_assert_eq(tu_capd_stop(&af_capd), 0);
    cr_assert_eq(tu_capd_start(&af_capd, dir, NULL), 0);
    json_t *b = af_bisect_done(&af_capd, id, 150, &dump);
    cr_expect_str_eq(tu_str(json_object_get(b, "result"), "first_bad"), c3, "%s", dump);
    free(dump);
    json_decref(b);
    snprintf(path, sizeof path, "/v1/events?job=%s", id);
    char *ev = tu_events_until(&af_capd, path, "\"state\":\"done\"", 20000);
    cr_expect(strstr(ev, "event: bisect\n"), "%s", ev);
    cr_expect(strstr(ev, "\"change\":\"created\""), "%s", ev);
    cr_expect(strstr(ev, "\"change\":\"probe\""), "%s", ev);
    cr_expect(strstr(ev, "\"change\":\"round\""), "%s", ev);
    cr_expect(strstr(ev, c3) && strstr(ev, "\"state\":\"done\""), "%s", ev);
    free(ev);
}

/* capctl bisect takes its commits from git rev-list and waits for the
 * result; the builds are named by the real commits of a repository. */
Test(bisect, capctl_bisect_from_git, .timeout = 180)
{
    cr_assert_eq(tu_sh("cd '%s' && git init -q repo && cd repo && for i in 0 1 2 3 4 5; do "
                       "git -c user.name=t -c user.email=t@t commit -q --allow-empty -m c$i; "
                       "done && git rev-list --reverse HEAD > ../revs",
                       af_capd.dir),
                 0);
    char p[400], *revs, *fake = tu_helper("fake_runner");
    snprintf(p, sizeof p, "%s/revs", af_capd.dir);
    revs = tu_slurp(p);
    char shas[6][41];
    for (int i = 0; i < 6; i++) {
        snprintf(shas[i], 41, "%.40s", revs + i * 41);
        cr_assert_eq(tu_sh("mkdir -p '%s/b/%s' && ln -s '%s' '%s/b/%s/python' && "
                           "printf '%s' > '%s/b/%s/env'",
                           af_capd.dir, shas[i], fake, af_capd.dir, shas[i],
                           i >= 3 ? "FAKE_PERTURB_KEY=" PKEY "\\n" : "", af_capd.dir, shas[i]),
                     0);
    }
    free(revs);
    free(fake);
    cr_assert_eq(template_build("tmpl"), 201);
    char args[1200], *out = NULL;
    snprintf(args, sizeof args,
             "bisect --project h --build tmpl --good %s --bad %s --commits-from-git '%s/repo' "
             "--models fake:ok --widths default --passes forward --iterations 0 --wait "
             "--timeout 150",
             shas[0], shas[5], af_capd.dir);
    cr_expect_eq(af_capctl(&af_capd, args, &out), 0, "%s", out);
    char want[80];
    snprintf(want, sizeof want, "first bad commit: %s", shas[3]);
    cr_expect(strstr(out, want), "%s", out);
    free(out);
    /* A range git does not know is capctl's error, before capd hears of it. */
    snprintf(args, sizeof args,
             "bisect --project h --build tmpl --good %s --bad deadbeef --commits-from-git "
             "'%s/repo' --models fake:ok --widths default --passes forward",
             shas[0], af_capd.dir);
    cr_expect_eq(af_capctl(&af_capd, args, &out), 2, "%s", out);
    cr_expect(strstr(out, "git rev-list"), "%s", out);
    free(out);
}

/* A bisection over two commits whose ends hang: it stays running. */
static long post_hanging(int i, char id[16])
{
    char body[1024];
    snprintf(body, sizeof body,
             "{\"project\":\"lim\",\"build\":\"plain\",\"commits\":[\"%012x\",\"%012x\"],"
             "\"good\":\"%012x\",\"bad\":\"%012x\",\"matrix\":{\"models\":[\"fake:hang\"],"
             "\"widths\":[\"default\"],\"passes\":[\"forward\"]},\"predicate\":\"outcome\"}",
             0xb00000 + 2 * i, 0xb00001 + 2 * i, 0xb00000 + 2 * i, 0xb00001 + 2 * i);
    long st = 0;
    json_t *r = post_bisect(body, &st);
    if (st == 201)
        snprintf(id, 16, "%s", tu_str(r, "id"));
    else if (st == 429) {
        json_t *e = json_object_get(r, "error");
        cr_expect_str_eq(tu_str(e, "code"), "too_many_bisections");
        cr_expect(strstr(tu_str(e, "message"), "16 bisections are already running"), "%s",
                  tu_str(e, "message"));
    }
    json_decref(r);
    return st;
}

/* STORE_BISECT_MAX_RUNNING (16) run at once: the 17th is a 429 that
 * changes nothing, and one more is taken once one of them has ended. */
Test(bisect, too_many_running, .timeout = 120)
{
    cr_assert_eq(tu_fake_build(&af_capd, "plain", "{}"), 201);
    char ids[17][16];
    for (int i = 0; i < 16; i++)
        cr_assert_eq(post_hanging(i, ids[i]), 201, "bisection %d", i);
    cr_expect_eq(post_hanging(16, ids[16]), 429);
    long st = 0;
    json_t *l = tu_json(&af_capd, "GET", "/v1/bisect", NULL, &st);
    json_t *list = json_object_get(l, "bisections"), *b;
    cr_expect_eq(json_array_size(list), 16, "%s", json_dumps(l, 0));
    size_t i;
    json_array_foreach(list, i, b)
    {
        cr_expect_str_eq(tu_str(b, "state"), "running");
    }
    json_decref(l);
    char path[64];
    snprintf(path, sizeof path, "/v1/bisect/%s/cancel", ids[0]);
    json_decref(tu_json(&af_capd, "POST", path, NULL, &st));
    cr_expect_eq(st, 202);
    cr_expect_eq(post_hanging(16, ids[16]), 201);
}

#define KP 5 /* the first commit whose timings are 1.5x */

/* Submits commit I to branch "perf" in commit order and waits for it. */
static void capture_ordered(int i, const char *options)
{
    char c[41], p[41];
    sha(i, c);
    sha(i - 1, p);
    long st = 0;
    json_t *j = tu_jsonf(&af_capd, "POST", "/v1/jobs", &st,
                         "{\"project\":\"h\",\"commit\":\"%s\",\"branch\":\"perf\",\"build\":"
                         "\"tmpl\",\"commit_time\":\"2024-01-01T00:%02d:00Z\",\"parents\":"
                         "[\"%s\"]," MATRIX ",\"options\":%s}",
                         c, i, p, options);
    cr_assert_eq(st, 201, "%s", json_dumps(j, 0));
    json_t *done = tu_wait_job(&af_capd, json_string_value(json_object_get(j, "id")), 60);
    cr_assert_not_null(done);
    json_decref(done);
    json_decref(j);
}

/*
 * The perf predicate and the branch form: the commits are the branch's
 * history, and from KP on the fake runner's timings are 1.5x (its samples
 * are synthetic: FAKE_TIMING_SCALE from the commit's env file, paired
 * against the good build's, so nothing depends on this host's noise).
 * Every probe runs paired against good, even where the branch's job of
 * the commit exists (it was not paired).
 */
Test(bisect, perf_predicate_over_a_branch, .timeout = 240)
{
    const char *opts = "{\"iterations\":12,\"warmup\":1}";
    make_builds_env(8, KP, -1, "FAKE_TIMING_SCALE=1.5\\n");
    cr_assert_eq(template_build("tmpl"), 201);
    for (int i = 0; i < 8; i++)
        capture_ordered(i, opts);
    char good[41], bad[41], ck[41], ck1[41], body[2048];
    sha(0, good);
    sha(7, bad);
    sha(KP, ck);
    sha(KP - 1, ck1);
    snprintf(body, sizeof body,
             "{\"project\":\"h\",\"build\":\"tmpl\",\"branch\":\"perf\",\"good\":\"%s\","
             "\"bad\":\"%s\"," MATRIX ",\"options\":%s,\"predicate\":\"perf\",\"threshold\":0.2}",
             good, bad, opts);
    long st = 0;
    json_t *b = NULL;
    char id[16], *dump = NULL;
    af_post_bisect(&af_capd, body, id, &b);
    cr_expect_eq(json_integer_value(json_object_get(b, "commit_count")), 8);
    json_decref(b);
    b = af_bisect_done(&af_capd, id, 200, &dump);
    json_t *res = json_object_get(b, "result");
    cr_expect_str_eq(tu_str(res, "first_bad"), ck, "%s", dump);
    cr_expect_str_eq(tu_str(res, "last_good"), ck1, "%s", dump);
    cr_expect(json_is_true(json_object_get(res, "exact")), "%s", dump);
    json_t *pb = probe_of(b, KP), *pg = probe_of(b, KP - 1);
    cr_assert(pb && pg, "%s", dump);
    cr_expect(json_is_false(json_object_get(pb, "reused")), "%s", dump);
    json_t *cell = json_array_get(json_object_get(json_object_get(pb, "verdict"), "cells"), 0);
    cr_expect_str_eq(tu_str(cell, "perf_verdict"), "regression", "%s", dump);
    double ratio = json_number_value(json_object_get(cell, "perf_ratio"));
    cr_expect(ratio > 1.3 && ratio < 1.7, "ratio %g: %s", ratio, dump);
    free(dump);
    json_decref(b);
    /* A branch that does not hold both ends: send the commits instead. */
    snprintf(body, sizeof body,
             "{\"project\":\"h\",\"build\":\"tmpl\",\"branch\":\"perf\",\"good\":\"%s\","
             "\"bad\":\"feedface\"," MATRIX ",\"predicate\":\"perf\"}",
             good);
    b = post_bisect(body, &st);
    cr_expect_eq(st, 400);
    cr_expect_str_eq(tu_str(json_object_get(b, "error"), "code"), "not_in_branch");
    cr_expect_str_eq(tu_str(json_object_get(b, "error"), "field"), "bad");
    json_decref(b);
}
