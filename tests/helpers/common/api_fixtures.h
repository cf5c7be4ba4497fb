/*
 * tests/helpers/common/api_fixtures.h - what the REST API tests
 * (tests/test_api_*.c) share: one real capd per test, started on an
 * ephemeral port in the test's own temp dir (af_capd, af_dir), and short
 * helpers that talk JSON to it and fail the test when a reply is not what
 * they need. Every suite of those files takes AF_SUITE, whose fini stops
 * the capd and removes the temp dir even when the test failed.
 *
 * Cells need a runner. These tests never depend on torch: builds point at
 * small shell scripts written into the test's temp dir, so what a cell does
 * is deterministic:
 *   hang.sh  sleeps forever: with the default max_parallel=1 the first cell
 *            runs and every later cell stays queued (listing, cancel);
 *   ok.sh    speaks the runner protocol: hello, env, five stats-only
 *            tensors, timing, memory, end ok (cells, records, compare);
 *   /bin/true exits 0 without a frame: the cell ends `failed`.
 *
 * JSON literals in these tests use ' for " to stay readable; af_q() and
 * the helpers that take such text swap them.
 */
#ifndef CAPD_API_FIXTURES_H
#define CAPD_API_FIXTURES_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "tests/helpers/common/testutil.h"

/* The test's capd and temp dir; af_teardown stops and removes them. */
extern struct tu_capd af_capd;
extern char *af_dir;

void af_teardown(void);
#define AF_SUITE .fini = af_teardown, .timeout = 120
/* For a suite each of whose tests starts with capd on the defaults
 * (af_start(NULL)) and no limit of its own: init and fini. */
void af_start_defaults(void);
#define AF_CAPD_SUITE .init = af_start_defaults, .fini = af_teardown
/* For the suites of real torch cells: capd on the defaults but two cells
 * at a time (--max-parallel 2), as an operator would run it. */
void af_start_two_cells(void);
#define AF_TWO_CELLS_SUITE .init = af_start_two_cells, .fini = af_teardown

/* For the suites that keep their own capd and temp dir: starts capd in DIR
 * (as tu_capd_start) and fails the test with capd's stderr when it does not
 * start; stops C and removes *DIR (a tu_tmpdir() path), then nulls it. */
void af_start_capd(struct tu_capd *c, const char *dir, const char *const *extra);
void af_stop_capd(struct tu_capd *c, char **dir);
/* Stops C and removes the temp dir tu_capd_start made for it (C->dir). */
void af_stop_own_capd(struct tu_capd *c);
/* Stops C (SIGKILL when KILL9, else SIGTERM, after which capd must exit
 * 0) and starts capd again in the same data dir, on the same port, with
 * --config CONFIG: a restart that the workers and clients of C see as
 * capd coming back. */
void af_restart_capd(struct tu_capd *c, const char *config, bool kill9);
/* A suite's own capd with a fresh temp dir DIR and its data dir DIR/data;
 * af_env_init zeroes E and makes the dir. */
struct af_env {
    struct tu_capd c;
    char dir[256];
    char data[300];
};
void af_env_init(struct af_env *e);

/* Creates the temp dir unless the test already has one. */
void af_ensure_dir(void);
/* Starts capd in the temp dir (data in DIR/data) with EXTRA flags
 * (NULL-terminated, may be NULL); fails the test with capd's stderr when
 * it does not start. */
void af_start(const char *const *extra);
/* Writes TEXT to PATH (created or truncated), failing the test when it
 * cannot. */
void af_put_file(const char *path, const char *text);
/* Writes file NAME with TEXT and MODE into the temp dir; returns its path
 * (valid for the next seven calls). */
const char *af_write_file(const char *name, const char *text, mode_t mode);

extern const char AF_HANG_SH[];
extern const char AF_OK_SH[];

/* S with ' swapped for "; lives until the next few calls (a ring). */
const char *af_q(const char *s);
/* J as compact JSON text (owned); "(null)" for NULL. */
char *af_dump(json_t *j);

/* One request with a JSON body (BODY may be NULL); returns the parsed
 * reply (json null when the reply is not JSON). */
json_t *af_call(const char *method, const char *path, const char *body, long *status);
/* Like af_call() with BODY run through af_q(). */
json_t *af_callq(const char *method, const char *path, const char *body, long *status);
json_t *af_get(const char *path, long *status);
/* GET PATH, failing the test unless the reply is 200 (owned). */
json_t *af_get_ok(const char *path);
/* A raw request with headers HDRS; the reply is parsed as JSON when
 * possible, and kept whole in KEEP (the caller frees) unless it is NULL. */
json_t *af_raw(const char *method, const char *path, const char *body, size_t len,
               const char *const *hdrs, long *status, struct tu_resp *keep);
/* The value of header NAME in a raw header block (static), or NULL; the
 * first one when there are several. */
const char *af_header(const char *headers, const char *name);
/* Checks an error reply: the status, and a body of exactly
 * {"error":{"code":CODE,"message":non-empty string,"field":FIELD|null}}. */
void af_expect_error(json_t *j, long status, long want, const char *code, const char *field);
/* GET PATH and check its reply is error CODE with status WANT and no field. */
void af_expect_get_error(const char *path, long want, const char *code);
/* The same for METHOD PATH with BODY (af_q() text, may be NULL), and FIELD. */
void af_expect_call_error(const char *method, const char *path, const char *body, long want,
                          const char *code, const char *field);

/* Number of jobs the server lists (walking every page), and of builds. */
int af_count_jobs(void);
int af_count_builds(void);
/* Registers build NAME running PYTHON; ROOTS adds the temp dir as its
 * model root. Fails the test unless the reply is 201. */
void af_add_build(const char *name, const char *python, bool roots);
/* A build of hang.sh (with the temp dir as model root), and one of ok.sh. */
void af_hang_build(const char *name);
void af_ok_build(const char *name);
/* Posts a job (FMT: af_q() text); returns it (owned) after asserting WANT. */
json_t *af_post_job(long want, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A one-cell job (mlp, avx2, forward) of BUILD at COMMIT; returns its id
 * (owned). */
char *af_submit1(const char *build, const char *commit);
/* The id of JOB (a job the API answered), which it releases (owned);
 * fails the test when JOB has none. */
char *af_job_id(json_t *job);

/* GET /v1/jobs/ID, asserting 200 (owned). */
json_t *af_get_job(const char *id);
/* The state of cell I of JOB. */
const char *af_cell_state(json_t *job, size_t i);
/* Polls job ID until cell I is in STATE; returns the job (owned). */
json_t *af_wait_cell(const char *id, size_t i, const char *state, double timeout);
/* Waits (30 s at most) for job ID to finish; returns it (owned). */
json_t *af_wait_done(const char *id);
/* The same on capd C, TIMEOUT_S at most. */
json_t *af_wait_job(const struct tu_capd *c, const char *id, int timeout_s);
/* af_wait_job, TIMEOUT_S each, for the NULL-terminated job ids that follow. */
void af_wait_jobs(const struct tu_capd *c, int timeout_s, ...);
/* GET PATH on C once it no longer answers 409 pending (jobs it waits on
 * still running), polling for up to TIMEOUT_S seconds: the 200 answer
 * (owned); fails the test on another status or past the time. */
json_t *af_get_settled(const struct tu_capd *c, const char *path, int timeout_s);
/* Job ID's label KEY on C once it is there (GET /v1/jobs/ID every 100 ms
 * for TIMEOUT_S at most, failing the test then): its value (owned). */
char *af_wait_label(const struct tu_capd *c, const char *id, const char *key, int timeout_s);
/* The official-build lane's interpreter ($CAPD_OFFICIAL_PYTHON); without
 * one the test is skipped with the reason ($CAPD_OFFICIAL_SKIP), or fails
 * under CI=true, where the lane must be there. */
const char *af_official_python(void);
/* The cell of MODEL, WIDTH and PASS in a comparison RESULT's "cells", or NULL. */
json_t *af_find_cell(json_t *result, const char *model, const char *width, const char *pass);

/* A job for af_submit_job: MODELS, WIDTHS and PASSES are the contents of
 * the matrix's JSON lists ("\"mlp\",\"cnn\""), CONTROL a control commit or
 * NULL, OPTIONS a JSON object or NULL for {}. */
struct af_job {
    const char *project, *commit, *control, *build;
    const char *models, *widths, *passes, *options;
};
/* Posts JOB to capd C; fails the test unless the reply is 201 with an id,
 * which it returns (owned). */
char *af_submit_job(const struct tu_capd *c, const struct af_job *job);
/* The same with the matrix's MODES too (the contents of its JSON list;
 * NULL for none, the API's default, as af_submit_job). */
char *af_submit_modes_job(const struct tu_capd *c, const struct af_job *job, const char *modes);
/* Runs one cell of MODEL on C's build "fake" (tu_submit with OPTIONS),
 * waits for it (120 s at most) and returns the cell's own GET reply (owned,
 * with details); the job id goes to *JOB_OUT (owned) unless it is NULL. */
json_t *af_run_cell(const struct tu_capd *c, const char *model, const char *options,
                    char **job_out);
/* Every record of KIND of CELL of JOB on capd C, walking every page, in
 * the order the API returns them (owned). */
json_t *af_cell_records(const struct tu_capd *c, const char *job, const char *cell,
                        const char *kind);
/* "KEY HASH HASH_ALG\n" of every tensor record of CELL of JOB on capd C,
 * in order (owned): two cells' records compared hash for hash. */
char *af_record_lines(const struct tu_capd *c, const char *job, const char *cell);
/* The same lines of one cell of MODEL (build "fake", tu_submit's width)
 * run on a capd of its own with the local executor, which is stopped
 * after; the cell must end ok. */
char *af_local_lines(const char *model);
/* Fails the test (saying WHAT) unless CELL of JOB on C has records, and
 * they are, hash for hash, those af_local_lines gives for MODEL. */
void af_expect_local_records(const struct tu_capd *c, const char *job, const char *cell,
                             const char *model, const char *what);
/* Runs capctl (next to CAPD_BIN) against capd C with ARGS; its exit
 * status, and its output (stdout and stderr) in *OUT (owned). */
int af_capctl(const struct tu_capd *c, const char *args, char **out);
/* One capctl run a table of them expects: its arguments, exit status and
 * a text its output holds. */
struct af_capctl_run {
    const char *args;
    int rc;
    const char *says;
};
/* Runs each of the N runs of RUNS against af_capd; fails the test at the
 * first whose exit status or output is not the one expected. */
void af_expect_capctl_n(const struct af_capctl_run *runs, size_t n);
#define af_expect_capctl(runs) af_expect_capctl_n((runs), sizeof(runs) / sizeof((runs)[0]))

/* The JSON array text of the commits SHA(0) .. SHA(N - 1) (owned). */
char *af_commit_list(int n, void (*sha)(int i, char out[41]));
/* Posts bisection BODY to C, failing the test unless the reply is 201; its
 * id goes to ID and the reply to *REPLY (owned) unless REPLY is NULL. */
void af_post_bisect(const struct tu_capd *c, const char *body, char id[16], json_t **reply);
/* Polls bisection ID on C until it is no longer running, TIMEOUT_S at
 * most, and fails the test unless it ended done; returns it (owned) and
 * its indented text in *DUMP (owned). */
json_t *af_bisect_done(const struct tu_capd *c, const char *id, int timeout_s, char **dump);
/* af_post_bisect of BODY, then af_bisect_done: the finished bisection
 * (owned) and its text in *DUMP (owned). */
json_t *af_bisect_run(const struct tu_capd *c, const char *body, int timeout_s, char **dump);
/* /healthz's running_cells, and a wait (20 s at most) until it is WANT. */
long af_running_cells(void);
void af_wait_running_cells(long want);

/* Whether V is a UTC timestamp as capd writes them: 2024-01-02T03:04:05.678Z. */
bool af_is_rfc3339(json_t *v);

#endif
