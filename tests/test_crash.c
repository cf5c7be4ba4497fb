/*
 * tests/test_crash.c - scripted kill -9 during ingest: 20 rounds of a
 * random (seeded) delay, SIGKILL to capd while cells stream records and a
 * client keeps posting jobs, a restart on the same data dir, and checks of
 * the database after each round, read directly from the SQLite file
 * (read-only): integrity, no job lost, no record duplicated or missing
 * within an attempt, interrupted attempts discarded and their cells
 * re-queued. At the end capd is left running until every cell is in a
 * terminal state. Set CAPD_CRASH_SEED to replay a run; the seed is printed.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers/common/testutil.h"

#define ROUNDS        20
#define MAX_JOBS      64
#define TRICKLE_N     1200
#define CELLS_PER_JOB 2

/* The client that posts jobs while capd is being killed: every id it got a
 * 201 for must be in the database after the next restart. */
struct poster {
    pthread_mutex_t mu;
    struct tu_capd c; /* current capd (port changes on every restart) */
    bool up, stop;
    unsigned seed;
    int njobs, posts, refused;
    char jobs[MAX_JOBS][16];
};

static bool post_job(struct tu_capd *c, char id[16])
{
    long st = 0;
    json_t *j = tu_jsonf(c, "POST", "/v1/jobs", &st,
                         "{\"project\":\"crash\",\"commit\":\"abcdef1\",\"build\":\"fake\","
                         "\"matrix\":{\"models\":[\"fake:trickle__%d\",\"fake:trickle__%d\"],"
                         "\"widths\":[\"avx2\"],\"passes\":[\"forward\"]}}",
                         TRICKLE_N, TRICKLE_N / 2);
    const char *v = json_string_value(json_object_get(j, "id"));
    bool ok = st == 201 && v && strlen(v) < 16;
    if (ok)
        snprintf(id, 16, "%s", v);
    json_decref(j);
    return ok;
}

static void *poster_main(void *arg)
{
    struct poster *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        bool stop = p->stop, up = p->up, full = p->njobs >= MAX_JOBS;
        struct tu_capd c = p->c;
        unsigned delay = 60 + (unsigned)rand_r(&p->seed) % 240;
        pthread_mutex_unlock(&p->mu);
        if (stop)
            break;
        if (up && !full) {
            char id[16];
            bool ok = post_job(&c, id);
            pthread_mutex_lock(&p->mu);
            p->posts++;
            if (ok && p->njobs < MAX_JOBS)
                snprintf(p->jobs[p->njobs++], 16, "%s", id);
            else if (!ok)
                p->refused++;
            pthread_mutex_unlock(&p->mu);
        }
        usleep(delay * 1000);
    }
    return NULL;
}

static sqlite3 *open_ro(const char *dir)
{
    char path[400];
    snprintf(path, sizeof path, "%s/data/capd.db", dir);
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK, "open %s",
                 path);
    sqlite3_busy_timeout(db, 10000);
    return db;
}

static int64_t q_int(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql,
                 sqlite3_errmsg(db));
    int rc = sqlite3_step(st);
    cr_assert_eq(rc, SQLITE_ROW, "%s: %s", sql, sqlite3_errmsg(db));
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

/* The invariants that hold at any moment, capd dead or alive: the file is
 * sound, every job that got a 201 exists with its cells, and within each
 * attempt records are seq 0..n-1 with no key twice. */
static void check_db(const char *dir, struct poster *p, int round)
{
    sqlite3 *db = open_ro(dir);
    sqlite3_stmt *st = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "ok", "round %d: integrity_check",
                     round);
    sqlite3_finalize(st);

    pthread_mutex_lock(&p->mu);
    cr_assert_eq(sqlite3_prepare_v2(db,
                                    "SELECT count(*) FROM cells c JOIN jobs j ON "
                                    "c.job_seq = j.seq WHERE j.id = ?",
                                    -1, &st, NULL),
                 SQLITE_OK);
    for (int i = 0; i < p->njobs; i++) {
        sqlite3_bind_text(st, 1, p->jobs[i], -1, SQLITE_STATIC);
        cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
        cr_assert_eq(sqlite3_column_int(st, 0), CELLS_PER_JOB,
                     "round %d: job %s (201 before the kill) is there with its cells", round,
                     p->jobs[i]);
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&p->mu);

    /* No duplicate and no gap: per attempt, seq runs 0..n-1 and tensor keys
     * are distinct. */
    cr_assert_eq(q_int(db, "SELECT count(*) FROM (SELECT attempt_id FROM records GROUP BY "
                           "attempt_id HAVING min(seq) != 0 OR max(seq) != count(*) - 1)"),
                 0, "round %d: records of every attempt are seq 0..n-1", round);
    cr_assert_eq(q_int(db, "SELECT count(*) FROM (SELECT attempt_id FROM records WHERE "
                           "kind = 'tensor' GROUP BY attempt_id HAVING count(*) != "
                           "count(DISTINCT key))"),
                 0, "round %d: no tensor key twice in an attempt", round);
    /* A committed ok attempt holds the whole stream, exactly once. */
    cr_assert_eq(q_int(db, "SELECT count(*) FROM cells c WHERE c.state = 'ok' AND "
                           "(SELECT count(*) FROM records r WHERE r.attempt_id = "
                           "c.committed_attempt AND r.kind = 'tensor') != "
                           "CAST(substr(c.model, 15) AS INTEGER)"),
                 0, "round %d: ok cells have every tensor once", round);
    /* Nothing but the open attempt of a running cell is uncommitted. */
    cr_assert_eq(q_int(db, "SELECT count(*) FROM records r JOIN attempts a ON a.id = "
                           "r.attempt_id WHERE a.state = 'discarded'"),
                 0, "round %d: discarded attempts have no records", round);
    sqlite3_close(db);
}

/* Attempts open at the kill, and how many records they had written. */
static int64_t *open_attempts(const char *dir, int *n, int64_t *records)
{
    sqlite3 *db = open_ro(dir);
    *records = q_int(db, "SELECT count(*) FROM records r JOIN attempts a ON a.id = r.attempt_id "
                         "WHERE a.state = 'open'");
    sqlite3_stmt *st = NULL;
    int64_t *ids = calloc(256, sizeof *ids);
    *n = 0;
    sqlite3_prepare_v2(db, "SELECT id FROM attempts WHERE state = 'open'", -1, &st, NULL);
    while (sqlite3_step(st) == SQLITE_ROW && *n < 256)
        ids[(*n)++] = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return ids;
}

Test(crash, kill9_twenty_rounds_during_ingest, .timeout = 600)
{
    const char *env_seed = getenv("CAPD_CRASH_SEED");
    unsigned seed = env_seed ? (unsigned)strtoul(env_seed, NULL, 10) : (unsigned)time(NULL);
    printf("crash: seed %u (CAPD_CRASH_SEED=%u replays it)\n", seed, seed);
    fflush(stdout);
    cr_log_info("crash: seed %u", seed);

    char *dir = tu_tmpdir();
    char cfg[400];
    snprintf(cfg, sizeof cfg, "%s/capd.json", dir);
    FILE *f = fopen(cfg, "w");
    /* Enough attempts that most cells survive being killed a few times;
     * those that do not end interrupted, which is terminal too. */
    fprintf(f, "{\"max_attempts\": 6, \"kill_grace_ms\": 200}\n");
    fclose(f);
    const char *extra[] = {"--config", cfg, NULL};

    struct poster p;
    memset(&p, 0, sizeof p);
    pthread_mutex_init(&p.mu, NULL);
    p.seed = seed ^ 0x9e3779b9u;
    struct tu_capd c;
    cr_assert_eq(tu_capd_start(&c, dir, extra), 0, "capd starts");
    cr_assert_eq(tu_fake_build(&c, "fake", NULL), 201);
    /* A queue that never runs dry during the rounds. */
    for (int i = 0; i < 4; i++) {
        cr_assert(post_job(&c, p.jobs[p.njobs]));
        p.njobs++;
    }
    p.c = c;
    p.up = true;
    pthread_t th;
    pthread_create(&th, NULL, poster_main, &p);

    int requeued_total = 0;
    int64_t inflight_total = 0;
    for (int round = 1; round <= ROUNDS; round++) {
        unsigned delay = 150 + (unsigned)rand_r(&seed) % 650;
        usleep(delay * 1000);
        int64_t running = 0;
        {
            sqlite3 *db = open_ro(dir);
            running = q_int(db, "SELECT count(*) FROM cells WHERE state = 'running'");
            sqlite3_close(db);
        }
        tu_capd_kill9(&c);
        pthread_mutex_lock(&p.mu);
        p.up = false;
        pthread_mutex_unlock(&p.mu);

        check_db(dir, &p, round);
        int nopen = 0;
        int64_t inflight = 0;
        int64_t *open = open_attempts(dir, &nopen, &inflight);
        inflight_total += inflight;

        cr_assert_eq(tu_capd_start(&c, dir, extra), 0, "round %d: capd restarts (see %s)", round,
                     c.errlog);
        pthread_mutex_lock(&p.mu);
        p.c = c;
        p.up = true;
        pthread_mutex_unlock(&p.mu);

        /* Recovery ran before capd listened: the attempts that were open
         * at the kill are discarded with their records, and their cells
         * went back to the queue (or ended interrupted past max_attempts),
         * never stayed running on a dead attempt. */
        sqlite3 *db = open_ro(dir);
        for (int i = 0; i < nopen; i++) {
            char sql[512];
            snprintf(sql, sizeof sql, "SELECT state = 'discarded' FROM attempts WHERE id = %lld",
                     (long long)open[i]);
            cr_assert_eq(q_int(db, sql), 1, "round %d: open attempt %lld discarded", round,
                         (long long)open[i]);
            snprintf(sql, sizeof sql,
                     "SELECT count(*) FROM cells c JOIN attempts a ON a.cell_seq = c.seq "
                     "WHERE a.id = %lld AND (c.state IN ('queued', 'interrupted') OR "
                     "(c.state IN ('running', 'ok') AND c.attempts > a.n))",
                     (long long)open[i]);
            cr_assert_eq(q_int(db, sql), 1,
                         "round %d: the cell of attempt %lld is re-queued or interrupted", round,
                         (long long)open[i]);
        }
        sqlite3_close(db);
        requeued_total += nopen;
        printf("crash: round %2d: killed after %3u ms, %lld running, %d attempts discarded "
               "(%lld records written), %d jobs posted\n",
               round, delay, (long long)running, nopen, (long long)inflight, p.njobs);
        fflush(stdout);
        free(open);
    }

    pthread_mutex_lock(&p.mu);
    p.stop = true;
    pthread_mutex_unlock(&p.mu);
    pthread_join(th, NULL);
    cr_assert_gt(requeued_total, 0, "some kills hit running cells");
    cr_assert_gt(inflight_total, 0, "some kills hit cells mid-ingest");

    /* Left running, capd finishes every job: each cell ends terminal. */
    for (int i = 0; i < p.njobs; i++) {
        json_t *j = tu_wait_job(&c, p.jobs[i], 240);
        cr_assert_not_null(j, "job %s finishes", p.jobs[i]);
        json_t *cells = json_object_get(j, "cells");
        cr_assert_eq(json_array_size(cells), CELLS_PER_JOB);
        for (size_t k = 0; k < json_array_size(cells); k++) {
            const char *st = json_string_value(json_object_get(json_array_get(cells, k), "state"));
            cr_assert(st && (strcmp(st, "ok") == 0 || strcmp(st, "interrupted") == 0),
                      "job %s cell %zu ends ok or interrupted, not %s", p.jobs[i], k,
                      st ? st : "?");
        }
        json_decref(j);
    }
    /* A POST that capd committed just before a kill never got its 201, so
     * the client counted it refused; capd runs it all the same. Such jobs
     * must finish too before nothing may be left queued or running. */
    sqlite3 *db = open_ro(dir);
    sqlite3_stmt *st = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, "SELECT id FROM jobs", -1, &st, NULL), SQLITE_OK);
    int unacked = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *id = (const char *)sqlite3_column_text(st, 0);
        bool known = false;
        for (int i = 0; i < p.njobs && !known; i++)
            known = strcmp(p.jobs[i], id) == 0;
        if (known)
            continue;
        unacked++;
        json_t *j = tu_wait_job(&c, id, 240);
        cr_assert_not_null(j, "job %s (committed, its 201 lost to a kill) finishes", id);
        json_decref(j);
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    cr_assert_leq(unacked, p.refused, "only refused POSTs can be unknown to the client");
    check_db(dir, &p, ROUNDS + 1);
    db = open_ro(dir);
    int64_t ok = q_int(db, "SELECT count(*) FROM cells WHERE state = 'ok'");
    int64_t intr = q_int(db, "SELECT count(*) FROM cells WHERE state = 'interrupted'");
    int64_t left = q_int(db, "SELECT count(*) FROM cells WHERE state IN ('queued', 'running')");
    sqlite3_close(db);
    cr_assert_eq(left, 0, "no cell left queued or running");
    printf("crash: %d jobs (%d posts, %d refused while capd was down, %d of them committed "
           "before the kill), cells ok %lld, interrupted %lld, attempts discarded %d\n",
           p.njobs, p.posts, p.refused, unacked, (long long)ok, (long long)intr, requeued_total);
    cr_assert_eq(tu_capd_stop(&c), 0);
    tu_sh("rm -rf '%s'", dir);
    free(dir);
}
