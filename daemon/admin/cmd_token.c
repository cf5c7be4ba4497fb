/*
 * daemon/admin/cmd_token.c - `capd token ...`, the bootstrap path for API tokens:
 *
 *   capd token create --data-dir DIR --scope read|submit|admin
 *                     [--name NAME] [--expires 30d|12h|90m|3600s|never]
 *   capd token list   --data-dir DIR [--json]
 *   capd token revoke --data-dir DIR ID
 *
 * It opens the database directly (running migrations, like capd does at
 * start-up), so it works before capd ever ran and while it runs. The new
 * token is printed once, alone on stdout, so `TOKEN=$(capd token create
 * ...)` captures it; everything else goes to stderr.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "daemon/admin/cmd_token.h"
#include "storage/store.h"
#include "util/clock.h"
#include "util/opts.h"

#define TOKEN_MAX_NAME     64
#define TOKEN_MAX_EXPIRY_S (10LL * 366 * 86400)

static void usage(FILE *f)
{
    fprintf(f, "usage: capd token create --data-dir DIR --scope read|submit|admin [--name NAME]\n"
               "                         [--expires DURATION|never]\n"
               "       capd token list --data-dir DIR [--json]\n"
               "       capd token revoke --data-dir DIR ID\n"
               "\n"
               "DURATION is a number with a unit: s, m, h, d or w (30d). The token is printed\n"
               "once on stdout and only its SHA-256 is stored; list shows ids, never secrets.\n"
               "Scopes: read (GETs), submit (read + post jobs, cancel its own), admin\n"
               "(everything: builds, branches, tokens, any job).\n");
}

/* "30d" -> seconds; -1 when malformed or past ten years; 0 for "never". */
static long long parse_duration(const char *s)
{
    char *end;
    if (strcmp(s, "never") == 0)
        return 0;
    errno = 0;
    long long n = strtoll(s, &end, 10);
    if (errno || end == s || n <= 0 || strlen(end) != 1)
        return -1;
    static const struct {
        char unit;
        long long secs;
    } units[] = {{'s', 1}, {'m', 60}, {'h', 3600}, {'d', 86400}, {'w', 7 * 86400}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (*end == units[i].unit)
            return n > TOKEN_MAX_EXPIRY_S / units[i].secs ? -1 : n * units[i].secs;
    return -1;
}

static bool valid_name(const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return false;
    return n <= TOKEN_MAX_NAME;
}

static int open_store(const char *dir, struct store **s)
{
    char *err = NULL;
    if (mkdir(dir, 0750) != 0 && errno != EEXIST) {
        fprintf(stderr, "capd token: cannot create data dir %s: %s\n", dir, strerror(errno));
        return 1;
    }
    if (store_open(dir, true, s, &err) != 0) {
        fprintf(stderr, "capd token: %s\n", err ? err : "cannot open the database");
        free(err);
        return 1;
    }
    return 0;
}

static const char *str(json_t *o, const char *k, const char *def)
{
    const char *v = json_string_value(json_object_get(o, k));
    return v ? v : def;
}

static int do_list(struct store *s, bool as_json)
{
    json_t *out = NULL;
    int rc = store_token_list(s, &out);
    if (rc) {
        fprintf(stderr, "capd token list: %s\n", store_errmsg(s));
        return 1;
    }
    if (as_json) {
        json_dumpf(out, stdout, JSON_INDENT(2));
        putchar('\n');
    } else {
        size_t i;
        json_t *t;
        int64_t now = util_wall_ms();
        printf("%-14s %-7s %-8s %-24s %-24s %s\n", "ID", "SCOPE", "STATE", "CREATED", "EXPIRES",
               "NAME");
        json_array_foreach(json_object_get(out, "tokens"), i, t)
        {
            /* The state is recomputed here the way store_token_check sees
             * it, from the RFC 3339 strings only to print them. */
            const char *exp = str(t, "expires_at", NULL);
            const char *state =
                !json_is_null(json_object_get(t, "revoked_at")) ? "revoked" : "active";
            if (exp && strcmp(state, "active") == 0) {
                struct tm tm = {0};
                int ms = 0;
                if (sscanf(exp, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                           &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) == 7) {
                    tm.tm_year -= 1900;
                    tm.tm_mon -= 1;
                    if ((int64_t)timegm(&tm) * 1000 + ms <= now)
                        state = "expired";
                }
            }
            printf("%-14s %-7s %-8s %-24s %-24s %s\n", str(t, "id", ""), str(t, "scope", ""), state,
                   str(t, "created_at", ""), exp ? exp : "never", str(t, "name", ""));
        }
    }
    json_decref(out);
    return 0;
}

/* The options every verb shares, with their defaults. */
struct token_args {
    const char *dir, *scope_s, *name, *expires;
    bool as_json;
};

/* Parses the options after the verb into A. Returns true when the command
 * is over (--help, or a bad option) with its exit status in *STATUS. */
static bool parse_token_opts(int argc, char **argv, struct token_args *a, int *status)
{
    const struct util_opt opts[] = {
        {"data-dir", &a->dir, NULL, false}, {"scope", &a->scope_s, NULL, false},
        {"name", &a->name, NULL, false},    {"expires", &a->expires, NULL, false},
        {"json", NULL, &a->as_json, false}, {"help", NULL, NULL, true},
    };
    const char *bad = NULL;
    int rc = util_opts_parse(argc, argv, 2, opts, sizeof opts / sizeof opts[0], &bad);

    if (rc == 1) {
        usage(stdout);
        *status = 0;
        return true;
    }
    if (rc < 0) {
        fprintf(stderr, "capd token: unknown or incomplete option '%s'\n", bad ? bad : "");
        usage(stderr);
        *status = 2;
        return true;
    }
    return false;
}

/* `capd token create`: the options are checked before the database is
 * opened, and the token goes alone to stdout (then is wiped), its
 * description to stderr. */
static int do_create(const struct token_args *a, bool extra_args)
{
    int scope = store_scope_parse(a->scope_s);
    long long secs = parse_duration(a->expires);
    struct store *s = NULL;
    int rc = 1;
    if (extra_args || scope < 0 || secs < 0 || !valid_name(a->name)) {
        fprintf(stderr, "capd token create: %s\n",
                extra_args  ? "unexpected argument"
                : scope < 0 ? "--scope must be read, submit or admin"
                : secs < 0  ? "--expires must be like 30d, 12h, 90m, 3600s (at most ten "
                              "years) or never"
                            : "--name must be at most 64 printable characters");
        return 2;
    }
    if (open_store(a->dir, &s))
        return 1;
    char token[STORE_TOKEN_LEN + 1];
    json_t *info = NULL;
    int64_t exp_at = secs ? util_wall_ms() + secs * 1000 : 0;
    if (store_token_create(s, scope, a->name, exp_at, token, &info) != 0) {
        fprintf(stderr, "capd token create: cannot create the token: %s\n", store_errmsg(s));
        goto out;
    }
    printf("%s\n", token);
    fflush(stdout);
    memset(token, 0, sizeof token);
    fprintf(stderr,
            "capd: created token %s (scope %s, name '%s', expires %s). It is shown only "
            "this once; capd keeps only its hash.\n",
            str(info, "id", "?"), str(info, "scope", "?"), str(info, "name", ""),
            str(info, "expires_at", "never"));
    json_decref(info);
    rc = 0;
out:
    store_close(s);
    return rc;
}

/* `capd token revoke ID`: revoking a revoked token is not an error, so a
 * script can repeat it. */
static int do_revoke(const char *dir, const char *id)
{
    struct store *s = NULL;
    int rc = 1;
    if (open_store(dir, &s))
        return 1;
    int r = store_token_revoke(s, id);
    if (r == 0) {
        fprintf(stderr, "capd: revoked token %s\n", id);
        rc = 0;
    } else if (r == -EALREADY) {
        fprintf(stderr, "capd: token %s was already revoked\n", id);
        rc = 0;
    } else if (r == -ENOENT) {
        fprintf(stderr, "capd token revoke: no token with id '%s'\n", id);
    } else {
        fprintf(stderr, "capd token revoke: %s\n", store_errmsg(s));
    }
    store_close(s);
    return rc;
}

/* `capd token VERB ...`: the options are parsed (and refused) before the
 * verb is looked at, then each verb checks its own arguments. */
int cmd_token(int argc, char **argv)
{
    struct token_args a = {.dir = "/var/lib/capd", .name = "", .expires = "never"};
    int rc = 1;
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *verb = argv[1];
    if (strcmp(verb, "--help") == 0 || strcmp(verb, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (parse_token_opts(argc, argv, &a, &rc))
        return rc;
    if (strcmp(verb, "create") == 0)
        return do_create(&a, optind != argc);
    if (strcmp(verb, "list") == 0) {
        struct store *s = NULL;
        if (optind != argc) {
            fprintf(stderr, "capd token list: unexpected argument '%s'\n", argv[optind]);
            return 2;
        }
        if (open_store(a.dir, &s))
            return 1;
        rc = do_list(s, a.as_json);
        store_close(s);
        return rc;
    }
    if (strcmp(verb, "revoke") == 0) {
        if (optind != argc - 1) {
            fprintf(stderr, "capd token revoke: give exactly one token id (see capd token list)\n");
            return 2;
        }
        return do_revoke(a.dir, argv[optind]);
    }
    fprintf(stderr, "capd token: unknown command '%s'\n", verb);
    usage(stderr);
    return 2;
}
