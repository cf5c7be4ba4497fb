/*
 * storage/backup.c - the online backup (store_backup): a consistent copy
 * of the database taken while capd keeps writing, the payload blobs and
 * cell logs that copy names, and the trimming that keeps a backup
 * directory a mirror of one snapshot.
 *
 * A backup reads one snapshot (a WAL reader never blocks the ingest
 * writer) and holds the blob and log locks shared while it copies, so
 * retention (prune.c) deletes nothing it still needs.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/layout.h"
#include "storage/store_int.h"
#include "util/err.h"
#include "util/fs.h"
#include "util/path.h"

/* How long a backup retries while the source is locked (only possible
 * during a checkpoint or a WAL reset, never for long). */
#define BACKUP_BUSY_MS 30000

static void unlink_db(const char *path)
{
    static const char *const sfx[] = {"", "-journal", "-wal", "-shm"};
    char p[PATH_MAX + 64];
    for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++) {
        snprintf(p, sizeof p, "%s%s", path, sfx[i]);
        unlink(p);
    }
}

static int fsync_path(const char *path, int flags)
{
    int fd = open(path, flags | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

/* Copies SRC to DST through a temporary name, so DST is whole or absent. */
static int copy_file(const char *src, const char *dst, int64_t *bytes)
{
    char tmp[PATH_MAX + 16], buf[1 << 16];
    int in = open(src, O_RDONLY | O_CLOEXEC), out = -1, rc = 0;
    if (in < 0)
        return -errno;
    snprintf(tmp, sizeof tmp, "%s.tmp%d", dst, (int)getpid());
    if ((out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640)) < 0) {
        rc = -errno;
        goto out;
    }
    for (;;) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            break;
        }
        if (r == 0)
            break;
        if ((rc = util_write_all(out, buf, (size_t)r)) != 0)
            goto out;
        *bytes += r;
    }
out:
    close(in);
    return util_tmp_finish(out, rc, tmp, dst);
}

/* Step 1 of a backup: the database, as of one commit, to TMP. The copy is
 * taken with sqlite3_backup_step(-1): every page in one call, inside one
 * read transaction on the source. Stepping in chunks would let the ingest
 * writer's commits restart the copy over and over; one step reads a single
 * snapshot while writers carry on (WAL). The copy is then made a plain
 * rollback-journal file (no -wal beside it to lose) and checked. */
static int backup_db(const char *src_path, const char *tmp, struct store_backup_info *info,
                     char **err)
{
    sqlite3 *src = NULL, *dst = NULL;
    sqlite3_backup *b = NULL;
    sqlite3_stmt *st = NULL;
    int rc = -EIO, src_rc = SQLITE_OK;
    if (sqlite3_open_v2(src_path, &src, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK) {
        util_errf(err, rc, "cannot open %s: %s", src_path,
                  src ? sqlite3_errmsg(src) : "out of memory");
        goto out;
    }
    sqlite3_busy_timeout(src, 10000);
    if (sqlite3_open_v2(tmp, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK) {
        util_errf(err, rc, "cannot open %s: %s", tmp, dst ? sqlite3_errmsg(dst) : "out of memory");
        goto out;
    }
    if (!(b = sqlite3_backup_init(dst, "main", src, "main"))) {
        util_errf(err, rc, "cannot start the backup: %s", sqlite3_errmsg(dst));
        goto out;
    }
    for (int waited = 0;; waited += 100) {
        src_rc = sqlite3_backup_step(b, -1);
        if ((src_rc != SQLITE_BUSY && src_rc != SQLITE_LOCKED) || waited >= BACKUP_BUSY_MS)
            break;
        sqlite3_sleep(100);
    }
    int fin_rc = sqlite3_backup_finish(b);
    b = NULL;
    if (src_rc == SQLITE_DONE)
        src_rc = fin_rc;
    if (src_rc != SQLITE_OK) {
        rc = store_rc(NULL, src_rc);
        util_errf(err, rc, "backup failed: %s", sqlite3_errstr(src_rc));
        goto out;
    }
    char *msg = NULL;
    if (sqlite3_exec(dst, "PRAGMA journal_mode=DELETE", NULL, NULL, &msg) != SQLITE_OK) {
        util_errf(err, rc, "cannot finish the copy: %s", msg ? msg : sqlite3_errmsg(dst));
        sqlite3_free(msg);
        goto out;
    }
    if (sqlite3_prepare_v2(dst, "PRAGMA quick_check", -1, &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW ||
        strcmp((const char *)sqlite3_column_text(st, 0), "ok") != 0) {
        util_errf(err, rc, "the copy fails its check: %s",
                  st && sqlite3_column_text(st, 0) ? (const char *)sqlite3_column_text(st, 0)
                                                   : sqlite3_errmsg(dst));
        goto out;
    }
    sqlite3_finalize(st);
    st = NULL;
    if (sqlite3_prepare_v2(dst,
                           "SELECT (SELECT user_version FROM pragma_user_version), "
                           "(SELECT page_size FROM pragma_page_size), "
                           "(SELECT page_count FROM pragma_page_count)",
                           -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW) {
        info->schema_version = sqlite3_column_int(st, 0);
        info->db_bytes = sqlite3_column_int64(st, 1) * sqlite3_column_int64(st, 2);
    }
    rc = 0;
out:
    sqlite3_finalize(st);
    if (b)
        sqlite3_backup_finish(b);
    if (dst && sqlite3_close(dst) != SQLITE_OK && rc == 0) {
        util_errf(err, rc, "cannot close the copy %s", tmp);
        rc = -EIO;
    }
    sqlite3_close(src);
    return rc;
}

/* What the backup steps over the rows of the copy share. */
struct backup_ctx {
    const char *data_dir, *dest;
    struct store_backup_info *info;
};

/* Runs fn on every row of sql over the database copy (read-only); fn
 * returns 0 to go on, or a negative errno with *err set. */
static int for_each_row_of_copy(const char *copy, const char *sql,
                                int (*fn)(sqlite3_stmt *, const struct backup_ctx *, char **),
                                const struct backup_ctx *ctx, char **err)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int rc = -EIO, src;
    if (sqlite3_open_v2(copy, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        util_errf(err, rc, "cannot read the copy %s: %s", copy, db ? sqlite3_errmsg(db) : "?");
        goto out;
    }
    while ((src = sqlite3_step(st)) == SQLITE_ROW)
        if ((rc = fn(st, ctx, err)) != 0)
            goto out;
    rc = src == SQLITE_DONE ? 0 : -EIO;
    if (rc)
        util_errf(err, rc, "cannot read the copy %s: %s", copy, sqlite3_errmsg(db));
out:
    sqlite3_finalize(st);
    sqlite3_close(db);
    return rc;
}

/* Step 2: every blob the copy names, from DATA_DIR/blobs to DEST/blobs.
 * Blobs are immutable and content-addressed, so one already in DEST with
 * the right size is the same blob: backing up into the previous backup
 * copies only what is new. */
static int backup_blob_row(sqlite3_stmt *st, const struct backup_ctx *ctx, char **err)
{
    const char *hash = (const char *)sqlite3_column_text(st, 0);
    int64_t size = sqlite3_column_int64(st, 1);
    char from[PATH_MAX], to[PATH_MAX], dir[PATH_MAX];
    struct stat sb;
    int rc;
    if (!hash || !store__is_blob_name(hash))
        return 0;
    ctx->info->blobs++;
    layout_blob(from, sizeof from, ctx->data_dir, hash);
    layout_blob(to, sizeof to, ctx->dest, hash);
    if (stat(to, &sb) == 0 && sb.st_size == size)
        return 0;
    snprintf(dir, sizeof dir, "%s", to);
    *strrchr(dir, '/') = 0;
    if ((rc = util_mkdir_p(dir, 0750)) != 0)
        return util_errf(err, rc, "cannot create %s: %s", dir, strerror(-rc));
    rc = copy_file(from, to, &ctx->info->blob_bytes_copied);
    if (rc == -ENOENT) {
        ctx->info->blobs_missing++;
        return 0;
    }
    if (rc)
        return util_errf(err, rc, "cannot copy %s: %s", from, strerror(-rc));
    ctx->info->blobs_copied++;
    return 0;
}

static bool same_file_version(const struct stat *a, const struct stat *b)
{
    return a->st_size == b->st_size && a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
           a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Step 3: the finished log of every cell the copy names, DATA/logs/<job>/
 * <cell>.log to DEST/logs/. A cell still running has no finished log yet
 * (its output is in <cell>.log.part; it runs again after a restore), and
 * a job retention pruned has none any more: either way DEST keeps no
 * stale copy. Unlike blobs, a log can change (a cell run again after an
 * interruption rewrites it), so one is copied again when its size or
 * modification time differs; the copy gets the source's times. */
static int backup_log_row(sqlite3_stmt *st, const struct backup_ctx *ctx, char **err)
{
    const char *job = (const char *)sqlite3_column_text(st, 0);
    const char *cell = (const char *)sqlite3_column_text(st, 1);
    char from[PATH_MAX + 160], to[PATH_MAX + 240], dir[PATH_MAX + 80];
    struct stat a, b;
    int rc;
    if (!job || !cell || !store__is_id_name(job) || !store__is_id_name(cell))
        return 0;
    if (layout_cell_log(from, sizeof from, ctx->data_dir, job, cell) != 0 ||
        layout_job_logs(dir, sizeof dir, ctx->dest, job) != 0 ||
        layout_cell_log(to, sizeof to, ctx->dest, job, cell) != 0)
        return 0; /* no such file can exist */
    if (stat(from, &a) != 0 || !S_ISREG(a.st_mode)) {
        unlink(to);
        return 0;
    }
    if (stat(to, &b) == 0 && same_file_version(&a, &b)) {
        ctx->info->logs++;
        return 0;
    }
    if ((rc = util_mkdir_p(dir, 0750)) != 0)
        return util_errf(err, rc, "cannot create %s: %s", dir, strerror(-rc));
    rc = copy_file(from, to, &ctx->info->log_bytes_copied);
    if (rc == -ENOENT) {
        unlink(to);
        return 0;
    }
    if (rc)
        return util_errf(err, rc, "cannot copy %s: %s", from, strerror(-rc));
    struct timespec times[2] = {a.st_atim, a.st_mtim};
    utimensat(AT_FDCWD, to, times, 0);
    ctx->info->logs++;
    ctx->info->logs_copied++;
    return 0;
}

/* Whether the file NAME of the directory DIR in a sweep stays, asked of
 * the new copy through the sweep's prepared statement ST. */
typedef bool (*sweep_keep_fn)(sqlite3_stmt *st, const char *dir, const char *name);

/* One of the trims below: which directory of DEST, the question it asks
 * of the new copy, which of its subdirectories it walks, and whether a
 * subdirectory it empties goes too. */
struct sweep {
    const char *sub;
    const char *sql;
    bool (*dir_ok)(const char *name);
    sweep_keep_fn keep;
    bool rmdir_empty;
};

/* Walks DEST/W->sub/DIR/FILE, removing every file W->keep does not keep.
 * Nothing is removed when the copy cannot be opened or asked. */
static void backup_sweep(const char *dest, const struct sweep *w)
{
    char path[PATH_MAX + 16], top_path[PATH_MAX + 16];
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    layout_dir(path, sizeof path, dest, "capd.db");
    layout_dir(top_path, sizeof top_path, dest, w->sub);
    DIR *top = opendir(top_path);
    if (!top)
        return;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, w->sql, -1, &st, NULL) != SQLITE_OK)
        goto out;
    struct dirent *d;
    while ((d = readdir(top)) != NULL) {
        char sub[UTIL_PATH_MAX];
        if (d->d_name[0] == '.' || !w->dir_ok(d->d_name) ||
            util_path_join(sub, top_path, d->d_name) != 0)
            continue;
        DIR *in = opendir(sub);
        struct dirent *f;
        while (in && (f = readdir(in)) != NULL) {
            char file[UTIL_PATH_MAX];
            sqlite3_reset(st);
            if (!w->keep(st, d->d_name, f->d_name) && util_path_join(file, sub, f->d_name) == 0)
                unlink(file);
        }
        if (in)
            closedir(in);
        if (w->rmdir_empty)
            rmdir(sub); /* only when empty */
    }
out:
    sqlite3_finalize(st);
    sqlite3_close(db);
    closedir(top);
}

static bool is_blob_dir(const char *name)
{
    return strlen(name) == 2;
}

/* A blob stays while the copy names it; a temporary left by a crash goes. */
static bool keep_blob(sqlite3_stmt *st, const char *dir, const char *name)
{
    (void)dir;
    if (name[0] == '.')
        return true;
    if (!store__is_blob_name(name))
        return false;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    return sqlite3_step(st) != SQLITE_DONE;
}

/* A file under logs/JOB stays when it is JOB's CELL.log of a cell the copy
 * names. */
static bool keep_log(sqlite3_stmt *st, const char *job, const char *name)
{
    char cell[300];
    size_t n = strlen(name);
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return true;
    if (!(n > 4 && n - 4 < sizeof cell && strcmp(name + n - 4, ".log") == 0))
        return false;
    snprintf(cell, sizeof cell, "%.*s", (int)(n - 4), name);
    sqlite3_bind_text(st, 1, job, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, cell, -1, SQLITE_STATIC);
    return sqlite3_step(st) == SQLITE_ROW;
}

/* Step 4: blobs left in DEST by an earlier backup that the new copy no
 * longer names (retention dropped them) go, so DEST mirrors one snapshot. */
static const struct sweep trim_blobs = {
    .sub = "blobs",
    .sql = "SELECT 1 FROM blobs WHERE hash = ?",
    .dir_ok = is_blob_dir,
    .keep = keep_blob,
};

/* Step 5: files under DEST/logs that are not the log of a cell the new
 * copy names (an earlier backup's, or a temporary left by a crash) go,
 * and so do the directories that leaves empty. */
static const struct sweep trim_logs = {
    .sub = "logs",
    .sql = "SELECT 1 FROM cells c JOIN jobs j ON j.seq = c.job_seq WHERE j.id = ?1 AND c.id = ?2",
    .dir_ok = store__is_id_name,
    .keep = keep_log,
    .rmdir_empty = true,
};

/*
 * Checks where a backup of DATA_DIR may go: SRC_PATH gets DATA_DIR's
 * database, DEST is created when needed and resolved into DEST_REAL.
 * Copying the data dir into itself (or over itself) is refused, and so is
 * a non-empty DEST that holds no capd.db (it is not an earlier backup).
 */
static int backup_check_dest(const char *data_dir, const char *dest, char src_path[PATH_MAX],
                             char dest_real[PATH_MAX], char **err)
{
    char data_real[PATH_MAX], final[PATH_MAX + 16];
    struct stat sb;
    int rc;
    if ((size_t)snprintf(src_path, PATH_MAX, "%s/capd.db", data_dir) >= PATH_MAX)
        return -ENAMETOOLONG;
    if (stat(src_path, &sb) != 0 || !realpath(data_dir, data_real)) {
        rc = -errno;
        return util_errf(err, rc, "no database at %s: %s", src_path, strerror(-rc));
    }
    if ((rc = util_mkdir_p(dest, 0750)) != 0 || !realpath(dest, dest_real)) {
        rc = rc ? rc : -errno;
        return util_errf(err, rc, "cannot use %s as the backup directory: %s", dest, strerror(-rc));
    }
    size_t dl = strlen(data_real);
    if (strcmp(dest_real, data_real) == 0 ||
        (strncmp(dest_real, data_real, dl) == 0 && dest_real[dl] == '/'))
        return util_errf(err, -EINVAL, "the backup directory %s is inside the data dir %s", dest,
                         data_real);
    snprintf(final, sizeof final, "%s/capd.db", dest_real);
    if (stat(final, &sb) == 0)
        return 0;
    DIR *d = opendir(dest_real);
    struct dirent *e;
    bool empty = true;
    while (d && (e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            empty = false;
    if (d)
        closedir(d);
    if (!empty)
        return util_errf(err, -ENOTEMPTY, "%s is neither empty nor a capd backup (no capd.db)",
                         dest);
    return 0;
}

/*
 * A backup is a data dir: DEST/capd.db, DEST/blobs/ and DEST/logs/. The
 * blob and log locks are held shared from before the database snapshot
 * until every blob and log it names is copied, so retention cannot delete
 * one in between. The new capd.db is renamed into place only after its
 * blobs are on disk (syncfs), so at every moment DEST's database names
 * only blobs DEST has.
 */
int store_backup(const char *data_dir, const char *dest, struct store_backup_info *info, char **err)
{
    char src_path[PATH_MAX], dest_real[PATH_MAX];
    char tmp[PATH_MAX + 32], final[PATH_MAX + 16];
    bool tmp_made = false;
    int lock = -1, log_lock = -1, rc;
    if (err)
        *err = NULL;
    memset(info, 0, sizeof *info);
    if ((rc = backup_check_dest(data_dir, dest, src_path, dest_real, err)) != 0)
        return rc;
    snprintf(final, sizeof final, "%s/capd.db", dest_real);
    lock = store__dir_lock(data_dir, "blobs", LOCK_SH);
    if (lock < 0 && lock != -ENOENT) {
        rc = lock;
        return util_errf(err, rc, "cannot lock %s/blobs: %s", data_dir, strerror(-rc));
    }
    log_lock = store__dir_lock(data_dir, "logs", LOCK_SH);
    if (log_lock < 0 && log_lock != -ENOENT) {
        rc = log_lock;
        util_errf(err, rc, "cannot lock %s/logs: %s", data_dir, strerror(-rc));
        goto out;
    }
    snprintf(tmp, sizeof tmp, "%s/capd.db.tmp-XXXXXX", dest_real);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        util_errf(err, rc, "cannot create a file in %s: %s", dest, strerror(-rc));
        goto out;
    }
    close(fd);
    tmp_made = true;
    const struct backup_ctx ctx = {data_dir, dest_real, info};
    if ((rc = backup_db(src_path, tmp, info, err)) != 0 ||
        (rc = for_each_row_of_copy(tmp, "SELECT hash, stored_size FROM blobs", backup_blob_row,
                                   &ctx, err)) != 0 ||
        (rc = for_each_row_of_copy(
             tmp, "SELECT j.id, c.id FROM cells c JOIN jobs j ON j.seq = c.job_seq", backup_log_row,
             &ctx, err)) != 0)
        goto out;
    store__dir_unlock(lock);
    store__dir_unlock(log_lock);
    lock = log_lock = -1;
    /* Every copied file and the database reach the disk before the
     * rename makes the new database the backup's. */
    if ((fd = open(dest_real, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
        syncfs(fd);
        close(fd);
    }
    if (rename(tmp, final) != 0) {
        rc = -errno;
        util_errf(err, rc, "cannot put the copy in place at %s: %s", final, strerror(-rc));
        goto out;
    }
    tmp_made = false;
    fsync_path(dest_real, O_RDONLY | O_DIRECTORY);
    backup_sweep(dest_real, &trim_blobs);
    backup_sweep(dest_real, &trim_logs);
    snprintf(info->path, sizeof info->path, "%s", dest_real);
    rc = 0;
out:
    store__dir_unlock(lock);
    store__dir_unlock(log_lock);
    if (tmp_made)
        unlink_db(tmp);
    return rc;
}
