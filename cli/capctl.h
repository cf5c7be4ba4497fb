/*
 * cli/capctl.h - what the files of capctl share: exit codes, the flag
 * parser, the command runner, the HTTP client, the output helpers and the
 * run of a gate (diff, widths check). Each subcommand group lives in its
 * own cmd_*.c file and is reached through its table ctl_cmd_*, which
 * capctl.c lists. Of capd's code capctl links only util/, the bottom
 * library (its buffer, file reads, clock, the HTTP clients' base URL and
 * token, the dispatch wrappers' names); it reaches capd over HTTP alone.
 *
 * A command is a table (struct ctl_cmd): its flags and help, and two
 * hooks. ctl_main() runs every command the same way: parse the flags
 * (--help exits 0), CHECK them before the network is touched, open the
 * client, RUN, and free what it opened. The hooks share the command's own
 * state through CTX, CTX_SIZE zeroed bytes that ctl_main() hands to DONE
 * at the end. A command that only prints what one GET returns has no
 * hooks: its table names the GET and the printer (SHOW for one object,
 * LIST for a list). A group (builds) is a table of SUBS. Each cmd_*.c
 * defines its tables below the functions they name:
 *
 *     const struct ctl_cmd ctl_cmd_cancel = {.name = "cancel", ..., .run = cancel_run};
 */
#ifndef CAPD_CLI_CAPCTL_H
#define CAPD_CLI_CAPCTL_H

#include <curl/curl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>

#ifndef CAPD_VERSION
#define CAPD_VERSION "unknown"
#endif

/* Exit codes, documented in docs/capctl.md. */
#define CTL_EXIT_OK         0
#define CTL_EXIT_REGRESSION 1 /* diff: the verdict is "regression" */
#define CTL_EXIT_ERROR      2 /* bad flags, network, a server error */
#define CTL_EXIT_NOT_OK     3 /* wait: the job finished with some cell not ok */

#define CTL_DEFAULT_SERVER "http://127.0.0.1:8470"

/* The end of a command group's usage (capctl GROUP --help): the global
 * options, in short. */
#define CTL_GROUP_GLOBAL_OPTIONS                                                                   \
    "global options:\n"                                                                            \
    "  --server URL  capd to talk to (default: $CAPD_SERVER, else " CTL_DEFAULT_SERVER ")\n"       \
    "  --token T     bearer token (default: $CAPD_TOKEN)\n"                                        \
    "  --cacert FILE CA certificate(s) for an https:// server (default: $CAPD_CACERT)\n"

/* Where capctl looks for capd's admin.token without --data-dir or
 * CAPD_DATA_DIR (capd's own default data dir). */
#define CTL_DEFAULT_DATA_DIR "/var/lib/capd"

/* Responses past this size are refused rather than buffered. */
#define CTL_MAX_RESPONSE (256u * 1024u * 1024u)
#define CTL_MAX_URL      8192

/* ---- flags ---- */

enum ctl_opt_kind {
    CTL_FLAG,  /* --name */
    CTL_VALUE, /* --name V, once */
    /* --name V, once, and a value the command needs: its CHECK says so
     * through ctl_required() (the parser itself lets it be left out, so
     * that a command can need it only in one of its forms). */
    CTL_REQUIRED,
    CTL_MULTI, /* --name V, repeatable */
    /* --name V, once, that sets the cell option options.FIELD of the job
     * the command sends: FIELD is NAME with '_' for '-', or the field
     * "options.FIELD" that the command's FIELDS pairs with --NAME. INT: a
     * whole number (its syntax checked by capctl, its range by capd);
     * STR: a string. */
    CTL_OPTION_INT,
    CTL_OPTION_STR,
};

struct ctl_opt {
    const char *name; /* without the leading "--" */
    enum ctl_opt_kind kind;
    const char *metavar;
    const char *help;
};

/* Rows that several commands share, so that a flag which means the same
 * everywhere is written once. CTL_OPT_END ends every table. */
#define CTL_OPT_END                                                                                \
    {                                                                                              \
        NULL, CTL_FLAG, NULL, NULL                                                                 \
    }
/* --json: JSON instead of the table or text, HELP saying which (the job,
 * the stored build); CTL_OPT_JSON where the server's reply is printed as
 * it came. */
#define CTL_OPT_JSON_HELP(help)                                                                    \
    {                                                                                              \
        "json", CTL_FLAG, NULL, help                                                               \
    }
#define CTL_OPT_JSON CTL_OPT_JSON_HELP("print the server's JSON")
/* --wait of the commands that can follow what they start or stop to its
 * end; HELP says what they then print or exit with. */
#define CTL_OPT_WAIT(help)                                                                         \
    {                                                                                              \
        "wait", CTL_FLAG, NULL, help                                                               \
    }
/* --wait-timeout of the commands that follow a job to its end; WHEN is
 * the condition the command puts first ("with --wait: "), or "". */
#define CTL_OPT_WAIT_TIMEOUT(when)                                                                 \
    {                                                                                              \
        "wait-timeout", CTL_VALUE, "S", when "give up (exit 2) after S seconds"                    \
    }
/* The matrix of a job (submit) or of each commit (bisect): --models,
 * --widths and --passes, each a required comma-separated list. The
 * arguments are the command's own words: what follows "(required" for
 * models and for widths, the word before "widths", the metavar of
 * --passes. */
#define CTL_OPTS_MATRIX(models_note, widths_word, widths_note, passes_metavar)                     \
    {"models", CTL_REQUIRED, "a,b", "models, comma-separated (required" models_note ")"},          \
        {"widths", CTL_REQUIRED, "x,y",                                                            \
         widths_word "widths, comma-separated (required" widths_note ")"},                         \
    {                                                                                              \
        "passes", CTL_REQUIRED, passes_metavar, "passes, comma-separated (required)"               \
    }

/* --reference, the reference a tensor out of tolerance is judged against:
 * KIND is CTL_OPTION_STR where it sets the job's option (submit), CTL_VALUE
 * where it overrides it (diff). */
#define CTL_OPT_REFERENCE(kind, help)                                                              \
    {                                                                                              \
        "reference", kind, "none|float64|default-width", help                                      \
    }
/* --project: KIND is CTL_REQUIRED where the command names one (submit,
 * bisect, history), CTL_VALUE where it narrows what is listed (alerts). */
#define CTL_OPT_PROJECT(kind, help)                                                                \
    {                                                                                              \
        "project", kind, "P", help                                                                 \
    }
/* --build, the registered build that the jobs a command starts run
 * (submit, bisect). */
#define CTL_OPT_BUILD(help)                                                                        \
    {                                                                                              \
        "build", CTL_REQUIRED, "B", help                                                           \
    }
/* The branch a command is about, by --project and --branch, of the one
 * KIND (CTL_OPT_PROJECT's); the helps are the command's own. */
#define CTL_OPTS_BRANCH(kind, project_help, branch_help)                                           \
    CTL_OPT_PROJECT(kind, project_help),                                                           \
    {                                                                                              \
        "branch", kind, "B", branch_help                                                           \
    }
/* The cell a command is about, by --model, --width and --pass: KIND is
 * CTL_REQUIRED where they name one cell (history), CTL_VALUE where each
 * narrows the cells (diff); the helps are the command's own. */
#define CTL_OPTS_CELL(kind, model_help, width_help, pass_help)                                     \
    {"model", kind, "M", model_help}, {"width", kind, "W", width_help},                            \
    {                                                                                              \
        "pass", kind, "P", pass_help                                                               \
    }

/* A request field whose flag is not named like it, for error hints. */
struct ctl_field_flag {
    const char *field; /* exact, or a prefix followed by '.' in the reply */
    const char *flag;
};

struct ctl_args;
struct ctl_client;

struct ctl_cmd {
    const char *name;  /* "builds register": used in messages */
    const char *usage; /* after "capctl NAME "; a group's whole --help */
    const char *summary;
    const char *details;        /* more help text, may be NULL */
    const struct ctl_opt *opts; /* terminated by a NULL name */
    int min_pos, max_pos;       /* positional arguments */
    /* The request fields whose flag is not named like them (terminated by
     * a NULL field; may be NULL), for ctl_report_fields(). */
    const struct ctl_field_flag *fields;
    /* Checks the flags before the network is touched; NULL when the
     * parser's checks are all. 0, or the exit code after saying why. */
    int (*check)(const struct ctl_args *a, void *ctx);
    /* The command itself, with the client open: its exit code. NULL for
     * a command that SHOW or LIST describes. */
    int (*run)(struct ctl_client *c, const struct ctl_args *a, void *ctx);
    /* Without RUN, with PRINT set: ctl_show_object() of BASE/ID, where ID
     * is the one positional (WHAT names it in errors); such a command
     * takes that positional and the flags of ctl_json_opts (ctl_opts_of),
     * and leaves OPTS, MIN_POS and MAX_POS unset. */
    struct {
        const char *base, *what;
        void (*print)(json_t *obj);
    } show;
    /* Without RUN and SHOW: ctl_show_list() of PATH, printing the array
     * KEY (NULL: the whole reply) through PRINT. */
    struct {
        const char *path, *key;
        int (*print)(struct ctl_client *c, const struct ctl_args *a, json_t *list);
    } list;
    /* The state of CHECK and RUN: CTX_SIZE zeroed bytes (CTX is NULL for
     * 0), given to DONE (may be NULL) to free what they hold. */
    size_t ctx_size;
    void (*done)(void *ctx);
    /* A group: the subcommands (NULL-terminated) that its first word
     * names, each NAME being "GROUP WORD"; no word, or a flag other than
     * --help, is the first of them. USAGE is the group's --help and the
     * other fields are unset. */
    const struct ctl_cmd *const *subs;
};

struct ctl_item {
    const struct ctl_opt *opt;
    const char *val;
};

struct ctl_args {
    const struct ctl_cmd *cmd;
    struct ctl_item *items;
    int nitems;
    const char **pos;
    int npos;
};

/* The options every command accepts (--server, --token, --help). */
extern const struct ctl_opt ctl_global_opts[];
/* The options of a command whose only flag is --json ("print the server's
 * JSON"). */
extern const struct ctl_opt ctl_json_opts[];

/* The flags of CMD: its OPTS, or ctl_json_opts for a SHOW command. */
const struct ctl_opt *ctl_opts_of(const struct ctl_cmd *cmd);
/* Parses ARGV[0..ARGC) (the words after the command name) against CMD.
 * Returns 0 on success; 1 when --help was asked for (help printed); 2
 * after printing a usage error. */
int ctl_parse(const struct ctl_cmd *cmd, int argc, char **argv, struct ctl_args *a);
void ctl_args_free(struct ctl_args *a);
const char *ctl_arg(const struct ctl_args *a, const char *name);
bool ctl_has(const struct ctl_args *a, const char *name);
/* Iterates the values of a repeatable flag: start with *IT = 0. */
const char *ctl_arg_next(const struct ctl_args *a, const char *name, int *it);
void ctl_help(const struct ctl_cmd *cmd, FILE *f);
/* Prints "capctl CMD: MESSAGE" and a pointer to --help; returns 2. */
int ctl_usage_error(const struct ctl_cmd *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* "--NAME is required" for the first CTL_REQUIRED flag of A's command (in
 * the order of its table) that was not given, or with NONEMPTY was given
 * empty: the usage error's exit code, else 0. */
int ctl_required(const struct ctl_args *a, bool nonempty);
/* Parses an integer flag value; prints a usage error naming the flag. */
int ctl_int_arg(const struct ctl_cmd *cmd, const char *flag, const char *s, long long min,
                long long max, long long *out);
/* Parses a duration in seconds (decimals allowed). */
int ctl_seconds_arg(const struct ctl_cmd *cmd, const char *flag, const char *s, double *out);
/* The values of the repeatable flag FLAG, each KEY=VALUE (FORM, as errors
 * write it: "NAME=VALUE"), into the object OBJ: each key once and shorter
 * than KEY_CAP bytes (at most 256), each value UTF-8. A longer key is said
 * to be too long with NAME_LONG, else to be not of the form. 0, or the
 * usage error's exit code. */
int ctl_pairs_arg(const struct ctl_args *a, const char *flag, const char *form, size_t key_cap,
                  bool name_long, json_t *obj);

/* ---- running a command (cli/command.c) ---- */

/* Runs CMD on ARGV[0..ARGC) (the words after its name): ctl_parse(), then
 * CMD->check, ctl_client_open() and CMD->run (or its SHOW or LIST), each
 * given its CTX; for a group, the subcommand its first word names. Returns
 * the exit code: 0 after --help, the first stage's error, else what run
 * says. */
int ctl_main(const struct ctl_cmd *cmd, int argc, char **argv);

/* Seconds on the monotonic clock, and a sleep that rides out signals. */
double ctl_now_s(void);
void ctl_sleep_s(double s);

/* One progress line on stderr while polling: on a terminal it is redrawn
 * in place, otherwise (CI logs) a new line is written only when it
 * changes. ctl_progress_end() ends a line drawn in place, so what is
 * printed next starts on its own line. */
struct ctl_progress {
    bool tty;
    char last[512];
};
void ctl_progress_init(struct ctl_progress *p);
void ctl_progress_show(struct ctl_progress *p, const char *line);
void ctl_progress_end(struct ctl_progress *p);

/* ---- HTTP client ---- */

struct ctl_client {
    char server[1024]; /* without a trailing slash */
    char *auth;        /* "Authorization: Bearer T" or NULL; never printed */
    char cacert[1024]; /* PEM CA bundle to verify an https server against; "" = system's */
    CURL *h;
};

struct ctl_resp {
    long status; /* 0 when no HTTP response came */
    char *body;  /* NUL-terminated */
    size_t len;
    char ctype[128];
    char err[CURL_ERROR_SIZE + 64]; /* transport error text */
};

/* Server, token and CA file from the flags, else CAPD_SERVER / CAPD_TOKEN /
 * CAPD_CACERT, else the default; without a token, DATA/admin.token when it
 * can be read (DATA: --data-dir, CAPD_DATA_DIR, or for a loopback server
 * CTL_DEFAULT_DATA_DIR); a usage error (2) for a URL that is not
 * http(s) or a CA file that cannot be read. */
int ctl_client_open(struct ctl_client *c, const struct ctl_args *a);
void ctl_client_close(struct ctl_client *c);
/* One request. PATH starts with "/" and may carry a query. BODY (may be
 * NULL) is sent as application/json. HEADERS is NULL-terminated or NULL.
 * Returns 0 when an HTTP response came (any status), -1 otherwise
 * (r->err says why). */
int ctl_request(struct ctl_client *c, const char *method, const char *path, const json_t *body,
                const char *const *headers, struct ctl_resp *r);
void ctl_resp_free(struct ctl_resp *r);
json_t *ctl_resp_json(const struct ctl_resp *r);
/* ctl_request() that expects status WANT: 0 with *OUT the reply's JSON
 * (owned; NULL when the body is not JSON), else CTL_EXIT_ERROR after
 * ctl_report(). */
int ctl_call(struct ctl_client *c, const char *method, const char *path, const json_t *body,
             long want, json_t **out);
/* Prints why a request failed: the transport error, or the server's
 * {"error":{code,message,field}} as "capctl: MESSAGE (CODE, field FIELD)". */
void ctl_report(const struct ctl_client *c, const struct ctl_resp *r);
/* ctl_report(), then "capctl: FIELD is set by --FLAG" when the field the
 * server named is set by a flag of another name: the option of CMD named
 * like the field's last part (matrix.models: --models), else the flag
 * CMD->fields gives it. */
void ctl_report_fields(const struct ctl_client *c, const struct ctl_resp *r,
                       const struct ctl_cmd *cmd);

/* How often a command polls a reply that is still 409 pending. */
#define CTL_POLL_S 1.0
/* GETs URL until the reply is no longer 409 pending, retrying for up to
 * WAIT_TIMEOUT seconds (< 0: not at all) with a progress line naming the
 * unfinished jobs: 0 with a 200 in R, or CTL_EXIT_ERROR after saying why
 * (with a hint for a pending one), the field named by CMD's flag
 * (cli/command.c). */
int ctl_fetch_settled(struct ctl_client *c, const struct ctl_cmd *cmd, const char *url,
                      double wait_timeout, struct ctl_resp *r);
/* GETs URL (a rendered report, md or text) and prints its body: 0, or
 * CTL_EXIT_ERROR having said why (an overlong URL included: OVERFLOW). */
int ctl_print_url(struct ctl_client *c, const char *url, bool overflow);
/* The "field" of an error reply, or NULL. Owned by the caller (free). */
char *ctl_resp_error_field(const struct ctl_resp *r);
/* The "code" of an error reply into BUF ("" when none). */
void ctl_resp_error_code(const struct ctl_resp *r, char *buf, size_t cap);
/* Percent-encodes S for a path segment or query value (malloc'd). */
char *ctl_escape(struct ctl_client *c, const char *s);

/* A growing URL path with a hard size limit. */
struct ctl_url {
    char buf[CTL_MAX_URL];
    size_t n;
    bool overflow;
    bool has_query;
};
void ctl_url_init(struct ctl_url *u, const char *path);
/* GET PATH and the array KEY of its reply (*DOC owns it); CTL_EXIT_ERROR,
 * reported, on an error reply or a reply without that array. With KEY
 * NULL, *LIST is the whole reply, whatever its shape. */
int ctl_get_list(struct ctl_client *c, const char *path, const char *key, json_t **doc,
                 json_t **list);
/* GET BASE/ID and expect a JSON object: 0 with *OUT set (owned), or an exit
 * code after saying why (a too-long ID is a usage error of CMD). */
int ctl_get_object(struct ctl_client *c, const struct ctl_cmd *cmd, const char *base,
                   const char *id, const char *what, json_t **out);
/* ctl_get_object() of the command's one positional argument, printed as
 * the server's JSON with --json, else by PRINT. */
int ctl_show_object(struct ctl_client *c, const struct ctl_args *a, const char *base,
                    const char *what, void (*print)(json_t *obj));
/* ctl_get_list() of PATH: the server's JSON with --json, else PRINT of the
 * array KEY (or of the reply, KEY NULL); PRINT's result is the exit code. */
int ctl_show_list(struct ctl_client *c, const struct ctl_args *a, const char *path, const char *key,
                  int (*print)(struct ctl_client *c, const struct ctl_args *a, json_t *list));
void ctl_url_seg(struct ctl_client *c, struct ctl_url *u, const char *segment);
void ctl_url_lit(struct ctl_url *u, const char *text);
void ctl_url_query(struct ctl_client *c, struct ctl_url *u, const char *key, const char *val);
/* ctl_url_query() of each flag of KEYS (NULL-terminated) that was given,
 * under its own name. */
void ctl_url_query_args(struct ctl_client *c, struct ctl_url *u, const struct ctl_args *a,
                        const char *const *keys);

/* ---- output ---- */

/* Copy of S with control characters replaced (server text reaching a
 * terminal); "-" for NULL. Returns a pointer into BUF. */
const char *ctl_clean(const char *s, char *buf, size_t cap);
/* "a, b or c": WORDS (NULL-terminated) joined for a message, into BUF
 * (cut at CAP bytes). */
void ctl_or_list(const char *const *words, char *buf, size_t cap);
/* Member K of object O as a string, uncleaned; "-" when it is absent or
 * not a string. */
const char *ctl_jstr(json_t *o, const char *k);
/* A JSON value as display text ("-" for null/absent). */
const char *ctl_jtext(json_t *v, char *buf, size_t cap);
void ctl_duration(json_t *ms, char *buf, size_t cap);
void ctl_print_json(FILE *f, json_t *j);
/* Writes a rendered report (N bytes at S) to stdout, keeping newlines and
 * tabs but no other control characters, ending in a newline. */
void ctl_print_report(const char *s, size_t n);

struct ctl_table;
struct ctl_table *ctl_table_new(int ncol, const char *const *headers);
/* Adds a row of NCOL strings (copied, cleaned). T may be NULL (the table
 * could not be made); a row that cannot be added is remembered, and
 * ctl_table_emit() reports it. */
int ctl_table_row(struct ctl_table *t, const char *const *cells);
/* Prints what T holds (nothing for NULL). */
void ctl_table_print(struct ctl_table *t, FILE *f);
void ctl_table_free(struct ctl_table *t);
/* Prints T on F and frees it: 0; or, when T is NULL or lost a row, prints
 * nothing but "capctl: out of memory" and returns CTL_EXIT_ERROR. */
int ctl_table_emit(struct ctl_table *t, FILE *f);

/* ---- gates: diff and widths check (cli/gate.c) ---- */

/* The flags of a command whose exit code is a verdict, by ctl_gate_check(). */
struct ctl_gate {
    const char *format;  /* --format md|json|text, text by default */
    const char *fail_on; /* --fail-on, one of the command's words */
    double wait_timeout; /* --wait-timeout S; < 0 without it */
};

/* Their option rows: --format, --fail-on (METAVAR and HELP are the
 * command's, its words), --wait-timeout. */
#define CTL_OPTS_GATE(fail_on_metavar, fail_on_help)                                               \
    {"format", CTL_VALUE, "md|json|text", "output (default text); the verdict is the same"},       \
        {"fail-on", CTL_VALUE, fail_on_metavar, fail_on_help},                                     \
    {                                                                                              \
        "wait-timeout", CTL_VALUE, "S", "while a job is unfinished (409 pending), retry for S s"   \
    }

/* What differs from one gate to another; CTX is the command's. */
struct ctl_gate_kind {
    const char *what;                       /* "comparison": what the result is, in messages */
    const char *const *verdicts;            /* the verdicts a result may have, NULL-terminated */
    json_int_t (*compared)(json_t *result); /* cells the result compared */
    const char *none_hint;                  /* after "the WHAT compared no cell", a hint */
    /* Into U: the URL of RESULT's report in FORMAT (md or text), pinned
     * to the jobs RESULT names. 0, or CTL_EXIT_ERROR having said why. */
    int (*report_url)(struct ctl_client *c, const struct ctl_args *a, const void *ctx,
                      json_t *result, const char *format, struct ctl_url *u);
    /* The exit code of VERDICT (and RESULT's counts) under G's --fail-on. */
    int (*exit_code)(const struct ctl_gate *g, const char *verdict, json_t *result);
};

/* Reads --format, --fail-on (one of FAIL_ON, NULL-terminated, the first
 * the default) and --wait-timeout into G: 0, or the usage error's exit
 * code. */
int ctl_gate_check(const struct ctl_args *a, const char *const *fail_on, struct ctl_gate *g);
/* GETs the JSON result at U (an overlong one is a usage error), waiting
 * out 409 pending for G's --wait-timeout; refuses it without one of K's
 * verdicts or when it compared no cell; prints it as the server's JSON
 * for --format json, else fetches and prints the report at K's
 * report_url; returns K's exit code, or CTL_EXIT_ERROR having said why. */
int ctl_gate_run(struct ctl_client *c, const struct ctl_args *a, const struct ctl_gate *g,
                 const struct ctl_url *u, const struct ctl_gate_kind *k, const void *ctx);

/* ---- jobs (shared by submit --wait and wait) ---- */

/* Polls job ID until it is done or cancelled (or TIMEOUT_S passes, when
 * > 0), drawing a progress line on stderr. *FINAL (may be NULL) gets the
 * last job object. Returns CTL_EXIT_OK, CTL_EXIT_NOT_OK or CTL_EXIT_ERROR. */
int ctl_wait_job(struct ctl_client *c, const char *id, double timeout_s, json_t **final);

/* ---- commands ---- */

extern const struct ctl_cmd ctl_cmd_builds;  /* cli/cmd_builds.c */
extern const struct ctl_cmd ctl_cmd_submit;  /* cli/cmd_jobs.c */
extern const struct ctl_cmd ctl_cmd_status;  /* cli/cmd_wait.c */
extern const struct ctl_cmd ctl_cmd_wait;    /* cli/cmd_wait.c */
extern const struct ctl_cmd ctl_cmd_cancel;  /* cli/cmd_cancel.c */
extern const struct ctl_cmd ctl_cmd_diff;    /* cli/cmd_diff.c */
extern const struct ctl_cmd ctl_cmd_widths;  /* cli/cmd_widths.c */
extern const struct ctl_cmd ctl_cmd_modes;   /* cli/cmd_widths.c */
extern const struct ctl_cmd ctl_cmd_history; /* cli/cmd_history.c */
extern const struct ctl_cmd ctl_cmd_alerts;  /* cli/cmd_history.c */
extern const struct ctl_cmd ctl_cmd_bisect;  /* cli/cmd_bisect.c */
extern const struct ctl_cmd ctl_cmd_repro;   /* cli/cmd_repro.c */

/* Global flags given before the command name (capctl --server U CMD ...). */
extern const char *ctl_global_server;
extern const char *ctl_global_token;
extern const char *ctl_global_data_dir;
extern const char *ctl_global_cacert;

#endif
