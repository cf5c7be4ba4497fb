/*
 * daemon/admin/cmd_db.c - `capd db ...`, database care from the command line:
 *
 *   capd db backup DEST [--data-dir DIR] [--config FILE] [--json]
 *   capd db vacuum      [--data-dir DIR] [--config FILE] [--force] [--json]
 *   capd db prune       [--data-dir DIR] [--config FILE] [--keep-heads N]
 *                       [--dry-run] [--json]
 *
 * They open the database directly, next to a running capd (SQLite WAL and
 * a busy timeout make that safe), and never create or migrate one. The
 * data dir and the retention setting come from --config when given (the
 * file capd itself reads), and the flags win, as they do for capd.
 * What a script wants (the backup's path, or with --json the whole
 * report) goes to stdout; words for people go to stderr.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/admin/cmd_db.h"
#include "daemon/config/config.h"
#include "storage/layout.h"
#include "storage/store.h"
#include "util/opts.h"

struct db_args {
    const char *verb, *dest;
    struct capd_config cfg;
    int keep_heads; /* -1: from the config */
    bool force, dry_run, as_json;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: capd db backup DEST [--data-dir DIR] [--config FILE] [--json]\n"
            "       capd db vacuum [--data-dir DIR] [--config FILE] [--force] [--json]\n"
            "       capd db prune [--data-dir DIR] [--config FILE] [--keep-heads N] [--dry-run]\n"
            "                     [--json]\n"
            "\n"
            "backup  copies the data dir's database (SQLite's online backup API: one consistent\n"
            "        snapshot, safe while capd runs), the payload files and the cell logs it\n"
            "        names into the directory DEST, which capd can then use as a data dir. DEST\n"
            "        must be new, empty, or an earlier backup (then only new payloads and\n"
            "        changed logs are copied). Its path is printed on stdout.\n"
            "vacuum  rebuilds the database file to give free pages back to the file system.\n"
            "        It blocks capd's writers while it runs, so it refuses while cells run\n"
            "        unless --force.\n"
            "prune   applies the retention policy: keeps every job of a control commit and of\n"
            "        the newest N commits of each branch (N: --keep-heads, else the config's\n"
            "        retention_keep_heads_per_branch) and drops the payloads and the cell logs\n"
            "        of the others (their statistics, hashes and timings stay). --dry-run\n"
            "        only reports.\n"
            "\n"
            "DIR defaults to the config's data_dir, else /var/lib/capd. Run these as the user\n"
            "capd runs as, so files it creates stay readable by capd.\n");
}

/* The flags that only parse() reads: they are applied over the config
 * file's values once it is loaded. */
struct db_flags {
    const char *data_dir, *config, *keep;
};

/* The options after the verb into A and F. Returns 0, 1 when --help has
 * answered, or 2 (the exit status) on a bad option. */
static int parse_opts(struct db_args *a, struct db_flags *f, int argc, char **argv)
{
    const struct util_opt opts[] = {
        {"data-dir", &f->data_dir, NULL, false},
        {"config", &f->config, NULL, false},
        {"keep-heads", &f->keep, NULL, false},
        {"force", NULL, &a->force, false},
        {"dry-run", NULL, &a->dry_run, false},
        {"json", NULL, &a->as_json, false},
        {"help", NULL, NULL, true},
    };
    const char *bad = NULL;
    int rc = util_opts_parse(argc, argv, 2, opts, sizeof opts / sizeof opts[0], &bad);

    if (rc == 1) {
        usage(stdout);
        return 1;
    }
    if (rc < 0) {
        fprintf(stderr, "capd db: unknown or incomplete option '%s' (see capd db --help)\n",
                bad ? bad : "");
        return 2;
    }
    return 0;
}

/* The arguments each verb takes: backup's DEST and nothing else, and the
 * flags that belong to one verb only on that verb. 0, or 2 (the exit
 * status) having said why. */
static int check_verb_args(struct db_args *a, const struct db_flags *f, int argc, char **argv)
{
    char *end;
    bool is_backup = strcmp(a->verb, "backup") == 0;
    if (is_backup && optind == argc - 1) {
        a->dest = argv[optind++];
    } else if (is_backup) {
        fprintf(stderr, "capd db backup: give exactly one DEST directory\n");
        return 2;
    }
    if (optind != argc) {
        fprintf(stderr, "capd db %s: unexpected argument '%s'\n", a->verb, argv[optind]);
        return 2;
    }
    if ((f->keep || a->dry_run) && strcmp(a->verb, "prune") != 0) {
        fprintf(stderr, "capd db %s: --keep-heads and --dry-run are for prune\n", a->verb);
        return 2;
    }
    if (a->force && strcmp(a->verb, "vacuum") != 0) {
        fprintf(stderr, "capd db %s: --force is for vacuum\n", a->verb);
        return 2;
    }
    if (f->keep) {
        long n = strtol(f->keep, &end, 10);
        if (*end || end == f->keep || n < 0 || n > 1000000) {
            fprintf(stderr, "capd db prune: --keep-heads must be an integer in [0, 1000000]\n");
            return 2;
        }
        a->keep_heads = (int)n;
    }
    return 0;
}

/* The command line into A, over --config's file (flags win). Returns 0, 1
 * when --help has answered, or 2 (the exit status) having said why. */
static int parse(struct db_args *a, int argc, char **argv)
{
    struct db_flags f = {NULL, NULL, NULL};
    char *err = NULL;
    int rc;
    config_defaults(&a->cfg);
    a->keep_heads = -1;
    if ((rc = parse_opts(a, &f, argc, argv)) != 0 || (rc = check_verb_args(a, &f, argc, argv)) != 0)
        return rc;
    if (f.config && config_load_file(&a->cfg, f.config, &err) != 0) {
        fprintf(stderr, "capd db: %s\n", err ? err : "cannot read the config");
        free(err);
        return 2;
    }
    if (f.data_dir)
        snprintf(a->cfg.data_dir, sizeof a->cfg.data_dir, "%s", f.data_dir);
    if (a->keep_heads < 0)
        a->keep_heads = a->cfg.retention_keep_heads_per_branch;
    return 0;
}

/* Opening never creates a database (store_open would): a wrong --data-dir
 * must not leave an empty capd.db behind. Nor does it migrate: that is
 * capd's job at start-up. */
static int open_existing(const struct db_args *a, struct store **s)
{
    char path[LAYOUT_PATH_MAX], *err = NULL;
    struct stat sb;
    layout_dir(path, sizeof path, a->cfg.data_dir, "capd.db");
    if (stat(path, &sb) != 0) {
        fprintf(stderr, "capd db %s: no database at %s: %s\n", a->verb, path, strerror(errno));
        return 1;
    }
    if (store_open(a->cfg.data_dir, false, s, &err) != 0) {
        fprintf(stderr, "capd db %s: %s%s\n", a->verb, err ? err : "cannot open the database",
                err && strstr(err, "schema version")
                    ? " (start this capd once to migrate it, or use the capd that wrote it)"
                    : "");
        free(err);
        return 1;
    }
    return 0;
}

static void emit_json(json_t *j)
{
    json_dumpf(j, stdout, JSON_INDENT(2));
    putchar('\n');
    json_decref(j);
}

static int do_backup(const struct db_args *a)
{
    char *err = NULL;
    struct store_backup_info info;
    if (store_backup(a->cfg.data_dir, a->dest, &info, &err) != 0) {
        fprintf(stderr, "capd db backup: %s\n", err ? err : "failed");
        free(err);
        return 1;
    }
    if (a->as_json)
        emit_json(json_pack("{s:s,s:s,s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "path", info.path,
                            "data_dir", a->cfg.data_dir, "schema_version", info.schema_version,
                            "db_bytes", (json_int_t)info.db_bytes, "blobs", (json_int_t)info.blobs,
                            "blobs_copied", (json_int_t)info.blobs_copied, "blob_bytes_copied",
                            (json_int_t)info.blob_bytes_copied, "blobs_missing",
                            (json_int_t)info.blobs_missing, "logs", (json_int_t)info.logs,
                            "logs_copied", (json_int_t)info.logs_copied, "log_bytes_copied",
                            (json_int_t)info.log_bytes_copied));
    else
        printf("%s\n", info.path);
    fprintf(stderr,
            "capd: backed up %s (schema version %d, database %lld bytes, %lld payload files, "
            "%lld new: %lld bytes; %lld cell logs, %lld new or changed: %lld bytes) to %s\n",
            a->cfg.data_dir, info.schema_version, (long long)info.db_bytes, (long long)info.blobs,
            (long long)info.blobs_copied, (long long)info.blob_bytes_copied, (long long)info.logs,
            (long long)info.logs_copied, (long long)info.log_bytes_copied, info.path);
    if (info.blobs_missing > 0) {
        fprintf(stderr,
                "capd db backup: %lld payload files the database names are missing from "
                "%s/blobs; the backup has the same gaps\n",
                (long long)info.blobs_missing, a->cfg.data_dir);
        return 1;
    }
    return 0;
}

static int do_vacuum(const struct db_args *a)
{
    struct store *s = NULL;
    struct store_size before, after;
    int64_t running = 0;
    bool busy = false;
    int rc = 1;
    if (open_existing(a, &s))
        return 1;
    if (store_running_cells(s, &running) != 0 || store_size(s, &before) != 0) {
        fprintf(stderr, "capd db vacuum: %s\n", store_errmsg(s));
        goto out;
    }
    if (running > 0 && !a->force) {
        fprintf(stderr,
                "capd db vacuum: %lld cells are running; a vacuum would hold back their "
                "records while it runs. Wait for them, stop capd, or add --force.\n",
                (long long)running);
        goto out;
    }
    if (store_vacuum(s, &busy) != 0 || store_size(s, &after) != 0) {
        fprintf(stderr, "capd db vacuum: %s\n", store_errmsg(s));
        goto out;
    }
    if (a->as_json)
        emit_json(json_pack("{s:I,s:I,s:I,s:I,s:b}", "bytes_before",
                            (json_int_t)(before.file_bytes + before.wal_bytes), "bytes_after",
                            (json_int_t)(after.file_bytes + after.wal_bytes), "free_pages_before",
                            (json_int_t)before.free_pages, "free_pages_after",
                            (json_int_t)after.free_pages, "checkpoint_busy", busy));
    fprintf(stderr, "capd: vacuumed %s/capd.db: %lld -> %lld bytes (database and WAL)%s\n",
            a->cfg.data_dir, (long long)(before.file_bytes + before.wal_bytes),
            (long long)(after.file_bytes + after.wal_bytes),
            busy ? "; a reader kept the WAL from being truncated, it shrinks at a later "
                   "checkpoint"
                 : "");
    rc = 0;
out:
    store_close(s);
    return rc;
}

static int do_prune(const struct db_args *a)
{
    struct store *s = NULL;
    struct store_prune_report r;
    struct store_prune_opts o = {.keep_heads_per_branch = a->keep_heads, .dry_run = a->dry_run};
    if (a->keep_heads == 0) {
        fprintf(stderr, "capd db prune: retention is off (retention_keep_heads_per_branch is 0); "
                        "give --keep-heads N or set it in the config\n");
        return 2;
    }
    if (open_existing(a, &s))
        return 1;
    int rc = store_prune(s, &o, &r);
    if (rc) {
        fprintf(stderr, "capd db prune: %s%s\n", r.error[0] ? r.error : store_errmsg(s),
                rc == -EBUSY ? " (the database stayed locked; try again)" : "");
        store_close(s);
        return 1;
    }
    store_close(s);
    if (a->as_json)
        emit_json(json_pack(
            "{s:b,s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "dry_run", a->dry_run,
            "keep_heads_per_branch", a->keep_heads, "jobs", (json_int_t)r.jobs, "jobs_kept",
            (json_int_t)r.jobs_kept, "jobs_pruned", (json_int_t)r.jobs_pruned, "records_detached",
            (json_int_t)r.records_detached, "blobs_deleted", (json_int_t)r.blobs_deleted,
            "orphans_deleted", (json_int_t)r.orphans_deleted, "bytes_freed",
            (json_int_t)r.bytes_freed, "logs_deleted", (json_int_t)r.logs_deleted,
            "log_bytes_freed", (json_int_t)r.log_bytes_freed, "replays_deleted",
            (json_int_t)r.replays_deleted, "replay_bytes_freed", (json_int_t)r.replay_bytes_freed));
    fprintf(stderr,
            "capd: %s %lld of %lld jobs kept whole (controls and the newest %d commits per "
            "branch); payloads of %lld jobs %s: %lld record references, %lld payload files and "
            "%lld orphaned files, %lld bytes; %lld cell logs, %lld bytes; %lld replay folders, "
            "%lld bytes\n",
            a->dry_run ? "dry run:" : "pruned:", (long long)r.jobs_kept, (long long)r.jobs,
            a->keep_heads, (long long)r.jobs_pruned, a->dry_run ? "would go" : "dropped",
            (long long)r.records_detached, (long long)r.blobs_deleted, (long long)r.orphans_deleted,
            (long long)r.bytes_freed, (long long)r.logs_deleted, (long long)r.log_bytes_freed,
            (long long)r.replays_deleted, (long long)r.replay_bytes_freed);
    return 0;
}

int cmd_db(int argc, char **argv)
{
    struct db_args a;
    memset(&a, 0, sizeof a);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    a.verb = argv[1];
    if (strcmp(a.verb, "--help") == 0 || strcmp(a.verb, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(a.verb, "backup") != 0 && strcmp(a.verb, "vacuum") != 0 &&
        strcmp(a.verb, "prune") != 0) {
        fprintf(stderr, "capd db: unknown command '%s'\n", a.verb);
        usage(stderr);
        return 2;
    }
    int rc = parse(&a, argc, argv);
    if (rc)
        return rc == 1 ? 0 : rc;
    if (strcmp(a.verb, "backup") == 0)
        return do_backup(&a);
    if (strcmp(a.verb, "vacuum") == 0)
        return do_vacuum(&a);
    return do_prune(&a);
}
