/*
 * tests/test_diskfull.c - capd on a data dir whose file system fills up: a
 * small tmpfs mounted in a private mount namespace of the test process
 * (needs root or CAP_SYS_ADMIN; skipped with the reason otherwise), so the
 * errors are the real ones (SQLITE_FULL from the WAL, ENOSPC from payload
 * files), nothing simulated. Checks 503 storage_unavailable with
 * Retry-After for writes while reads keep working, a cell whose ingest runs
 * out of room ending failed with a clear reason while capd keeps running,
 * the database staying consistent, and capd working again, without a
 * restart, once room is made.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/helpers/common/testutil.h"

/* Mounts a SIZE tmpfs on DIR/data in a mount namespace of this test's own
 * process (Criterion runs each test in its own process; capd, started
 * later, inherits it), so nothing is left mounted on the host whatever
 * happens. Returns NULL or why it is not possible. */
static const char *mount_small_fs(const char *dir, const char *size, char *why, size_t n)
{
    char data[400], opts[64];
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(opts, sizeof opts, "size=%s,mode=0751", size);
    if (mkdir(data, 0751) != 0 && errno != EEXIST)
        return snprintf(why, n, "mkdir %s: %s", data, strerror(errno)), why;
    if (unshare(CLONE_NEWNS) != 0)
        return snprintf(why, n, "unshare(CLONE_NEWNS): %s", strerror(errno)), why;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        return snprintf(why, n, "making / private: %s", strerror(errno)), why;
    if (mount("capd-test", data, "tmpfs", 0, opts) != 0)
        return snprintf(why, n, "mount -t tmpfs -o %s: %s", opts, strerror(errno)), why;
    return NULL;
}

static sqlite3 *open_db(const char *dir, int flags)
{
    char path[400];
    snprintf(path, sizeof path, "%s/data/capd.db", dir);
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open_v2(path, &db, flags, NULL), SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);
    return db;
}

static const char *text(const json_t *o, const char *k)
{
    const char *v = json_string_value(json_object_get(o, k));
    return v ? v : "";
}

/* Fills the file system of DIR/data to the last block. The WAL is first
 * checkpointed and truncated to nothing, so that the very next commit must
 * grow a file; otherwise SQLite could keep writing into WAL space it
 * already has. */
static void fill_up(const char *dir, const char *name)
{
    sqlite3 *db = open_db(dir, SQLITE_OPEN_READWRITE);
    cr_assert_eq(sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    tu_sh("dd if=/dev/zero of='%s/data/%s' bs=64k 2>/dev/null; "
          "dd if=/dev/zero of='%s/data/%s.tail' bs=4k 2>/dev/null; true",
          dir, name, dir, name);
    cr_assert_eq(tu_sh("test \"$(df --output=avail '%s/data' | tail -1 | tr -d ' ')\" -eq 0", dir),
                 0, "the data dir's file system is full");
}

static void check_503(struct tu_capd *c, const char *method, const char *path, const char *body)
{
    const char *hdr[] = {"Content-Type: application/json", NULL};
    struct tu_resp r;
    tu_http(c, method, path, body, strlen(body), hdr, &r);
    cr_assert_eq(r.status, 503, "%s %s on a full disk: 503, got %ld %s", method, path, r.status,
                 r.body);
    json_t *j = json_loads(r.body, 0, NULL);
    json_t *e = json_object_get(j, "error");
    cr_assert_str_eq(text(e, "code"), "storage_unavailable", "%s", r.body);
    cr_assert(strstr(text(e, "message"), "disk full"), "%s", r.body);
    cr_assert(strcasestr(r.headers, "\nRetry-After: 10"), "Retry-After: %s", r.headers);
    json_decref(j);
    tu_resp_free(&r);
}

/* A one-cell job on C is accepted (WHY says when) and its cell ends ok. */
static void runs_a_cell(struct tu_capd *c, const char *why)
{
    char *job = tu_submit(c, "fake", "fake:ok", NULL);
    cr_assert_not_null(job, "%s", why);
    json_t *j = tu_wait_job(c, job, 60);
    cr_assert_not_null(j);
    cr_assert_str_eq(text(json_array_get(json_object_get(j, "cells"), 0), "state"), "ok");
    json_decref(j);
    free(job);
}

Test(diskfull, writes_503_cells_fail_cleanly_and_capd_recovers, .timeout = 240)
{
    char *dir = tu_tmpdir(), why[512];
    tu_sh("chmod 0711 '%s'", dir);
    if (geteuid() != 0 || mount_small_fs(dir, "40m", why, sizeof why)) {
        if (geteuid() != 0)
            snprintf(why, sizeof why, "not root: cannot mount a small tmpfs");
        printf("diskfull: SKIPPED: %s\n", why);
        tu_sh("rm -rf '%s'", dir);
        free(dir);
        cr_skip_test("cannot mount a small file system for the data dir: %s", why);
    }
    struct tu_capd c;
    cr_assert_eq(tu_capd_start(&c, dir, NULL), 0, "capd starts on the tmpfs (see %s)", c.errlog);
    cr_assert_eq(tu_fake_build(&c, "fake", NULL), 201);

    /* 1. Full disk: writes are 503 storage_unavailable with Retry-After,
     * nothing is stored, reads keep working. */
    fill_up(dir, "filler");
    check_503(&c, "POST", "/v1/jobs",
              "{\"project\":\"t\",\"commit\":\"abcdef1\",\"build\":\"fake\",\"matrix\":"
              "{\"models\":[\"fake:ok\"],\"widths\":[\"avx2\"],\"passes\":[\"forward\"]}}");
    check_503(&c, "PUT", "/v1/branches/main", "{\"control_commit\":\"abcdef1\"}");
    long st = 0;
    json_t *j = tu_json(&c, "GET", "/v1/jobs", NULL, &st);
    cr_assert_eq(st, 200, "reads work on a full disk");
    cr_assert_eq(json_array_size(json_object_get(j, "jobs")), 0, "no job was stored");
    json_decref(j);
    json_decref(tu_json(&c, "GET", "/healthz", NULL, &st));
    cr_assert_eq(st, 200);

    /* 2. Room again: the same request works, without a restart. */
    cr_assert_eq(tu_sh("rm -f '%s/data/filler' '%s/data/filler.tail'", dir, dir), 0);
    runs_a_cell(&c, "POST /v1/jobs works once room is made");
    char *job;

    /* 3. The disk fills during ingest: 64 MiB of payloads into about 30 MiB
     * of room. The cell ends failed and says why; capd keeps running. */
    tu_sh("dd if=/dev/zero of='%s/data/filler' bs=1M count=6 2>/dev/null", dir);
    job = tu_submit(&c, "fake", "fake:payload__64", NULL);
    cr_assert_not_null(job);
    j = tu_wait_job(&c, job, 120);
    cr_assert_not_null(j, "the cell ends although the disk is full");
    json_t *cell = json_array_get(json_object_get(j, "cells"), 0);
    cr_assert_str_eq(text(cell, "state"), "failed", "%s", text(cell, "reason"));
    cr_assert(strstr(text(cell, "reason"), "storage unavailable"), "clear reason: %s",
              text(cell, "reason"));
    char cell_id[32];
    snprintf(cell_id, sizeof cell_id, "%s", text(cell, "id"));
    json_decref(j);
    json_decref(tu_json(&c, "GET", "/healthz", NULL, &st));
    cr_assert_eq(st, 200, "capd survived");
    cr_assert_gt(c.pid, 0);
    cr_assert_eq(kill(c.pid, 0), 0, "capd is still running");

    /* The database is consistent, and the failed attempt's records are a
     * prefix of the stream without a hole. */
    sqlite3 *db = open_db(dir, SQLITE_OPEN_READONLY);
    sqlite3_stmt *q = NULL;
    sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &q, NULL);
    cr_assert_eq(sqlite3_step(q), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(q, 0), "ok");
    sqlite3_finalize(q);
    sqlite3_prepare_v2(db,
                       "SELECT count(*), coalesce(max(r.seq), -1), sum(a.partial) FROM records r "
                       "JOIN cells c ON c.committed_attempt = r.attempt_id "
                       "JOIN attempts a ON a.id = r.attempt_id WHERE c.id = ?",
                       -1, &q, NULL);
    sqlite3_bind_text(q, 1, cell_id, -1, SQLITE_STATIC);
    cr_assert_eq(sqlite3_step(q), SQLITE_ROW);
    int64_t n = sqlite3_column_int64(q, 0), max = sqlite3_column_int64(q, 1);
    cr_assert_eq(max, n - 1, "records kept are seq 0..%lld without a hole", (long long)n - 1);
    cr_assert(n == 0 || sqlite3_column_int64(q, 2) == n, "the attempt is marked partial");
    printf("diskfull: the failed cell kept %lld records: %s\n", (long long)n, cell_id);
    sqlite3_finalize(q);
    sqlite3_close(db);
    free(job);

    /* 4. Room again (the filler goes; the payload files of the failed
     * attempt stay until retention sweeps them): capd runs cells again. */
    cr_assert_eq(tu_sh("rm -f '%s/data/filler'", dir), 0);
    runs_a_cell(&c, "a job is accepted again");

    cr_assert_eq(tu_capd_stop(&c), 0, "a clean stop after all that");
    /* Operators see it in the log: the refused writes and the cell. */
    cr_assert_eq(tu_sh("grep -q 'code=storage_unavailable' '%s'", c.errlog), 0, "%s", c.errlog);
    cr_assert_eq(tu_sh("grep -q 'event=cell_store_failed' '%s'", c.errlog), 0, "%s", c.errlog);
    char data[400];
    snprintf(data, sizeof data, "%s/data", dir);
    umount2(data, MNT_DETACH);
    tu_sh("rm -rf '%s'", dir);
    free(dir);
}
