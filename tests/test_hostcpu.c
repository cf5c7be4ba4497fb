/*
 * tests/test_hostcpu.c - widths this host's CPU cannot run (daemon/cpu/hostcpu.h,
 * docs/widths.md): what capd reads and says about the host, cells that end
 * unsupported before any child starts, and comparisons that call them
 * not_run. cpu_features_hide takes the "host lacks it" path on any host, so
 * these tests take both paths wherever they run. Cells are the fake runner's
 * (tests/helpers/fake_runner): what is tested is capd's decision, not torch.
 */
#include <criterion/criterion.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/testutil.h"

/* The member of OBJ's array LIST whose FIELD is VALUE, or NULL. */
static json_t *find(json_t *obj, const char *list, const char *field, const char *value)
{
    size_t i;
    json_t *row;
    json_array_foreach(json_object_get(obj, list), i, row)
    {
        if (!strcmp(tu_str(row, field), value))
            return row;
    }
    return NULL;
}

static json_t *width_row(json_t *widths, const char *name)
{
    return find(widths, "widths", "name", name);
}

/* Whether /proc/cpuinfo's first flags line lists FLAG (read here, apart
 * from capd). */
static bool proc_flag(const char *flag)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char *line = NULL;
    size_t cap = 0;
    bool found = false;
    while (f && getline(&line, &cap, f) > 0) {
        if (strncmp(line, "flags", 5) != 0)
            continue;
        for (char *t = strtok(strchr(line, ':') + 1, " \n"); t; t = strtok(NULL, " \n"))
            found |= !strcmp(t, flag);
        break;
    }
    free(line);
    if (f)
        fclose(f);
    return found;
}

static void start(struct tu_capd *c, const char *dir, const char *hide)
{
    const char *extra[] = {hide ? "--cpu-features-hide" : NULL, hide, NULL};
    cr_assert_eq(tu_capd_start(c, dir, extra), 0, "capd starts (hide %s)", hide ? hide : "-");
}

static char *submit(struct tu_capd *c, const char *commit, const char *widths)
{
    struct af_job job = {"t",           commit, NULL,          "fake",
                         "\"fake:ok\"", widths, "\"forward\"", "{\"iterations\":0}"};
    return af_submit_job(c, &job);
}

static json_t *job_cell(json_t *job, const char *width)
{
    json_t *cell = find(job, "cells", "width", width);
    cr_assert_not_null(cell, "job has no cell at %s", width);
    return cell;
}

static bool log_has(const struct tu_capd *c, const char *a, const char *b)
{
    FILE *f = fopen(c->errlog, "r");
    char line[4096];
    bool found = false;
    while (f && fgets(line, sizeof line, f))
        found |= strstr(line, a) && strstr(line, b);
    if (f)
        fclose(f);
    return found;
}

/* What capd says of the host agrees with itself and with /proc/cpuinfo. */
Test(hostcpu, host_document_and_widths_agree)
{
    struct tu_capd c;
    start(&c, NULL, NULL);
    long st = 0;
    json_t *host = tu_json(&c, "GET", "/v1/host", NULL, &st);
    cr_assert_eq(st, 200);
    struct utsname u;
    uname(&u);
    cr_assert_str_eq(tu_str(host, "arch"), u.machine);
    cr_assert_gt(json_integer_value(json_object_get(host, "cores_usable")), 0);
    cr_assert_eq(json_array_size(json_object_get(host, "hidden")), 0);
    json_t *feat = json_object_get(host, "features");
    cr_assert(json_is_object(feat));
    if (!strcmp(u.machine, "x86_64")) {
        static const char *const flags[] = {"avx2",     "fma",      "avx512f", "avx512bw",
                                            "amx_tile", "amx_bf16", "amx_int8"};
        for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
            cr_assert_eq(json_is_true(json_object_get(feat, flags[i])), proc_flag(flags[i]),
                         "%s: capd and /proc/cpuinfo agree", flags[i]);
    }
    json_t *widths = tu_json(&c, "GET", "/v1/widths", NULL, &st);
    cr_assert_eq(st, 200);
    size_t i, k;
    json_t *row, *f;
    json_array_foreach(json_object_get(widths, "widths"), i, row)
    {
        bool want = !strcmp(tu_str(row, "arch"), "any") || !strcmp(tu_str(row, "arch"), u.machine);
        json_array_foreach(json_object_get(row, "requires"), k, f)
        {
            want &= json_is_true(json_object_get(feat, json_string_value(f)));
        }
        cr_assert_eq(json_is_true(json_object_get(row, "runnable_here")), want, "width %s",
                     tu_str(row, "name"));
        cr_assert_eq(json_is_string(json_object_get(row, "missing")), !want);
    }
    cr_assert(json_is_true(json_object_get(width_row(widths, "default"), "runnable_here")));
    json_decref(widths);
    json_decref(host);
    cr_assert_eq(tu_capd_stop(&c), 0);
}

/* A typo in cpu_features_hide must not silently hide nothing. */
Test(hostcpu, unknown_hidden_feature_refused)
{
    char *dir = tu_tmpdir();
    cr_assert_not_null(dir);
    int rc = tu_sh("'%s' --listen 127.0.0.1:0 --data-dir '%s/data' --cpu-features-hide "
                   "avx2,avx512x >'%s/out' 2>'%s/err'",
                   tu_bin("CAPD_BIN"), dir, dir, dir);
    cr_assert_eq(rc, 2, "capd refuses to start (rc %d)", rc);
    char path[600], buf[2048] = "";
    snprintf(path, sizeof path, "%s/err", dir);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    cr_assert(strstr(buf, "unknown CPU feature 'avx512x'") && strstr(buf, "known: "), "%s", buf);
    tu_sh("rm -rf '%s'", dir);
    free(dir);
}

/*
 * With AVX2 and AVX-512 hidden, the avx2 and avx512 cells end unsupported
 * at once, no child started, naming what is missing; the default cell runs;
 * two such jobs compare as a pass with those cells not_run.
 */
Test(hostcpu, hidden_widths_not_run_and_aa_passes)
{
    struct tu_capd c;
    start(&c, NULL, "avx2,avx512f");
    cr_assert_eq(tu_fake_build(&c, "fake", NULL), 201);
    long st = 0;
    json_t *widths = tu_json(&c, "GET", "/v1/widths", NULL, &st);
    json_t *row = width_row(widths, "avx512");
    cr_assert(json_is_false(json_object_get(row, "runnable_here")));
    cr_assert(strstr(tu_str(row, "missing"), "avx512f"), "missing: %s", tu_str(row, "missing"));
    json_decref(widths);

    const char *w = "\"default\",\"avx2\",\"avx512\"";
    char *a = submit(&c, "aaaaaaa", w), *b = submit(&c, "bbbbbbb", w);
    json_t *ja = tu_wait_job(&c, a, 120), *jb = tu_wait_job(&c, b, 120);
    cr_assert(ja && jb, "jobs finish");
    cr_assert_str_eq(tu_str(job_cell(ja, "default"), "state"), "ok");
    static const char *const lost[][2] = {{"avx2", "avx2"}, {"avx512", "avx512f"}};
    for (int i = 0; i < 2; i++) {
        json_t *cell = job_cell(ja, lost[i][0]);
        /* the hidden feature, and any others this host lacks for that width */
        char lacks[64], needed[64];
        snprintf(lacks, sizeof lacks, "lacks %s", lost[i][1]);
        snprintf(needed, sizeof needed, "(needed by width %s)", lost[i][0]);
        cr_assert_str_eq(tu_str(cell, "state"), "unsupported");
        const char *why = tu_str(cell, "reason");
        cr_assert(strstr(why, lacks) && strstr(why, needed), "reason: %s", why);
        cr_assert(strstr(tu_str(cell, "host_missing"), lost[i][1]));
        json_int_t ms = json_integer_value(json_object_get(cell, "duration_ms"));
        cr_assert_lt(ms, 50, "%s ended in %lld ms", lost[i][0], (long long)ms);
        cr_assert_not(log_has(&c, "cell_started", tu_str(cell, "id")), "no child for %s",
                      lost[i][0]);
        cr_assert(log_has(&c, "cell_not_run", tu_str(cell, "id")));
    }
    cr_assert(log_has(&c, "cell_started", tu_str(job_cell(ja, "default"), "id")));
    /* the cells no attempt ran count by outcome, not among the durations */
    cr_assert_eq(tu_metric(&c, "capd_cells_finished_total{outcome=\"unsupported\"}"), 4);
    cr_assert_eq(tu_metric(&c, "capd_cells_finished_total{outcome=\"ok\"}"), 2);
    cr_assert_eq(tu_metric(&c, "capd_cell_duration_seconds_count"), 2);

    char path[256];
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s", a, b);
    json_t *r = tu_json(&c, "GET", path, NULL, &st);
    cr_assert_eq(st, 200);
    json_t *counts = json_object_get(r, "counts");
    cr_assert_str_eq(tu_str(r, "verdict"), "pass");
    cr_assert_eq(json_integer_value(json_object_get(counts, "not_run")), 2);
    cr_assert_eq(json_integer_value(json_object_get(counts, "incomparable")), 0);
    cr_assert_eq(json_integer_value(json_object_get(counts, "identical")), 1);
    cr_assert_eq(json_integer_value(json_object_get(counts, "outcome_regressions")), 0);
    cr_assert_eq(json_integer_value(json_object_get(counts, "lost_coverage")), 0);
    json_decref(r);

    struct tu_resp txt;
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s&format=text", a, b);
    tu_http(&c, "GET", path, NULL, 0, NULL, &txt);
    cr_assert(strstr(txt.body, "NOT RUN on this host: width avx512 (1 cells): both sides' "
                               "hosts lack avx512f"),
              "%s", txt.body);
    tu_resp_free(&txt);

    /* capctl wait: not run is listed, and is not a failed cell (exit 0). */
    char *bin = strdup(tu_bin("CAPD_BIN"));
    char err[600];
    snprintf(err, sizeof err, "%s/wait.err", c.dir);
    int rc = tu_sh("CAPD_SERVER='%s' CAPD_TOKEN='%s' '%s/capctl' wait %s >/dev/null 2>'%s'", c.base,
                   c.token, dirname(bin), a, err);
    free(bin);
    cr_assert_eq(rc, 0, "capctl wait exits 0 when cells were only not run");
    cr_assert_eq(tu_sh("grep -q '2 of 3 cells not run' '%s'", err), 0);

    /* capctl widths: the host line names what is hidden, the table and
     * --runnable what runs here. */
    char out[600];
    snprintf(out, sizeof out, "%s/widths.out", c.dir);
    bin = strdup(tu_bin("CAPD_BIN"));
    const char *capctl_dir = dirname(bin);
    cr_assert_eq(tu_sh("CAPD_SERVER='%s' CAPD_TOKEN='%s' '%s/capctl' widths >'%s'", c.base, c.token,
                       capctl_dir, out),
                 0);
    cr_assert_eq(tu_sh("grep -q 'hidden features: avx2,avx512f' '%s'", out), 0);
    cr_assert_eq(tu_sh("grep -Eq '^avx512 +x86_64 +avx512f,avx512bw,avx512vl,avx512dq,fma +no "
                       "+avx512f' '%s'",
                       out),
                 0, "the avx512 row says no and what is missing");
    cr_assert_eq(tu_sh("CAPD_SERVER='%s' CAPD_TOKEN='%s' '%s/capctl' widths --runnable >'%s'",
                       c.base, c.token, capctl_dir, out),
                 0);
    cr_assert_eq(tu_sh("grep -qx default '%s' && ! grep -qx avx512 '%s' && ! grep -qx avx2 '%s'",
                       out, out, out),
                 0, "--runnable lists default, not the hidden widths");
    free(bin);
    json_decref(ja);
    json_decref(jb);
    free(a);
    free(b);
    cr_assert_eq(tu_capd_stop(&c), 0);
}

/*
 * The control ran a width that the head's host (the same data dir, capd
 * restarted with the width's feature hidden) cannot: not_run with the lost
 * coverage counted and warned about, never an outcome regression.
 */
Test(hostcpu, lost_coverage_is_a_warning_not_a_regression)
{
    struct tu_capd c;
    char *dir = tu_tmpdir();
    cr_assert_not_null(dir);
    start(&c, dir, NULL);
    const char *wide = tu_widest_width(&c);
    if (!strcmp(wide, "default")) {
        tu_capd_stop(&c);
        cr_skip_test("this host runs no vector width whose loss could be tested");
    }
    /* The first feature the width requires. */
    json_t *widths = tu_json(&c, "GET", "/v1/widths", NULL, NULL);
    char hide[64], list[64];
    snprintf(
        hide, sizeof hide, "%s",
        json_string_value(json_array_get(json_object_get(width_row(widths, wide), "requires"), 0)));
    json_decref(widths);
    snprintf(list, sizeof list, "\"default\",\"%s\"", wide);
    cr_assert_eq(tu_fake_build(&c, "fake", NULL), 201);
    char *a = submit(&c, "aaaaaaa", list);
    json_t *ja = tu_wait_job(&c, a, 120);
    cr_assert_not_null(ja);
    cr_assert_str_eq(tu_str(job_cell(ja, wide), "state"), "ok");
    json_decref(ja);
    cr_assert_eq(tu_capd_stop(&c), 0);

    start(&c, dir, hide);
    char *b = submit(&c, "bbbbbbb", list);
    json_t *jb = tu_wait_job(&c, b, 120);
    cr_assert_not_null(jb);
    cr_assert_str_eq(tu_str(job_cell(jb, wide), "state"), "unsupported");
    json_decref(jb);
    char path[256];
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s", a, b);
    json_t *r = tu_json(&c, "GET", path, NULL, NULL);
    json_t *counts = json_object_get(r, "counts");
    cr_assert_str_eq(tu_str(r, "verdict"), "pass");
    cr_assert_eq(json_integer_value(json_object_get(counts, "not_run")), 1);
    cr_assert_eq(json_integer_value(json_object_get(counts, "lost_coverage")), 1);
    cr_assert_eq(json_integer_value(json_object_get(counts, "outcome_regressions")), 0);
    size_t i;
    json_t *cell;
    json_array_foreach(json_object_get(r, "cells"), i, cell)
    {
        if (strcmp(tu_str(cell, "width"), wide) != 0)
            continue;
        cr_assert_str_eq(tu_str(cell, "status"), "not_run");
        cr_assert_str_eq(tu_str(cell, "not_run_reason"), "head_host");
        cr_assert_str_eq(tu_str(cell, "outcome_change"), "not_run");
        cr_assert(strstr(tu_str(cell, "head_host_missing"), hide));
    }
    json_decref(r);
    struct tu_resp md;
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s&format=md", a, b);
    tu_http(&c, "GET", path, NULL, 0, NULL, &md);
    cr_assert(strstr(md.body, "Warning: coverage lost:") && strstr(md.body, hide), "%s", md.body);
    cr_assert_null(strstr(md.body, "Outcome regressions"), "%s", md.body);
    tu_resp_free(&md);
    free(a);
    free(b);
    cr_assert_eq(tu_capd_stop(&c), 0);
    tu_sh("rm -rf '%s'", dir);
    free(dir);
}
