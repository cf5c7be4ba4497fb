/*
 * tests/helpers/common/testutil.h - what integration tests share: temp
 * dirs, a real capd started on an ephemeral port, HTTP through libcurl.
 * Processes are started with posix_spawn (never a bare fork inside a
 * Criterion test).
 */
#ifndef CAPD_TESTUTIL_H
#define CAPD_TESTUTIL_H

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/types.h>

struct tu_capd {
    pid_t pid;
    int port;
    char dir[256];
    char base[64];
    char errlog[300];
    /* Set by the caller after tu_capd_start for a capd serving HTTPS: the
     * PEM file tu_http verifies the server's certificate against. */
    char cacert[300];
    /* The first admin token capd wrote to DIR/data/admin.token (auth is on
     * by default), read by tu_capd_start; "" when there is none. tu_http
     * sends it as a bearer token unless the request names its own
     * Authorization header. A test of anonymous requests clears it
     * (tu_anonymous). */
    char token[128];
};

/* Clears C's token: tu_http then sends no Authorization header. */
void tu_anonymous(struct tu_capd *c);

/* A fresh directory under $TMPDIR; the caller frees. */
char *tu_tmpdir(void);
/* Path of a built binary or helper from the environment ctest sets. */
const char *tu_bin(const char *env);
char *tu_helper(const char *name);

/* Starts capd on 127.0.0.1:0 with data dir DIR (created when NULL), plus
 * EXTRA flags (NULL-terminated). Returns 0 and fills C once it listens;
 * C->base is https://... when capd says it serves HTTPS. */
int tu_capd_start(struct tu_capd *c, const char *dir, const char *const *extra);
/* SIGTERM and wait; returns the exit status (or 128+signal). */
int tu_capd_stop(struct tu_capd *c);
/* SIGKILL and wait. */
void tu_capd_kill9(struct tu_capd *c);

struct tu_resp {
    long status;
    char *body;
    size_t len;
    char *headers;
};
void tu_resp_free(struct tu_resp *r);
/* Appends N bytes at D to the NUL-terminated *TEXT of *LEN bytes (both
 * may start NULL and 0): 0, or -ENOMEM with *TEXT unchanged. */
int tu_append(char **text, size_t *len, const char *d, size_t n);

/* One HTTP request. HEADERS is a NULL-terminated list of "Name: value";
 * C's token is added unless HEADERS has an Authorization header ("Host:"
 * and "Authorization:" with no value make curl send none). */
int tu_http(const struct tu_capd *c, const char *method, const char *path, const char *body,
            size_t body_len, const char *const *headers, struct tu_resp *out);
/* JSON convenience: sends BODY (may be NULL) as application/json, returns
 * the parsed reply (json null when not JSON) and the status. */
json_t *tu_json(const struct tu_capd *c, const char *method, const char *path, const char *body,
                long *status);
json_t *tu_jsonf(const struct tu_capd *c, const char *method, const char *path, long *status,
                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Reads GET PATH (an event stream) from its first event until the text
 * holds UNTIL or TIMEOUT_MS pass; returns what it read (owned). */
char *tu_events_until(const struct tu_capd *c, const char *path, const char *until, int timeout_ms);

/* Polls the job until it is done or cancelled, up to TIMEOUT_S. Returns the
 * final job (owned) or NULL on timeout. */
json_t *tu_wait_job(const struct tu_capd *c, const char *job_id, int timeout_s);

/* Registers build NAME running the fake runner helper, with model roots so
 * fake:* user models are accepted. Returns the HTTP status. */
long tu_fake_build(const struct tu_capd *c, const char *name, const char *env_json);

/* Submits a one-cell job of MODEL on the fake build; returns the job id
 * (malloc'd) or NULL. OPTIONS is a JSON object text or NULL. */
char *tu_submit(const struct tu_capd *c, const char *build, const char *model, const char *options);

/* Whether capd says this host runs WIDTH (GET /v1/widths runnable_here). */
bool tu_width_runnable(const struct tu_capd *c, const char *width);
/* The widest x86 width capd says this host runs (GET /v1/widths, after its
 * cpu_features_hide): "avx512", else "avx2", else "default" (no vector
 * width: a host where the width tests cannot run). */
const char *tu_widest_width(const struct tu_capd *c);

/* Counts of /proc/PID/fd entries, and of zombie children of PID. */
int tu_count_fds(pid_t pid);
int tu_count_zombies(pid_t ppid);

/* FMT formatted (owned), or NULL when memory runs out. */
char *tu_vfmt(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));

/* Where a spawned process's fd 0, 1 or 2 points: FROM (a descriptor
 * above 2 of ours) when it is not 0, else file PATH opened with FLAGS
 * (mode 0644) when PATH is not NULL, else our own. */
struct tu_fd {
    const char *path;
    int flags;
    int from;
};
/* posix_spawn of ARGV[0] with ARGV and ENVP (NULL for ours), its fds 0-2
 * set up as FDS says; 0 and *PID, or posix_spawn's error number. */
int tu_spawn(pid_t *pid, const char *const *argv, const char *const *envp,
             const struct tu_fd fds[3]);

/* tu_spawn with stdin /dev/null and stdout, stderr to the files OUT and
 * ERR (truncated). */
int tu_spawn_to_files(pid_t *pid, const char *const *argv, const char *const *envp, const char *out,
                      const char *err);

/* Runs a shell command line; returns its exit status. */
int tu_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The whole file at PATH as a NUL-terminated string (owned); "" when it
 * cannot be opened. */
char *tu_slurp(const char *path);
/* Seconds on CLOCK_MONOTONIC. */
double tu_now_s(void);
/* Member KEY of object J as a string: NULL (tu_jstr) or "" (tu_str) when
 * it is absent or not a string. */
const char *tu_jstr(json_t *j, const char *key);
const char *tu_str(json_t *j, const char *key);
/* The value of one series of C's /metrics (the line starting with SERIES
 * and a space), -1 when it is absent. */
double tu_metric(const struct tu_capd *c, const char *series);
/* The interpreter with torch: $CAPD_PYTHON, else /usr/bin/python3. */
const char *tu_python(void);

#endif
