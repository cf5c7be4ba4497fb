/*
 * tests/test_api_replay.c - a diverged op's replay and its reproducer
 * (api/api_replay.c, daemon/replay/) through a real capd and the fake
 * runner's per-op stream, whose targeted capture records the op's argument
 * as the real runner does: the op picked from the comparison, the two
 * replay jobs (asked again: the same ones), the replay step's folder of
 * the control's arguments and the isolated pair that runs the op alone on
 * them, the archive's files read back byte for byte, and every refusal
 * with the clear error and nothing lost.
 * On real torch cells, with repro.py run: tests/test_perop_e2e.c.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/json_want.h"
#include "tests/helpers/common/testutil.h"

TestSuite(replay, AF_SUITE);

/* layer1's op (aten::mul) moved by the head build. */
#define OP     "layer1.0.forward/op.aten::mul.0"
#define OPSKEY OP ".output.0"

static void builds(void)
{
    cr_assert_eq(tu_fake_build(&af_capd, "clean", "{}"), 201);
    cr_assert_eq(tu_fake_build(&af_capd, "pertop", "{\"FAKE_PERTURB_KEY\":\"" OPSKEY "\"}"), 201);
}

/* A job of MODELS (JSON array items) at WIDTHS (likewise), forward, with OPTIONS
 * (JSON object text), of BUILD at COMMIT with CONTROL (or NULL); waited
 * for, its id (owned). */
static char *ops_job(const char *build, const char *commit, const char *control, const char *models,
                     const char *widths, const char *options)
{
    struct af_job j = {"p", commit, control, build, models, widths, "\"forward\"", options};
    char *id = af_submit_job(&af_capd, &j);
    json_decref(af_wait_done(id));
    return id;
}

/* A job of the per-op fake model at avx2, forward, granularity op, of
 * BUILD at COMMIT with CONTROL (or NULL), replaying nothing by itself
 * (option replay off): the tests below ask; waited for, its id (owned). */
static char *op_job(const char *build, const char *commit, const char *control)
{
    return ops_job(build, commit, control, "\"fake:ops__3\"", "\"avx2\"",
                   "{\"granularity\":\"op\",\"iterations\":0,\"replay\":\"off\"}");
}

/* "/v1/jobs/JOB/cells/<its first cell>/WHAT" (static). */
static const char *cell_path(const char *job, const char *what)
{
    static char p[256];
    json_t *j = af_get_job(job);
    snprintf(p, sizeof p, "/v1/jobs/%s/cells/%s/%s", job,
             tu_jstr(json_array_get(json_object_get(j, "cells"), 0), "id"), what);
    json_decref(j);
    return p;
}

/* Control c1, head c2 of BUILD paired with it: the head's id (owned). */
static char *pair(const char *build, char **control)
{
    builds();
    *control = op_job("clean", "c0c0c01", NULL);
    return op_job(build, "c0c0c02", "c0c0c01");
}

/* The whole archive of a GET that must answer 200. */
static struct tu_resp get_archive(const char *path)
{
    struct tu_resp r;
    cr_assert_eq(tu_http(&af_capd, "GET", path, NULL, 0, NULL, &r), 0);
    cr_assert_eq(r.status, 200, "GET %s: %ld %s", path, r.status, r.body);
    return r;
}

/* GET URL once it is no longer 409 pending (the replay's jobs, the
 * isolated pair's included, run): the 200 answer (owned). */
static json_t *settled(const char *url)
{
    return af_get_settled(&af_capd, url, 120);
}

/* The bytes of file NAME in ustar archive T (N bytes), its size in *LEN;
 * fails the test when it is not there. */
static const unsigned char *tar_file(const struct tu_resp *t, const char *name, size_t *len)
{
    const unsigned char *p = (const unsigned char *)t->body;
    for (size_t off = 0; off + 512 <= t->len && p[off];) {
        size_t sz = strtoull((const char *)p + off + 124, NULL, 8);
        cr_assert(memcmp(p + off + 257, "ustar", 5) == 0, "a ustar header at %zu", off);
        if (strcmp((const char *)p + off, name) == 0) {
            *len = sz;
            return p + off + 512;
        }
        off += 512 + (sz + 511) / 512 * 512;
    }
    cr_assert_fail("the archive has no %s", name);
    return NULL;
}

/* The values of a one-dimensional float32 .npy file, after its header. */
static const float *npy_values(const unsigned char *f, size_t len, size_t *n)
{
    cr_assert(len > 10 && memcmp(f, "\x93NUMPY\x01\x00", 8) == 0, "a .npy 1.0 file");
    size_t hl = (size_t)f[8] | (size_t)f[9] << 8;
    cr_assert_eq((10 + hl) % 64, 0, "the header ends on 64 bytes");
    cr_assert(strstr((const char *)f + 10, "'descr': '<f4'") != NULL);
    cr_assert(strstr((const char *)f + 10, "'shape': (4,)") != NULL);
    *n = (len - 10 - hl) / sizeof(float);
    return (const float *)(f + 10 + hl);
}

/* The replay picks the op the head moved, runs both sides once more with
 * that op targeted, and the archive holds the control's argument and both
 * results, the head's moved by 2^-10 in element 0. */
Test(replay, the_diverged_op_is_replayed_and_packed)
{
    af_start(NULL);
    char *ctl, *head = pair("pertop", &ctl);
    const char *rp = cell_path(head, "replay");
    char replay[256];
    snprintf(replay, sizeof replay, "%s", rp);
    long st;
    json_t *r = af_call("POST", replay, "{}", &st);
    cr_assert_eq(st, 202, "%s", af_dump(r));
    const struct jw_want w[] = {JW_S("op", OP), JW_S("control.commit", "c0c0c01"),
                                JW_S("head.commit", "c0c0c02"), JW_S("control.build", "clean"),
                                JW_S("head.build", "pertop")};
    jw_expect_all(r, w);
    char cj[16], hj[16];
    snprintf(cj, sizeof cj, "%s", jw_str(r, "control.job"));
    snprintf(hj, sizeof hj, "%s", jw_str(r, "head.job"));
    json_decref(r);
    /* asked again: the same two jobs */
    r = af_call("POST", replay, "{}", &st);
    cr_assert_eq(st, 202);
    cr_assert_str_eq(jw_str(r, "control.job"), cj);
    cr_assert_str_eq(jw_str(r, "head.job"), hj);
    json_decref(r);
    json_decref(af_wait_done(cj));
    json_decref(af_wait_done(hj));
    /* a replay job stands for no commit: the diff is still the head's */
    json_t *d = af_get_ok("/v1/commits/c0c0c02/diff");
    cr_assert_str_eq(jw_str(d, "head.job"), head);
    json_decref(d);

    struct tu_resp t = get_archive(cell_path(head, "repro"));
    size_t n, na, nc, nh, la, lc, lh;
    const unsigned char *fa = tar_file(&t, "repro/inputs/arg.0.npy", &la);
    const unsigned char *fc = tar_file(&t, "repro/expected/control.output.0.npy", &lc);
    const unsigned char *fh = tar_file(&t, "repro/expected/head.output.0.npy", &lh);
    const float *a = npy_values(fa, la, &na), *c = npy_values(fc, lc, &nc);
    const float *h = npy_values(fh, lh, &nh);
    cr_assert(na == 4 && nc == 4 && nh == 4, "%zu %zu %zu", na, nc, nh);
    cr_assert_float_eq(c[0] - h[0], -1.0f / 1024.0f, 1e-9, "the head's result moved by 2^-10");
    cr_assert_float_eq(c[0], 16 * a[0], 1e-6, "aten::mul scales element 0 by 16");
    for (int i = 1; i < 4; i++)
        cr_assert(c[i] == h[i] && c[i] == a[i]);
    const unsigned char *mf = tar_file(&t, "repro/manifest.json", &n);
    json_t *m = json_loadb((const char *)mf, n, 0, NULL);
    cr_assert_not_null(m, "the manifest is JSON");
    const struct jw_want mw[] = {
        JW_I("format", 1),
        JW_S("key", OP),
        JW_S("op_call.name", "aten::mul"),
        JW_I("op_call.args.0.arg", 0),
        JW_S("args.0.file", "inputs/arg.0.npy"),
        JW_S("expected.head.0.file", "expected/head.output.0.npy"),
        JW_S("cell.width", "avx2"),
        JW_S("width_env.ATEN_CPU_CAPABILITY", "avx2"),
        JW_S("builds.control.build", "clean"),
        JW_S("builds.head.commit", "c0c0c02"),
    };
    jw_expect_all(m, mw);
    json_decref(m);
    tar_file(&t, "repro/repro.py", &n);
    cr_assert(n > 0, "repro.py is in the archive");

    /* the replay step wrote the control's argument, byte for byte the
     * archive's, and the isolated pair ran the op alone on it: the head's
     * result moved there too */
    json_t *rep = settled(replay);
    const struct jw_want iw[] = {JW_S("isolated.op", "model.0.forward/op.aten::mul.0"),
                                 JW_S("isolated.control.build", "clean"),
                                 JW_S("isolated.head.build", "pertop"),
                                 JW_S("conclusion", "kernel_changed")};
    jw_expect_all(rep, iw);
    /* the head build moves the op at every width: avx2 among them (the
     * widths in name order, amx before avx2 on a host that has it) */
    json_t *cw;
    size_t k;
    bool at_avx2 = false;
    json_array_foreach(json_object_get(rep, "widths"), k, cw)
    {
        at_avx2 |= strcmp(json_string_value(cw), "avx2") == 0;
    }
    cr_assert(at_avx2, "the kernel changed at avx2: %s", af_dump(rep));
    json_t *e = jw_find(json_object_get(rep, "per_width"), "width", "avx2");
    cr_assert_str_eq(jw_str(e, "isolated.verdict"), "diverged", "%s", af_dump(rep));
    char path[600], got[512];
    snprintf(path, sizeof path, "%s/data/replays/%s/inputs/arg.0.npy", af_dir, cj);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "the replay step wrote %s", path);
    size_t gl = fread(got, 1, sizeof got, f);
    fclose(f);
    cr_assert(gl == la && memcmp(got, fa, la) == 0, "%s is the archive's argument", path);
    /* the isolated jobs stand for no commit either */
    d = af_get_ok("/v1/commits/c0c0c02/diff");
    cr_assert_str_eq(jw_str(d, "head.job"), head);
    json_decref(d);
    json_decref(rep);
    tu_resp_free(&t);
    free(ctl);
    free(head);
}

/* What cannot be replayed says why, and nothing is created. */
Test(replay, refusals_name_what_is_missing)
{
    af_start(NULL);
    char *ctl, *head = pair("clean", &ctl);
    int jobs = af_count_jobs();
    char p[256];
    /* an A/A cell has no op to replay */
    snprintf(p, sizeof p, "%s", cell_path(head, "replay"));
    af_expect_call_error("POST", p, "{}", 409, "no_op_divergence", NULL);
    af_expect_call_error("POST", p, "{'op':'layer1.0.forward.output.0'}", 400, "invalid_field",
                         "op");
    af_expect_call_error("POST", p, "{'op':7}", 400, "invalid_field", "op");
    /* a job without a control */
    snprintf(p, sizeof p, "%s", cell_path(ctl, "replay"));
    af_expect_call_error("POST", p, "{}", 404, "no_control", NULL);
    /* no replay asked: no reproducer */
    af_expect_get_error(cell_path(head, "repro"), 404, "no_replay");
    af_expect_get_error("/v1/jobs/jnope/cells/c0000/repro", 404, "no_replay");
    cr_assert_eq(af_count_jobs(), jobs, "no job was created");
    free(ctl);
    free(head);
}

/* A named op is replayed even where nothing diverged; another op for the
 * same cell is a conflict; an op that records nothing is a clear 422. */
Test(replay, a_named_op_and_its_conflicts)
{
    af_start(NULL);
    char *ctl, *head = pair("clean", &ctl);
    char p[256];
    snprintf(p, sizeof p, "%s", cell_path(head, "replay"));
    long st;
    json_t *r = af_callq("POST", p, "{'op':'layer9.0.forward/op.aten::mul.0'}", &st);
    cr_assert_eq(st, 202, "%s", af_dump(r));
    json_decref(af_wait_done(jw_str(r, "control.job")));
    json_decref(af_wait_done(jw_str(r, "head.job")));
    json_decref(r);
    af_expect_call_error("POST", p, "{'op':'layer1.0.forward/op.aten::mul.0'}", 409,
                         "idempotency_conflict", "op");
    af_expect_get_error(cell_path(head, "repro"), 422, "no_target_records");
    /* nothing to run the op alone on: the report says why, from the model
     * run alone */
    json_t *rep = settled(p);
    cr_assert(strstr(jw_str(rep, "isolated.refused"), "hold no records of layer9"), "%s",
              af_dump(rep));
    cr_assert_str_eq(jw_str(rep, "conclusion"), "not_reproducible");
    json_decref(rep);
    free(ctl);
    free(head);
}

/* options.target_op: one op call's name (at granularity op only), or one
 * module's forward call. */
Test(replay, target_op_is_checked_at_submission)
{
    af_start(NULL);
    builds();
    static const char *const bad[] = {
        "{'granularity':'op','target_op':'layer1.0.forward.output.0'}",
        "{'target_op':'layer1.0.backward'}",
        "{'target_op':'layer1.forward'}",
        "{'target_op':'0.forward'}",
        "{'target_op':'layer1.0.forward/x'}",
        "{'granularity':'op','target_op':'layer1.x.forward/op.aten::mul.0'}",
        "{'granularity':'op','target_op':'layer1.0.sideways/op.aten::mul.0'}",
        "{'granularity':'op','target_op':'layer1.0.forward/op.aten::mul'}",
        "{'granularity':'op','target_op':''}",
        "{'granularity':'op','target_op':3}",
        "{'target_op':'layer1.0.forward/op.aten::mul.0'}",
    };
    char body[512];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body,
                 "{'project':'p','commit':'abcdef1','build':'clean','matrix':{'models':['fake:ops']"
                 ",'widths':['avx2'],'passes':['forward']},'options':%s}",
                 bad[i]);
        af_expect_call_error("POST", "/v1/jobs", body, 400, "invalid_field", "options.target_op");
    }
    /* target_inputs is capd's own (the replay step's folder), never a
     * request's */
    af_expect_call_error("POST", "/v1/jobs",
                         "{'project':'p','commit':'abcdef1','build':'clean','matrix':{'models':["
                         "'fake:ops'],'widths':['avx2'],'passes':['forward']},'options':{"
                         "'granularity':'op','target_op':'layer1.0.forward/op.aten::mul.0',"
                         "'target_inputs':'/etc'}}",
                         400, "unknown_field", "options.target_inputs");
    cr_assert_eq(af_count_jobs(), 0);
    /* a module's forward call, at either granularity; stored as given */
    static const char *const good[] = {"{'target_op':'layer1.0.forward'}",
                                       "{'granularity':'op','target_op':'model.2.forward'}"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        json_t *job = af_post_job(201,
                                  "{'project':'p','commit':'abcdef%zu','build':'clean','matrix':{"
                                  "'models':['fake:ops'],'widths':['avx2'],'passes':['forward']},"
                                  "'options':%s}",
                                  i, good[i]);
        cr_assert_str_eq(jw_str(json_object_get(job, "options"), "target_op"),
                         i ? "model.2.forward" : "layer1.0.forward");
        json_decref(job);
    }
    cr_assert_eq(af_count_jobs(), 2);
}

/* repro_max_bytes: an archive past it is refused whole, never cut. */
Test(replay, an_archive_past_repro_max_bytes_is_refused)
{
    af_ensure_dir();
    const char *cfg = af_write_file("capd.json", "{\"repro_max_bytes\": 4096}\n", 0644);
    const char *const extra[] = {"--config", cfg, NULL};
    af_start(extra);
    char *ctl, *head = pair("pertop", &ctl);
    char p[256];
    long st;
    snprintf(p, sizeof p, "%s", cell_path(head, "replay"));
    json_t *r = af_call("POST", p, "{}", &st);
    cr_assert_eq(st, 202);
    json_decref(af_wait_done(jw_str(r, "control.job")));
    json_decref(af_wait_done(jw_str(r, "head.job")));
    json_decref(r);
    af_expect_get_error(cell_path(head, "repro"), 422, "repro_too_large");
    /* the isolated pair's folder has the same limit, refused in words */
    json_t *rep = settled(p);
    cr_assert(strstr(jw_str(rep, "isolated.refused"), "larger than repro_max_bytes (4096 bytes)"),
              "%s", af_dump(rep));
    json_decref(rep);
    free(ctl);
    free(head);
}

/* The replay of CELL_PATH's cell (its ".../replay" URL) with BODY, both
 * jobs waited for; then its report (owned). */
static json_t *replay_report(const char *replay_url, const char *body)
{
    long st;
    json_t *r = af_callq("POST", replay_url, body, &st);
    cr_assert_eq(st, 202, "%s", af_dump(r));
    json_decref(af_wait_done(jw_str(r, "control.job")));
    json_decref(af_wait_done(jw_str(r, "head.job")));
    json_decref(r);
    return settled(replay_url);
}

/* The width entry of REPORT's per_width for WIDTH (there must be one). */
static const char *verdict_at(json_t *report, const char *width)
{
    json_t *e = jw_find(json_object_get(report, "per_width"), "width", width);
    cr_assert_not_null(e, "no width %s in %s", width, af_dump(report));
    return tu_jstr(e, "verdict");
}

/* The isolated pair's verdict at WIDTH in REPORT. */
static const char *isolated_at(json_t *report, const char *width)
{
    json_t *e = jw_find(json_object_get(report, "per_width"), "width", width);
    cr_assert_not_null(e, "no width %s in %s", width, af_dump(report));
    return jw_str(e, "isolated.verdict");
}

/* capd with the builds "clean" and "h" (fake runner, env HEAD_ENV: JSON
 * object text), a control job and a job of h paired with it, and the
 * report of the replay of h's cell asked with BODY (owned); the replay's
 * URL into URL. */
static json_t *replayed(const char *head_env, const char *body, char url[256])
{
    af_start(NULL);
    cr_assert_eq(tu_fake_build(&af_capd, "clean", "{}"), 201);
    cr_assert_eq(tu_fake_build(&af_capd, "h", head_env), 201);
    char *ctl = op_job("clean", "c0c0c01", NULL), *head = op_job("h", "c0c0c02", "c0c0c01");
    snprintf(url, 256, "%s", cell_path(head, "replay"));
    free(ctl);
    free(head);
    return replay_report(url, body);
}

/* A kernel wrong at avx2 only: the replay runs every width this host
 * runs, and the op with the same inputs computes something else at avx2
 * and the same everywhere else. */
Test(replay, a_kernel_changed_at_one_width_only)
{
    char url[256];
    json_t *rep = replayed("{\"FAKE_PERTURB_KEY\":\"" OPSKEY "\",\"FAKE_PERTURB_WIDTH\":\"avx2\"}",
                           "{}", url);
    const struct jw_want w[] = {JW_S("op", OP),           JW_S("conclusion", "kernel_changed"),
                                JW_S("widths.0", "avx2"), JW_A("widths.1"),
                                JW_N("upstream"),         JW_S("cell_width", "avx2")};
    jw_expect_all(rep, w);
    cr_assert_str_eq(verdict_at(rep, "avx2"), "kernel_changed");
    cr_assert_str_eq(verdict_at(rep, "default"), "same");
    cr_assert_str_eq(isolated_at(rep, "avx2"), "diverged");
    cr_assert_str_eq(isolated_at(rep, "default"), "same");
    /* each build at each width against the control's output (its build at
     * the cell's width, avx2): only the head's at avx2 departs */
    json_t *a = jw_find(json_object_get(rep, "per_width"), "width", "avx2");
    json_t *d = jw_find(json_object_get(rep, "per_width"), "width", "default");
    cr_assert_str_eq(jw_str(a, "isolated.control"), "same", "%s", af_dump(rep));
    cr_assert_str_eq(jw_str(a, "isolated.head"), "diverged", "%s", af_dump(rep));
    cr_assert_str_eq(jw_str(d, "isolated.control"), "same", "%s", af_dump(rep));
    cr_assert_str_eq(jw_str(d, "isolated.head"), "same", "%s", af_dump(rep));
    cr_assert(json_array_size(json_object_get(rep, "per_width")) >= 2);
    json_decref(rep);
    /* the Markdown says it in words */
    char md[300];
    snprintf(md, sizeof md, "%s?format=md", url);
    struct tu_resp t;
    cr_assert_eq(tu_http(&af_capd, "GET", md, NULL, 0, NULL, &t), 0);
    cr_assert(
        strstr(t.body, "kernel_changed") && strstr(t.body, "| avx2 | kernel_changed |") &&
            strstr(t.body, "at avx2; `mul_stub`, aten/src/ATen/native/cpu/BinaryOpsKernel.cpp"),
        "%s", t.body);
    tu_resp_free(&t);
}

/* An upstream op moved: the replayed op downstream got other inputs, so
 * its divergence is inherited, and the report names where it came from. */
Test(replay, a_fault_upstream_is_inherited)
{
    char url[256];
    json_t *rep =
        replayed("{\"FAKE_PERTURB_KEY\":\"layer0.0.forward/op.aten::hardswish.0.output.0\"}",
                 "{'op':'" OP "'}", url);
    const struct jw_want w[] = {
        JW_S("conclusion", "inherited"),
        JW_S("upstream.key", "layer0.0.forward/op.aten::hardswish.0.output.0"),
        JW_S("upstream.op", "aten::hardswish"),
        JW_A("widths.0"),
    };
    jw_expect_all(rep, w);
    cr_assert_str_eq(verdict_at(rep, "avx2"), "inputs_differ");
    /* on the control's inputs the head's op computes the same */
    cr_assert_str_eq(isolated_at(rep, "avx2"), "same");
    json_decref(rep);
}

/* A result the runner saw change between two runs of one build: not
 * reproducible in isolation, and the report says why. */
Test(replay, a_nondeterministic_op_is_not_reproducible)
{
    char url[256];
    /* its result moves, and its runner saw it move between two runs */
    json_t *rep =
        replayed("{\"FAKE_NONDET_KEY\":\"" OPSKEY "\",\"FAKE_PERTURB_KEY\":\"" OPSKEY "\"}",
                 "{'op':'" OP "'}", url);
    cr_assert_str_eq(jw_str(rep, "conclusion"), "not_reproducible");
    cr_assert(strstr(jw_str(rep, "why"), "nondeterministic at"), "%s", jw_str(rep, "why"));
    cr_assert_str_eq(verdict_at(rep, "avx2"), "nondeterministic");
    cr_assert_str_eq(isolated_at(rep, "avx2"), "nondeterministic");
    json_decref(rep);
}

/* The label the automatic replay leaves on job ID, once it has looked. */
static char *auto_label(const char *id)
{
    return af_wait_label(&af_capd, id, "replay_auto", 60);
}

/* With the defaults (option replay auto) a head whose op diverged is
 * replayed without asking; asking again answers the same jobs; a job with
 * replay off and a control job are looked at and left alone. */
Test(replay, a_divergence_is_replayed_without_asking)
{
    af_start(NULL);
    builds();
    static const char *const opts = "{\"granularity\":\"op\",\"iterations\":0}";
    char *ctl = ops_job("clean", "c0c0c01", NULL, "\"fake:ops__3\"", "\"avx2\"", opts);
    char *off = ops_job("pertop", "c0c0c0f", "c0c0c01", "\"fake:ops__3\"", "\"avx2\"",
                        "{\"granularity\":\"op\",\"iterations\":0,\"replay\":\"off\"}");
    char *head = ops_job("pertop", "c0c0c02", "c0c0c01", "\"fake:ops__3\"", "\"avx2\"", opts);
    char *l = auto_label(head);
    cr_assert_str_eq(l, "replayed 1");
    free(l);
    l = auto_label(ctl);
    cr_assert_str_eq(l, "no control job");
    free(l);
    /* looked at before the head (older), and left without a label */
    json_t *j = af_get_job(off);
    cr_assert_null(json_object_get(json_object_get(j, "labels"), "replay_auto"), "%s", af_dump(j));
    json_decref(j);
    af_expect_get_error(cell_path(off, "replay"), 404, "no_replay");
    char url[256];
    snprintf(url, sizeof url, "%s", cell_path(head, "replay"));
    json_t *rep = settled(url);
    const struct jw_want w[] = {JW_S("op", OP), JW_S("conclusion", "kernel_changed"),
                                JW_S("isolated.op", "model.0.forward/op.aten::mul.0")};
    jw_expect_all(rep, w);
    long st;
    json_t *r = af_call("POST", url, "{}", &st);
    cr_assert_eq(st, 202, "%s", af_dump(r));
    cr_assert_str_eq(jw_str(r, "control.job"), jw_str(rep, "control.job"));
    cr_assert_str_eq(jw_str(r, "head.job"), jw_str(rep, "head.job"));
    json_decref(r);
    json_decref(rep);
    free(ctl);
    free(off);
    free(head);
}

/* MODE's cell of job J (a GET reply), owned. */
static json_t *cell_of_mode(json_t *j, const char *mode)
{
    json_t *c;
    size_t i;
    json_array_foreach(json_object_get(j, "cells"), i, c)
    {
        if (strcmp(tu_jstr(c, "mode"), mode) == 0)
            return json_incref(c);
    }
    cr_assert_fail("no %s cell: %s", mode, af_dump(j));
    return NULL;
}

/* Replay runs ops eagerly: in a head of inductor and eager cells (the
 * inductor one first, both diverged), the automatic replay takes the
 * eager cell, the same replay that a POST for it answers, and a POST for
 * the inductor cell is refused (409 compiled_cell), creating no job. */
Test(replay, only_eager_cells_are_replayed)
{
    af_start(NULL);
    builds();
    static const char *const m = "'models':['fake:ops__3'],'widths':['avx2'],"
                                 "'passes':['forward'],'modes':['inductor','eager']},"
                                 "'options':{'granularity':'op','iterations':0}}";
    json_t *c =
        af_post_job(201, "{'project':'p','commit':'c0c0c01','build':'clean','matrix':{%s", m);
    json_decref(af_wait_done(tu_jstr(c, "id")));
    json_t *h = af_post_job(201,
                            "{'project':'p','commit':'c0c0c02','control_commit':'c0c0c01',"
                            "'build':'pertop','matrix':{%s",
                            m);
    const char *head = tu_jstr(h, "id");
    json_decref(af_wait_done(head));
    char *l = auto_label(head);
    cr_assert_str_eq(l, "replayed 1");
    free(l);
    json_t *j = af_get_job(head);
    cr_assert_str_eq(tu_jstr(json_array_get(json_object_get(j, "cells"), 0), "mode"), "inductor");
    json_t *ind = cell_of_mode(j, "inductor"), *eag = cell_of_mode(j, "eager");
    char pi[256], pe[256];
    snprintf(pi, sizeof pi, "/v1/jobs/%s/cells/%s/replay", head, tu_jstr(ind, "id"));
    snprintf(pe, sizeof pe, "/v1/jobs/%s/cells/%s/replay", head, tu_jstr(eag, "id"));
    /* the automatic replay and its isolated pair, all done */
    json_t *rep = settled(pe);
    const struct jw_want w[] = {JW_S("op", OP), JW_S("conclusion", "kernel_changed")};
    jw_expect_all(rep, w);
    int jobs = af_count_jobs();
    af_expect_call_error("POST", pi, "{}", 409, "compiled_cell", NULL);
    af_expect_call_error("POST", pi, "{'op':'" OP "'}", 409, "compiled_cell", NULL);
    af_expect_get_error(pi, 404, "no_replay");
    long st;
    json_t *r = af_call("POST", pe, "{}", &st);
    cr_assert_eq(st, 202, "%s", af_dump(r));
    cr_assert_str_eq(jw_str(r, "head.job"), jw_str(rep, "head.job"), "the automatic replay's");
    cr_assert_eq(af_count_jobs(), jobs, "no job was created");
    json_decref(r);
    json_decref(rep);
    json_decref(ind);
    json_decref(eag);
    json_decref(j);
    json_decref(c);
    json_decref(h);
}

/* auto replays at most 4 cells of a job, always every one: 6 cells
 * diverged at layer1's op (three models at default and avx2). */
Test(replay, auto_replays_four_cells_and_always_every_one)
{
    af_start(NULL);
    builds();
    static const char *const models = "\"fake:ops__2\",\"fake:ops__3\",\"fake:ops__4\"";
    static const char *const widths = "\"default\",\"avx2\"";
    char *ctl = ops_job("clean", "c0c0c01", NULL, models, widths,
                        "{\"granularity\":\"op\",\"iterations\":0}");
    char *a = ops_job("pertop", "c0c0c02", "c0c0c01", models, widths,
                      "{\"granularity\":\"op\",\"iterations\":0}");
    char *b = ops_job("pertop", "c0c0c03", "c0c0c01", models, widths,
                      "{\"granularity\":\"op\",\"iterations\":0,\"replay\":\"always\"}");
    char *la = auto_label(a), *lb = auto_label(b);
    cr_assert_str_eq(la, "replayed 4");
    cr_assert_str_eq(lb, "replayed 6");
    free(la);
    free(lb);
    free(ctl);
    free(a);
    free(b);
}

/* capctl repro: the replay, what it found, and the archive written where
 * --output says; a cell with nothing to replay exits 2 saying why. */
Test(replay, capctl_repro_writes_the_archive)
{
    af_start(NULL);
    char *ctl, *head = pair("pertop", &ctl);
    json_t *j = af_get_job(head);
    const char *cell = tu_jstr(json_array_get(json_object_get(j, "cells"), 0), "id");
    char args[512], *out = NULL, tar[300];
    snprintf(tar, sizeof tar, "%s/out.tar", af_dir);
    snprintf(args, sizeof args, "repro %s %s --output %s --wait-timeout 120", head, cell, tar);
    int rc = af_capctl(&af_capd, args, &out);
    cr_assert_eq(rc, 0, "capctl %s: exit %d: %s", args, rc, out);
    cr_assert(strstr(out, "replaying " OP) && strstr(out, "kernel_changed") &&
                  strstr(out, "wrote ") && strstr(out, "tar xf"),
              "%s", out);
    free(out);
    char *bytes = tu_slurp(tar);
    cr_assert(strlen(bytes) > 0 && strcmp(bytes, "repro/inputs/arg.0.npy") == 0,
              "the archive starts with the first argument's header: %.40s", bytes);
    free(bytes);
    json_decref(j);
    /* the control job has no control: nothing to replay */
    j = af_get_job(ctl);
    snprintf(args, sizeof args, "repro %s %s", ctl,
             tu_jstr(json_array_get(json_object_get(j, "cells"), 0), "id"));
    rc = af_capctl(&af_capd, args, &out);
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "no_control"), "%s", out);
    free(out);
    json_decref(j);
    free(ctl);
    free(head);
}
