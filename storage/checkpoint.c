/*
 * storage/checkpoint.c - WAL checkpoints off the committing threads: the
 * background checkpointer (its thread and connection) and the WAL hooks
 * that wake it, or that checkpoint inline when the process runs none.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "storage/layout.h"
#include "storage/store_int.h"

/* WAL pages after a commit that start a background checkpoint (8 KiB
 * pages: 8 MiB). Early, so that the WAL is copied while the loop does
 * other work and restarts between two bursts of ingest: a burst that
 * starts on a WAL already near a threshold is the one that pays for it. */
#define STORE_CHECKPOINT_PAGES 1024
/* WAL pages past which the writer finishes a checkpoint itself (256 MiB):
 * the bound on the WAL during one unbroken stream of commits. Only a
 * stream longer than that pays for a checkpoint on the loop thread
 * (copying, and two fsyncs that stall every cell's ingest meanwhile). */
#define STORE_CHECKPOINT_INLINE_PAGES 32768

struct store_ckpt {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool want, stop;
    sqlite3 *db; /* the checkpointer's own connection, used by its thread only */
};

/* The process's background checkpointer, when the daemon runs one: every
 * other connection of the process (HTTP threads, the event hub) hands its
 * checkpoints to it rather than running them inside a request. */
static pthread_mutex_t g_ckpt_mu = PTHREAD_MUTEX_INITIALIZER;
static struct store_ckpt *g_ckpt;

static void ckpt_wake(struct store_ckpt *c)
{
    pthread_mutex_lock(&c->mu);
    c->want = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/*
 * sqlite3_wal_hook of every connection but the writer's (which has
 * ckpt_hook): wakes the background checkpointer, so a POST that happens
 * to follow a large ingest does not copy the whole WAL, fsyncs included,
 * before it can answer. Without a checkpointer (capd db, capd token),
 * the connection checkpoints itself as SQLite's autocheckpoint would.
 */
static int conn_hook(void *arg, sqlite3 *db, const char *name, int pages)
{
    (void)arg;
    if (pages < STORE_CHECKPOINT_PAGES)
        return SQLITE_OK;
    pthread_mutex_lock(&g_ckpt_mu);
    struct store_ckpt *c = g_ckpt;
    if (c)
        ckpt_wake(c);
    pthread_mutex_unlock(&g_ckpt_mu);
    if (!c)
        sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
    return SQLITE_OK;
}

/* Every connection starts with conn_hook; store_checkpoint_in_background
 * gives the writer's ckpt_hook instead. */
void store__checkpoint_attach(struct store *s)
{
    sqlite3_wal_hook(s->db, conn_hook, NULL);
}

static void *ckpt_main(void *arg)
{
    struct store_ckpt *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->want && !c->stop)
            pthread_cond_wait(&c->cv, &c->mu);
        if (c->stop)
            break;
        c->want = false;
        pthread_mutex_unlock(&c->mu);
        /* Passive: copies what no reader still needs and never waits;
         * the writer restarts the WAL once all of it was copied. */
        sqlite3_wal_checkpoint_v2(c->db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/*
 * sqlite3_wal_hook: runs on the committing thread after each commit. A
 * checkpoint running beside a stream of commits never copies the newest
 * ones, so the WAL could not restart and would grow as long as ingest
 * lasts; past STORE_CHECKPOINT_INLINE_PAGES the writer copies the rest
 * itself, between two of its commits (little is left by then), which lets
 * its next transaction restart the WAL. A passive checkpoint never waits:
 * when the thread is busy copying, the next commit tries again.
 */
static int ckpt_hook(void *arg, sqlite3 *db, const char *name, int pages)
{
    struct store_ckpt *c = arg;
    if (pages >= STORE_CHECKPOINT_INLINE_PAGES) {
        sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        return SQLITE_OK;
    }
    if (pages >= STORE_CHECKPOINT_PAGES)
        ckpt_wake(c);
    return SQLITE_OK;
}

int store_checkpoint_in_background(struct store *s)
{
    char path[LAYOUT_PATH_MAX];
    if (layout_dir(path, sizeof path, s->data_dir, "capd.db") != 0)
        return -ENAMETOOLONG;
    struct store_ckpt *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    if (sqlite3_open_v2(path, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK) {
        sqlite3_close(c->db);
        free(c);
        return -EIO;
    }
    sqlite3_busy_timeout(c->db, 10000);
    /* A connection learns that the database is in WAL mode when it first
     * reads it; until then sqlite3_wal_checkpoint_v2() succeeds and does
     * nothing at all (log and checkpointed frames -1). */
    if (sqlite3_exec(c->db, "SELECT count(*) FROM sqlite_master", NULL, NULL, NULL) != SQLITE_OK) {
        sqlite3_close(c->db);
        free(c);
        return -EIO;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (pthread_create(&c->thread, NULL, ckpt_main, c) != 0) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        sqlite3_close(c->db);
        free(c);
        return -EAGAIN;
    }
    /* Replaces the inline autocheckpoint (itself a WAL hook). */
    sqlite3_wal_hook(s->db, ckpt_hook, c);
    s->ckpt = c;
    pthread_mutex_lock(&g_ckpt_mu);
    g_ckpt = c;
    pthread_mutex_unlock(&g_ckpt_mu);
    return 0;
}

void store__checkpoint_stop(struct store *s)
{
    struct store_ckpt *c = s->ckpt;
    if (!c)
        return;
    pthread_mutex_lock(&g_ckpt_mu);
    if (g_ckpt == c)
        g_ckpt = NULL;
    pthread_mutex_unlock(&g_ckpt_mu);
    sqlite3_wal_hook(s->db, NULL, NULL);
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    sqlite3_close(c->db);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
    s->ckpt = NULL;
}
