/*
 * tests/test_api_config.c - capd's configuration end to end: the config
 * file and its keys, flags over the file, --help and --version, SIGTERM
 * and restart, a database newer than capd. The fixture (a real capd per
 * test): api_fixtures.h.
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

TestSuite(api_config, AF_SUITE);

/* =============================================================== config */

/* Runs capd with ARGS (a shell fragment) under a timeout; returns the exit
 * status and the captured stdout and stderr (owned). */
static int run_capd(const char *args, char **out, char **err)
{
    af_ensure_dir();
    char o[512], e[512];
    snprintf(o, sizeof o, "%s/run.out", af_dir);
    snprintf(e, sizeof e, "%s/run.err", af_dir);
    int rc = tu_sh("timeout -s KILL 20 '%s' %s >'%s' 2>'%s'", tu_bin("CAPD_BIN"), args, o, e);
    *out = tu_slurp(o);
    *err = tu_slurp(e);
    return rc;
}

/* Runs capd with ARGS and checks it refuses them: a non-zero exit of its
 * own (not the timeout's kill), stderr naming NAMED, and no "listening"
 * on stdout. */
static void expect_capd_refused(const char *args, const char *named)
{
    char *out, *err;
    int rc = run_capd(args, &out, &err);
    cr_assert(rc != 0 && rc != 137, "capd accepted %s (rc %d)", args, rc);
    cr_assert(strstr(err, named), "the message must name %s: %s", named, err);
    cr_assert(!strstr(out, "listening"), "it must not start: %s", out);
    free(out);
    free(err);
}

/* A config file capd cannot use stops it before it listens, its message
 * naming what is wrong: an unknown key, a known key of the wrong type or
 * out of its range (the GPU sharing keys at both ends), a
 * file that is not JSON (named: NULL, the message names the file) and a
 * missing file (text: NULL). */
Test(api_config, unknown_config_key_refused)
{
    af_ensure_dir();
    static const struct {
        const char *text, *named;
    } cases[] = {
        {"{\"max_parallel\":1,\"bogus_key\":1}", "bogus_key"},
        {"{\"max_cells_per_job\":\"many\"}", "max_cells_per_job"},
        {"{\"gpu_cells_per_device\":0}", "gpu_cells_per_device"},
        {"{\"gpu_cells_per_device\":65}", "gpu_cells_per_device"},
        {"{\"gpu_memory_fraction\":0}", "gpu_memory_fraction"},
        {"{\"gpu_memory_fraction\":1.01}", "gpu_memory_fraction"},
        {"{\"gpu_memory_fraction\":\"0.9\"}", "gpu_memory_fraction"},
        {"{max_parallel: 1", NULL},
        {NULL, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32], cfg[600], args[1024];
        snprintf(name, sizeof name, "capd%zu.json", i);
        if (cases[i].text)
            snprintf(cfg, sizeof cfg, "%s", af_write_file(name, cases[i].text, 0644));
        else
            snprintf(cfg, sizeof cfg, "%s/%s", af_dir, name);
        snprintf(args, sizeof args, "--config '%s' --listen 127.0.0.1:0 --data-dir '%s/data'", cfg,
                 af_dir);
        expect_capd_refused(args, cases[i].named ? cases[i].named : name);
    }
}

/* Flags win over the file; keys the flags do not set come from it. */
Test(api_config, flags_win_over_file)
{
    af_ensure_dir();
    const char *cfg =
        af_write_file("capd.json",
                      "{\"listen\":\"127.0.0.1:1\",\"data_dir\":\"/nonexistent/capd\","
                      "\"max_cells_per_job\":4,\"max_body_bytes\":2048}",
                      0644);
    const char *extra[] = {"--config", cfg, NULL};
    af_start(extra);
    cr_assert_neq(af_capd.port, 1, "the file's listen won over --listen");
    char db[512];
    snprintf(db, sizeof db, "%s/data/capd.db", af_dir);
    cr_assert_eq(access(db, F_OK), 0, "the database is not in the --data-dir directory");

    af_hang_build("b");
    long st;
    json_t *j = af_callq("POST", "/v1/jobs",
                         "{'project':'p','commit':'abcdef1','build':'b','matrix':{'models':['mlp',"
                         "'cnn','lstm'],'widths':['default','avx2'],'passes':['forward']}}",
                         &st);
    af_expect_error(j, st, 400, "too_many_cells", "matrix");
    cr_assert(strstr(tu_jstr(json_object_get(j, "error"), "message"), "limit is 4"));
    json_decref(j);
    j = af_post_job(201, "{'project':'p','commit':'abcdef1','build':'b','matrix':{'models':['mlp',"
                         "'cnn'],'widths':['default','avx2'],'passes':['forward']}}");
    json_decref(j);
    char body[4096];
    memset(body, ' ', sizeof body);
    body[0] = '{';
    body[sizeof body - 1] = '}';
    const char *h[] = {"Content-Type: application/json", NULL};
    j = NULL;
    st = 0;
    for (int t = 0; t < 5 && st == 0; t++) {
        json_decref(j);
        j = af_raw("POST", "/v1/jobs", body, sizeof body, h, &st, NULL);
    }
    af_expect_error(j, st, 413, "body_too_large", NULL);
    cr_assert(strstr(tu_jstr(json_object_get(j, "error"), "message"), "2048"));
    json_decref(j);
    cr_assert_eq(af_count_jobs(), 1);
    cr_assert_eq(tu_capd_stop(&af_capd), 0);
}

Test(api_config, help_version_and_bad_flags)
{
    char *out, *err;
    int rc = run_capd("--help", &out, &err);
    cr_assert_eq(rc, 0);
    cr_assert(strstr(out, "usage: capd"), "%s", out);
    cr_assert(strstr(out, "--config"));
    free(out);
    free(err);
    rc = run_capd("--version", &out, &err);
    cr_assert_eq(rc, 0);
    cr_assert(strstr(out, "capd " CAPD_VERSION), "%s", out);
    free(out);
    free(err);
    expect_capd_refused("--no-such-flag", "--no-such-flag");
    expect_capd_refused("--listen nonsense --data-dir /tmp", "listen");
    expect_capd_refused("--max-parallel 0 --data-dir /tmp", "max_parallel");
}

/* SIGTERM with a cell running exits 0; a restart finds everything and
 * runs the interrupted cell again. */
Test(api_config, sigterm_exits_0_and_restart_keeps_state)
{
    af_start(NULL);
    af_hang_build("b");
    char *id = af_submit1("b", "abcdef1");
    json_decref(af_wait_cell(id, 0, "running", 20));
    cr_assert_eq(tu_capd_stop(&af_capd), 0, "SIGTERM must exit 0");
    af_start(NULL);
    json_t *j = af_wait_cell(id, 0, "running", 20);
    json_t *c0 = json_array_get(json_object_get(j, "cells"), 0);
    cr_assert_eq(json_integer_value(json_object_get(c0, "attempts")), 2);
    json_decref(j);
    cr_assert_eq(af_count_builds(), 1);
    cr_assert_eq(af_count_jobs(), 1);
    cr_assert_eq(tu_capd_stop(&af_capd), 0);
    free(id);
}

Test(api_config, newer_database_refused)
{
    af_start(NULL);
    cr_assert_eq(af_count_jobs(), 0);
    tu_capd_stop(&af_capd); /* its status: see sigterm_right_after_start_exits_0 */
    char db[512];
    snprintf(db, sizeof db, "%s/data/capd.db", af_dir);
    cr_assert_eq(tu_sh("sqlite3 '%s' 'PRAGMA user_version=999'", db), 0);
    char args[1024], *out, *err;
    snprintf(args, sizeof args, "--listen 127.0.0.1:0 --data-dir '%s/data'", af_dir);
    int rc = run_capd(args, &out, &err);
    cr_assert(rc != 0 && rc != 137, "capd opened a database newer than itself (rc %d)", rc);
    cr_assert(strstr(err, "newer"), "unclear error: %s", err);
    cr_assert(strstr(err, "999"), "the message should give the version: %s", err);
    cr_assert(!strstr(out, "listening"));
    free(out);
    free(err);
    char v[512];
    snprintf(v, sizeof v, "%s/uv", af_dir);
    cr_assert_eq(tu_sh("sqlite3 '%s' 'PRAGMA user_version' >'%s'", db, v), 0);
    char *s = tu_slurp(v);
    cr_assert_str_eq(s, "999\n", "the refused database was modified");
    free(s);
}
