/* test_capd_cell.c: capd-cell, the worker of a remote cell attempt
 * (worker/).
 *
 * The spec rewriting and the chunk bookkeeping are pure functions of the
 * worker library (worker/worker.h), table-tested here. The program itself
 * runs as a real process ($CAPD_CELL_BIN) with a controlled environment:
 * every usage error is exit 2 with a message that says what is wrong and
 * touches nothing, and a capd that nothing listens for is exit 1 after
 * the retries, naming the request. No server stands in for capd: what
 * needs one is tested against the real endpoints once capd has them.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/helpers/common/testutil.h"
#include "util/fs.h"
#include "worker/worker.h"

extern char **environ;

/* ======================================================================
 * The chunk bookkeeping
 * ==================================================================== */

Test(chunk, next_table)
{
    static const struct {
        uint64_t acked;
        size_t buffered, chunk;
        bool due, flush;
        bool send;
        uint64_t offset;
        size_t len;
    } t[] = {
        /* nothing buffered: nothing to send, due or not */
        {0, 0, 256, false, false, false, 0, 0},
        {0, 0, 256, true, true, false, 0, 0},
        /* less than a chunk and not due: wait for more */
        {0, 100, 256, false, false, false, 0, 0},
        {1000, 255, 256, false, false, false, 0, 0},
        /* a whole chunk waits: send it now */
        {0, 256, 256, false, false, true, 0, 256},
        /* more than a chunk: one chunk, from the acknowledged offset */
        {4096, 1000, 256, false, false, true, 4096, 256},
        /* 100 ms passed with bytes waiting: what there is */
        {0, 1, 256, true, false, true, 0, 1},
        {777, 100, 256, true, false, true, 777, 100},
        /* the runner ended: the rest, a chunk at a time */
        {10, 100, 256, false, true, true, 10, 100},
        {10, 1000, 256, false, true, true, 10, 256},
        /* a chunk of 1 byte */
        {5, 3, 1, false, false, true, 5, 1},
        /* a chunk of 0 never sends (the caller's error) */
        {0, 10, 0, true, true, false, 0, 0},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        struct worker_window w = {.acked = t[i].acked, .buffered = t[i].buffered};
        struct worker_chunk c = {.offset = 12345, .len = 678};
        bool send = worker_chunk_next(&w, t[i].chunk, t[i].due, t[i].flush, &c);
        cr_assert_eq(send, t[i].send, "row %zu: send %d", i, send);
        if (send) {
            cr_assert_eq(c.offset, t[i].offset, "row %zu: offset %llu", i,
                         (unsigned long long)c.offset);
            cr_assert_eq(c.len, t[i].len, "row %zu: len %zu", i, c.len);
        } else {
            cr_assert(c.offset == 12345 && c.len == 678, "row %zu: C was changed", i);
        }
        cr_assert(w.acked == t[i].acked && w.buffered == t[i].buffered, "row %zu: W changed", i);
    }
}

Test(chunk, ack_table)
{
    static const struct {
        uint64_t acked;
        size_t buffered;
        uint64_t received;
        enum worker_ack want;
        size_t drop;
        uint64_t acked_after;
        size_t buffered_after;
    } t[] = {
        /* a 200 for the whole chunk */
        {0, 256, 256, WORKER_ACK_OK, 256, 256, 0},
        /* a 200 for the first chunk of more */
        {1000, 600, 1256, WORKER_ACK_OK, 256, 1256, 344},
        /* capd already held part of a retried chunk: it names more */
        {1000, 600, 1500, WORKER_ACK_OK, 500, 1500, 100},
        /* a 409: capd holds less than the offset sent; resend from it,
         * which is still in the buffer */
        {1000, 600, 1000, WORKER_ACK_OK, 0, 1000, 600},
        /* a 409 naming everything buffered */
        {1000, 600, 1600, WORKER_ACK_OK, 600, 1600, 0},
        /* capd lost bytes it acknowledged: the worker no longer has them */
        {1000, 600, 999, WORKER_ACK_BEHIND, 0, 1000, 600},
        {1000, 0, 0, WORKER_ACK_BEHIND, 0, 1000, 0},
        /* capd names bytes the runner never wrote */
        {1000, 600, 1601, WORKER_ACK_AHEAD, 0, 1000, 600},
        {0, 0, 1, WORKER_ACK_AHEAD, 0, 0, 0},
        /* nothing buffered and capd agrees */
        {42, 0, 42, WORKER_ACK_OK, 0, 42, 0},
        /* offsets past 4 GiB */
        {5000000000ull, 10, 5000000010ull, WORKER_ACK_OK, 10, 5000000010ull, 0},
        {5000000000ull, 10, 5000000011ull, WORKER_ACK_AHEAD, 0, 5000000000ull, 10},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        struct worker_window w = {.acked = t[i].acked, .buffered = t[i].buffered};
        size_t drop = 0;
        enum worker_ack a = worker_chunk_ack(&w, t[i].received, &drop);
        cr_assert_eq(a, t[i].want, "row %zu: answer %d", i, (int)a);
        cr_assert_eq(drop, t[i].drop, "row %zu: drop %zu", i, drop);
        cr_assert_eq(w.acked, t[i].acked_after, "row %zu: acked %llu", i,
                     (unsigned long long)w.acked);
        cr_assert_eq(w.buffered, t[i].buffered_after, "row %zu: buffered %zu", i, w.buffered);
    }
}

/* A POST that failed, a 409 and a 200 in a row: the window replays the
 * stream a retried chunk at a time without a gap or a repeat. */
Test(chunk, retry_resume_sequence)
{
    struct worker_window w = {0, 700};
    struct worker_chunk c;
    size_t drop;
    cr_assert(worker_chunk_next(&w, 256, false, false, &c));
    cr_assert(c.offset == 0 && c.len == 256);
    /* a connection error: nothing acknowledged, the same chunk again */
    cr_assert(worker_chunk_next(&w, 256, false, false, &c));
    cr_assert(c.offset == 0 && c.len == 256);
    cr_assert_eq(worker_chunk_ack(&w, 256, &drop), WORKER_ACK_OK);
    cr_assert(worker_chunk_next(&w, 256, false, false, &c));
    cr_assert(c.offset == 256 && c.len == 256);
    /* the reply was lost but capd stored it; its answer to the retry says so */
    cr_assert_eq(worker_chunk_ack(&w, 512, &drop), WORKER_ACK_OK);
    cr_assert_eq(drop, 256);
    cr_assert_not(worker_chunk_next(&w, 256, false, false, &c), "188 bytes wait for more");
    cr_assert(worker_chunk_next(&w, 256, false, true, &c));
    cr_assert(c.offset == 512 && c.len == 188);
    cr_assert_eq(worker_chunk_ack(&w, 700, &drop), WORKER_ACK_OK);
    cr_assert(w.acked == 700 && w.buffered == 0);
    cr_assert_not(worker_chunk_next(&w, 256, true, true, &c));
}

Test(chunk, backoff)
{
    static const int want[][2] = {{1, 100},  {2, 200},  {3, 400},   {4, 800},   {5, 1600},
                                  {6, 3200}, {7, 5000}, {10, 5000}, {100, 5000}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert_eq(worker_backoff_ms(want[i][0]), want[i][1], "try %d: %d ms", want[i][0],
                     worker_backoff_ms(want[i][0]));
}

/* ======================================================================
 * The spec rewriting
 * ==================================================================== */

#define CAPD_SCRATCH "/var/lib/capd/scratch/j1/c2/a7"
#define MY_SCRATCH   "/tmp/capd-cell-7"

/* A spec reply of attempt 7 with ENV (a JSON object's text) and SPEC
 * (the cell spec's text). */
static char *reply_with(const char *env, const char *spec)
{
    char *s = NULL;
    cr_assert(asprintf(&s,
                       "{\"attempt\": 7, \"job\": \"j1\", \"cell\": \"c2\", "
                       "\"argv\": [\"/usr/bin/python3\", \"-m\", \"capd_runner\"], "
                       "\"env\": %s, \"spec\": %s, \"scratch\": \"" CAPD_SCRATCH "\", "
                       "\"timeout_s\": 600, \"chunk_max_bytes\": 1048576, "
                       "\"memory_max_bytes\": 67108864, "
                       "\"frames_received\": 0, \"log_received\": 0}",
                       env, spec) > 0);
    return s;
}

/* The value of NAME in the NULL-terminated "K=V" list ENV, or NULL. */
static const char *env_get(char **env, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; env && env[i]; i++)
        if (strncmp(env[i], name, n) == 0 && env[i][n] == '=')
            return env[i] + n + 1;
    return NULL;
}

static size_t strv_len(char **v)
{
    size_t n = 0;
    while (v && v[n])
        n++;
    return n;
}

Test(spec, env_values_table)
{
    static const struct {
        const char *value, *want;
    } t[] = {
        /* the scratch dir itself, and paths below it */
        {CAPD_SCRATCH, MY_SCRATCH},
        {CAPD_SCRATCH "/", MY_SCRATCH "/"},
        {CAPD_SCRATCH "/home/.cache", MY_SCRATCH "/home/.cache"},
        /* a sibling whose name merely starts the same is not below it */
        {CAPD_SCRATCH "0", CAPD_SCRATCH "0"},
        {CAPD_SCRATCH "-old/x", CAPD_SCRATCH "-old/x"},
        /* only a prefix is replaced, not a path further in */
        {"/opt/lib:" CAPD_SCRATCH "/lib", "/opt/lib:" CAPD_SCRATCH "/lib"},
        {"x" CAPD_SCRATCH, "x" CAPD_SCRATCH},
        /* values that have nothing to do with it */
        {"", ""},
        {"1", "1"},
        {"/var/lib/capd", "/var/lib/capd"},
        {"a=b=c", "a=b=c"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        json_t *env = json_pack("{s:s}", "V", t[i].value);
        char *etext = json_dumps(env, JSON_COMPACT);
        char *r = reply_with(etext, "{\"frame_fd\": 3}");
        struct worker_spec sp;
        char *err = NULL;
        int rc = worker_spec_rewrite(r, strlen(r), MY_SCRATCH, &sp, &err);
        cr_assert_eq(rc, 0, "row %zu: %s", i, err ? err : "");
        cr_assert_str_eq(env_get(sp.env, "V"), t[i].want, "row %zu: '%s' became '%s'", i,
                         t[i].value, env_get(sp.env, "V"));
        worker_spec_free(&sp);
        free(r);
        free(etext);
        json_decref(env);
    }
}

Test(spec, whole_reply)
{
    const char *env = "{\"HOME\": \"" CAPD_SCRATCH "\", \"PYTHONPATH\": \"/opt/capd/runner\", "
                      "\"TMP\": \"" CAPD_SCRATCH "/tmp\", \"OMP_NUM_THREADS\": \"4\", "
                      "\"CAPD_CELL_SPEC\": \"" CAPD_SCRATCH "/cell.json\"}";
    const char *spec = "{\"protocol\": 1, \"job\": \"j1\", \"attempt\": 7, \"model\": \"m\", "
                       "\"frame_fd\": 9, \"scratch\": \"" CAPD_SCRATCH "\", "
                       "\"options\": {\"threads\": 4}, "
                       "\"reference\": {\"env\": {\"HOME\": \"" CAPD_SCRATCH "\", "
                       "\"CAPD_CELL_SPEC\": \"" CAPD_SCRATCH "/cell.json\", \"K\": \"v\"}}}";
    char *r = reply_with(env, spec), *err = NULL;
    struct worker_spec sp;
    cr_assert_eq(worker_spec_rewrite(r, strlen(r), MY_SCRATCH, &sp, &err), 0, "%s", err ? err : "");
    cr_assert_eq(sp.attempt, 7);
    cr_assert_eq(sp.timeout_s, 600);
    cr_assert_eq(sp.chunk_max_bytes, 1048576);
    cr_assert_eq(sp.memory_max_bytes, 67108864);
    cr_assert(sp.frames_received == 0 && sp.log_received == 0);
    cr_assert_eq(strv_len(sp.argv), 3);
    cr_assert_str_eq(sp.argv[0], "/usr/bin/python3");
    cr_assert_str_eq(sp.argv[2], "capd_runner");
    /* exactly the reply's variables: CAPD_CELL_SPEC once, pointed here */
    cr_assert_eq(strv_len(sp.env), 5);
    cr_assert_str_eq(env_get(sp.env, "HOME"), MY_SCRATCH);
    cr_assert_str_eq(env_get(sp.env, "TMP"), MY_SCRATCH "/tmp");
    cr_assert_str_eq(env_get(sp.env, "PYTHONPATH"), "/opt/capd/runner");
    cr_assert_str_eq(env_get(sp.env, "OMP_NUM_THREADS"), "4");
    cr_assert_str_eq(env_get(sp.env, "CAPD_CELL_SPEC"), MY_SCRATCH "/cell.json");
    cr_assert_null(env_get(sp.env, "PATH"), "nothing of the worker's own environment");
    /* cell.json: the spec as capd wrote it, frame_fd 3, our scratch */
    json_t *c = json_loads(sp.cell_json, 0, NULL);
    cr_assert_not_null(c, "cell.json is JSON: %s", sp.cell_json);
    cr_assert_eq(json_integer_value(json_object_get(c, "frame_fd")), 3);
    cr_assert_str_eq(tu_str(c, "scratch"), MY_SCRATCH);
    cr_assert_str_eq(tu_str(c, "model"), "m");
    cr_assert_eq(json_integer_value(json_object_get(c, "protocol")), 1);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(c, "options"), "threads")), 4);
    json_t *renv = json_object_get(json_object_get(c, "reference"), "env");
    cr_assert_str_eq(tu_str(renv, "HOME"), MY_SCRATCH);
    cr_assert_str_eq(tu_str(renv, "CAPD_CELL_SPEC"), MY_SCRATCH "/cell.json");
    cr_assert_str_eq(tu_str(renv, "K"), "v");
    json_decref(c);
    worker_spec_free(&sp);
    cr_assert_null(sp.argv);
    free(r);
}

/* No CAPD_CELL_SPEC in the reply: the worker sets it anyway. */
Test(spec, sets_cell_spec)
{
    char *r = reply_with("{}", "{}"), *err = NULL;
    struct worker_spec sp;
    cr_assert_eq(worker_spec_rewrite(r, strlen(r), MY_SCRATCH, &sp, &err), 0, "%s", err ? err : "");
    cr_assert_eq(strv_len(sp.env), 1);
    cr_assert_str_eq(sp.env[0], "CAPD_CELL_SPEC=" MY_SCRATCH "/cell.json");
    json_t *c = json_loads(sp.cell_json, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(c, "frame_fd")), 3);
    cr_assert_str_eq(tu_str(c, "scratch"), MY_SCRATCH);
    json_decref(c);
    worker_spec_free(&sp);
    free(r);
}

/* The GPUs the node's scheduler gave the worker (Slurm's --gres sets
 * CUDA_VISIBLE_DEVICES) reach the runner, unless capd's env names them. */
Test(spec, gpu_visibility_from_the_node)
{
    setenv("CUDA_VISIBLE_DEVICES", "3", 1);
    setenv("ROCR_VISIBLE_DEVICES", "1", 1);
    char *r = reply_with("{\"ROCR_VISIBLE_DEVICES\": \"0\"}", "{}"), *err = NULL;
    struct worker_spec sp;
    cr_assert_eq(worker_spec_rewrite(r, strlen(r), MY_SCRATCH, &sp, &err), 0, "%s", err ? err : "");
    cr_assert_str_eq(env_get(sp.env, "CUDA_VISIBLE_DEVICES"), "3");
    cr_assert_str_eq(env_get(sp.env, "ROCR_VISIBLE_DEVICES"), "0", "capd's value wins");
    cr_assert_null(env_get(sp.env, "HIP_VISIBLE_DEVICES"));
    cr_assert_str_eq(env_get(sp.env, "CAPD_CELL_SPEC"), MY_SCRATCH "/cell.json");
    unsetenv("CUDA_VISIBLE_DEVICES");
    unsetenv("ROCR_VISIBLE_DEVICES");
    worker_spec_free(&sp);
    free(r);
}

Test(spec, counts_of_an_earlier_worker)
{
    const char *r = "{\"attempt\": 3, \"argv\": [\"/bin/true\"], \"env\": {}, \"spec\": {}, "
                    "\"scratch\": \"/s\", \"timeout_s\": 0, \"frames_received\": 5000000000, "
                    "\"log_received\": 17}";
    struct worker_spec sp;
    char *err = NULL;
    cr_assert_eq(worker_spec_rewrite(r, strlen(r), MY_SCRATCH, &sp, &err), 0, "%s", err ? err : "");
    cr_assert_eq(sp.frames_received, 5000000000ull);
    cr_assert_eq(sp.log_received, 17);
    cr_assert_eq(sp.chunk_max_bytes, 0, "absent: capd names no limit");
    cr_assert_eq(sp.memory_max_bytes, 0, "absent: no memory limit");
    worker_spec_free(&sp);
}

/* REPLY refused (-EINVAL) with a message that holds MSG, with SCRATCH as
 * the local scratch dir; a failure leaves the spec empty. ROW names it. */
static void expect_refused(const char *reply, const char *scratch, const char *msg, const char *row)
{
    struct worker_spec sp;
    char *err = NULL;
    int rc = worker_spec_rewrite(reply, strlen(reply), scratch, &sp, &err);
    cr_assert_eq(rc, -EINVAL, "%s: rc %d", row, rc);
    cr_assert_not_null(err, "%s: no message", row);
    cr_assert(strstr(err, msg), "%s: '%s' lacks '%s'", row, err, msg);
    cr_assert(!sp.argv && !sp.env && !sp.cell_json, "%s: a failure holds nothing", row);
    free(err);
}

/* The least reply worker_spec_rewrite takes. */
#define GOOD_REPLY                                                                                 \
    "{\"attempt\": 7, \"argv\": [\"/p\"], \"env\": {}, \"spec\": {}, \"scratch\": \"/s\"}"

Test(spec, bad_replies_table)
{
    /* whole replies */
    static const struct {
        const char *reply, *scratch, *msg;
    } t[] = {
        {"not json", MY_SCRATCH, "not a JSON object"},
        {"[1, 2]", MY_SCRATCH, "not a JSON object"},
        {"{\"attempt\": 7, \"attempt\": 8, \"argv\": [\"/p\"], \"env\": {}, \"spec\": {}, "
         "\"scratch\": \"/s\"}",
         MY_SCRATCH, "not a JSON object"},
        /* the local scratch dir must be absolute */
        {GOOD_REPLY, "tmp/x", "not an absolute path"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char row[32];
        snprintf(row, sizeof row, "row %zu", i);
        expect_refused(t[i].reply, t[i].scratch, t[i].msg, row);
    }
    /* GOOD_REPLY itself is taken; with MEMBER set to VALUE (JSON text), or
     * removed (NULL), it is not */
    struct worker_spec sp;
    char *err = NULL;
    cr_assert_eq(worker_spec_rewrite(GOOD_REPLY, strlen(GOOD_REPLY), MY_SCRATCH, &sp, &err), 0,
                 "%s", err ? err : "");
    worker_spec_free(&sp);
    static const struct {
        const char *member, *value, *msg;
    } m[] = {
        {"scratch", NULL, "'scratch'"},
        {"scratch", "\"rel\"", "'scratch' must be an absolute path"},
        {"attempt", NULL, "no 'attempt'"},
        {"attempt", "0", "'attempt' must be an integer >= 1"},
        {"attempt", "\"7\"", "'attempt'"},
        {"argv", "[]", "'argv' must be a non-empty array"},
        {"argv", "[\"\"]", "argv[0] must be a non-empty string"},
        {"argv", "[\"/p\", 3]", "argv[1] must be a string"},
        {"argv", "[\"/p\", \"a\\u0000b\"]", "not allowed"},
        {"env", "[]", "'env' must be an object"},
        {"env", "{\"K\": 1}", "env.K must be a string"},
        {"env", "{\"A=B\": \"1\"}", "bad name 'A=B'"},
        {"env", "{\"\": \"1\"}", "bad name"},
        {"spec", "1", "'spec' must be an object"},
        {"timeout_s", "-1", "'timeout_s' must be an integer >= 0"},
        {"chunk_max_bytes", "0", "'chunk_max_bytes' must be an integer >= 1"},
        {"memory_max_bytes", "-1", "'memory_max_bytes' must be an integer >= 0"},
        {"frames_received", "-5", "'frames_received'"},
    };
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        json_t *r = json_loads(GOOD_REPLY, 0, NULL);
        cr_assert_not_null(r);
        if (m[i].value) {
            json_t *v = json_loads(m[i].value, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
            cr_assert_not_null(v, "%s: %s", m[i].member, m[i].value);
            json_object_set_new(r, m[i].member, v);
        } else {
            json_object_del(r, m[i].member);
        }
        char *text = json_dumps(r, JSON_COMPACT), row[96];
        snprintf(row, sizeof row, "%s %s", m[i].member, m[i].value ? m[i].value : "removed");
        expect_refused(text, MY_SCRATCH, m[i].msg, row);
        free(text);
        json_decref(r);
    }
}

/* The limits on argv and env, crossed by one. */
Test(spec, limits)
{
    for (int which = 0; which < 2; which++) {
        int max = which ? WORKER_ENV_MAX : WORKER_ARGV_MAX;
        for (int n = max; n <= max + 1; n++) {
            json_t *a = json_array(), *e = json_object();
            json_array_append_new(a, json_string("/p"));
            for (int i = 1; i < (which == 0 ? n : 1); i++)
                json_array_append_new(a, json_string("x"));
            for (int i = 0; which == 1 && i < n; i++) {
                char k[32];
                snprintf(k, sizeof k, "V%d", i);
                json_object_set_new(e, k, json_string("1"));
            }
            json_t *r = json_pack("{s:i,s:o,s:o,s:{},s:s}", "attempt", 7, "argv", a, "env", e,
                                  "spec", "scratch", "/s");
            char *text = json_dumps(r, JSON_COMPACT), *err = NULL;
            struct worker_spec sp;
            int rc = worker_spec_rewrite(text, strlen(text), MY_SCRATCH, &sp, &err);
            bool over = n > max;
            cr_assert_eq(rc, over ? -E2BIG : 0, "%s of %d: rc %d %s", which ? "env" : "argv", n, rc,
                         err ? err : "");
            if (over)
                cr_assert(strstr(err, which ? "variables, more than" : "words, more than"), "%s",
                          err);
            worker_spec_free(&sp);
            free(err);
            free(text);
            json_decref(r);
        }
    }
    /* a reply larger than WORKER_SPEC_MAX is refused before it is parsed */
    struct worker_spec sp;
    char *err = NULL;
    cr_assert_eq(worker_spec_rewrite("{}", WORKER_SPEC_MAX + 1, MY_SCRATCH, &sp, &err), -E2BIG);
    cr_assert(strstr(err, "bytes, more than"), "%s", err);
    free(err);
}

/* ======================================================================
 * The program
 * ==================================================================== */

struct run {
    int code;
    char *out, *err;
    double secs;
};

static void run_free(struct run *r)
{
    free(r->out);
    free(r->err);
    memset(r, 0, sizeof *r);
}

#define SHOW(r) "exit %d\nstdout: %s\nstderr: %s", (r).code, (r).out, (r).err
/* The same, after "row I: ". */
#define SHOW_ROW(i, r) "row %zu: exit %d\nstdout: %s\nstderr: %s", (i), (r).code, (r).out, (r).err

/* Whether the NULL-terminated "K=V" list ENV (may be NULL) sets the
 * variable of KV. */
static bool overridden(const char *kv, const char *const *env)
{
    size_t n = strcspn(kv, "=");
    for (int i = 0; env && env[i]; i++)
        if (strncmp(env[i], kv, n + 1) == 0)
            return true;
    return false;
}

/* Runs capd-cell ARGS (NULL-terminated, after the program name) in DIR
 * with the environment minus every CAPD_* variable, TMPDIR and what ENV
 * sets, plus TMPDIR=DIR and ENV (may be NULL). Output goes to files in DIR. */
static void run_cell(struct run *r, const char *dir, const char *const *env,
                     const char *const *args)
{
    static int seq;
    char out[512], err[512], tmpdir[600];
    const char *argv[64], *envp[512];
    int a = 0, e = 0;
    memset(r, 0, sizeof *r);
    seq++;
    snprintf(out, sizeof out, "%s/cell-%d.out", dir, seq);
    snprintf(err, sizeof err, "%s/cell-%d.err", dir, seq);
    snprintf(tmpdir, sizeof tmpdir, "TMPDIR=%s", dir);
    argv[a++] = tu_bin("CAPD_CELL_BIN");
    for (int i = 0; args[i] && a < 63; i++)
        argv[a++] = args[i];
    argv[a] = NULL;
    for (int i = 0; environ[i] && e < 500; i++)
        if (strncmp(environ[i], "CAPD_", 5) != 0 && strncmp(environ[i], "TMPDIR=", 7) != 0 &&
            !overridden(environ[i], env))
            envp[e++] = environ[i];
    envp[e++] = tmpdir;
    for (int i = 0; env && env[i] && e < 510; i++)
        envp[e++] = env[i];
    envp[e] = NULL;
    pid_t pid;
    double t0 = tu_now_s();
    int rc = tu_spawn_to_files(&pid, argv, envp, out, err);
    cr_assert_eq(rc, 0, "cannot spawn %s: %s", argv[0], strerror(rc));
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    r->secs = tu_now_s() - t0;
    r->code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r->out = tu_slurp(out);
    r->err = tu_slurp(err);
}

/* A port of 127.0.0.1 that nothing listens on: bound, then closed. */
static int dead_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    cr_assert(fd >= 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

static bool exists(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

Test(program, help)
{
    char *dir = tu_tmpdir();
    struct run r;
    const char *const args[] = {"--help", NULL};
    run_cell(&r, dir, NULL, args);
    cr_assert_eq(r.code, 0, SHOW(r));
    static const char *const flags[] = {"--url",   "--attempt", "--token-file", "--scratch",
                                        "--chunk", "--retries", "--cacert",     "--keep-scratch",
                                        "--quiet", "CAPD_URL",  "CAPD_ATTEMPT", "CAPD_TOKEN"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        cr_assert(strstr(r.out, flags[i]), "--help names %s: " SHOW(r), flags[i]);
    run_free(&r);
    util_rm_tree(dir);
    free(dir);
}

/* Every usage error: exit 2, a message naming what is wrong, the hint to
 * --help, and nothing made (no scratch dir). */
Test(program, usage_errors)
{
    char *dir = tu_tmpdir(), tokfile[600], empty[600], unreadable[600], spacey[600];
    snprintf(tokfile, sizeof tokfile, "%s/token", dir);
    snprintf(empty, sizeof empty, "%s/empty", dir);
    snprintf(unreadable, sizeof unreadable, "%s/missing/token", dir);
    snprintf(spacey, sizeof spacey, "%s/spacey", dir);
    cr_assert_eq(tu_sh("printf 'capd_at_0123456789abcdef0123456789abcdef01234567\\n' > '%s' && "
                       ": > '%s' && printf 'a b\\n' > '%s'",
                       tokfile, empty, spacey),
                 0);
    static const char *const tok[] = {"CAPD_TOKEN=capd_at_x", NULL};
    char home_var[700];
    snprintf(home_var, sizeof home_var, "HOME=%s", dir);
    const char *const home[] = {"CAPD_TOKEN=capd_at_x", home_var, NULL};
    const struct {
        const char *const *env;
        const char *args[12];
        const char *msg;
    } t[] = {
        {tok, {"--attempt", "7", NULL}, "--url (or CAPD_URL) is required"},
        {tok, {"--url", "ftp://h", "--attempt", "7", NULL}, "must be an http:// or https:// URL"},
        {tok, {"--url", "http://h", NULL}, "--attempt (or CAPD_ATTEMPT) is required"},
        {tok, {"--url", "http://h", "--attempt", "0", NULL}, "--attempt must be a positive"},
        {tok, {"--url", "http://h", "--attempt", "-3", NULL}, "got '-3'"},
        {tok, {"--url", "http://h", "--attempt", "7x", NULL}, "got '7x'"},
        {tok, {"--url", "http://h", "--attempt", "", NULL}, "--attempt (or CAPD_ATTEMPT)"},
        {tok, {"--url", "http://h", "--attempt", " 7", NULL}, "got ' 7'"},
        {tok, {"--url", "http://h", "--attempt", "99999999999999999999", NULL}, "positive"},
        {NULL, {"--url", "http://h", "--attempt", "7", NULL}, "no token: give --token-file"},
        {NULL,
         {"--url", "http://h", "--attempt", "7", "--token-file", unreadable, NULL},
         "cannot be read: No such file or directory"},
        {NULL,
         {"--url", "http://h", "--attempt", "7", "--token-file", empty, NULL},
         "holds no token"},
        {NULL,
         {"--url", "http://h", "--attempt", "7", "--token-file", spacey, NULL},
         "holds a space or a control character"},
        {tok,
         {"--url", "http://h", "--attempt", "7", "--chunk", "0", NULL},
         "--chunk must be 1 to"},
        {tok,
         {"--url", "http://h", "--attempt", "7", "--chunk", "16777217", NULL},
         "--chunk must be 1 to 16777216 bytes, got '16777217'"},
        {tok, {"--url", "http://h", "--attempt", "7", "--chunk", "1k", NULL}, "got '1k'"},
        {tok,
         {"--url", "http://h", "--attempt", "7", "--retries", "101", NULL},
         "--retries must be 0 to 100"},
        {tok, {"--url", "http://h", "--attempt", "7", "--bogus", NULL}, "unknown option"},
        {tok, {"--url", "http://h", "--attempt", "7", "extra", NULL}, "unexpected argument"},
        {tok, {"--url", "http://h", "--attempt", NULL}, "missing value"},
        {tok, {"--url", "http://h", "--attempt", "7", "--cacert", unreadable, NULL}, "--cacert"},
        {tok, {"--url", "http://h", "--attempt", "7", "--scratch", "/", NULL}, "is / or $HOME"},
        {tok, {"--url", "http://h", "--attempt", "7", "--scratch", "/tmp/..", NULL}, "is / or"},
        {home, {"--url", "http://h", "--attempt", "7", "--scratch", dir, NULL}, "is / or $HOME"},
        {tok, {"--url", "http://h", "--attempt", "7", "--scratch", "", NULL}, "--scratch must be"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        struct run r;
        run_cell(&r, dir, t[i].env, t[i].args);
        cr_assert_eq(r.code, 2, SHOW_ROW(i, r));
        cr_assert(strstr(r.err, t[i].msg), "wants '%s': " SHOW_ROW(i, r), t[i].msg);
        cr_assert(strstr(r.err, "Try 'capd-cell --help'."), SHOW_ROW(i, r));
        cr_assert_null(strstr(r.err, "capd_at_"), "row %zu: the token was printed", i);
        run_free(&r);
    }
    char scratch[600];
    snprintf(scratch, sizeof scratch, "%s/capd-cell-7", dir);
    cr_assert_not(exists(scratch), "a usage error made the scratch dir");
    util_rm_tree(dir);
    free(dir);
}

/* The values from the environment: CAPD_URL and CAPD_ATTEMPT stand in for
 * the flags, and are checked the same way. */
Test(program, environment_values)
{
    char *dir = tu_tmpdir();
    static const char *const bad_att[] = {"CAPD_TOKEN=t", "CAPD_URL=http://h", "CAPD_ATTEMPT=seven",
                                          NULL};
    static const char *const bad_url[] = {"CAPD_TOKEN=t", "CAPD_URL=h:1", "CAPD_ATTEMPT=7", NULL};
    static const char *const none[] = {NULL};
    struct run r;
    run_cell(&r, dir, bad_att, none);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "got 'seven'"), SHOW(r));
    run_free(&r);
    run_cell(&r, dir, bad_url, none);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "got 'h:1'"), SHOW(r));
    run_free(&r);
    util_rm_tree(dir);
    free(dir);
}

/* A capd that nothing listens for: the spec's GET is tried 1 + --retries
 * times with a growing backoff (100 ms, then 200 ms), then exit 1 with a
 * message naming the request and why, never the token; no scratch dir. */
Test(program, unreachable_capd, .timeout = 60)
{
    char *dir = tu_tmpdir(), url[64], tokfile[600], want[160];
    int port = dead_port();
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", port);
    snprintf(tokfile, sizeof tokfile, "%s/token", dir);
    cr_assert_eq(
        tu_sh("printf 'capd_at_0123456789abcdef0123456789abcdef01234567\\n' > '%s'", tokfile), 0);
    const char *const args[] = {"--url", url,         "--attempt", "7", "--token-file",
                                tokfile, "--retries", "2",         NULL};
    struct run r;
    run_cell(&r, dir, NULL, args);
    cr_assert_eq(r.code, 1, SHOW(r));
    snprintf(want, sizeof want, "GET http://127.0.0.1:%d/v1/attempts/7/spec: cannot reach capd",
             port);
    cr_assert(strstr(r.err, want), "wants '%s': " SHOW(r), want);
    cr_assert(strstr(r.err, "(gave up after 3 tries)"), SHOW(r));
    cr_assert(strstr(r.err, "trying again in 100 ms"), SHOW(r));
    cr_assert(strstr(r.err, "trying again in 200 ms"), SHOW(r));
    cr_assert_null(strstr(r.err, "trying again in 400 ms"), "only --retries 2: " SHOW(r));
    cr_assert_geq(r.secs, 0.3, "the backoff was waited: %.3f s", r.secs);
    cr_assert_null(strstr(r.err, "capd_at_"), "the token was printed: " SHOW(r));
    char scratch[600];
    snprintf(scratch, sizeof scratch, "%s/capd-cell-7", dir);
    cr_assert_not(exists(scratch), "no spec, no scratch dir");
    run_free(&r);

    /* --quiet keeps the final error and drops the retry lines; --retries 0
     * is a single try. */
    const char *const quiet[] = {"--url", url,         "--attempt", "7",       "--token-file",
                                 tokfile, "--retries", "0",         "--quiet", NULL};
    run_cell(&r, dir, NULL, quiet);
    cr_assert_eq(r.code, 1, SHOW(r));
    cr_assert(strstr(r.err, want), SHOW(r));
    cr_assert_null(strstr(r.err, "trying again"), SHOW(r));
    cr_assert_null(strstr(r.err, "gave up after"), "one try: " SHOW(r));
    run_free(&r);
    util_rm_tree(dir);
    free(dir);
}
