/*
 * tests/test_db.c - database care: `capd db backup|vacuum|prune` run as the
 * real binary next to a real capd, and the retention timer (daemon/
 * retention.c) on a libuv loop of its own.
 *
 * Jobs run the fake runner (tests/helpers/fake_runner) with capture
 * "sample": every tensor record names a payload blob whose content depends
 * only on the job's seed and the record key, so jobs with the same seed
 * share blobs. The copies and the data dirs are inspected with SQLite
 * directly.
 *
 * Every test has the same .timeout: Criterion 2.4.1 leaks a record (which
 * LeakSanitizer reports in scripts/test) when tests with different
 * timeouts run side by side.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "daemon/config/config.h"
#include "daemon/retention.h"
#include "storage/store.h"
#include "storage/store_int.h"
#include "tests/helpers/common/testutil.h"

struct env {
    struct tu_capd c;
    char data[300];
};

static void start_in(struct env *e, const char *dir, const char *const *extra)
{
    cr_assert_eq(tu_capd_start(&e->c, dir, extra), 0, "capd starts (see %s)", e->c.errlog);
    snprintf(e->data, sizeof e->data, "%s/data", e->c.dir);
}

static void start(struct env *e, const char *const *extra)
{
    start_in(e, NULL, extra);
    cr_assert_eq(tu_fake_build(&e->c, "fake", NULL), 201);
}

/* Posts a one-cell job of MODEL on the fake build and returns its id;
 * replaying nothing by itself (the fixtures count their jobs' records). */
static char *submit(struct env *e, const char *commit, const char *branch, const char *control,
                    const char *model, int seed)
{
    long st = 0;
    char br[300] = "", cc[300] = "";
    if (branch)
        snprintf(br, sizeof br, "\"branch\":\"%s\",", branch);
    if (control)
        snprintf(cc, sizeof cc, "\"control_commit\":\"%s\",", control);
    json_t *j = tu_jsonf(&e->c, "POST", "/v1/jobs", &st,
                         "{\"project\":\"p\",\"commit\":\"%s\",%s%s\"build\":\"fake\","
                         "\"matrix\":{\"models\":[\"%s\"],\"widths\":[\"avx2\"],"
                         "\"passes\":[\"forward\"]},\"options\":{\"capture\":\"sample\","
                         "\"seed\":%d,\"replay\":\"off\"}}",
                         commit, br, cc, model, seed);
    const char *id = json_string_value(json_object_get(j, "id"));
    cr_assert_eq(st, 201, "job of %s posted", commit);
    char *r = strdup(id);
    json_decref(j);
    return r;
}

static void wait_ok(struct env *e, const char *job)
{
    json_t *j = tu_wait_job(&e->c, job, 120);
    cr_assert_not_null(j, "job %s finished", job);
    json_t *cell = json_array_get(json_object_get(j, "cells"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(cell, "state")), "ok", "cell of %s: %s", job,
                     json_string_value(json_object_get(cell, "reason")));
    json_decref(j);
}

static char *submit_ok(struct env *e, const char *commit, const char *branch, const char *control,
                       int seed)
{
    char *id = submit(e, commit, branch, control, "fake:ok", seed);
    wait_ok(e, id);
    return id;
}

/* capd started in E with two finished jobs on main, a0000001 (seed 1) then
 * a0000002 (seed 2), their ids in *A and *B (owned): the older head is
 * what keeping one head per branch prunes. */
static void start_two_heads(struct env *e, char **a, char **b)
{
    start(e, NULL);
    *a = submit_ok(e, "a0000001", "main", NULL, 1);
    *b = submit_ok(e, "a0000002", "main", NULL, 2);
}

static const char *job_state(struct env *e, const char *job)
{
    static char state[32];
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", job);
    json_t *j = tu_json(&e->c, "GET", path, NULL, NULL);
    const char *v = json_string_value(json_object_get(j, "state"));
    snprintf(state, sizeof state, "%s", v ? v : "?");
    json_decref(j);
    return state;
}

/* Runs `capd db ARGS`; returns its exit status, *out its stdout parsed as
 * JSON when asked (NULL otherwise), and keeps stderr in *err_text. */
static int capd_db(json_t **out, char **err_text, const char *fmt, ...)
{
    char *args = NULL, *dir = tu_tmpdir();
    va_list ap;
    va_start(ap, fmt);
    cr_assert_geq(vasprintf(&args, fmt, ap), 0);
    va_end(ap);
    int rc = tu_sh("'%s' db %s >'%s/out' 2>'%s/err'", tu_bin("CAPD_BIN"), args, dir, dir);
    char p[400];
    if (out) {
        snprintf(p, sizeof p, "%s/out", dir);
        *out = json_load_file(p, 0, NULL);
    }
    if (err_text) {
        snprintf(p, sizeof p, "%s/err", dir);
        FILE *f = fopen(p, "r");
        char buf[8192] = "";
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        buf[n] = 0;
        if (f)
            fclose(f);
        *err_text = strdup(buf);
    }
    tu_sh("rm -rf '%s'", dir);
    free(dir);
    free(args);
    return rc;
}

static json_int_t jint(json_t *o, const char *k)
{
    cr_assert(json_is_integer(json_object_get(o, k)), "report has %s", k);
    return json_integer_value(json_object_get(o, k));
}

static sqlite3 *db_open(const char *data_dir)
{
    char p[400];
    sqlite3 *db = NULL;
    snprintf(p, sizeof p, "%s/capd.db", data_dir);
    cr_assert_eq(sqlite3_open_v2(p, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK, "open %s", p);
    sqlite3_busy_timeout(db, 10000);
    return db;
}

static int64_t q1(sqlite3 *db, const char *fmt, ...)
{
    char *sql = NULL;
    sqlite3_stmt *st = NULL;
    va_list ap;
    va_start(ap, fmt);
    cr_assert_geq(vasprintf(&sql, fmt, ap), 0);
    va_end(ap);
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql,
                 sqlite3_errmsg(db));
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s", sql);
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    free(sql);
    return v;
}

static void q_text(sqlite3 *db, const char *sql, char *out, size_t n)
{
    sqlite3_stmt *st = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    snprintf(out, n, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
}

/* Regular files under DATA/blobs (two levels). */
static int blob_files(const char *data_dir)
{
    char top[400];
    snprintf(top, sizeof top, "%s/blobs", data_dir);
    DIR *d = opendir(top);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)) != NULL) {
        char sub[800];
        if (e->d_name[0] == '.')
            continue;
        snprintf(sub, sizeof sub, "%s/%s", top, e->d_name);
        DIR *in = opendir(sub);
        struct dirent *f;
        while (in && (f = readdir(in)) != NULL)
            n += f->d_name[0] != '.';
        if (in)
            closedir(in);
    }
    if (d)
        closedir(d);
    return n;
}

/* Every blob row has its file, of its stored size; every payload reference
 * names a blob row; committed cells name committed attempts. */
static void check_data_dir(const char *data_dir)
{
    sqlite3 *db = db_open(data_dir);
    char ok[64];
    q_text(db, "PRAGMA integrity_check", ok, sizeof ok);
    cr_assert_str_eq(ok, "ok", "integrity_check of %s", data_dir);
    cr_assert_eq(q1(db, "SELECT count(*) FROM records r WHERE blob_hash IS NOT NULL AND NOT "
                        "EXISTS (SELECT 1 FROM blobs b WHERE b.hash = r.blob_hash)"),
                 0, "every payload reference names a blob");
    cr_assert_eq(q1(db, "SELECT count(*) FROM cells WHERE committed_attempt IS NOT NULL AND "
                        "committed_attempt NOT IN (SELECT id FROM attempts WHERE "
                        "state = 'committed')"),
                 0, "visible attempts are committed");
    /* Tensor records name their hash's algorithm (blake2b-128 when the
     * runner named none); no other kind has one. */
    cr_assert_eq(q1(db, "SELECT count(*) FROM records WHERE kind = 'tensor' AND hash_alg NOT IN "
                        "('blake2b-128', 'xxh3-128')"),
                 0, "every tensor record has a hash_alg");
    cr_assert_eq(q1(db, "SELECT count(*) FROM records WHERE kind != 'tensor' AND hash_alg IS NOT "
                        "NULL"),
                 0, "only tensor records have a hash_alg");
    sqlite3_stmt *st = NULL;
    cr_assert_eq(
        sqlite3_prepare_v2(db, "SELECT hash, stored_size, codec FROM blobs", -1, &st, NULL),
        SQLITE_OK);
    int n = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *h = (const char *)sqlite3_column_text(st, 0);
        char p[600];
        struct stat sb;
        snprintf(p, sizeof p, "%s/blobs/%.2s/%s", data_dir, h + 1, h);
        cr_assert_eq(stat(p, &sb), 0, "blob file %s exists", p);
        cr_assert_eq((int64_t)sb.st_size, sqlite3_column_int64(st, 1), "size of %s", p);
        /* Named by the SHA-256 of its bytes, as sha256sum computes it. */
        cr_assert(h[0] == 's' && strlen(h) == 65, "blob name %s", h);
        if (strcmp((const char *)sqlite3_column_text(st, 2), "raw") == 0 && n < 4) {
            char cmd[700], sum[80] = "";
            snprintf(cmd, sizeof cmd, "sha256sum '%s'", p);
            FILE *f = popen(cmd, "r");
            cr_assert_not_null(f);
            cr_assert_not_null(fgets(sum, sizeof sum, f));
            pclose(f);
            cr_assert(strncmp(sum, h + 1, 64) == 0, "blob %s holds bytes whose SHA-256 is %.64s", h,
                      sum);
        }
        n++;
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    cr_assert_eq(blob_files(data_dir), n, "no blob file without its row in %s", data_dir);
}

/* The path of the log of job JOB's (only) cell under DATA_DIR. */
static void cell_log(struct env *e, const char *data_dir, const char *job, char *out, size_t n)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", job);
    json_t *j = tu_json(&e->c, "GET", path, NULL, NULL);
    const char *cell =
        json_string_value(json_object_get(json_array_get(json_object_get(j, "cells"), 0), "id"));
    cr_assert_not_null(cell, "job %s has a cell", job);
    snprintf(out, n, "%s/logs/%s/%s.log", data_dir, job, cell);
    json_decref(j);
}

static bool exists(const char *fmt, const char *a, const char *b)
{
    char p[800];
    struct stat sb;
    snprintf(p, sizeof p, fmt, a, b);
    return stat(p, &sb) == 0;
}

Test(db, backup_while_ingesting_is_consistent_and_restorable, .timeout = 300)
{
    struct env e;
    start(&e, NULL);
    char *top = tu_tmpdir();
    chmod(top, 0711); /* the restored capd's cells run as nobody under root */
    /* Payloads on disk first: eight 1 MiB full payloads. */
    char *pay = submit(&e, "a0000001", "main", NULL, "fake:payload__8", 1);
    wait_ok(&e, pay);
    /* Then a cell that streams records for a while; backups are taken over
     * and over until it ends, and at least one must land mid-ingest. */
    char *stream = submit(&e, "a0000002", "main", NULL, "fake:stream__400000", 2);
    int during = 0, taken = 0;
    char dest[64][400];
    for (int i = 0; i < 200 && taken < 64; i++) {
        const char *st = job_state(&e, stream);
        if (strcmp(st, "done") == 0)
            break;
        if (strcmp(st, "running") != 0) {
            usleep(20 * 1000);
            continue;
        }
        snprintf(dest[taken], sizeof dest[taken], "%s/b%d/data", top, taken);
        json_t *rep = NULL;
        char *err = NULL;
        int rc = capd_db(&rep, &err, "backup '%s' --data-dir '%s' --json", dest[taken], e.data);
        cr_assert_eq(rc, 0, "backup %d: %s", taken, err);
        cr_assert_geq(jint(rep, "blobs"), 8, "the payload job's blobs are in the backup");
        cr_assert_eq(jint(rep, "blobs_copied"), jint(rep, "blobs"), "a new backup copies all");
        cr_assert_eq(jint(rep, "blobs_missing"), 0);
        json_decref(rep);
        free(err);
        if (strcmp(job_state(&e, stream), "running") == 0)
            during++;
        taken++;
    }
    wait_ok(&e, stream);
    cr_log_info("%d backups, %d of them while the stream cell ran", taken, during);
    cr_assert_geq(during, 1, "a backup was taken while the cell was ingesting (%d backups)", taken);
    for (int i = 0; i < taken; i++)
        check_data_dir(dest[i]);

    /* Backing up into the previous backup copies nothing new (the stream
     * job has no payloads), and the result is complete again. */
    json_t *rep = NULL;
    cr_assert_eq(capd_db(&rep, NULL, "backup '%s' --data-dir '%s' --json", dest[0], e.data), 0);
    cr_assert_eq(jint(rep, "blobs_copied"), 0, "incremental backup copies no known blob");
    json_decref(rep);
    check_data_dir(dest[0]);
    sqlite3 *db = db_open(dest[0]);
    cr_assert_eq(q1(db, "SELECT count(*) FROM jobs WHERE state = 'done'"), 2,
                 "the refreshed backup has both finished jobs");
    sqlite3_close(db);

    /* Refused: a destination inside the data dir, a directory that is not
     * a backup. Neither writes anything. */
    char *err = NULL;
    cr_assert_eq(capd_db(NULL, &err, "backup '%s/bk' --data-dir '%s'", e.data, e.data), 1);
    cr_assert(strstr(err, "inside the data dir"), "%s", err);
    free(err);
    char other[400];
    snprintf(other, sizeof other, "%s/other", top);
    cr_assert_eq(tu_sh("mkdir -p '%s' && echo x > '%s/notes.txt'", other, other), 0);
    cr_assert_eq(capd_db(NULL, &err, "backup '%s' --data-dir '%s'", other, e.data), 1);
    cr_assert(strstr(err, "neither empty nor a capd backup"), "%s", err);
    free(err);
    cr_assert_eq(tu_capd_stop(&e.c), 0);

    /* A backup is a data dir: capd starts on it and compares the payload
     * job with itself, reading every payload file from the copy. */
    struct env r;
    char restored[400];
    snprintf(restored, sizeof restored, "%s/b0", top);
    start_in(&r, restored, NULL);
    /* The backup holds the tokens' hashes, not DATA/admin.token: the
     * original admin token opens the restored capd, and no new one is
     * made. */
    cr_assert_eq(r.c.token[0], 0, "the restored capd made a second admin token");
    snprintf(r.c.token, sizeof r.c.token, "%s", e.c.token);
    char path[200];
    long status = 0;
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s", pay, pay);
    json_t *cmp = tu_json(&r.c, "GET", path, NULL, &status);
    cr_assert_eq(status, 200, "comparison on the restored data: %s", json_dumps(cmp, JSON_COMPACT));
    cr_assert_str_eq(json_string_value(json_object_get(cmp, "verdict")), "pass");
    json_decref(cmp);
    cr_assert_eq(tu_capd_stop(&r.c), 0);
    tu_sh("rm -rf '%s'", top);
    free(top);
    free(pay);
    free(stream);
}

/* A backup holds every finished cell log, copies a log again only when it
 * changed, and mirrors the data dir: a log gone there (pruned) or a file
 * that is not a cell's log goes from the backup too. */
Test(db, backup_copies_cell_logs_and_mirrors_them, .timeout = 300)
{
    struct env e;
    char *a, *b;
    start_two_heads(&e, &a, &b);
    char la[400], lb[400], ba[600], bb[600], dest[400];
    cell_log(&e, e.data, a, la, sizeof la);
    cell_log(&e, e.data, b, lb, sizeof lb);
    cr_assert(exists("%s%s", la, ""), "cell log %s written", la);
    cr_assert_eq(tu_capd_stop(&e.c), 0);
    char *top = tu_tmpdir();
    snprintf(dest, sizeof dest, "%s/bk", top);
    snprintf(ba, sizeof ba, "%s%s", dest, la + strlen(e.data));
    snprintf(bb, sizeof bb, "%s%s", dest, lb + strlen(e.data));

    json_t *rep = NULL;
    char *err = NULL;
    cr_assert_eq(capd_db(&rep, &err, "backup '%s' --data-dir '%s' --json", dest, e.data), 0, "%s",
                 err);
    free(err);
    cr_assert_eq(jint(rep, "logs"), 2);
    cr_assert_eq(jint(rep, "logs_copied"), 2);
    json_decref(rep);
    cr_assert_eq(tu_sh("cmp -s '%s' '%s' && cmp -s '%s' '%s'", la, ba, lb, bb), 0,
                 "the backup's logs are the data dir's");

    /* Again: nothing changed, nothing copied. */
    cr_assert_eq(capd_db(&rep, NULL, "backup '%s' --data-dir '%s' --json", dest, e.data), 0);
    cr_assert_eq(jint(rep, "logs"), 2);
    cr_assert_eq(jint(rep, "logs_copied"), 0, "an unchanged log is not copied again");
    json_decref(rep);

    /* a's log changes (a cell run again rewrites it), b's goes (retention),
     * and the backup gets a file that is no cell's log. */
    cr_assert_eq(tu_sh("sleep 0.05; echo rerun >> '%s'", la), 0);
    cr_assert_eq(unlink(lb), 0);
    cr_assert_eq(tu_sh("mkdir -p '%s/logs/jzzz' && echo x > '%s/logs/jzzz/c1.log' && echo t > "
                       "'%s.tmp42'",
                       dest, dest, ba),
                 0);
    cr_assert_eq(capd_db(&rep, NULL, "backup '%s' --data-dir '%s' --json", dest, e.data), 0);
    cr_assert_eq(jint(rep, "logs"), 1);
    cr_assert_eq(jint(rep, "logs_copied"), 1, "the changed log is copied");
    json_decref(rep);
    cr_assert_eq(tu_sh("cmp -s '%s' '%s'", la, ba), 0, "the backup has a's new log");
    cr_assert(!exists("%s%s", bb, ""), "b's log left the backup with the data dir's");
    cr_assert(!exists("%s/logs/jzzz%s", dest, ""), "no stray log directory");
    cr_assert(!exists("%s.tmp42%s", ba, ""), "no stray file");
    check_data_dir(dest);
    tu_sh("rm -rf '%s'", top);
    free(top);
    free(a);
    free(b);
}

/*
 * The policy, with keep = 1 (one head per branch):
 *   main: m1 (seed 1), m2 (seed 2), m3 (seed 3)      m3 newest of main
 *   feat: f1 (seed 4), f2 (seed 3), f3 (seed 5)      f3 newest; all name m1 as control
 *   rel:  no job; its branch control is m2
 *   wip:  w1 (seed 8, still running), w2 (seed 9)    w2 newest; w1 not finished
 * Kept: m1 (a job's control), m2 (a branch's control), m3, f3, w2 (newest),
 * w1 (running). Pruned: f1, whose 3 blobs only it has, and f2, whose blobs
 * m3 shares (seed 3): its references go, its blobs stay.
 */
Test(db, prune_keeps_controls_and_newest_heads, .timeout = 300)
{
    struct env e;
    const char *extra[] = {"--max-parallel", "2", NULL};
    start(&e, extra);
    char *m1 = submit_ok(&e, "a0000001", "main", NULL, 1);
    char *m2 = submit_ok(&e, "a0000002", "main", NULL, 2);
    char *m3 = submit_ok(&e, "a0000003", "main", NULL, 3);
    char *f1 = submit_ok(&e, "b0000001", "feat", "a0000001", 4);
    char *f2 = submit_ok(&e, "b0000002", "feat", "a0000001", 3);
    char *f3 = submit_ok(&e, "b0000003", "feat", "a0000001", 5);
    long st = 0;
    json_decref(
        tu_jsonf(&e.c, "PUT", "/v1/branches/rel", &st, "{\"control_commit\":\"a0000002\"}"));
    cr_assert(st == 200 || st == 201, "branch rel: %ld", st);
    char *w1 = submit(&e, "c0000001", "wip", NULL, "fake:slow__60000", 8);
    char *w2 = submit_ok(&e, "c0000002", "wip", NULL, 9);
    cr_assert_str_eq(job_state(&e, w1), "running");

    sqlite3 *db = db_open(e.data);
    /* The fixture is what the comment says: 3 distinct blobs per seed,
     * seven seeds, eight jobs of 3 tensor records each. */
    cr_assert_eq(q1(db, "SELECT count(*) FROM blobs"), 7 * 3, "blobs of seeds 1-5, 8, 9");
    cr_assert_eq(q1(db, "SELECT count(*) FROM records WHERE blob_hash IS NOT NULL"), 8 * 3);
    int64_t files = blob_files(e.data);
    cr_assert_eq(files, 7 * 3);
    int64_t bytes4 = q1(db,
                        "SELECT sum(b.stored_size) FROM blobs b JOIN records r ON "
                        "r.blob_hash = b.hash JOIN attempts a ON a.id = r.attempt_id JOIN "
                        "cells c ON c.seq = a.cell_seq JOIN jobs j ON j.seq = c.job_seq "
                        "WHERE j.id = '%s'",
                        f1);

    /* Every job has its log directory (w1's holds its running log). */
    const char *all[] = {m1, m2, m3, f1, f2, f3, w1, w2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        cr_assert(exists("%s/logs/%s", e.data, all[i]), "log directory of %s", all[i]);

    /* A replay's folder of recorded arguments (daemon/replay/isolate.h)
     * for a job that goes and one that stays: 100 + 25 bytes each. */
    const char *rep[] = {f1, m1};
    for (size_t i = 0; i < 2; i++)
        cr_assert_eq(tu_sh("mkdir -p '%s/replays/%s/inputs' && head -c 100 /dev/zero > "
                           "'%s/replays/%s/inputs/arg.0.npy' && printf '{\"format\": 1, "
                           "\"args\": []}' > '%s/replays/%s/manifest.json'",
                           e.data, rep[i], e.data, rep[i], e.data, rep[i]),
                     0);

    /* A dry run says what a real run does, and changes nothing. */
    json_t *dry = NULL, *real = NULL;
    char *err = NULL;
    cr_assert_eq(
        capd_db(&dry, &err, "prune --data-dir '%s' --keep-heads 1 --dry-run --json", e.data), 0,
        "%s", err);
    free(err);
    cr_assert_eq(q1(db, "SELECT count(*) FROM blobs"), 7 * 3, "a dry run deletes nothing");
    cr_assert_eq(q1(db, "SELECT count(*) FROM records WHERE blob_hash IS NOT NULL"), 8 * 3,
                 "a dry run detaches nothing");
    cr_assert_eq(blob_files(e.data), files);
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        cr_assert(exists("%s/logs/%s", e.data, all[i]), "a dry run keeps %s's logs", all[i]);

    /* The real run, while capd runs (w1 is still ingesting). */
    cr_assert_eq(capd_db(&real, &err, "prune --data-dir '%s' --keep-heads 1 --json", e.data), 0,
                 "%s", err);
    free(err);
    cr_assert_eq(jint(real, "jobs"), 8);
    cr_assert_eq(jint(real, "jobs_kept"), 6, "m1 m2 m3 f3 w1 w2");
    cr_assert_eq(jint(real, "jobs_pruned"), 2, "f1 and f2");
    cr_assert_eq(jint(real, "records_detached"), 6, "3 tensors each");
    cr_assert_eq(jint(real, "blobs_deleted"), 3, "only f1's own blobs; f2 shares m3's");
    cr_assert_eq(jint(real, "orphans_deleted"), 0);
    cr_assert_eq(jint(real, "bytes_freed"), bytes4);
    cr_assert_eq(jint(real, "logs_deleted"), 2, "the cell logs of f1 and f2");
    cr_assert_eq(jint(real, "replays_deleted"), 1, "f1's replay folder");
    cr_assert_eq(jint(real, "replay_bytes_freed"), 125, "its two files");
    cr_assert(!exists("%s/replays/%s", e.data, f1), "f1's replay folder is gone");
    cr_assert(exists("%s/replays/%s/inputs/arg.0.npy", e.data, m1), "m1's stays");
    static const char *const same[] = {
        "jobs",        "jobs_kept",    "jobs_pruned",     "records_detached", "blobs_deleted",
        "bytes_freed", "logs_deleted", "log_bytes_freed", "replays_deleted",  "replay_bytes_freed"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        cr_assert_eq(jint(dry, same[i]), jint(real, same[i]), "dry run's %s", same[i]);

    /* Kept jobs keep every reference; pruned ones have none left. */
    const char *kept[] = {m1, m2, m3, f3, w2};
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++)
        cr_assert_eq(q1(db,
                        "SELECT count(*) FROM records r JOIN attempts a ON a.id = "
                        "r.attempt_id JOIN cells c ON c.seq = a.cell_seq JOIN jobs j ON "
                        "j.seq = c.job_seq WHERE j.id = '%s' AND r.kind = 'tensor' AND "
                        "r.blob_hash IS NOT NULL",
                        kept[i]),
                     3, "kept job %s keeps its payloads", kept[i]);
    const char *pruned[] = {f1, f2};
    for (size_t i = 0; i < 2; i++)
        cr_assert_eq(q1(db,
                        "SELECT count(*) FROM records r JOIN attempts a ON a.id = "
                        "r.attempt_id JOIN cells c ON c.seq = a.cell_seq JOIN jobs j ON "
                        "j.seq = c.job_seq WHERE j.id = '%s' AND r.blob_hash IS NOT NULL",
                        pruned[i]),
                     0, "pruned job %s has no payload reference", pruned[i]);
    for (size_t i = 0; i < 2; i++)
        cr_assert(!exists("%s/logs/%s", e.data, pruned[i]), "pruned job %s has no log", pruned[i]);
    const char *kept_logs[] = {m1, m2, m3, f3, w1, w2};
    for (size_t i = 0; i < sizeof kept_logs / sizeof kept_logs[0]; i++)
        cr_assert(exists("%s/logs/%s", e.data, kept_logs[i]), "kept job %s keeps its logs",
                  kept_logs[i]);
    /* The running job's records (an open attempt) were not touched. */
    cr_assert_eq(q1(db,
                    "SELECT count(*) FROM records r JOIN attempts a ON a.id = "
                    "r.attempt_id JOIN cells c ON c.seq = a.cell_seq JOIN jobs j ON "
                    "j.seq = c.job_seq WHERE j.id = '%s' AND r.blob_hash IS NOT NULL",
                    w1),
                 3, "the running job keeps its payloads");
    cr_assert_eq(blob_files(e.data), files - 3, "f1's three files are gone");
    check_data_dir(e.data);

    /* Comparisons still work: a pruned head against its control (on
     * statistics now), and a kept head on payloads. */
    char path[200];
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s", m1, f1);
    json_t *cmp = tu_json(&e.c, "GET", path, NULL, &st);
    cr_assert_eq(st, 200, "pruned head still compares");
    json_decref(cmp);
    cmp = tu_json(&e.c, "GET", "/v1/commits/b0000003/diff", NULL, &st);
    cr_assert_eq(st, 200, "kept head's diff");
    json_decref(cmp);

    /* Again: nothing left to do. */
    json_decref(real);
    cr_assert_eq(capd_db(&real, NULL, "prune --data-dir '%s' --keep-heads 1 --json", e.data), 0);
    cr_assert_eq(jint(real, "jobs_pruned"), 0);
    cr_assert_eq(jint(real, "blobs_deleted"), 0);
    cr_assert_eq(jint(real, "logs_deleted"), 0);
    json_decref(real);
    json_decref(dry);
    sqlite3_close(db);

    char cancel[128];
    snprintf(cancel, sizeof cancel, "/v1/jobs/%s/cancel", w1);
    json_decref(tu_json(&e.c, "POST", cancel, "{}", NULL));
    cr_assert_eq(tu_capd_stop(&e.c), 0);
    free(m1), free(m2), free(m3), free(f1), free(f2), free(f3), free(w1), free(w2);
}

/* While a backup holds DATA/blobs shared, retention drops rows but leaves
 * the files; the next run (or sweep) removes them, with crash leftovers. */
Test(db, prune_defers_file_deletes_during_a_backup_then_sweeps, .timeout = 300)
{
    struct env e;
    char *a, *b;
    start_two_heads(&e, &a, &b);
    cr_assert_eq(tu_capd_stop(&e.c), 0);
    int files = blob_files(e.data);
    cr_assert_eq(files, 6);

    char blobs[400], logs[400];
    snprintf(blobs, sizeof blobs, "%s/blobs", e.data);
    snprintf(logs, sizeof logs, "%s/logs", e.data);
    int lock = open(blobs, O_RDONLY | O_DIRECTORY), log_lock = open(logs, O_RDONLY | O_DIRECTORY);
    cr_assert_geq(lock, 0);
    cr_assert_geq(log_lock, 0);
    cr_assert_eq(flock(lock, LOCK_SH), 0);
    cr_assert_eq(flock(log_lock, LOCK_SH), 0);
    json_t *rep = NULL;
    cr_assert_eq(capd_db(&rep, NULL, "prune --data-dir '%s' --keep-heads 1 --json", e.data), 0);
    cr_assert_eq(jint(rep, "blobs_deleted"), 3, "a's rows go");
    cr_assert_eq(jint(rep, "logs_deleted"), 0, "a's logs wait for the backup");
    json_decref(rep);
    cr_assert_eq(blob_files(e.data), 6, "but not its files while the lock is held");
    cr_assert(exists("%s/logs/%s", e.data, a), "a's logs stay while the lock is held");
    close(lock);
    close(log_lock);

    /* Leftovers of a crash: a temporary and a blob file without a row. */
    cr_assert_eq(
        tu_sh("mkdir -p '%s/ab' && echo t > '%s/ab/xab000000000000000000000000000000.tmp42'"
              " && echo o > '%s/ab/xab000000000000000000000000000001'",
              blobs, blobs, blobs),
        0);
    cr_assert_eq(
        capd_db(&rep, NULL, "prune --data-dir '%s' --keep-heads 1 --dry-run --json", e.data), 0);
    cr_assert_eq(jint(rep, "orphans_deleted"), 5, "dry run counts 3 deferred + 2 leftovers");
    cr_assert_eq(jint(rep, "logs_deleted"), 1, "and a's deferred log");
    json_decref(rep);
    cr_assert(exists("%s/logs/%s", e.data, a), "which a dry run keeps");
    cr_assert_eq(blob_files(e.data), 8);
    cr_assert_eq(capd_db(&rep, NULL, "prune --data-dir '%s' --keep-heads 1 --json", e.data), 0);
    cr_assert_eq(jint(rep, "orphans_deleted"), 5);
    cr_assert_eq(jint(rep, "logs_deleted"), 1, "a's log goes once the lock is free");
    json_decref(rep);
    cr_assert_eq(blob_files(e.data), 3, "only b's blobs remain");
    cr_assert(!exists("%s/logs/%s", e.data, a), "a's log directory is gone");
    cr_assert(exists("%s/logs/%s", e.data, b), "b's stays");
    check_data_dir(e.data);
    free(a);
    free(b);
}

Test(db, vacuum_gives_free_pages_back_and_keeps_data, .timeout = 300)
{
    struct env e;
    start(&e, NULL);
    char *a = submit_ok(&e, "a0000001", "main", NULL, 1);
    char *slow = submit(&e, "a0000002", "main", NULL, "fake:slow__60000", 2);
    for (int i = 0; i < 200 && strcmp(job_state(&e, slow), "running") != 0; i++)
        usleep(20 * 1000);
    char *err = NULL;
    cr_assert_eq(capd_db(NULL, &err, "vacuum --data-dir '%s'", e.data), 1,
                 "vacuum refuses while a cell runs");
    cr_assert(strstr(err, "cells are running"), "%s", err);
    free(err);
    char cancel[128];
    snprintf(cancel, sizeof cancel, "/v1/jobs/%s/cancel", slow);
    json_decref(tu_json(&e.c, "POST", cancel, "{}", NULL));
    json_decref(tu_wait_job(&e.c, slow, 60));
    cr_assert_eq(tu_capd_stop(&e.c), 0);

    /* Free pages: 8 MiB in a scratch table, dropped. */
    sqlite3 *db = db_open(e.data);
    cr_assert_eq(sqlite3_exec(db,
                              "CREATE TABLE filler(b BLOB); WITH RECURSIVE n(i) AS (SELECT 1 "
                              "UNION ALL SELECT i + 1 FROM n WHERE i < 2048) INSERT INTO filler "
                              "SELECT randomblob(4096) FROM n; DROP TABLE filler; "
                              "PRAGMA wal_checkpoint(TRUNCATE);",
                              NULL, NULL, NULL),
                 SQLITE_OK, "%s", sqlite3_errmsg(db));
    int64_t free_before = q1(db, "PRAGMA freelist_count");
    sqlite3_close(db);
    cr_assert_gt(free_before, 500, "the drop left free pages");

    json_t *rep = NULL;
    cr_assert_eq(capd_db(&rep, &err, "vacuum --data-dir '%s' --json", e.data), 0, "%s", err);
    free(err);
    cr_assert_eq(jint(rep, "free_pages_before"), free_before);
    cr_assert_eq(jint(rep, "free_pages_after"), 0);
    cr_assert_lt(jint(rep, "bytes_after") + 4 * 1024 * 1024, jint(rep, "bytes_before"),
                 "the file shrank by the dropped 8 MiB (%lld -> %lld)",
                 (long long)jint(rep, "bytes_before"), (long long)jint(rep, "bytes_after"));
    json_decref(rep);
    check_data_dir(e.data);

    /* capd starts on it and still has the job and its payloads. */
    struct env r;
    start_in(&r, e.c.dir, NULL);
    char path[200];
    long st = 0;
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s", a, a);
    json_decref(tu_json(&r.c, "GET", path, NULL, &st));
    cr_assert_eq(st, 200);
    cr_assert_eq(tu_capd_stop(&r.c), 0);
    free(a);
    free(slow);
}

Test(db, usage_errors_and_no_database, .timeout = 300)
{
    char *dir = tu_tmpdir(), *err = NULL;
    cr_assert_eq(capd_db(NULL, NULL, ""), 2, "no command");
    cr_assert_eq(capd_db(NULL, NULL, "frobnicate"), 2, "unknown command");
    cr_assert_eq(capd_db(NULL, NULL, "backup"), 2, "backup needs DEST");
    cr_assert_eq(capd_db(NULL, NULL, "vacuum --keep-heads 2 --data-dir '%s'", dir), 2);
    cr_assert_eq(capd_db(NULL, NULL, "prune --keep-heads -1 --data-dir '%s'", dir), 2);
    cr_assert_eq(capd_db(NULL, &err, "prune --data-dir '%s'", dir), 2, "retention off");
    cr_assert(strstr(err, "retention is off"), "%s", err);
    free(err);
    cr_assert_eq(capd_db(NULL, &err, "vacuum --data-dir '%s'", dir), 1);
    cr_assert(strstr(err, "no database"), "%s", err);
    free(err);
    cr_assert_eq(capd_db(NULL, NULL, "prune --keep-heads 1 --data-dir '%s'", dir), 1);
    cr_assert_eq(capd_db(NULL, NULL, "backup '%s/b' --data-dir '%s'", dir, dir), 1);
    char p[400];
    struct stat sb;
    snprintf(p, sizeof p, "%s/capd.db", dir);
    cr_assert_neq(stat(p, &sb), 0, "no database was created by a failed command");
    /* The keep count comes from --config when no flag gives it. */
    snprintf(p, sizeof p, "%s/c.json", dir);
    FILE *f = fopen(p, "w");
    fprintf(f, "{\"data_dir\":\"%s\",\"retention_keep_heads_per_branch\":3}", dir);
    fclose(f);
    cr_assert_eq(capd_db(NULL, &err, "prune --config '%s'", p), 1);
    cr_assert(strstr(err, "no database"), "config's data_dir and keep count used: %s", err);
    free(err);
    tu_sh("rm -rf '%s'", dir);
    free(dir);
}

/* ---- the retention timer, on a loop of this test's own ---- */

static void on_tick(uv_timer_t *t)
{
    (void)t;
}

Test(db, retention_timer_prunes_and_stops_on_sigterm, .timeout = 300)
{
    struct env e;
    char *a, *b;
    start_two_heads(&e, &a, &b);
    cr_assert_eq(tu_capd_stop(&e.c), 0);

    struct capd_config cfg;
    config_defaults(&cfg);
    snprintf(cfg.data_dir, sizeof cfg.data_dir, "%s", e.data);
    uv_loop_t loop;
    struct retention *r = NULL;
    cr_assert_eq(uv_loop_init(&loop), 0);
    /* Off unless both settings are set. */
    cr_assert_eq(retention_start(&loop, &cfg, &r), 0);
    cr_assert_null(r, "interval 0: no timer");
    cfg.retention_interval_s = 1;
    cr_assert_eq(retention_start(&loop, &cfg, &r), 0);
    cr_assert_null(r, "keep 0: no timer");
    cfg.retention_keep_heads_per_branch = 1;
    cr_assert_eq(retention_start(&loop, &cfg, &r), 0);
    cr_assert_not_null(r);

    /* Retention's handles do not keep the loop alive; this ticker does. */
    uv_timer_t tick;
    uv_timer_init(&loop, &tick);
    uv_timer_start(&tick, on_tick, 20, 20);
    struct store_prune_report rep;
    for (int i = 0; i < 1000 && retention_runs(r, &rep) == 0; i++)
        uv_run(&loop, UV_RUN_ONCE);
    cr_assert_geq(retention_runs(r, &rep), 1, "a run completed within its first interval");
    cr_assert_eq(rep.jobs, 2);
    cr_assert_eq(rep.jobs_pruned, 1, "a0000001 is not the newest head of main");
    cr_assert_eq(rep.blobs_deleted, 3);

    /* SIGTERM (as capd gets it) closes retention's handles by itself. */
    uv_timer_stop(&tick);
    uv_close((uv_handle_t *)&tick, NULL);
    raise(SIGTERM);
    for (int i = 0; i < 100; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0, "every handle of retention was closed");
    check_data_dir(e.data);
    sqlite3 *db = db_open(e.data);
    cr_assert_eq(q1(db, "SELECT count(*) FROM blobs"), 3);
    sqlite3_close(db);
    free(a);
    free(b);
}

/* The newest finished job of a commit is looked up by the commit's index,
 * not by walking every finished job (a scan that grows with the table:
 * 12.6 ms per lookup at 10,000 jobs). The plan is read off the real
 * schema of a database capd created; without the "+" SQLite picks the
 * state index. */
Test(db, newest_done_job_of_a_commit_uses_the_commit_index, .timeout = 120)
{
    struct env e;
    start(&e, NULL);
    tu_capd_stop(&e.c);
    sqlite3 *db = db_open(e.data);
    char *sql = NULL;
    cr_assert_geq(asprintf(&sql, "EXPLAIN QUERY PLAN %s", store_sql_job_for_commit_done), 0);
    sqlite3_stmt *st = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
    char plan[1024] = "";
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *d = (const char *)sqlite3_column_text(st, 3);
        size_t n = strlen(plan);
        snprintf(plan + n, sizeof plan - n, "%s; ", d ? d : "");
    }
    sqlite3_finalize(st);
    free(sql);
    sqlite3_close(db);
    cr_assert(strstr(plan, "jobs_commit") != NULL, "plan: %s", plan);
    cr_assert(strstr(plan, "jobs_state") == NULL, "plan: %s", plan);
}

/* The checkpoint sequence number in the WAL header (big-endian, offset 12):
 * SQLite increments it each time the WAL restarts from its beginning. */
static long wal_restarts(const char *data_dir)
{
    char path[600];
    unsigned char h[16];
    snprintf(path, sizeof path, "%s/capd.db-wal", data_dir);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    ssize_t n = pread(fd, h, sizeof h, 0);
    close(fd);
    if (n != (ssize_t)sizeof h)
        return -1;
    return (long)(((unsigned long)h[12] << 24) | ((unsigned long)h[13] << 16) |
                  ((unsigned long)h[14] << 8) | h[15]);
}

static off_t wal_size(const char *data_dir)
{
    char path[600];
    struct stat st;
    snprintf(path, sizeof path, "%s/capd.db-wal", data_dir);
    return stat(path, &st) == 0 ? st.st_size : -1;
}

/*
 * The writer never checkpoints a WAL below 256 MiB itself (storage/checkpoint.c):
 * past 8 MiB the background checkpointer copies it, and the writer's next
 * commit starts the WAL again from its beginning. So bursts of 12 MiB with
 * a pause between them leave the WAL at about one burst, and it restarts
 * after each, although no commit ever reached the inline threshold.
 */
Test(db, background_checkpoint_restarts_the_wal_between_bursts, .timeout = 120)
{
    char *dir = tu_tmpdir(), *err = NULL;
    struct store *s = NULL;
    cr_assert_eq(store_open(dir, true, &s, &err), 0, "%s", err ? err : "");
    cr_assert_eq(store_checkpoint_in_background(s), 0);
    cr_assert_eq(store_exec(s, "CREATE TABLE ckpt_test(x BLOB)"), 0);
    long before = wal_restarts(dir);
    off_t biggest = 0;
    for (int burst = 0; burst < 3; burst++) {
        for (int i = 0; i < 12; i++)
            cr_assert_eq(store_exec(s, "INSERT INTO ckpt_test VALUES (randomblob(1048576))"), 0);
        off_t size = wal_size(dir);
        if (size > biggest)
            biggest = size;
        /* The checkpointer copies the burst; a later commit restarts. */
        long seen = wal_restarts(dir), now = seen;
        for (int tries = 0; tries < 1000 && now == seen; tries++) {
            usleep(10 * 1000);
            cr_assert_eq(store_exec(s, "DELETE FROM ckpt_test WHERE rowid < 0"), 0);
            cr_assert_eq(store_exec(s, "INSERT INTO ckpt_test VALUES (1)"), 0);
            now = wal_restarts(dir);
        }
        cr_assert_gt(now, seen, "burst %d: the WAL never restarted (still %ld)", burst, now);
    }
    cr_assert_geq(wal_restarts(dir) - before, 3);
    cr_assert_lt(biggest, 20 << 20, "the WAL grew to %lld bytes over three 12 MiB bursts",
                 (long long)biggest);
    cr_assert_gt(biggest, 8 << 20, "a burst went through the WAL (%lld bytes)", (long long)biggest);
    store_close(s);
    tu_sh("rm -rf '%s'", dir);
    free(dir);
}

/* A data dir path past what a store keeps is refused with the reason, not
 * cut short (every path below it would then name another directory). */
Test(db, data_dir_too_long_is_refused)
{
    char *dir = tu_tmpdir(), *err = NULL, path[700];
    int n = snprintf(path, sizeof path, "%s/", dir);
    while (n < 600)
        path[n++] = 'x';
    path[n] = 0;
    struct store *s = NULL;
    cr_assert_eq(store_open(path, true, &s, &err), -ENAMETOOLONG);
    cr_assert_null(s);
    cr_assert(err && strstr(err, "data dir path too long (600 bytes"), "%s", err ? err : "(none)");
    free(err);
    free(dir);
}

/*
 * A database of schema version 13 (migrations 1-13 run by the sqlite3
 * shell, a finished job of two cells with attempts and records) is
 * upgraded by capd at start to the newest schema: migration 14 rebuilds
 * cells with the mode (every old cell eager) while foreign keys are off, so
 * no attempt or record goes with the old table, and the job reads back
 * whole; migration 15 adds the compiler bisection's index.
 */
Test(db, an_older_database_keeps_its_cells_attempts_and_records)
{
    char *top = tu_tmpdir();
    char data[400], db[500];
    snprintf(data, sizeof data, "%s/data", top);
    snprintf(db, sizeof db, "%s/capd.db", data);
    cr_assert_eq(mkdir(data, 0750), 0);
    cr_assert_eq(tu_sh("for f in '%s'/schema/0*.sql; do n=$(basename \"$f\" | cut -c1-3); "
                       "if [ \"$n\" -le 13 ]; then sqlite3 '%s' < \"$f\" || exit 1; fi; done "
                       "&& sqlite3 '%s' 'PRAGMA user_version=13'",
                       tu_bin("CAPD_SOURCE_DIR"), db, db),
                 0);
    sqlite3 *h = db_open(data);
    cr_assert_eq(q1(h, "SELECT count(*) FROM pragma_table_info('cells') WHERE name = 'mode'"), 0,
                 "the fixture is version 13");
    const char *rows =
        "INSERT INTO jobs(id, project, commit_sha, build, request_json, options_json, state, "
        "created_at, updated_at) VALUES ('jold00000001', 'p', 'a0000001', 'fake', "
        "'{\"matrix\":{\"models\":[\"fake:ok\"],\"widths\":[\"avx2\"],\"passes\":[\"forward\","
        "\"backward\"]}}', '{}', 'done', 1, 1);"
        "INSERT INTO cells(id, job_seq, ord, model, width, pass, state) VALUES "
        "('cold00000001', 1, 0, 'fake:ok', 'avx2', 'forward', 'ok'),"
        "('cold00000002', 1, 1, 'fake:ok', 'avx2', 'backward', 'ok');"
        "INSERT INTO attempts(cell_seq, n, state, started_at) VALUES (1, 1, 'committed', 1), "
        "(2, 1, 'committed', 1);"
        "UPDATE cells SET committed_attempt = seq, attempts = 1;"
        "INSERT INTO records(attempt_id, seq, kind, key, header) VALUES "
        "(1, 0, 'env', NULL, '{}'), (2, 0, 'env', NULL, '{}'), (2, 1, 'env', NULL, '{}');";
    cr_assert_eq(sqlite3_exec(h, rows, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(h));
    sqlite3_close(h);

    struct env e;
    start_in(&e, top, (const char *[]){NULL});
    h = db_open(e.data);
    cr_assert_eq(q1(h, "PRAGMA user_version"), store_schema_version(), "every migration ran");
    cr_assert_eq(q1(h, "SELECT count(*) FROM sqlite_master WHERE name = "
                       "'jobs_compiler_bisect_auto'"),
                 1, "migration 15's index");
    cr_assert_eq(q1(h, "SELECT count(*) FROM cells WHERE mode = 'eager'"), 2);
    cr_assert_eq(q1(h, "SELECT count(*) FROM attempts"), 2, "no attempt went with the old cells");
    cr_assert_eq(q1(h, "SELECT count(*) FROM records"), 3, "nor any record");
    cr_assert_eq(q1(h, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    cr_assert_eq(q1(h, "SELECT count(*) FROM sqlite_schema WHERE name IN ('cells_state', "
                       "'jobs_version_cell', 'cells_event_state')"),
                 3, "the index and triggers are back");
    sqlite3_close(h);
    long st = 0;
    json_t *j = tu_json(&e.c, "GET", "/v1/jobs/jold00000001", NULL, &st);
    cr_assert_eq(st, 200);
    json_t *cells = json_object_get(j, "cells");
    cr_assert_eq(json_array_size(cells), 2);
    cr_assert_str_eq(tu_jstr(json_array_get(cells, 1), "mode"), "eager");
    cr_assert_str_eq(tu_jstr(json_array_get(cells, 1), "pass"), "backward");
    json_decref(j);
    cr_assert_eq(tu_capd_stop(&e.c), 0);
    tu_sh("rm -rf '%s'", top);
    free(top);
}
