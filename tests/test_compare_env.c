/*
 * tests/test_compare_env.c - the comparison's environment section
 * ("what else differs"), from the recorded runner fingerprints in
 * tests/fixtures/.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "compare/cmp.h"
#include "tests/helpers/common/cmp_fixtures.h"
#include "tests/helpers/common/cmp_records.h"
#include "tests/helpers/common/json_want.h"
#include "tests/helpers/common/text_want.h"

TestSuite(environment, .init = reset_pool);

static json_t *fixture_fp(const char *name)
{
    char path[512];
    json_error_t e;
    snprintf(path, sizeof path, "%s/tests/fixtures/%s", CAPD_SOURCE_DIR, name);
    json_t *fp = json_load_file(path, 0, &e);
    cr_assert(json_is_object(fp), "%s: %s", path, e.text);
    return fp;
}

static struct cmp_cell *fp_cell(struct cmp_side *s, const char *width, const json_t *fp)
{
    struct cmp_cell *c = mlp_cell(s, width, NULL, "ok");
    cr_assert_eq(cmp_cell_set_fingerprint(c, fp), 0);
    return c;
}

/* The avx2 mlp cell on each side with fingerprints CFP and HFP. The cells
 * keep copies: the caller still owns the fingerprints. */
static struct duo duo_fp(const json_t *cfp, const json_t *hfp)
{
    struct duo s = duo_new();
    s.cc = fp_cell(s.c, "avx2", cfp);
    s.hc = fp_cell(s.h, "avx2", hfp);
    return s;
}

/* duo_fp, and a default mlp cell on each side with the same fingerprints. */
static struct duo duo_fp_widths(const json_t *cfp, const json_t *hfp)
{
    struct duo s = duo_fp(cfp, hfp);
    fp_cell(s.c, "default", cfp);
    fp_cell(s.h, "default", hfp);
    return s;
}

/* The difference entry for FIELD, or NULL. */
static json_t *env_diff(json_t *r, const char *field)
{
    return jw_find(jw_path(r, "environment.differences"), "field", field);
}

static const char *dstr(json_t *d, const char *k)
{
    cr_assert_not_null(d);
    return json_string_value(json_object_get(d, k));
}

static int group_rank(const char *g)
{
    static const char *const order[] = {"build",       "libraries", "threads", "cpu",
                                        "environment", "python",    "runner",  "other"};
    for (int i = 0; i < 8; i++)
        if (strcmp(g, order[i]) == 0)
            return i;
    cr_assert_fail("unknown group %s", g);
    return -1;
}

/* Entries come group by group in the order of likely numeric impact. */
static void assert_grouped(json_t *r)
{
    size_t i;
    json_t *d;
    int last = -1;
    json_array_foreach(jw_path(r, "environment.differences"), i, d)
    {
        int g = group_rank(dstr(d, "group"));
        cr_assert_geq(g, last, "entry %zu (%s) out of group order", i, dstr(d, "field"));
        last = g;
    }
}

Test(environment, identical_fingerprints_give_an_empty_section)
{
    json_t *fp = fixture_fp("fingerprint-debian-torch-1.13.json");
    json_t *copy = json_deep_copy(fp);
    struct duo s = duo_fp(fp, copy);
    json_decref(fp);
    json_decref(copy);
    json_t *r = duo_compare(&s, NULL);
    static const struct jw_want w[] = {
        JW_I("environment.pairs_compared", 1),
        JW_I("environment.pairs_without_fingerprint", 0),
        JW_S("environment.premise", "ok"),
    };
    cr_assert_eq(json_array_size(jw_path(r, "environment.differences")), 0);
    jw_expect_all(r, w);
    /* torch fields, every config line and build setting, cpu, env, ... */
    cr_assert_gt(ji(r, "environment.fields_compared"), 60, "%lld",
                 ji(r, "environment.fields_compared"));
    char *md = cmp_result_to_markdown(r), *txt = cmp_result_to_text(r);
    cr_assert_null(strstr(md, "What else differs"), "%s", md);
    cr_assert_null(strstr(txt, "What else differs"), "%s", txt);
    free(md);
    free(txt);
    duo_free(&s, r);
}

Test(environment, section_in_every_result)
{
    struct duo s = duo_mlp(NULL, "ok");
    json_t *r = duo_compare(&s, NULL);
    cr_assert(json_is_object(jw_path(r, "environment")));
    static const struct jw_want w[] = {
        JW_I("environment.pairs_compared", 0),
        JW_I("environment.pairs_without_fingerprint", 1),
        JW_I("environment.fields_compared", 0),
    };
    jw_expect_all(r, w);
    cr_assert_eq(json_array_size(jw_path(r, "environment.differences")), 0);
    cr_assert_eq(json_array_size(jw_path(r, "environment.inconsistent")), 0);
    duo_free(&s, r);
}

Test(environment, two_torch_builds)
{
    json_t *a = fixture_fp("fingerprint-debian-torch-1.13.json");
    json_t *b = fixture_fp("fingerprint-pip-torch-2.1-cpu.json");
    struct duo s = duo_fp(a, b);
    json_decref(a);
    json_decref(b);
    json_t *r = duo_compare(&s, NULL);
    assert_grouped(r);
    json_t *d = json_array_get(jw_path(r, "environment.differences"), 0);
    cr_assert_str_eq(dstr(d, "field"), "torch.version", "the torch version leads");
    cr_assert_str_eq(dstr(d, "control"), "1.13.0a0");
    cr_assert_str_eq(dstr(d, "head"), "2.1.0+cpu");
    cr_assert_str_eq(dstr(d, "change"), "changed");
    cr_assert_eq(json_integer_value(json_object_get(d, "cells")), 1);
    cr_assert_str_eq(dstr(env_diff(r, "torch.git_version"), "head"),
                     "7bcf7da3a268b435777fe87c7794c382f444e86d");
    /* each build setting on its own, libraries grouped as libraries */
    d = env_diff(r, "build_settings.BLAS_INFO");
    cr_assert_str_eq(dstr(d, "group"), "libraries");
    cr_assert_str_eq(dstr(d, "control"), "generic");
    cr_assert_str_eq(dstr(d, "head"), "mkl");
    cr_assert_str_eq(dstr(env_diff(r, "build_settings.BUILD_TYPE"), "group"), "build");
    cr_assert_str_eq(dstr(env_diff(r, "build_settings.USE_MKL"), "change"), "added");
    cr_assert_str_eq(dstr(env_diff(r, "build.GCC"), "head"), "GCC 9.3");
    d = env_diff(r, "build.Intel(R) MKL-DNN");
    cr_assert_str_eq(dstr(d, "group"), "libraries");
    cr_assert_str_eq(dstr(d, "control"), "Intel(R) MKL-DNN v2.6.3 (Git Hash N/A)");
    cr_assert_str_eq(dstr(env_diff(r, "build.NNPACK"), "change"), "added");
    cr_assert_str_eq(dstr(env_diff(r, "parallel.mkl_get_max_threads()"), "group"), "threads");
    cr_assert_str_eq(dstr(env_diff(r, "python.executable"), "group"), "python");
    cr_assert_str_eq(dstr(env_diff(r, "torchvision"), "head"), "0.16.0+cpu");
    /* equal fields and the raw texts are not listed */
    cr_assert_null(env_diff(r, "build.OpenMP"));
    cr_assert_null(env_diff(r, "build.CPU capability usage"));
    cr_assert_null(env_diff(r, "build_settings.USE_OPENMP"));
    cr_assert_null(env_diff(r, "torch.config"));
    cr_assert_null(env_diff(r, "torch.config_sha256"));
    cr_assert_null(env_diff(r, "cpu.flags"));
    cr_assert_null(env_diff(r, "env.PYTHONPATH"));
    /* the libraries' group opens with the BLAS, then LAPACK */
    size_t k;
    json_array_foreach(jw_path(r, "environment.differences"), k, d)
    {
        if (strcmp(dstr(d, "group"), "libraries") == 0)
            break;
    }
    cr_assert_str_eq(dstr(d, "field"), "build_settings.BLAS_INFO");
    cr_assert_str_eq(dstr(json_array_get(jw_path(r, "environment.differences"), k + 1), "field"),
                     "build_settings.LAPACK_INFO");

    char *md = cmp_result_to_markdown(r);
    const char *blk = strstr(md, "\n### What else differs\n");
    cr_assert_not_null(blk, "%s", md);
    cr_assert(strstr(md, "## capd comparison: pass\n") < blk, "after the verdict: %s", md);
    cr_assert(strstr(blk, "- build `torch.version`: `1.13.0a0` -> `2.1.0+cpu`\n"), "%s", md);
    int items = 0;
    for (const char *p = blk; (p = strstr(p, "\n- ")) != NULL; p++)
        items++;
    cr_assert_leq(items, 13, "a short block: %s", md);
    cr_assert(strstr(blk, "- ... and "), "the rest is counted: %s", md);
    free(md);
    duo_free(&s, r);
}

/* A head whose build differs in more fields than the block holds still
 * shows its libraries and interpreter there: each group's first lines come
 * before the build's many settings fill it up. */
Test(environment, block_gives_every_group_its_first_lines)
{
    json_t *a = fixture_fp("fingerprint-debian-torch-1.13.json");
    json_t *b = fixture_fp("fingerprint-pip-torch-2.1-cpu.json");
    json_t *torch = json_object_get(b, "torch");
    for (int i = 0; i < 20; i++) {
        char k[32];
        snprintf(k, sizeof k, "extra_%02d", i);
        json_object_set_new(torch, k, json_string("x"));
    }
    struct duo s = duo_fp(a, b);
    json_decref(a);
    json_decref(b);
    json_t *r = duo_compare(&s, NULL);
    cr_assert_str_eq(dstr(env_diff(r, "torch.extra_19"), "group"), "build");
    char *txt = cmp_result_to_text(r);
    const char *tb = strstr(txt, "What else differs");
    cr_assert_not_null(tb, "%s", txt);
    cr_assert(strstr(tb, "  libraries build_settings.BLAS_INFO: generic -> mkl\n"), "%s", txt);
    cr_assert(strstr(tb, "  python python.executable: "), "%s", txt);
    cr_assert(strstr(tb, "  build torch.version: 1.13.0a0 -> 2.1.0+cpu\n") <
                  strstr(tb, "  libraries build_settings.BLAS_INFO"),
              "in the section's order: %s", txt);
    int lines = 0;
    for (const char *p = strchr(tb, '\n'); p && p[1] == ' '; p = strchr(p + 1, '\n'))
        lines++;
    int64_t total = json_array_size(jw_path(r, "environment.differences"));
    cr_assert_eq(lines, total > 12 ? 13 : total, "12 differences and the count of the rest: %s",
                 txt);
    free(txt);
    duo_free(&s, r);
}

Test(environment, perturbed_build_env_and_pythonpath)
{
    json_t *a = fixture_fp("fingerprint-debian-torch-1.13.json");
    json_t *b = json_deep_copy(a);
    json_t *benv = json_object_get(b, "env");
    json_object_set_new(benv, "PYTHONPATH",
                        json_string("/src/examples/perturbed-build:/opt/capd/runner"));
    json_object_set_new(benv, "OMP_NUM_THREADS", json_string("2"));
    /* Any variable of the cell's environment counts (the runner records
     * them all): one the head sets and the control does not is "added". */
    json_object_set_new(benv, "KMP_BLOCKTIME", json_string("0"));
    json_object_set_new(benv, "MKL_LICENSE_KEY", json_string("hunter2-secret-value"));
    json_object_set_new(json_object_get(a, "env"), "MKL_LICENSE_KEY",
                        json_string("an-older-secret-value"));
    struct duo s = duo_fp_widths(a, b);
    json_decref(a);
    json_decref(b);
    json_t *r = duo_compare(&s, NULL);
    assert_grouped(r);
    cr_assert_eq(ji(r, "environment.pairs_compared"), 2);
    json_t *d = env_diff(r, "env.PYTHONPATH");
    cr_assert_str_eq(dstr(d, "group"), "environment");
    cr_assert_str_eq(dstr(d, "control"), "/opt/capd/runner");
    cr_assert_str_eq(dstr(d, "head"), "/src/examples/perturbed-build:/opt/capd/runner");
    cr_assert_eq(json_integer_value(json_object_get(d, "cells")), 2, "both pairs, one entry");
    cr_assert_str_eq(dstr(env_diff(r, "env.OMP_NUM_THREADS"), "head"), "2");
    d = env_diff(r, "env.KMP_BLOCKTIME");
    cr_assert_str_eq(dstr(d, "change"), "added");
    cr_assert_str_eq(dstr(d, "head"), "0");
    d = env_diff(r, "env.MKL_LICENSE_KEY");
    cr_assert_str_eq(dstr(d, "change"), "changed");
    cr_assert(json_is_true(json_object_get(d, "redacted")));
    cr_assert_null(json_object_get(d, "control"));
    cr_assert_null(json_object_get(d, "head"));
    cr_assert_eq(json_array_size(jw_path(r, "environment.differences")), 4, "nothing else differs");

    char *all = json_dumps(r, 0), *md = cmp_result_to_markdown(r), *txt = cmp_result_to_text(r);
    const char *outs[] = {all, md, txt};
    for (int i = 0; i < 3; i++) {
        cr_assert_null(strstr(outs[i], "secret-value"), "a credential leaked: %s", outs[i]);
    }
    tw_expect_has(md,
                  "- environment `env.PYTHONPATH`: `/opt/capd/runner` -> "
                  "`/src/examples/perturbed-build:/opt/capd/runner`\n",
                  "- environment `env.MKL_LICENSE_KEY`: changed (value not shown)\n", NULL);
    cr_assert(strstr(txt, "  environment env.PYTHONPATH: /opt/capd/runner -> "
                          "/src/examples/perturbed-build:/opt/capd/runner\n"),
              "%s", txt);
    free(all);
    free(md);
    free(txt);
    duo_free(&s, r);
}

Test(environment, cells_of_one_side_that_disagree_break_the_premise)
{
    json_t *a = fixture_fp("fingerprint-debian-torch-1.13.json");
    json_t *other_cpu = json_deep_copy(a), *other_width = json_deep_copy(a);
    json_object_set_new(json_object_get(other_cpu, "cpu"), "model",
                        json_string("Intel(R) Xeon(R) Gold 6338"));
    json_object_set_new(json_object_get(other_cpu, "python"), "executable",
                        json_string("/opt/py/bin/python3"));
    /* width-dependent fields differ between cells by design */
    json_object_set_new(other_width, "cpu_capability", json_string("default"));
    json_object_set_new(json_object_get(other_width, "env"), "ATEN_CPU_CAPABILITY",
                        json_string("default"));
    struct duo s = duo_fp(a, a);
    fp_cell(s.c, "default", other_width);
    fp_cell(s.h, "default", other_width);
    json_decref(a);
    json_decref(other_width);
    json_t *r = duo_compare(&s, NULL);
    cr_assert_str_eq(jw_str(r, "environment.premise"), "ok", "width fields do not count");
    cr_assert_eq(json_array_size(jw_path(r, "environment.differences")), 0);
    json_decref(r);

    struct cmp_cell *x;
    cr_assert_eq(cmp_side_add_cell(s.h, "mlp", "avx512", "forward", &x), 0);
    cmp_cell_set_outcome(x, "ok");
    cr_assert_eq(cmp_cell_set_fingerprint(x, other_cpu), 0);
    r = duo_compare(&s, NULL);
    json_t *inc = jw_path(r, "environment.inconsistent");
    cr_assert_eq(json_array_size(inc), 2, "python.executable and cpu.model");
    static const struct jw_want w[] = {
        JW_S("environment.premise", "broken"),
        JW_S("environment.inconsistent.0.side", "head"),
        JW_S("environment.inconsistent.0.field", "python.executable"),
        JW_S("environment.inconsistent.1.field", "cpu.model"),
        JW_I("environment.inconsistent.0.values.0.cells", 2),
        JW_S("environment.inconsistent.0.values.1.value", "/opt/py/bin/python3"),
        JW_I("environment.inconsistent.0.values.1.cells", 1),
        JW_S("environment.inconsistent.0.values.1.example.width", "avx512"),
    };
    jw_expect_all(r, w);
    char *md = cmp_result_to_markdown(r);
    cr_assert(strstr(md, "- **Broken premise:** head cells disagree on `python.executable`: "
                         "`/usr/bin/python3` (2), `/opt/py/bin/python3` (1)\n"),
              "%s", md);
    free(md);
    json_decref(other_cpu);
    duo_free(&s, r);
}

Test(environment, limits_and_bad_input)
{
    struct duo s = duo_mlp(NULL, "ok");
    struct cmp_cell *cc = s.cc, *hc = s.hc;
    json_t *arr = json_array();
    cr_assert_eq(cmp_cell_set_fingerprint(cc, arr), -EINVAL);
    cr_assert_eq(cmp_cell_set_fingerprint(cc, NULL), -EINVAL);
    json_decref(arr);

    /* past CMP_MAX_ENV_FIELDS fields: refused, the cell keeps none */
    json_t *big = json_object(), *env = json_object();
    json_object_set_new(big, "env", env);
    for (int i = 0; i <= CMP_MAX_ENV_FIELDS; i++) {
        char k[32];
        snprintf(k, sizeof k, "MKL_V%05d", i);
        json_object_set_new(env, k, json_string("1"));
    }
    cr_assert_eq(cmp_cell_set_fingerprint(cc, big), -E2BIG);
    json_decref(big);

    /* 300 differing variables: the list stops at CMP_MAX_ENV_DIFFS, the rest is counted */
    json_t *fc = json_object(), *fh = json_object(), *ec = json_object(), *eh = json_object();
    json_object_set_new(fc, "env", ec);
    json_object_set_new(fh, "env", eh);
    for (int i = 0; i < 300; i++) {
        char k[32];
        snprintf(k, sizeof k, "OPENBLAS_V%03d", i);
        json_object_set_new(ec, k, json_string("a"));
        json_object_set_new(eh, k, json_string("b"));
    }
    /* a value past CMP_MAX_ENV_VALUE is cut, not refused */
    char *longv = malloc(CMP_MAX_ENV_VALUE * 2);
    memset(longv, 'x', CMP_MAX_ENV_VALUE * 2 - 1);
    longv[CMP_MAX_ENV_VALUE * 2 - 1] = '\0';
    json_object_set_new(fh, "torch", json_pack("{s:s}", "version", longv));
    free(longv);
    cr_assert_eq(cmp_cell_set_fingerprint(cc, fc), 0);
    cr_assert_eq(cmp_cell_set_fingerprint(hc, fh), 0);
    json_decref(fc);
    json_decref(fh);
    json_t *r = duo_compare(&s, NULL);
    cr_assert_eq(json_array_size(jw_path(r, "environment.differences")), CMP_MAX_ENV_DIFFS);
    cr_assert_eq(ji(r, "environment.differences_omitted"), 301 - CMP_MAX_ENV_DIFFS);
    cr_assert_eq(ji(r, "environment.fields_compared"), 301);
    json_t *pp = env_diff(r, "torch.version");
    cr_assert_not_null(pp);
    cr_assert_lt(strlen(dstr(pp, "head")), CMP_MAX_ENV_VALUE);
    cr_assert(strstr(dstr(pp, "head"), " [cut]"), "a cut value says so");
    cr_assert_str_eq(dstr(pp, "change"), "added");
    char *md = cmp_result_to_markdown(r);
    cr_assert(strstr(md, "- ... and 289 more\n"), "%s", md);
    cr_assert_lt(strlen(strstr(md, "### What else differs")), 8192);
    free(md);
    duo_free(&s, r);
}

Test(environment, cross_width_shows_the_width_variables)
{
    json_t *a = fixture_fp("fingerprint-debian-torch-1.13.json");
    json_t *b = json_deep_copy(a);
    json_object_set_new(json_object_get(b, "env"), "ATEN_CPU_CAPABILITY", json_string("default"));
    struct cmp_side *s;
    cmp_side_new(&s);
    fp_cell(s, "avx2", a);
    fp_cell(s, "default", b);
    /* The cells hold copies of the fingerprints. */
    json_decref(a);
    json_decref(b);
    struct cmp_options o;
    cross_width_options(&o, "avx2", "default");
    json_t *r = run_compare(s, s, &o);
    json_t *d = env_diff(r, "env.ATEN_CPU_CAPABILITY");
    cr_assert_str_eq(dstr(d, "control"), "avx2");
    cr_assert_str_eq(dstr(d, "head"), "default");
    cr_assert_str_eq(jw_str(r, "environment.premise"), "ok");
    json_decref(r);
    cmp_side_free(s);
}
