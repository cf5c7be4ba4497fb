/*
 * tests/test_api_jobs.c - the REST API v1 end to end, /v1/jobs
 * (api/api_jobs.c): the matrix expanded, invalid jobs, option bounds, the
 * cell limit, idempotency keys, the queue limit, listing with filters and
 * cursors, and cancel. The fixture (a real capd per test): api_fixtures.h.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/testutil.h"

TestSuite(api_jobs, AF_SUITE);
TestSuite(api_list, AF_SUITE);
TestSuite(api_cancel, AF_SUITE);

/* ================================================================ jobs */

Test(api_jobs, create_expands_matrix_in_order_with_defaults)
{
    af_start(NULL);
    af_hang_build("b");
    json_t *j = af_post_job(201, "{'project':'pytorch','commit':'3f2a9c1','branch':'feature/x',"
                                 "'build':'b','control_commit':'1b0e7d2',"
                                 "'matrix':{'models':['mlp','cnn'],'widths':['default','avx2',"
                                 "'avx512'],'passes':['forward','backward']},"
                                 "'options':{'iterations':5,'capture':'sample'},"
                                 "'labels':{'ci.run':'4711'},'provenance':{'tree':'clean'}}");
    const char *id = tu_jstr(j, "id");
    cr_assert(id && id[0] == 'j' && strlen(id) == 13, "job id %s", id);
    cr_assert_str_eq(tu_jstr(j, "project"), "pytorch");
    cr_assert_str_eq(tu_jstr(j, "commit"), "3f2a9c1");
    cr_assert_str_eq(tu_jstr(j, "branch"), "feature/x");
    cr_assert_str_eq(tu_jstr(j, "build"), "b");
    cr_assert_str_eq(tu_jstr(j, "control_commit"), "1b0e7d2");
    cr_assert_str_eq(tu_jstr(j, "state"), "queued");
    cr_assert(af_is_rfc3339(json_object_get(j, "created_at")));
    cr_assert(json_is_null(json_object_get(j, "finished_at")));
    cr_assert_str_eq(tu_jstr(json_object_get(j, "labels"), "ci.run"), "4711");
    cr_assert_str_eq(tu_jstr(json_object_get(j, "provenance"), "tree"), "clean");

    json_t *want_opts = json_loads(
        af_q("{'iterations':5,'warmup':3,'threads':1,'timeout_s':600,"
             "'seed':0,'batch':2,'sample_size':256,'timing_min_ms':50,'timing_processes':5,"
             "'timing_pairs':4,'max_timing_rounds':3,"
             "'capture':'sample','dtype':'float32','device':'cpu',"
             "'granularity':'module','replay':'auto','compiler_bisect':'auto','profile':'auto',"
             "'reference':'none'}"),
        0, NULL);
    char *os = af_dump(json_object_get(j, "options"));
    cr_assert(json_equal(json_object_get(j, "options"), want_opts), "options %s", os);
    free(os);
    json_decref(want_opts);

    static const char *const models[] = {"mlp", "cnn"};
    static const char *const widths[] = {"default", "avx2", "avx512"};
    static const char *const passes[] = {"forward", "backward"};
    json_t *cells = json_object_get(j, "cells");
    cr_assert_eq(json_array_size(cells), 12);
    size_t i = 0;
    for (int m = 0; m < 2; m++)
        for (int w = 0; w < 3; w++)
            for (int p = 0; p < 2; p++, i++) {
                json_t *c = json_array_get(cells, i);
                cr_assert_str_eq(tu_jstr(c, "model"), models[m], "cell %zu", i);
                cr_assert_str_eq(tu_jstr(c, "width"), widths[w], "cell %zu", i);
                cr_assert_str_eq(tu_jstr(c, "pass"), passes[p], "cell %zu", i);
                cr_assert_str_eq(tu_jstr(c, "state"), "queued");
                const char *cid = tu_jstr(c, "id");
                cr_assert(cid && cid[0] == 'c' && strlen(cid) == 13);
                for (size_t k = 0; k < i; k++)
                    cr_assert_str_neq(tu_jstr(json_array_get(cells, k), "id"), cid);
            }
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "counts"), "queued")), 12);

    /* The stored job reads back the same (the first cell may have started). */
    json_t *g = af_wait_cell(id, 0, "running", 20);
    cr_assert_str_eq(tu_jstr(g, "state"), "running");
    cr_assert(json_equal(json_object_get(g, "matrix"), json_object_get(j, "matrix")));
    cr_assert(json_equal(json_object_get(g, "options"), json_object_get(j, "options")));
    for (i = 0; i < 12; i++)
        cr_assert_str_eq(tu_jstr(json_array_get(json_object_get(g, "cells"), i), "id"),
                         tu_jstr(json_array_get(cells, i), "id"));
    cr_assert_eq(af_count_jobs(), 1);
    json_decref(g);
    json_decref(j);

    /* Without options/labels/branch/control: null and {} and defaults. */
    j = af_post_job(201, "{'project':'p','commit':'abcdef1','build':'b','matrix':{'models':['mlp'],"
                         "'widths':['native'],'passes':['backward']}}");
    cr_assert(json_is_null(json_object_get(j, "branch")));
    cr_assert(json_is_null(json_object_get(j, "control_commit")));
    cr_assert_eq(json_object_size(json_object_get(j, "labels")), 0);
    cr_assert_null(json_object_get(j, "provenance"));
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "options"), "iterations")),
                 20);
    cr_assert_str_eq(tu_jstr(json_object_get(j, "options"), "capture"), "stats");
    json_decref(j);
    cr_assert_eq(af_count_jobs(), 2);
}

/* The job every refusal below starts from: valid, on build "roots". */
static const char valid_job[] = "{'project':'p','commit':'abcdef1','build':'roots','matrix':{"
                                "'models':['mlp'],'widths':['default'],'passes':['forward']}}";

/* Sets member PATH (dotted, objects made on the way) of JOB to V (a
 * reference it takes), or deletes it when V is NULL. */
static void job_set(json_t *job, const char *path, json_t *v)
{
    char key[64];
    const char *dot;
    while ((dot = strchr(path, '.')) != NULL) {
        snprintf(key, sizeof key, "%.*s", (int)(dot - path), path);
        json_t *in = json_object_get(job, key);
        if (!json_is_object(in)) {
            in = json_object();
            json_object_set_new(job, key, in);
        }
        job = in;
        path = dot + 1;
    }
    if (v)
        json_object_set_new(job, path, v);
    else
        json_object_del(job, path);
}

/* POSTs JOB and checks the refusal: 400, error CODE naming FIELD. */
static void expect_job_refused(json_t *job, const char *code, const char *field)
{
    char *body = af_dump(job);
    long st;
    json_t *j = af_call("POST", "/v1/jobs", body, &st);
    char *s = af_dump(j);
    cr_assert_eq(st, 400, "%s -> %ld %s", body, st, s);
    free(s);
    af_expect_error(j, st, 400, code, field);
    json_decref(j);
    free(body);
}

/* Every invalid job is a 400 naming the offending field, and stores
 * nothing. Each refusal is the valid job with one member changed: BAD maps
 * an error code to the fields it names, each to the values that member is
 * set to in turn; MISSING lists the members whose absence is refused. */
Test(api_jobs, invalid_jobs_400_name_the_field)
{
    af_start(NULL);
    af_hang_build("roots");
    af_add_build("plain", "/bin/true", false);
    static const char bad[] =
        "{'invalid_field':{"
        "'options.iterations':['5',1.5,true,100001,-1],'options.warmup':[10001],"
        "'options.timing_processes':[0,65],'options.timing_pairs':[-1,65],"
        "'options.max_timing_rounds':[0,9],'options.threads':[0,1025],"
        "'options.timeout_s':[0,86401],'options.seed':[-1],'options.batch':[4097],"
        "'options.sample_size':[0],'options.capture':['all',1],'options.dtype':['int8'],"
        "'options.device':['tpu'],'options.granularity':['kernel',null],"
        "'options':[[],null],'options.compare':[5],'options.compare.alpha':[2],"
        "'matrix.widths':[['avx9'],['AVX2'],[]],'matrix.passes':[['sideways'],[]],"
        "'matrix.modes':[['jit'],['Inductor'],[],'eager',[1]],"
        "'matrix.models':[['nosuch'],['../x:y'],['a.b:c:d'],['1a:f'],[],[1],'mlp'],"
        "'matrix':[[]],'project':['a b'],"
        "'commit':['xyz1234','abcdef',1234567,"
        "'00000000000000000000000000000000000000000000000000000000000000000'],"
        "'control_commit':['zz',5],'branch':['a..b','',5,'a\\nb'],'build':['a b'],"
        "'labels':[[],{'a':1},{'bad key':'x'}],'provenance':[5,[]]},"
        "'unknown_field':{'bogus':[1],'options.foo':[1],'matrix.x':[[]]},"
        "'duplicate':{'matrix.models':[['mlp','mlp']],'matrix.widths':[['avx2','default','avx2']],"
        "'matrix.passes':[['forward','forward']],'matrix.modes':[['eager','eager']]},"
        "'no_gpu':{'options.device':['gpu']},'unknown_build':{'build':['nosuch']}}";
    static const char *const missing[] = {"matrix.passes", "matrix", "project", "commit", "build"};
    json_t *spec = json_loads(af_q(bad), 0, NULL);
    cr_assert_not_null(spec);
    const char *code, *field;
    json_t *fields, *values, *v;
    size_t i;
    json_object_foreach(spec, code, fields)
    {
        json_object_foreach(fields, field, values)
        {
            json_array_foreach(values, i, v)
            {
                json_t *job = json_loads(af_q(valid_job), 0, NULL);
                job_set(job, field, json_incref(v));
                expect_job_refused(job, code, field);
                json_decref(job);
            }
        }
    }
    json_decref(spec);
    for (i = 0; i < sizeof missing / sizeof missing[0]; i++) {
        json_t *job = json_loads(af_q(valid_job), 0, NULL);
        job_set(job, missing[i], NULL);
        expect_job_refused(job, "invalid_field", missing[i]);
        json_decref(job);
    }
    /* A user model (pkg.mod:make) needs a build with model roots. */
    json_t *job = json_loads(af_q(valid_job), 0, NULL);
    job_set(job, "build", json_string("plain"));
    job_set(job, "matrix.models", json_pack("[s]", "pkg.mod:make"));
    expect_job_refused(job, "invalid_field", "matrix.models");
    json_decref(job);
    cr_assert_eq(af_count_jobs(), 0, "an invalid job was stored");
    cr_assert_eq(af_running_cells(), 0);
}

/* The compile axis: modes multiply the cells, in order (a cell's modes
 * together), each cell says its mode, a job without modes is eager (the
 * cell limit counts modes: too_many_cells_default_limit). */
Test(api_jobs, modes_expand_the_matrix)
{
    af_start(NULL);
    af_hang_build("b");
    json_t *j = af_post_job(201, "{'project':'p','commit':'abcdef1','build':'b','matrix':{'models':"
                                 "['mlp'],'widths':['default','avx2'],'passes':['forward'],"
                                 "'modes':['eager','inductor','aot_eager']}}");
    json_t *cells = json_object_get(j, "cells");
    cr_assert_eq(json_array_size(cells), 6);
    static const char *const want[] = {"eager", "inductor", "aot_eager"};
    for (size_t i = 0; i < 6; i++) {
        json_t *c = json_array_get(cells, i);
        cr_assert_str_eq(tu_jstr(c, "mode"), want[i % 3], "cell %zu", i);
        cr_assert_str_eq(tu_jstr(c, "width"), i < 3 ? "default" : "avx2", "cell %zu", i);
    }
    json_decref(j);
    j = af_post_job(201, "{'project':'p','commit':'abcdef2','build':'b','matrix':{'models':"
                         "['mlp'],'widths':['default'],'passes':['forward']}}");
    cr_assert_str_eq(tu_jstr(json_array_get(json_object_get(j, "cells"), 0), "mode"), "eager");
    cr_assert_str_eq(json_string_value(
                         json_array_get(json_object_get(json_object_get(j, "matrix"), "modes"), 0)),
                     "eager", "the stored matrix names the default");
    json_decref(j);
    cr_assert_eq(af_count_jobs(), 2);
}

/* Options at their bounds are accepted (the refusals above are off by one). */
Test(api_jobs, options_at_bounds_accepted)
{
    af_start(NULL);
    af_hang_build("b");
    json_t *j = af_post_job(201, "{'project':'p','commit':'abcdef1','build':'b','matrix':{'models':"
                                 "['mlp'],'widths':['default'],'passes':['forward']},'options':{"
                                 "'iterations':100000,'warmup':0,'threads':1024,'timeout_s':86400,"
                                 "'seed':9223372036854775807,'batch':4096,'sample_size':65536,"
                                 "'timing_processes':64,'timing_pairs':64,'max_timing_rounds':8,"
                                 "'capture':'full','dtype':'bfloat16',"
                                 "'device':'cpu','granularity':'op'}}");
    json_t *o = json_object_get(j, "options");
    cr_assert_eq(json_integer_value(json_object_get(o, "timing_pairs")), 64);
    cr_assert_eq(json_integer_value(json_object_get(o, "max_timing_rounds")), 8);
    cr_assert_str_eq(tu_jstr(o, "granularity"), "op");
    cr_assert_eq(json_integer_value(json_object_get(o, "timing_processes")), 64);
    cr_assert_eq(json_integer_value(json_object_get(o, "seed")), INT64_MAX);
    cr_assert_eq(json_integer_value(json_object_get(o, "threads")), 1024);
    cr_assert_str_eq(tu_jstr(o, "dtype"), "bfloat16");
    json_decref(j);
    j = af_post_job(201, "{'project':'p','commit':'abcdef1','build':'b','matrix':{'models':"
                         "['mlp'],'widths':['default'],'passes':['forward']},'options':{"
                         "'iterations':0,'threads':1,'timeout_s':1,'batch':1,'sample_size':1}}");
    json_decref(j);
    cr_assert_eq(af_count_jobs(), 2);
}

/* The cell limit is max_cells_per_job (default 256): 256 cells are
 * accepted, 258 are refused naming the matrix. */
Test(api_jobs, too_many_cells_default_limit)
{
    af_start(NULL);
    af_hang_build("b");
    char models[4096] = "[";
    static const char *const zoo[] = {"mlp", "cnn", "transformer", "lstm", "embedding_bag"};
    for (int i = 0; i < 64; i++) {
        if (i < 5)
            snprintf(models + strlen(models), sizeof models - strlen(models), "%s'%s'",
                     i ? "," : "", zoo[i]);
        else
            snprintf(models + strlen(models), sizeof models - strlen(models), ",'pkg.m%d:make'", i);
    }
    strcat(models, "]");
    /* 64 x 2 x 2 = 256: at the limit. */
    json_t *j = af_post_job(201,
                            "{'project':'p','commit':'abcdef1','build':'b','matrix':{'models':%s,"
                            "'widths':['default','avx2'],'passes':['forward','backward']}}",
                            models);
    cr_assert_eq(json_array_size(json_object_get(j, "cells")), 256);
    json_decref(j);
    /* 43 x 3 x 2 = 258: over it. */
    char m43[4096];
    snprintf(m43, sizeof m43, "%s", models);
    char *cut = m43;
    for (int commas = 0; *cut && commas < 43; cut++)
        if (*cut == ',')
            commas++;
    strcpy(cut - 1, "]");
    long st;
    char *body;
    if (asprintf(&body,
                 "{'project':'p','commit':'abcdef2','build':'b','matrix':{'models':%s,"
                 "'widths':['default','avx2','avx512'],'passes':['forward','backward']}}",
                 m43) < 0)
        cr_assert_fail("asprintf");
    j = af_callq("POST", "/v1/jobs", body, &st);
    af_expect_error(j, st, 400, "too_many_cells", "matrix");
    cr_assert(strstr(tu_jstr(json_object_get(j, "error"), "message"), "258"),
              "message should give the cell count");
    json_decref(j);
    free(body);
    /* More than 64 entries in one axis is refused on its own. */
    char m65[4096];
    snprintf(m65, sizeof m65, "%s", models);
    strcpy(m65 + strlen(m65) - 1, ",'pkg.extra:make']");
    if (asprintf(&body,
                 "{'project':'p','commit':'abcdef2','build':'b','matrix':{'models':%s,"
                 "'widths':['default'],'passes':['forward']}}",
                 m65) < 0)
        cr_assert_fail("asprintf");
    af_expect_call_error("POST", "/v1/jobs", body, 400, "invalid_field", "matrix.models");
    free(body);
    /* 64 x 2 x 2 x 2 modes = 512: over it too */
    if (asprintf(&body,
                 "{'project':'p','commit':'abcdef3','build':'b','matrix':{'models':%s,"
                 "'widths':['default','avx2'],'passes':['forward','backward'],'modes':['eager',"
                 "'inductor']}}",
                 models) < 0)
        cr_assert_fail("asprintf");
    af_expect_call_error("POST", "/v1/jobs", body, 400, "too_many_cells", "matrix");
    free(body);
    cr_assert_eq(af_count_jobs(), 1);
}

Test(api_jobs, idempotency_key)
{
    af_start(NULL);
    af_hang_build("b");
    const char *body = af_q("{'project':'p','commit':'abcdef1','build':'b','matrix':{'models':"
                            "['mlp'],'widths':['default'],'passes':['forward']}}");
    char *b1 = strdup(body);
    const char *h1[] = {"Content-Type: application/json", "Idempotency-Key: ci-run-4711", NULL};
    long st;
    json_t *a = af_raw("POST", "/v1/jobs", b1, strlen(b1), h1, &st, NULL);
    cr_assert_eq(st, 201);
    json_t *b = af_raw("POST", "/v1/jobs", b1, strlen(b1), h1, &st, NULL);
    cr_assert_eq(st, 200, "a retry with the same key and body returns the job");
    cr_assert_str_eq(tu_jstr(b, "id"), tu_jstr(a, "id"));
    cr_assert_eq(af_count_jobs(), 1);

    /* Same key, different body: 409 naming the header, nothing stored. */
    char *b2 = strdup(af_q("{'project':'p','commit':'abcdef2','build':'b','matrix':{'models':"
                           "['mlp'],'widths':['default'],'passes':['forward']}}"));
    json_t *c = af_raw("POST", "/v1/jobs", b2, strlen(b2), h1, &st, NULL);
    af_expect_error(c, st, 409, "idempotency_conflict", "Idempotency-Key");
    cr_assert_eq(af_count_jobs(), 1);

    /* Another key is another job. */
    const char *h2[] = {"Content-Type: application/json", "Idempotency-Key: ci-run-4712", NULL};
    json_t *d = af_raw("POST", "/v1/jobs", b2, strlen(b2), h2, &st, NULL);
    cr_assert_eq(st, 201);
    cr_assert_str_neq(tu_jstr(d, "id"), tu_jstr(a, "id"));
    /* No key: every post is a new job. */
    json_t *e = af_call("POST", "/v1/jobs", b1, &st);
    cr_assert_eq(st, 201);
    cr_assert_str_neq(tu_jstr(e, "id"), tu_jstr(a, "id"));
    cr_assert_eq(af_count_jobs(), 3);

    /* A key with a control character is refused. */
    const char *h3[] = {"Content-Type: application/json", "Idempotency-Key: a\tb", NULL};
    json_t *f = af_raw("POST", "/v1/jobs", b1, strlen(b1), h3, &st, NULL);
    af_expect_error(f, st, 400, "invalid_header", "Idempotency-Key");
    /* An invalid body with a used key is still judged as a body first. */
    json_t *g = af_raw("POST", "/v1/jobs", "{}", 2, h1, &st, NULL);
    cr_assert_eq(st, 400);
    cr_assert_eq(af_count_jobs(), 3);
    json_decref(a);
    json_decref(b);
    json_decref(c);
    json_decref(d);
    json_decref(e);
    json_decref(f);
    json_decref(g);
    free(b1);
    free(b2);
}

Test(api_jobs, get_unknown_job_404)
{
    af_start(NULL);
    static const char *const paths[] = {"/v1/jobs/jdoesnotexist", "/v1/jobs/x",
                                        "/v1/jobs/j'%20OR%201=1"};
    for (size_t i = 0; i < 3; i++) {
        long st;
        af_expect_get_error(paths[i], 404, "not_found");
        char p[128];
        snprintf(p, sizeof p, "%s/cancel", paths[i]);
        json_t *j = af_call("POST", p, NULL, &st);
        af_expect_error(j, st, 404, "not_found", NULL);
        json_decref(j);
    }
}

/* max_queued_jobs (from the config file) answers 429 past the limit. */
Test(api_jobs, queue_limit_429)
{
    af_ensure_dir();
    const char *cfg = af_write_file("capd.json", "{\"max_queued_jobs\":2}", 0644);
    const char *extra[] = {"--config", cfg, NULL};
    af_start(extra);
    af_hang_build("b");
    free(af_submit1("b", "abcdef1"));
    free(af_submit1("b", "abcdef2"));
    long st;
    json_t *j = af_callq("POST", "/v1/jobs",
                         "{'project':'p','commit':'abcdef3','build':'b','matrix':{'models':['mlp'],"
                         "'widths':['default'],'passes':['forward']}}",
                         &st);
    af_expect_error(j, st, 429, "too_many_jobs", NULL);
    json_decref(j);
    cr_assert_eq(af_count_jobs(), 2);
}

/* =============================================================== list */

static void expect_ids(const char *query, const char *const *ids, size_t n)
{
    char path[256];
    long st;
    snprintf(path, sizeof path, "/v1/jobs?%s", query);
    json_t *j = af_get(path, &st);
    char *s = af_dump(j);
    cr_assert_eq(st, 200, "%s -> %ld %s", path, st, s);
    json_t *jobs = json_object_get(j, "jobs");
    cr_assert_eq(json_array_size(jobs), n, "%s: %zu jobs, want %zu: %s", path,
                 json_array_size(jobs), n, s);
    for (size_t i = 0; i < n; i++) {
        json_t *job = json_array_get(jobs, i);
        cr_assert_str_eq(tu_jstr(job, "id"), ids[i], "%s: job %zu", path, i);
        cr_assert_null(json_object_get(job, "cells"), "listed jobs carry counts, not cells");
        cr_assert(json_is_object(json_object_get(job, "counts")));
    }
    cr_assert(json_is_null(json_object_get(j, "next_cursor")), "%s: %s", path, s);
    free(s);
    json_decref(j);
}

Test(api_list, filters)
{
    af_start(NULL);
    af_hang_build("b1");
    af_add_build("b2", af_write_file("hang.sh", AF_HANG_SH, 0755), false);
    static const char *const spec[][4] = {
        /* project, commit, branch, build */
        {"p1", "aaaaaaa", "main", "b1"}, {"p1", "bbbbbbb", "main", "b2"},
        {"p2", "aaaaaaa", "dev", "b1"},  {"p2", "ccccccc", NULL, "b2"},
        {"p1", "aaaaaaa", "dev", "b2"},
    };
    char *id[5];
    for (int i = 0; i < 5; i++) {
        char br[64] = "";
        if (spec[i][2])
            snprintf(br, sizeof br, "'branch':'%s',", spec[i][2]);
        json_t *j = af_post_job(201,
                                "{'project':'%s','commit':'%s',%s'build':'%s','matrix':{'models':"
                                "['mlp'],'widths':['default'],'passes':['forward']}}",
                                spec[i][0], spec[i][1], br, spec[i][3]);
        id[i] = af_job_id(j);
    }
    json_decref(af_wait_cell(id[0], 0, "running", 20));
    {
        const char *w[] = {id[4], id[3], id[2], id[1], id[0]};
        expect_ids("", w, 5);
    }
    {
        const char *w[] = {id[4], id[2], id[0]};
        expect_ids("commit=aaaaaaa", w, 3);
    }
    {
        const char *w[] = {id[1], id[0]};
        expect_ids("branch=main", w, 2);
    }
    {
        const char *w[] = {id[4], id[2]};
        expect_ids("branch=dev", w, 2);
    }
    {
        const char *w[] = {id[2], id[0]};
        expect_ids("build=b1", w, 2);
    }
    {
        const char *w[] = {id[3], id[2]};
        expect_ids("project=p2", w, 2);
    }
    {
        const char *w[] = {id[0]};
        expect_ids("state=running", w, 1);
    }
    {
        const char *w[] = {id[4], id[3], id[2], id[1]};
        expect_ids("state=queued", w, 4);
    }
    expect_ids("state=done", NULL, 0);
    expect_ids("state=cancelled", NULL, 0);
    {
        const char *w[] = {id[4]};
        expect_ids("commit=aaaaaaa&build=b2", w, 1);
    }
    {
        const char *w[] = {id[2]};
        expect_ids("project=p2&branch=dev&state=queued", w, 1);
    }
    expect_ids("commit=ddddddd", NULL, 0);
    expect_ids("project=p3", NULL, 0);
    expect_ids("build=b3", NULL, 0);
    expect_ids("branch=feature%2Fx", NULL, 0);

    long st;
    json_t *j = af_get("/v1/jobs?state=bogus", &st);
    af_expect_error(j, st, 400, "invalid_query", "state");
    json_decref(j);
    for (int i = 0; i < 5; i++)
        free(id[i]);
}

Test(api_list, cursor_pagination_newest_first)
{
    af_start(NULL);
    af_hang_build("b");
    enum { N = 7 };
    char *id[N];
    for (int i = 0; i < N; i++) {
        char commit[16];
        snprintf(commit, sizeof commit, "abcdef%d", i);
        id[i] = af_submit1("b", commit);
    }
    /* Pages of 3: 3 + 3 + 1, newest first, no duplicates. */
    char path[256] = "/v1/jobs?limit=3";
    int seen = 0, pages = 0;
    for (;;) {
        long st;
        json_t *j = af_get(path, &st);
        cr_assert_eq(st, 200);
        json_t *jobs = json_object_get(j, "jobs");
        pages++;
        cr_assert_eq(json_array_size(jobs), pages < 3 ? 3 : 1, "page %d", pages);
        for (size_t i = 0; i < json_array_size(jobs); i++, seen++)
            cr_assert_str_eq(tu_jstr(json_array_get(jobs, i), "id"), id[N - 1 - seen],
                             "item %d out of order or repeated", seen);
        const char *c = tu_jstr(j, "next_cursor");
        if (!c) {
            json_decref(j);
            break;
        }
        cr_assert(pages < 3, "a cursor after the last page");
        snprintf(path, sizeof path, "/v1/jobs?limit=3&cursor=%s", c);
        json_decref(j);
    }
    cr_assert_eq(seen, N);
    cr_assert_eq(pages, 3);

    /* A page that ends exactly at the last job has no cursor. */
    long st;
    json_t *j = af_get("/v1/jobs?limit=7", &st);
    cr_assert_eq(json_array_size(json_object_get(j, "jobs")), 7);
    cr_assert(json_is_null(json_object_get(j, "next_cursor")));
    json_decref(j);
    /* Default limit (50) and the maximum (200) list everything here. */
    j = af_get("/v1/jobs", &st);
    cr_assert_eq(json_array_size(json_object_get(j, "jobs")), 7);
    json_decref(j);
    j = af_get("/v1/jobs?limit=200", &st);
    cr_assert_eq(st, 200);
    json_decref(j);
    /* Filters and the cursor combine. */
    j = af_get("/v1/jobs?limit=1&commit=abcdef3", &st);
    cr_assert_eq(json_array_size(json_object_get(j, "jobs")), 1);
    cr_assert(json_is_null(json_object_get(j, "next_cursor")));
    json_decref(j);

    static const char *const bad_limits[] = {"0", "201", "-1", "abc", "", "1x", "99999999999"};
    for (size_t i = 0; i < sizeof bad_limits / sizeof bad_limits[0]; i++) {
        snprintf(path, sizeof path, "/v1/jobs?limit=%s", bad_limits[i]);
        j = af_get(path, &st);
        af_expect_error(j, st, 400, "invalid_query", "limit");
        json_decref(j);
    }
    static const char *const bad_cursors[] = {"x", "s", "s-1", "r5", "s5x", "5", "", "s%20"};
    for (size_t i = 0; i < sizeof bad_cursors / sizeof bad_cursors[0]; i++) {
        snprintf(path, sizeof path, "/v1/jobs?cursor=%s", bad_cursors[i]);
        j = af_get(path, &st);
        af_expect_error(j, st, 400, "invalid_query", "cursor");
        json_decref(j);
    }
    for (int i = 0; i < N; i++)
        free(id[i]);
}

/* ============================================================= cancel */

Test(api_cancel, cancel_running_and_queued)
{
    af_start(NULL);
    af_hang_build("b");
    json_t *j1 =
        af_post_job(201, "{'project':'p','commit':'abcdef1','build':'b','matrix':{"
                         "'models':['mlp'],'widths':['default','avx2'],'passes':['forward']"
                         "}}");
    char *id1 = af_job_id(j1);
    char *id2 = af_submit1("b", "abcdef2");
    char *id3 = af_submit1("b", "abcdef3");
    json_decref(af_wait_cell(id1, 0, "running", 20));
    af_wait_running_cells(1);

    /* Cancel the running job: queued cells are cancelled at once. */
    char path[128];
    long st;
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id1);
    json_t *c = af_call("POST", path, NULL, &st);
    cr_assert_eq(st, 202);
    cr_assert_str_eq(tu_jstr(c, "id"), id1);
    cr_assert_str_eq(tu_jstr(c, "state"), "cancelled");
    cr_assert_str_eq(af_cell_state(c, 1), "cancelled");
    cr_assert_str_eq(tu_jstr(json_array_get(json_object_get(c, "cells"), 1), "reason"),
                     "job cancelled");
    json_decref(c);
    /* The running cell's process is stopped and the cell cancelled. */
    json_t *j = af_wait_cell(id1, 0, "cancelled", 20);
    cr_assert_str_eq(tu_jstr(j, "state"), "cancelled");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "counts"), "cancelled")), 2);
    cr_assert_eq(json_object_size(json_object_get(j, "counts")), 1);
    json_t *c0 = json_array_get(json_object_get(j, "cells"), 0);
    cr_assert_eq(json_integer_value(json_object_get(c0, "attempts")), 1);
    cr_assert(af_is_rfc3339(json_object_get(c0, "finished_at")));
    cr_assert(af_is_rfc3339(json_object_get(j, "finished_at")));
    json_decref(j);

    /* The scheduler moves on to the next job. */
    json_decref(af_wait_cell(id2, 0, "running", 20));
    af_wait_running_cells(1);

    /* A second cancel is a conflict. */
    c = af_call("POST", path, NULL, &st);
    af_expect_error(c, st, 409, "job_finished", NULL);
    json_decref(c);

    /* Cancelling a job that never started cancels every cell at once. */
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id3);
    c = af_call("POST", path, NULL, &st);
    cr_assert_eq(st, 202);
    cr_assert_str_eq(tu_jstr(c, "state"), "cancelled");
    cr_assert_str_eq(af_cell_state(c, 0), "cancelled");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(c, "counts"), "cancelled")), 1);
    json_decref(c);
    json_t *j2 = af_get_job(id2);
    cr_assert_str_eq(af_cell_state(j2, 0), "running",
                     "cancelling a queued job must not touch the running one");
    json_decref(j2);
    cr_assert_eq(af_running_cells(), 1);

    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id2);
    c = af_call("POST", path, NULL, &st);
    cr_assert_eq(st, 202);
    json_decref(c);
    af_wait_running_cells(0);
    json_decref(af_wait_cell(id2, 0, "cancelled", 20));
    {
        const char *w[] = {id3, id2, id1};
        expect_ids("state=cancelled", w, 3);
    }
    free(id1);
    free(id2);
    free(id3);
    cr_assert_eq(tu_capd_stop(&af_capd), 0);
}

Test(api_cancel, cancel_finished_job_409)
{
    af_start(NULL);
    af_add_build("t", "/bin/true", false);
    char *id = af_submit1("t", "abcdef1");
    json_t *j = af_wait_done(id);
    cr_assert_str_eq(tu_jstr(j, "state"), "done");
    json_t *c0 = json_array_get(json_object_get(j, "cells"), 0);
    cr_assert_str_eq(tu_jstr(c0, "state"), "failed");
    cr_assert_eq(json_integer_value(json_object_get(c0, "exit_code")), 0);
    cr_assert(strstr(tu_jstr(c0, "reason"), "end frame"), "reason %s", tu_jstr(c0, "reason"));
    json_decref(j);
    char path[128];
    long st;
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
    j = af_call("POST", path, NULL, &st);
    af_expect_error(j, st, 409, "job_finished", NULL);
    json_decref(j);
    j = af_get_job(id);
    cr_assert_str_eq(tu_jstr(j, "state"), "done", "a refused cancel changed the job");
    json_decref(j);
    free(id);
}
