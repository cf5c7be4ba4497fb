/*
 * tests/helpers/common/api_fixtures.c - the REST API tests' fixture
 * (api_fixtures.h): one capd per test in its own temp dir, and the JSON
 * helpers that fail the test when a reply is not what they need.
 */
#include <criterion/criterion.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/testutil.h"

struct tu_capd af_capd;
char *af_dir;

/* ---- process and file helpers ---- */

/* Removes only what tu_tmpdir() made, so a bad pointer cannot reach rm. */
void af_stop_capd(struct tu_capd *c, char **dir)
{
    if (c->pid > 0)
        tu_capd_stop(c);
    if (*dir && strncmp(*dir, "/", 1) == 0 && strstr(*dir, "capd-test-"))
        tu_sh("rm -rf '%s'", *dir);
    free(*dir);
    *dir = NULL;
}

void af_stop_own_capd(struct tu_capd *c)
{
    if (c->pid > 0)
        tu_capd_stop(c);
    if (c->dir[0] && strstr(c->dir, "capd-test-"))
        tu_sh("rm -rf '%s'", c->dir);
}

void af_teardown(void)
{
    af_stop_capd(&af_capd, &af_dir);
}

void af_ensure_dir(void)
{
    if (!af_dir) {
        af_dir = tu_tmpdir();
        cr_assert_not_null(af_dir, "cannot create a temp dir");
    }
}

void af_start_capd(struct tu_capd *c, const char *dir, const char *const *extra)
{
    if (tu_capd_start(c, dir, extra) != 0) {
        char p[512];
        snprintf(p, sizeof p, "%s/capd.stderr", dir ? dir : c->dir);
        char *err = tu_slurp(p);
        cr_assert_fail("capd did not start; its stderr:\n%s", err);
    }
}

void af_restart_capd(struct tu_capd *c, const char *config, bool kill9)
{
    char port[32], dir[sizeof c->dir];
    snprintf(port, sizeof port, "127.0.0.1:%d", c->port);
    snprintf(dir, sizeof dir, "%s", c->dir);
    if (kill9)
        tu_capd_kill9(c);
    else
        cr_assert_eq(tu_capd_stop(c), 0, "capd exits 0 on SIGTERM");
    const char *extra[] = {"--config", config, "--listen", port, NULL};
    af_start_capd(c, dir, extra);
}

void af_env_init(struct af_env *e)
{
    memset(e, 0, sizeof *e);
    char *d = tu_tmpdir();
    cr_assert_not_null(d, "cannot create a temp dir");
    snprintf(e->dir, sizeof e->dir, "%s", d);
    snprintf(e->data, sizeof e->data, "%s/data", d);
    free(d);
}

/* Starts capd in the test's temp dir (data in DIR/data). */
void af_start(const char *const *extra)
{
    af_ensure_dir();
    af_start_capd(&af_capd, af_dir, extra);
}

void af_start_defaults(void)
{
    af_start(NULL);
}

void af_start_two_cells(void)
{
    const char *const extra[] = {"--max-parallel", "2", NULL};
    af_start(extra);
}

void af_put_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s", path);
    fputs(text, f);
    cr_assert_eq(fclose(f), 0, "cannot write %s", path);
}

/* Writes an executable file NAME into the temp dir; returns its path. */
const char *af_write_file(const char *name, const char *text, mode_t mode)
{
    static char path[8][512];
    static int slot;
    af_ensure_dir();
    char *p = path[slot++ % 8];
    snprintf(p, 512, "%s/%s", af_dir, name);
    af_put_file(p, text);
    chmod(p, mode);
    return p;
}

const char AF_HANG_SH[] = "#!/bin/sh\nexec sleep 1000\n";

const char AF_OK_SH[] =
    "#!/bin/sh\n"
    "echo \"runner says hi\"\n"
    "printf '%s\\n' '{\"kind\":\"hello\",\"protocol\":1,\"runner\":\"test-sh\"}' >&3\n"
    "printf '%s\\n' '{\"kind\":\"env\",\"fingerprint\":{\"torch\":\"none\"},"
    "\"effective_width\":\"avx2\"}' >&3\n"
    "for i in 0 1 2 3 4; do\n"
    "  printf '{\"kind\":\"tensor\",\"seq\":%d,\"key\":\"model.%d.forward.output.0\","
    "\"dtype\":\"float32\",\"shape\":[2],\"numel\":2,\"stats\":{\"min\":0,\"max\":1,"
    "\"mean\":0.5,\"std\":0.5,\"l2\":1,\"nan\":0,\"pinf\":0,\"ninf\":0,\"zeros\":1},"
    "\"hash\":\"00112233445566778899aabbccddeeff\",\"capture\":\"stats\"}\\n' $i $i >&3\n"
    "done\n"
    "printf '%s\\n' '{\"kind\":\"timing\",\"phase\":\"forward\",\"samples_ns\":[100,200,300],"
    "\"warmup\":1,\"iterations\":3,\"threads\":1}' >&3\n"
    "printf '%s\\n' '{\"kind\":\"memory\",\"peak_rss_bytes\":12345}' >&3\n"
    "printf '%s\\n' '{\"kind\":\"end\",\"status\":\"ok\"}' >&3\n";

/* ---- HTTP helpers ---- */

const char *af_q(const char *s)
{
    static char *ring[16];
    static int slot;
    char **p = &ring[slot++ % 16];
    free(*p);
    *p = strdup(s);
    for (char *c = *p; *c; c++)
        if (*c == '\'')
            *c = '"';
    return *p;
}

char *af_dump(json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    return s ? s : strdup("(null)");
}

/* One request with a JSON body (BODY may be NULL); returns the parsed
 * reply (json null when the reply is not JSON). */
json_t *af_call(const char *method, const char *path, const char *body, long *status)
{
    return tu_json(&af_capd, method, path, body, status);
}

/* Like af_call() with BODY run through af_q(). */
json_t *af_callq(const char *method, const char *path, const char *body, long *status)
{
    return af_call(method, path, body ? af_q(body) : NULL, status);
}

json_t *af_get(const char *path, long *status)
{
    return af_call("GET", path, NULL, status);
}

json_t *af_get_ok(const char *path)
{
    long st;
    json_t *j = af_get(path, &st);
    char *s = af_dump(j);
    cr_assert_eq(st, 200, "GET %s -> %ld %s", path, st, s);
    free(s);
    return j;
}

void af_expect_get_error(const char *path, long want, const char *code)
{
    long st;
    json_t *j = af_get(path, &st);
    af_expect_error(j, st, want, code, NULL);
    json_decref(j);
}

void af_expect_call_error(const char *method, const char *path, const char *body, long want,
                          const char *code, const char *field)
{
    long st;
    json_t *j = af_callq(method, path, body, &st);
    af_expect_error(j, st, want, code, field);
    json_decref(j);
}

/* A raw request; the reply is parsed as JSON when possible. */
json_t *af_raw(const char *method, const char *path, const char *body, size_t len,
               const char *const *hdrs, long *status, struct tu_resp *keep)
{
    struct tu_resp r;
    tu_http(&af_capd, method, path, body, len, hdrs, &r);
    *status = r.status;
    json_t *j = json_loadb(r.body, r.len, 0, NULL);
    if (keep)
        *keep = r;
    else
        tu_resp_free(&r);
    return j ? j : json_null();
}

/* Finds header NAME in a raw header block; returns its value (static). */
const char *af_header(const char *headers, const char *name)
{
    static char val[512];
    size_t n = strlen(name);
    for (const char *l = headers; l && *l;) {
        const char *e = strstr(l, "\r\n");
        size_t len = e ? (size_t)(e - l) : strlen(l);
        if (len > n && strncasecmp(l, name, n) == 0 && l[n] == ':') {
            const char *v = l + n + 1;
            while (*v == ' ')
                v++;
            snprintf(val, sizeof val, "%.*s", (int)(len - (size_t)(v - l)), v);
            return val;
        }
        l = e ? e + 2 : l + len;
    }
    return NULL;
}

/* Checks an error reply: the status, and a body of exactly
 * {"error":{"code":CODE,"message":non-empty string,"field":FIELD|null}}. */
void af_expect_error(json_t *j, long status, long want, const char *code, const char *field)
{
    char *s = af_dump(j);
    cr_assert_eq(status, want, "status %ld, want %ld; body %s", status, want, s);
    json_t *e = json_object_get(j, "error");
    cr_assert(json_is_object(e), "no error object in %s", s);
    cr_assert_eq(json_object_size(e), 3, "error must have exactly code, message, field: %s", s);
    cr_assert(json_is_string(json_object_get(e, "code")), "code not a string: %s", s);
    cr_assert_str_eq(json_string_value(json_object_get(e, "code")), code, "body %s", s);
    json_t *m = json_object_get(e, "message");
    cr_assert(json_is_string(m) && json_string_length(m) > 0, "message empty: %s", s);
    json_t *f = json_object_get(e, "field");
    cr_assert(f != NULL, "field missing: %s", s);
    if (field) {
        cr_assert(json_is_string(f), "field not a string: %s", s);
        cr_assert_str_eq(json_string_value(f), field, "body %s", s);
    } else {
        cr_assert(json_is_null(f), "field should be null: %s", s);
    }
    free(s);
}

/* Number of jobs the server lists, walking every page. */
/* Every member of array LIST of the pages of PATH (a URL with a query)
 * on C, following next_cursor (owned); a listing past 1000 pages never
 * ends, and fails the test. */
static json_t *get_all_pages(const struct tu_capd *c, const char *path, const char *list)
{
    json_t *out = json_array();
    char url[512], cursor[64] = "";
    for (int page = 0; page < 1000; page++) {
        snprintf(url, sizeof url, "%s%s%s", path, cursor[0] ? "&cursor=" : "", cursor);
        long st = 0;
        json_t *j = tu_json(c, "GET", url, NULL, &st);
        cr_assert_eq(st, 200, "GET %s -> %ld", url, st);
        json_array_extend(out, json_object_get(j, list));
        const char *next = tu_jstr(j, "next_cursor");
        snprintf(cursor, sizeof cursor, "%s", next ? next : "");
        json_decref(j);
        if (!next)
            return out;
    }
    cr_assert_fail("the listing of %s never ended", path);
    return NULL;
}

int af_count_jobs(void)
{
    json_t *jobs = get_all_pages(&af_capd, "/v1/jobs?limit=200", "jobs");
    int n = (int)json_array_size(jobs);
    json_decref(jobs);
    return n;
}

int af_count_builds(void)
{
    json_t *j = af_get_ok("/v1/builds");
    int n = (int)json_array_size(json_object_get(j, "builds"));
    json_decref(j);
    return n;
}

/* Registers a build; ROOTS adds the temp dir as its model root. */
void af_add_build(const char *name, const char *python, bool roots)
{
    long st;
    json_t *j = tu_jsonf(&af_capd, "POST", "/v1/builds", &st,
                         "{\"name\":\"%s\",\"python\":\"%s\",\"model_roots\":%s%s%s}", name, python,
                         roots ? "[\"" : "[", roots ? af_dir : "", roots ? "\"]" : "]");
    char *s = af_dump(j);
    cr_assert_eq(st, 201, "build %s: %ld %s", name, st, s);
    free(s);
    json_decref(j);
}

void af_hang_build(const char *name)
{
    af_add_build(name, af_write_file("hang.sh", AF_HANG_SH, 0755), true);
}

void af_ok_build(const char *name)
{
    af_add_build(name, af_write_file("ok.sh", AF_OK_SH, 0755), false);
}

/* Posts a job; returns it (owned) after asserting STATUS. */
json_t *af_post_job(long want, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *body = tu_vfmt(fmt, ap);
    va_end(ap);
    long st;
    json_t *j = af_callq("POST", "/v1/jobs", body, &st);
    char *s = af_dump(j);
    cr_assert_eq(st, want, "POST /v1/jobs %s -> %ld %s", af_q(body), st, s);
    free(s);
    free(body);
    return j;
}

/* A one-cell job of BUILD at COMMIT; returns its id (owned). */
char *af_submit1(const char *build, const char *commit)
{
    json_t *j = af_post_job(201,
                            "{'project':'p','commit':'%s','build':'%s','matrix':{'models':['mlp'],"
                            "'widths':['avx2'],'passes':['forward']}}",
                            commit, build);
    return af_job_id(j);
}

char *af_job_id(json_t *job)
{
    const char *s = tu_jstr(job, "id");
    cr_assert_not_null(s, "a job without an id");
    char *id = strdup(s);
    json_decref(job);
    return id;
}

json_t *af_get_job(const char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    return af_get_ok(path);
}

const char *af_cell_state(json_t *job, size_t i)
{
    return tu_jstr(json_array_get(json_object_get(job, "cells"), i), "state");
}

/* Polls job ID until cell I is in STATE; returns the job (owned). */
json_t *af_wait_cell(const char *id, size_t i, const char *state, double timeout)
{
    double t0 = tu_now_s();
    for (;;) {
        json_t *j = af_get_job(id);
        const char *s = af_cell_state(j, i);
        if (s && strcmp(s, state) == 0)
            return j;
        if (tu_now_s() - t0 > timeout) {
            char *d = af_dump(j);
            cr_assert_fail("job %s cell %zu never became %s: %s", id, i, state, d);
        }
        json_decref(j);
        usleep(20 * 1000);
    }
}

json_t *af_wait_job(const struct tu_capd *c, const char *id, int timeout_s)
{
    json_t *j = tu_wait_job(c, id, timeout_s);
    cr_assert_not_null(j, "job %s did not finish", id);
    return j;
}

json_t *af_wait_done(const char *id)
{
    return af_wait_job(&af_capd, id, 30);
}

char *af_submit_job(const struct tu_capd *c, const struct af_job *job)
{
    return af_submit_modes_job(c, job, NULL);
}

char *af_submit_modes_job(const struct tu_capd *c, const struct af_job *job, const char *modes)
{
    long st = 0;
    char cc[96] = "";
    if (job->control)
        snprintf(cc, sizeof cc, ",\"control_commit\":\"%s\"", job->control);
    json_t *j = tu_jsonf(c, "POST", "/v1/jobs", &st,
                         "{\"project\":\"%s\",\"commit\":\"%s\",\"build\":\"%s\"%s,"
                         "\"matrix\":{\"models\":[%s],\"widths\":[%s],\"passes\":[%s]%s%s%s},"
                         "\"options\":%s}",
                         job->project, job->commit, job->build, cc, job->models, job->widths,
                         job->passes, modes ? ",\"modes\":[" : "", modes ? modes : "",
                         modes ? "]" : "", job->options ? job->options : "{}");
    char *s = af_dump(j);
    const char *id = tu_jstr(j, "id");
    cr_assert(st == 201 && id, "submit: %ld %s", st, s);
    char *out = strdup(id);
    free(s);
    json_decref(j);
    return out;
}

/* The cell's detail comes from its own endpoint: the job's listing of its
 * cells leaves out what the cell tests look at. */
json_t *af_run_cell(const struct tu_capd *c, const char *model, const char *options, char **job_out)
{
    char *job = tu_submit(c, "fake", model, options);
    cr_assert_not_null(job, "submit %s", model);
    json_t *j = tu_wait_job(c, job, 120);
    cr_assert_not_null(j, "job of %s finished", model);
    const char *cid = tu_jstr(json_array_get(json_object_get(j, "cells"), 0), "id");
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s", job, cid);
    json_t *cell = tu_json(c, "GET", path, NULL, NULL);
    json_decref(j);
    if (job_out)
        *job_out = job;
    else
        free(job);
    return cell;
}

json_t *af_cell_records(const struct tu_capd *c, const char *job, const char *cell,
                        const char *kind)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s/records?kind=%s&limit=1000", job, cell, kind);
    return get_all_pages(c, path, "records");
}

long af_running_cells(void)
{
    json_t *j = af_get_ok("/healthz");
    long n = (long)json_integer_value(json_object_get(j, "running_cells"));
    json_decref(j);
    return n;
}

void af_wait_running_cells(long want)
{
    double t0 = tu_now_s();
    while (af_running_cells() != want) {
        cr_assert(tu_now_s() - t0 < 20, "running_cells never became %ld", want);
        usleep(20 * 1000);
    }
}

bool af_is_rfc3339(json_t *v)
{
    const char *s = json_string_value(v);
    int y, mo, d, h, mi, se, ms;
    char z = 0;
    return s && strlen(s) == 24 &&
           sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &y, &mo, &d, &h, &mi, &se, &ms, &z) == 8 &&
           z == 'Z';
}

int af_capctl(const struct tu_capd *c, const char *args, char **out)
{
    char *bin = strdup(tu_bin("CAPD_BIN")), path[600];
    snprintf(path, sizeof path, "%s/capctl.out", c->dir);
    int rc = tu_sh("CAPD_TOKEN='%s' '%s/capctl' --server '%s' %s >'%s' 2>&1", c->token,
                   dirname(bin), c->base, args, path);
    free(bin);
    *out = tu_slurp(path);
    return rc;
}

void af_expect_capctl_n(const struct af_capctl_run *runs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char *out = NULL;
        int rc = af_capctl(&af_capd, runs[i].args, &out);
        cr_assert_eq(rc, runs[i].rc, "capctl %s: exit %d: %s", runs[i].args, rc, out);
        cr_assert(strstr(out, runs[i].says), "capctl %s: %s", runs[i].args, out);
        free(out);
    }
}

char *af_commit_list(int n, void (*sha)(int i, char out[41]))
{
    char *s = malloc((size_t)n * 44 + 4), *p = s;
    cr_assert_not_null(s);
    *p++ = '[';
    for (int i = 0; i < n; i++) {
        char c[41];
        sha(i, c);
        p += sprintf(p, "%s\"%s\"", i ? "," : "", c);
    }
    strcpy(p, "]");
    return s;
}

void af_post_bisect(const struct tu_capd *c, const char *body, char id[16], json_t **reply)
{
    long st = 0;
    json_t *b = tu_json(c, "POST", "/v1/bisect", body, &st);
    char *s = af_dump(b);
    cr_assert_eq(st, 201, "%s", s);
    free(s);
    snprintf(id, 16, "%s", tu_str(b, "id"));
    if (reply)
        *reply = b;
    else
        json_decref(b);
}

json_t *af_bisect_done(const struct tu_capd *c, const char *id, int timeout_s, char **dump)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/bisect/%s", id);
    double t0 = tu_now_s();
    while (tu_now_s() - t0 < timeout_s) {
        long st = 0;
        json_t *b = tu_json(c, "GET", path, NULL, &st);
        cr_assert_eq(st, 200);
        if (strcmp(tu_str(b, "state"), "running") != 0) {
            *dump = json_dumps(b, JSON_INDENT(1));
            cr_assert_str_eq(tu_str(b, "state"), "done", "%s", *dump);
            return b;
        }
        json_decref(b);
        usleep(100000);
    }
    cr_assert_fail("bisection %s did not end", id);
    return NULL;
}

json_t *af_bisect_run(const struct tu_capd *c, const char *body, int timeout_s, char **dump)
{
    char id[16];
    af_post_bisect(c, body, id, NULL);
    return af_bisect_done(c, id, timeout_s, dump);
}

char *af_record_lines(const struct tu_capd *c, const char *job, const char *cell)
{
    json_t *recs = af_cell_records(c, job, cell, "tensor");
    char *text = NULL;
    size_t len = 0, i;
    json_t *t;
    json_array_foreach(recs, i, t)
    {
        char line[600];
        int n = snprintf(line, sizeof line, "%s %s %s\n", tu_str(t, "key"), tu_str(t, "hash"),
                         tu_str(t, "hash_alg"));
        cr_assert_eq(tu_append(&text, &len, line, (size_t)n), 0);
    }
    json_decref(recs);
    return text ? text : strdup("");
}

char *af_local_lines(const char *model)
{
    struct tu_capd local;
    af_start_capd(&local, NULL, NULL);
    cr_assert_eq(tu_fake_build(&local, "fake", NULL), 201);
    char *job = NULL;
    json_t *cell = af_run_cell(&local, model, NULL, &job);
    cr_assert_str_eq(tu_str(cell, "state"), "ok", "%s", af_dump(cell));
    char *lines = af_record_lines(&local, job, tu_str(cell, "id"));
    json_decref(cell);
    free(job);
    af_stop_own_capd(&local);
    return lines;
}

void af_expect_local_records(const struct tu_capd *c, const char *job, const char *cell,
                             const char *model, const char *what)
{
    char *lines = af_record_lines(c, job, cell);
    cr_assert_gt(strlen(lines), 0, "%s: the cell has records", what);
    char *want = af_local_lines(model);
    cr_assert_str_eq(lines, want, "%s: records equal the local executor's", what);
    free(lines);
    free(want);
}

void af_wait_jobs(const struct tu_capd *c, int timeout_s, ...)
{
    va_list ap;
    va_start(ap, timeout_s);
    for (const char *id = va_arg(ap, const char *); id; id = va_arg(ap, const char *))
        json_decref(af_wait_job(c, id, timeout_s));
    va_end(ap);
}

json_t *af_get_settled(const struct tu_capd *c, const char *path, int timeout_s)
{
    for (long i = 0; i < (long)timeout_s * 10; i++) {
        long st = 0;
        json_t *r = tu_json((struct tu_capd *)c, "GET", path, NULL, &st);
        if (st != 409) {
            char *d = r ? json_dumps(r, JSON_COMPACT) : NULL;
            cr_assert_eq(st, 200, "GET %s: %ld %s", path, st, d ? d : "");
            free(d);
            return r;
        }
        json_decref(r);
        usleep(100 * 1000);
    }
    cr_assert_fail("GET %s still pending after %d s", path, timeout_s);
    return NULL;
}

char *af_wait_label(const struct tu_capd *c, const char *id, const char *key, int timeout_s)
{
    char path[100];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    for (long i = 0; i < (long)timeout_s * 10; i++) {
        long st = 0;
        json_t *j = tu_json((struct tu_capd *)c, "GET", path, NULL, &st);
        const char *l = json_string_value(json_object_get(json_object_get(j, "labels"), key));
        char *out = l ? strdup(l) : NULL;
        json_decref(j);
        if (out)
            return out;
        usleep(100 * 1000);
    }
    cr_assert_fail("job %s: no label %s after %d s", id, key, timeout_s);
    return NULL;
}

json_t *af_find_cell(json_t *result, const char *model, const char *width, const char *pass)
{
    size_t i;
    json_t *cell;
    json_array_foreach(json_object_get(result, "cells"), i, cell)
    {
        if (!strcmp(tu_jstr(cell, "model"), model) && !strcmp(tu_jstr(cell, "width"), width) &&
            !strcmp(tu_jstr(cell, "pass"), pass))
            return cell;
    }
    return NULL;
}

const char *af_official_python(void)
{
    const char *p = getenv("CAPD_OFFICIAL_PYTHON");
    if (p && *p)
        return p;
    const char *why = getenv("CAPD_OFFICIAL_SKIP");
    if (!why || !*why)
        why = "CAPD_OFFICIAL_PYTHON is not set (scripts/test sets it from "
              "scripts/official-torch.sh)";
    const char *ci = getenv("CI");
    cr_assert(!ci || strcmp(ci, "true") != 0, "CI=true needs the official-build lane: %s", why);
    cr_skip_test("no official-build lane: %s", why);
    return NULL;
}
