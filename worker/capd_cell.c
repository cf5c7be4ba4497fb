/*
 * worker/capd_cell.c - capd-cell, the worker of a remote cell attempt
 * (worker.h; docs/scale.md, "Running capd-cell by hand"):
 *
 *   capd-cell --url URL --attempt N (--token-file FILE | env CAPD_TOKEN)
 *             [--scratch DIR] [--chunk BYTES] [--retries N] [--cacert FILE]
 *             [--keep-scratch] [--quiet]
 *
 * It GETs the attempt's spec, makes its scratch dir and cell.json, runs
 * the runner (run.c) and streams its output to capd until capd accepted
 * the finish. Everything on the command line is checked before the
 * network is touched, so a mistake is exit 2 with nothing changed.
 */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fs.h"
#include "util/http.h"
#include "util/opts.h"
#include "util/path.h"
#include "worker/worker.h"

static const char usage_text[] =
    "usage: capd-cell --url URL --attempt N [--token-file FILE] [--scratch DIR]\n"
    "                 [--chunk BYTES] [--retries N] [--cacert FILE] [--keep-scratch] [--quiet]\n"
    "\n"
    "Runs attempt N of a capd cell on this host: fetches its spec from capd, runs its\n"
    "runner in a scratch dir, streams the runner's frames and log back, and reports how\n"
    "it ended.\n"
    "\n"
    "  --url URL          capd's base URL, http:// or https:// (default: $CAPD_URL)\n"
    "  --attempt N        the attempt's id (default: $CAPD_ATTEMPT)\n"
    "  --token-file FILE  the attempt's token, the file's first line (default: $CAPD_TOKEN)\n"
    "  --scratch DIR      the scratch dir, emptied first (default: $TMPDIR/capd-cell-N-PID)\n"
    "  --keep-scratch     leave the scratch dir in place at the end\n"
    "  --chunk BYTES      POST a stream's bytes once this many wait (default 262144,\n"
    "                     at most 16777216; capd's chunk_max_bytes caps it)\n"
    "  --retries N        tries again after a connection error or a 5xx, N times (default 12)\n"
    "  --cacert FILE      the CA certificate a self-signed capd is checked against\n"
    "  --quiet            say nothing but errors\n"
    "  --help             print this text\n"
    "\n"
    "Exit status: 0 capd accepted the finish (whatever the cell's outcome), 1 capd could\n"
    "not be reached or refused a request, 2 bad usage.\n";

struct args {
    const char *url, *attempt, *token_file, *scratch, *chunk, *retries, *cacert;
    bool keep, quiet, help;
};

/* The checked settings of one run. */
struct settings {
    char url[4096];
    long long attempt;
    char token[WORKER_TOKEN_MAX + 1];
    char scratch[UTIL_PATH_MAX];
    struct worker_opts o;
    bool keep;
};

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    fputs("capd-cell: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nTry 'capd-cell --help'.\n", stderr);
    return WORKER_EXIT_USAGE;
}

/* A decimal number from 0 to MAX, digits only. */
static bool parse_count(const char *s, unsigned long long max, unsigned long long *out)
{
    unsigned long long v = 0;
    if (!s || !*s)
        return false;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9' || v > (max - (unsigned)(*p - '0')) / 10)
            return false;
        v = v * 10 + (unsigned)(*p - '0');
    }
    *out = v;
    return true;
}

static const char *from_env(const char *given, const char *var)
{
    const char *v = given ? given : getenv(var);
    return v && *v ? v : NULL;
}

static int check_url(struct settings *st, const char *url)
{
    if (!url)
        return usage_error("--url (or CAPD_URL) is required");
    int rc = util_http_base(url, st->url, sizeof st->url);
    if (rc == -EINVAL)
        return usage_error("--url must be an http:// or https:// URL, got '%s'", url);
    if (rc != 0)
        return usage_error("--url is longer than %zu bytes", sizeof st->url - 1);
    return 0;
}

/* The token: FILE's first line, else $CAPD_TOKEN. */
static int check_token(struct settings *st, const char *file)
{
    const char *from = file ? "--token-file" : "CAPD_TOKEN";
    char *text = NULL;
    if (file) {
        int rc = util_slurp(file, 64 * 1024, &text, NULL);
        if (rc != 0)
            return usage_error("--token-file '%s' cannot be read: %s", file, strerror(-rc));
        text[strcspn(text, "\r\n")] = 0;
    }
    const char *tok = file ? text : getenv("CAPD_TOKEN");
    int rc = 0;
    if (!tok || !*tok)
        rc = file ? usage_error("--token-file '%s' holds no token", file)
                  : usage_error("no token: give --token-file FILE or set CAPD_TOKEN");
    else if (strlen(tok) > WORKER_TOKEN_MAX)
        rc = usage_error("the token of %s is longer than %d bytes", from, WORKER_TOKEN_MAX);
    else if (!util_http_token_ok(tok))
        rc = usage_error("the token of %s holds a space or a control character", from);
    if (rc == 0)
        snprintf(st->token, sizeof st->token, "%s", tok);
    util_http_secret_free(text);
    return rc;
}

static int check_numbers(struct settings *st, const struct args *a)
{
    unsigned long long v;
    const char *att = from_env(a->attempt, "CAPD_ATTEMPT");
    if (!att)
        return usage_error("--attempt (or CAPD_ATTEMPT) is required");
    if (!parse_count(att, (unsigned long long)INT64_MAX, &v) || v == 0)
        return usage_error("--attempt must be a positive decimal integer, got '%s'", att);
    st->attempt = (long long)v;
    st->o.chunk = WORKER_CHUNK_DEFAULT;
    if (a->chunk && (!parse_count(a->chunk, WORKER_CHUNK_MAX, &v) || v == 0))
        return usage_error("--chunk must be 1 to %u bytes, got '%s'", WORKER_CHUNK_MAX, a->chunk);
    if (a->chunk)
        st->o.chunk = (size_t)v;
    st->o.retries = WORKER_RETRIES;
    if (a->retries && !parse_count(a->retries, WORKER_RETRIES_MAX, &v))
        return usage_error("--retries must be 0 to %d, got '%s'", WORKER_RETRIES_MAX, a->retries);
    if (a->retries)
        st->o.retries = (int)v;
    return 0;
}

/* Whether DIR is / or $HOME, which the scratch dir's emptying would wipe. */
static bool emptying_hurts(const char *dir)
{
    char abs[UTIL_PATH_MAX], home[UTIL_PATH_MAX];
    const char *h = getenv("HOME");
    if (!realpath(dir, abs))
        return false;
    return strcmp(abs, "/") == 0 || (h && realpath(h, home) && strcmp(abs, home) == 0);
}

static int check_paths(struct settings *st, const struct args *a)
{
    int rc;
    if (a->scratch) {
        if (!*a->scratch || strlen(a->scratch) >= sizeof st->scratch)
            return usage_error("--scratch must be a path of 1 to %zu bytes",
                               sizeof st->scratch - 1);
        snprintf(st->scratch, sizeof st->scratch, "%s", a->scratch);
        if (emptying_hurts(st->scratch))
            return usage_error("--scratch '%s' is / or $HOME, which would be emptied", a->scratch);
    } else {
        const char *tmp = from_env(NULL, "TMPDIR");
        char name[64];
        /* the pid too: attempt ids are one capd's, and two capds' workers
         * (or a capd's after a new database) may share a node */
        snprintf(name, sizeof name, "capd-cell-%lld-%ld", st->attempt, (long)getpid());
        if ((rc = util_path_join(st->scratch, tmp ? tmp : "/tmp", name)) != 0)
            return usage_error("$TMPDIR is too long for the scratch dir's path");
    }
    const char *ca = from_env(a->cacert, "CAPD_CACERT");
    if (ca && access(ca, R_OK) != 0)
        return usage_error("--cacert '%s' cannot be read: %s", ca, strerror(errno));
    st->o.cacert = ca;
    return 0;
}

/* The command line into ST: 0, WORKER_EXIT_USAGE (said on stderr), or -1
 * for --help, which has been printed. */
static int parse_args(int argc, char **argv, struct settings *st)
{
    struct args a = {0};
    const struct util_opt opts[] = {
        {"url", &a.url, NULL, false},
        {"attempt", &a.attempt, NULL, false},
        {"token-file", &a.token_file, NULL, false},
        {"scratch", &a.scratch, NULL, false},
        {"chunk", &a.chunk, NULL, false},
        {"retries", &a.retries, NULL, false},
        {"cacert", &a.cacert, NULL, false},
        {"keep-scratch", NULL, &a.keep, false},
        {"quiet", NULL, &a.quiet, false},
        {"help", NULL, &a.help, true},
    };
    const char *bad = NULL;
    int rc = util_opts_parse(argc, argv, 1, opts, sizeof opts / sizeof opts[0], &bad);
    if (rc == 1) {
        fputs(usage_text, stdout);
        return -1;
    }
    if (rc != 0)
        return usage_error("unknown option or missing value: '%s'", bad ? bad : "?");
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    if ((rc = check_url(st, from_env(a.url, "CAPD_URL"))) != 0 ||
        (rc = check_numbers(st, &a)) != 0 || (rc = check_token(st, a.token_file)) != 0 ||
        (rc = check_paths(st, &a)) != 0)
        return rc;
    st->keep = a.keep;
    st->o.quiet = a.quiet;
    st->o.attempt = st->attempt;
    return 0;
}

/* Empties DIR and makes it again, mode 0700, then resolves it to the
 * absolute path the runner's env and cell.json name. What is there must
 * be a directory of the worker's own user: emptying it must never reach
 * someone else's files or follow a link. */
static int make_scratch(char dir[UTIL_PATH_MAX])
{
    struct stat sb;
    char abs[UTIL_PATH_MAX];
    if (lstat(dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode) || sb.st_uid != geteuid()) {
            worker_say("the scratch dir %s exists and is not a directory of this user", dir);
            return -1;
        }
        if (emptying_hurts(dir)) {
            worker_say("the scratch dir %s is / or $HOME: it would be emptied", dir);
            return -1;
        }
        if (util_rm_tree(dir) != 0 && lstat(dir, &sb) == 0) {
            worker_say("cannot empty the scratch dir %s", dir);
            return -1;
        }
    }
    int rc = util_mkdir_p(dir, 0700);
    if (rc != 0 || chmod(dir, 0700) != 0 || !realpath(dir, abs)) {
        worker_say("cannot make the scratch dir %s: %s", dir, strerror(rc ? -rc : errno));
        return -1;
    }
    snprintf(dir, UTIL_PATH_MAX, "%s", abs);
    return 0;
}

static int write_cell_json(const char *dir, const char *text)
{
    char path[UTIL_PATH_MAX], tmp[UTIL_PATH_MAX];
    if (util_path_join(path, dir, "cell.json") != 0 ||
        util_path_join(tmp, dir, ".cell.json.tmp") != 0)
        return -ENAMETOOLONG;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    return util_tmp_finish(fd, util_write_all(fd, text, strlen(text)), tmp, path);
}

/* GET the spec: its reply in R (200), or -1 said on stderr. */
static int fetch_spec(struct worker_http *c, const struct settings *st, struct worker_reply *r)
{
    char path[96];
    int tries = 0;
    snprintf(path, sizeof path, "/v1/attempts/%lld/spec", st->attempt);
    if (worker_http_retry(c, "GET", path, NULL, NULL, 0, st->o.retries, st->o.quiet, r, &tries) !=
        0) {
        worker_say("GET %s%s: out of memory", st->url, path);
        return -1;
    }
    if (r->status == 200)
        return 0;
    worker_request_failed(c, "GET", path, r, tries);
    worker_reply_free(r);
    return -1;
}

/* The spec's own checks against this run: the attempt asked for, and no
 * stream begun by an earlier worker (a runner started again would not
 * write the same bytes, so capd-cell never continues another's stream). */
static int spec_fits(const struct settings *st, const struct worker_spec *sp)
{
    if (sp->attempt != st->attempt) {
        worker_say("capd sent the spec of attempt %lld for attempt %lld", sp->attempt, st->attempt);
        return -1;
    }
    if (sp->frames_received || sp->log_received) {
        worker_say("attempt %lld already holds %llu frame bytes and %llu log bytes at capd: "
                   "another worker ran it",
                   st->attempt, (unsigned long long)sp->frames_received,
                   (unsigned long long)sp->log_received);
        return -1;
    }
    return 0;
}

/* Everything after the command line: spec, scratch, cell.json, the run. */
static int run_attempt(struct settings *st, struct worker_http *c)
{
    struct worker_reply r;
    struct worker_spec sp = {0};
    char *err = NULL;
    bool made = false;
    int rc = WORKER_EXIT_ERROR;
    if (fetch_spec(c, st, &r) != 0)
        return WORKER_EXIT_ERROR;
    if (make_scratch(st->scratch) != 0)
        goto out;
    made = true;
    st->o.scratch = st->scratch;
    int e = worker_spec_rewrite(r.body.p, r.body.len, st->scratch, &sp, &err);
    if (e != 0) {
        worker_say("GET %s/v1/attempts/%lld/spec: %s", st->url, st->attempt,
                   err ? err : strerror(-e));
        goto out;
    }
    if (spec_fits(st, &sp) != 0)
        goto out;
    if ((e = write_cell_json(st->scratch, sp.cell_json)) != 0) {
        worker_say("cannot write %s/cell.json: %s", st->scratch, strerror(-e));
        goto out;
    }
    rc = worker_run(c, &st->o, &sp);
out:
    if (made && !st->keep)
        util_rm_tree(st->scratch);
    free(err);
    worker_spec_free(&sp);
    worker_reply_free(&r);
    return rc;
}

int main(int argc, char **argv)
{
    struct settings st = {0};
    struct worker_http *c = NULL;
    int rc = parse_args(argc, argv, &st);
    if (rc != 0)
        return rc < 0 ? WORKER_EXIT_OK : rc;
    /* A POST to a capd that has gone away must be an error, not a signal. */
    signal(SIGPIPE, SIG_IGN);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0 ||
        worker_http_open(&c, st.url, st.token, st.o.cacert) != 0) {
        worker_say("cannot initialize libcurl");
        return WORKER_EXIT_ERROR;
    }
    memset(st.token, 0, sizeof st.token);
    rc = run_attempt(&st, c);
    worker_http_close(c);
    curl_global_cleanup();
    return rc;
}
