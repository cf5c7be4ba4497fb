/*
 * storage/maint.c - database care: online backup, vacuum and retention.
 *
 * All three are safe while capd runs. Backup and retention also cover the
 * per-cell logs under DATA/logs. A backup reads one consistent
 * snapshot (a WAL reader never blocks the ingest writer); retention works
 * in short write transactions so the ingest writer never waits long; a
 * vacuum holds the write lock for its whole run, which is why `capd db
 * vacuum` refuses while cells run unless forced.
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

#include "storage/store_int.h"

/* A prune transaction is committed after this many detached records (the
 * ingest batch size) or this many jobs, so the ingest writer, which waits
 * at most its busy timeout for the write lock, never waits on a long one. */
#define PRUNE_TXN_RECORDS 20000
#define PRUNE_TXN_JOBS    64

/* How long a backup retries while the source is locked (only possible
 * during a checkpoint or a WAL reset, never for long). */
#define BACKUP_BUSY_MS 30000

/* Error messages name at most two strings. */
static void set_err(char **err, const char *fmt, const char *a, const char *b)
{
    if (err && asprintf(err, fmt, a, b) < 0)
        *err = NULL;
}

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

/* The payload file of HASH under DATA_DIR; store_blob_path (records.c)
 * owns the layout and needs only the data dir. */
static void blob_path_in(const char *data_dir, const char *hash, char *out, size_t n)
{
    struct store tmp;
    memset(&tmp, 0, sizeof tmp);
    snprintf(tmp.data_dir, sizeof tmp.data_dir, "%.*s", (int)sizeof tmp.data_dir - 1, data_dir);
    store_blob_path(&tmp, hash, out, n);
}

/* A blob file name: 'x' and 32 hex digits (XXH3-128, records.c). */
static bool is_blob_name(const char *n)
{
    if (n[0] != 'x' || strlen(n) != 33)
        return false;
    for (int i = 1; i < 33; i++)
        if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f')))
            return false;
    return true;
}

/*
 * Blob files are deleted only under an exclusive flock(2) on DATA/blobs,
 * taken without waiting; a backup holds it shared from before its
 * database snapshot until every file that snapshot names is copied. A
 * deletion that finds it held is left for a later run (the file is then
 * an orphan, which the next sweep removes). Cell logs under DATA/logs
 * follow the same rule with a lock on that directory.
 */
static int dir_lock(const char *data_dir, const char *sub, int how)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", data_dir, sub);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    while (flock(fd, how) != 0) {
        if (errno == EINTR)
            continue;
        int e = errno;
        close(fd);
        return e == EWOULDBLOCK ? -EAGAIN : -e;
    }
    return fd;
}

static int blob_lock(const char *data_dir, int how)
{
    return dir_lock(data_dir, "blobs", how);
}

static void blob_unlock(int fd)
{
    if (fd >= 0)
        close(fd); /* releases the flock */
}

static int mkdir_p(const char *path, mode_t mode)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    for (char *c = p + 1; *c; c++) {
        if (*c != '/')
            continue;
        *c = 0;
        if (mkdir(p, mode) != 0 && errno != EEXIST)
            return -errno;
        *c = '/';
    }
    if (mkdir(p, mode) != 0 && errno != EEXIST)
        return -errno;
    return 0;
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
        for (ssize_t off = 0; off < r;) {
            ssize_t w = write(out, buf + off, (size_t)(r - off));
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                rc = w < 0 ? -errno : -EIO;
                goto out;
            }
            off += w;
            *bytes += w;
        }
    }
out:
    close(in);
    if (out >= 0 && close(out) != 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, dst) != 0)
        rc = -errno;
    if (rc)
        unlink(tmp);
    return rc;
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
        set_err(err, "cannot open %s: %s", src_path, src ? sqlite3_errmsg(src) : "out of memory");
        goto out;
    }
    sqlite3_busy_timeout(src, 10000);
    if (sqlite3_open_v2(tmp, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK) {
        set_err(err, "cannot open %s: %s", tmp, dst ? sqlite3_errmsg(dst) : "out of memory");
        goto out;
    }
    if (!(b = sqlite3_backup_init(dst, "main", src, "main"))) {
        set_err(err, "cannot start the backup: %s%s", sqlite3_errmsg(dst), "");
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
        set_err(err, "backup failed: %s%s", sqlite3_errstr(src_rc), "");
        goto out;
    }
    char *msg = NULL;
    if (sqlite3_exec(dst, "PRAGMA journal_mode=DELETE", NULL, NULL, &msg) != SQLITE_OK) {
        set_err(err, "cannot finish the copy: %s%s", msg ? msg : sqlite3_errmsg(dst), "");
        sqlite3_free(msg);
        goto out;
    }
    if (sqlite3_prepare_v2(dst, "PRAGMA quick_check", -1, &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW ||
        strcmp((const char *)sqlite3_column_text(st, 0), "ok") != 0) {
        set_err(err, "the copy fails its check: %s%s",
                st && sqlite3_column_text(st, 0) ? (const char *)sqlite3_column_text(st, 0)
                                                 : sqlite3_errmsg(dst),
                "");
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
        set_err(err, "cannot close the copy %s%s", tmp, "");
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
        set_err(err, "cannot read the copy %s: %s", copy, db ? sqlite3_errmsg(db) : "?");
        goto out;
    }
    while ((src = sqlite3_step(st)) == SQLITE_ROW)
        if ((rc = fn(st, ctx, err)) != 0)
            goto out;
    rc = src == SQLITE_DONE ? 0 : -EIO;
    if (rc)
        set_err(err, "cannot read the copy %s: %s", copy, sqlite3_errmsg(db));
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
    if (!hash || !is_blob_name(hash))
        return 0;
    ctx->info->blobs++;
    blob_path_in(ctx->data_dir, hash, from, sizeof from);
    blob_path_in(ctx->dest, hash, to, sizeof to);
    if (stat(to, &sb) == 0 && sb.st_size == size)
        return 0;
    snprintf(dir, sizeof dir, "%s", to);
    *strrchr(dir, '/') = 0;
    if ((rc = mkdir_p(dir, 0750)) != 0) {
        set_err(err, "cannot create %s: %s", dir, strerror(-rc));
        return rc;
    }
    rc = copy_file(from, to, &ctx->info->blob_bytes_copied);
    if (rc == -ENOENT) {
        ctx->info->blobs_missing++;
        return 0;
    }
    if (rc) {
        set_err(err, "cannot copy %s: %s", from, strerror(-rc));
        return rc;
    }
    ctx->info->blobs_copied++;
    return 0;
}

/* A job or cell id as it may appear in a path under DATA/logs: capd's ids
 * are letters and digits; anything else (a dot, a slash) is not ours. */
static bool is_id_name(const char *n)
{
    if (!*n || strlen(n) > 64)
        return false;
    for (; *n; n++)
        if (!((*n >= '0' && *n <= '9') || (*n >= 'a' && *n <= 'z') || (*n >= 'A' && *n <= 'Z') ||
              *n == '-' || *n == '_'))
            return false;
    return true;
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
    if (!job || !cell || !is_id_name(job) || !is_id_name(cell))
        return 0;
    snprintf(from, sizeof from, "%s/logs/%s/%s.log", ctx->data_dir, job, cell);
    snprintf(dir, sizeof dir, "%s/logs/%s", ctx->dest, job);
    snprintf(to, sizeof to, "%s/%s.log", dir, cell);
    if (stat(from, &a) != 0 || !S_ISREG(a.st_mode)) {
        unlink(to);
        return 0;
    }
    if (stat(to, &b) == 0 && same_file_version(&a, &b)) {
        ctx->info->logs++;
        return 0;
    }
    if ((rc = mkdir_p(dir, 0750)) != 0) {
        set_err(err, "cannot create %s: %s", dir, strerror(-rc));
        return rc;
    }
    rc = copy_file(from, to, &ctx->info->log_bytes_copied);
    if (rc == -ENOENT) {
        unlink(to);
        return 0;
    }
    if (rc) {
        set_err(err, "cannot copy %s: %s", from, strerror(-rc));
        return rc;
    }
    struct timespec times[2] = {a.st_atim, a.st_mtim};
    utimensat(AT_FDCWD, to, times, 0);
    ctx->info->logs++;
    ctx->info->logs_copied++;
    return 0;
}

/* Step 5: files under DEST/logs that are not the log of a cell the new
 * copy names (an earlier backup's, or a temporary left by a crash) go,
 * and so do the directories that leaves empty. */
static void backup_trim_logs(const char *dest)
{
    char path[PATH_MAX + 16], logs[PATH_MAX + 16];
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    snprintf(path, sizeof path, "%s/capd.db", dest);
    snprintf(logs, sizeof logs, "%s/logs", dest);
    DIR *top = opendir(logs);
    if (!top)
        return;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           "SELECT 1 FROM cells c JOIN jobs j ON j.seq = c.job_seq "
                           "WHERE j.id = ?1 AND c.id = ?2",
                           -1, &st, NULL) != SQLITE_OK)
        goto out;
    struct dirent *d;
    while ((d = readdir(top)) != NULL) {
        char sub[PATH_MAX + 300];
        if (d->d_name[0] == '.' || !is_id_name(d->d_name))
            continue;
        snprintf(sub, sizeof sub, "%s/%s", logs, d->d_name);
        DIR *in = opendir(sub);
        struct dirent *f;
        while (in && (f = readdir(in)) != NULL) {
            char cell[300];
            size_t n = strlen(f->d_name);
            if (strcmp(f->d_name, ".") == 0 || strcmp(f->d_name, "..") == 0)
                continue;
            bool keep = n > 4 && n - 4 < sizeof cell && strcmp(f->d_name + n - 4, ".log") == 0;
            if (keep) {
                snprintf(cell, sizeof cell, "%.*s", (int)(n - 4), f->d_name);
                sqlite3_reset(st);
                sqlite3_bind_text(st, 1, d->d_name, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 2, cell, -1, SQLITE_STATIC);
                keep = sqlite3_step(st) == SQLITE_ROW;
            }
            if (!keep) {
                char file[PATH_MAX + 600];
                snprintf(file, sizeof file, "%s/%s", sub, f->d_name);
                unlink(file);
            }
        }
        if (in)
            closedir(in);
        rmdir(sub); /* only when empty */
    }
out:
    sqlite3_finalize(st);
    sqlite3_close(db);
    closedir(top);
}

/* Step 4: blobs left in DEST by an earlier backup that the new copy no
 * longer names (retention dropped them) go, so DEST mirrors one snapshot. */
static void backup_trim(const char *dest)
{
    char path[PATH_MAX + 16], blobs[PATH_MAX + 16];
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    snprintf(path, sizeof path, "%s/capd.db", dest);
    snprintf(blobs, sizeof blobs, "%s/blobs", dest);
    DIR *top = opendir(blobs);
    if (!top)
        return;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "SELECT 1 FROM blobs WHERE hash = ?", -1, &st, NULL) != SQLITE_OK)
        goto out;
    struct dirent *d;
    while ((d = readdir(top)) != NULL) {
        char sub[PATH_MAX + 300];
        if (d->d_name[0] == '.' || strlen(d->d_name) != 2)
            continue;
        snprintf(sub, sizeof sub, "%s/%s", blobs, d->d_name);
        DIR *in = opendir(sub);
        struct dirent *f;
        while (in && (f = readdir(in)) != NULL) {
            if (f->d_name[0] == '.')
                continue;
            bool gone = !is_blob_name(f->d_name); /* a temporary left by a crash */
            if (!gone) {
                sqlite3_reset(st);
                sqlite3_bind_text(st, 1, f->d_name, -1, SQLITE_STATIC);
                gone = sqlite3_step(st) == SQLITE_DONE;
            }
            if (gone) {
                char file[PATH_MAX + 600];
                snprintf(file, sizeof file, "%s/%s", sub, f->d_name);
                unlink(file);
            }
        }
        if (in)
            closedir(in);
    }
out:
    sqlite3_finalize(st);
    sqlite3_close(db);
    closedir(top);
}

/*
 * A backup is a data dir: DEST/capd.db, DEST/blobs/ and DEST/logs/. The
 * blob and log locks are held shared from before the database snapshot
 * until every blob and log it names is copied, so retention cannot delete
 * one in between. The new capd.db is
 * renamed into place only after its blobs are on disk (syncfs), so at
 * every moment DEST's database names only blobs DEST has.
 */
int store_backup(const char *data_dir, const char *dest, struct store_backup_info *info, char **err)
{
    char src_path[PATH_MAX], data_real[PATH_MAX], dest_real[PATH_MAX];
    char tmp[PATH_MAX + 32], final[PATH_MAX + 16];
    bool tmp_made = false;
    int lock = -1, log_lock = -1, rc;
    struct stat sb;
    if (err)
        *err = NULL;
    memset(info, 0, sizeof *info);
    if ((size_t)snprintf(src_path, sizeof src_path, "%s/capd.db", data_dir) >= sizeof src_path)
        return -ENAMETOOLONG;
    if (stat(src_path, &sb) != 0 || !realpath(data_dir, data_real)) {
        rc = -errno;
        set_err(err, "no database at %s: %s", src_path, strerror(-rc));
        return rc;
    }
    if ((rc = mkdir_p(dest, 0750)) != 0 || !realpath(dest, dest_real)) {
        rc = rc ? rc : -errno;
        set_err(err, "cannot use %s as the backup directory: %s", dest, strerror(-rc));
        return rc;
    }
    /* Copying the data dir into itself (or over itself) is refused. */
    size_t dl = strlen(data_real);
    if (strcmp(dest_real, data_real) == 0 ||
        (strncmp(dest_real, data_real, dl) == 0 && dest_real[dl] == '/')) {
        set_err(err, "the backup directory %s is inside the data dir %s", dest, data_real);
        return -EINVAL;
    }
    snprintf(final, sizeof final, "%s/capd.db", dest_real);
    if (stat(final, &sb) != 0) {
        DIR *d = opendir(dest_real);
        struct dirent *e;
        bool empty = true;
        while (d && (e = readdir(d)) != NULL)
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
                empty = false;
        if (d)
            closedir(d);
        if (!empty) {
            set_err(err, "%s is neither empty nor a capd backup (no capd.db)%s", dest, "");
            return -ENOTEMPTY;
        }
    }
    lock = blob_lock(data_dir, LOCK_SH);
    if (lock < 0 && lock != -ENOENT) {
        rc = lock;
        set_err(err, "cannot lock %s/blobs: %s", data_dir, strerror(-rc));
        return rc;
    }
    log_lock = dir_lock(data_dir, "logs", LOCK_SH);
    if (log_lock < 0 && log_lock != -ENOENT) {
        rc = log_lock;
        set_err(err, "cannot lock %s/logs: %s", data_dir, strerror(-rc));
        goto out;
    }
    snprintf(tmp, sizeof tmp, "%s/capd.db.tmp-XXXXXX", dest_real);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        set_err(err, "cannot create a file in %s: %s", dest, strerror(-rc));
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
    blob_unlock(lock);
    blob_unlock(log_lock);
    lock = log_lock = -1;
    /* Every copied file and the database reach the disk before the
     * rename makes the new database the backup's. */
    if ((fd = open(dest_real, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
        syncfs(fd);
        close(fd);
    }
    if (rename(tmp, final) != 0) {
        rc = -errno;
        set_err(err, "cannot put the copy in place at %s: %s", final, strerror(-rc));
        goto out;
    }
    tmp_made = false;
    fsync_path(dest_real, O_RDONLY | O_DIRECTORY);
    backup_trim(dest_real);
    backup_trim_logs(dest_real);
    snprintf(info->path, sizeof info->path, "%s", dest_real);
    rc = 0;
out:
    blob_unlock(lock);
    blob_unlock(log_lock);
    if (tmp_made)
        unlink_db(tmp);
    return rc;
}

int store_size(struct store *s, struct store_size *out)
{
    sqlite3_stmt *st = NULL;
    memset(out, 0, sizeof *out);
    int rc = store_prepare(s,
                           "SELECT (SELECT page_size FROM pragma_page_size), "
                           "(SELECT page_count FROM pragma_page_count), "
                           "(SELECT freelist_count FROM pragma_freelist_count)",
                           &st);
    if (rc)
        return rc;
    if (sqlite3_step(st) == SQLITE_ROW) {
        out->page_size = sqlite3_column_int64(st, 0);
        out->pages = sqlite3_column_int64(st, 1);
        out->free_pages = sqlite3_column_int64(st, 2);
    } else {
        rc = -EIO;
    }
    sqlite3_finalize(st);
    const char *db = sqlite3_db_filename(s->db, "main");
    struct stat sb;
    char wal[PATH_MAX + 8];
    if (db && *db) {
        if (stat(db, &sb) == 0)
            out->file_bytes = (int64_t)sb.st_size;
        snprintf(wal, sizeof wal, "%s-wal", db);
        if (stat(wal, &sb) == 0)
            out->wal_bytes = (int64_t)sb.st_size;
    }
    return rc;
}

int store_running_cells(struct store *s, int64_t *n)
{
    sqlite3_stmt *st = NULL;
    int rc = store_prepare(s, "SELECT count(*) FROM cells WHERE state = 'running'", &st);
    if (rc)
        return rc;
    rc = sqlite3_step(st) == SQLITE_ROW ? 0 : -EIO;
    *n = rc ? 0 : sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return rc;
}

/*
 * In WAL mode VACUUM writes the rebuilt database into the WAL; the file
 * only shrinks once a checkpoint copies it back and truncates. A reader
 * holding an old snapshot can keep the checkpoint from finishing: then
 * *checkpoint_busy is set and the space comes back at a later checkpoint.
 */
int store_vacuum(struct store *s, bool *checkpoint_busy)
{
    sqlite3_stmt *st = NULL;
    int rc = store_flush(s);
    *checkpoint_busy = false;
    if (rc)
        return rc;
    if ((rc = store_exec(s, "VACUUM")) != 0)
        return rc;
    if ((rc = store_prepare(s, "PRAGMA wal_checkpoint(TRUNCATE)", &st)) != 0)
        return rc;
    if (sqlite3_step(st) == SQLITE_ROW)
        *checkpoint_busy = sqlite3_column_int(st, 0) != 0;
    else
        rc = store_rc(s, sqlite3_errcode(s->db));
    sqlite3_finalize(st);
    return rc;
}

/* ---- retention ---- */

/*
 * The commits whose jobs are kept whole: every control (named by any job's
 * control_commit or a branch's), the newest KEEP commits of each
 * (project, branch) (jobs without a branch form one group per project),
 * and every commit with a job still queued or running. Comparisons find
 * jobs by commit, so keeping is decided per commit: all jobs of a kept
 * commit are kept, whichever branch they were posted on.
 */
static const char keep_sql[] =
    "INSERT OR IGNORE INTO temp.prune_keep(commit_sha) "
    "SELECT control_commit FROM main.jobs WHERE control_commit IS NOT NULL "
    "UNION SELECT control_commit FROM main.branches WHERE control_commit IS NOT NULL "
    "UNION SELECT j.commit_sha FROM main.jobs j WHERE j.state NOT IN ('done','cancelled') "
    "  OR EXISTS (SELECT 1 FROM main.cells c WHERE c.job_seq = j.seq "
    "             AND c.state IN ('queued','running')) "
    "UNION SELECT commit_sha FROM (SELECT commit_sha, row_number() OVER "
    "  (PARTITION BY project, branch ORDER BY last_seq DESC) AS rn FROM "
    "  (SELECT project, branch, commit_sha, max(seq) AS last_seq FROM main.jobs "
    "   GROUP BY project, branch, commit_sha)) WHERE rn <= ?1";

/* Jobs of commits not kept that still hold payload references. */
#define CANDIDATES                                                                                 \
    "SELECT j.seq FROM main.jobs j WHERE j.commit_sha NOT IN "                                     \
    "(SELECT commit_sha FROM temp.prune_keep) AND j.seq > ?1 AND EXISTS "                          \
    "(SELECT 1 FROM main.cells c JOIN main.attempts a ON a.cell_seq = c.seq JOIN main.records r "  \
    "ON r.attempt_id = a.id WHERE c.job_seq = j.seq AND r.blob_hash IS NOT NULL) ORDER BY j.seq"

/* Candidate blobs (of the job being pruned) that no record names. */
#define UNREFERENCED                                                                               \
    "FROM main.blobs AS b WHERE b.hash IN (SELECT hash FROM temp.prune_blobs) AND NOT EXISTS "     \
    "(SELECT 1 FROM main.records r WHERE r.blob_hash = b.hash)"

#define JOB_ATTEMPTS                                                                               \
    "SELECT a.id FROM main.attempts a JOIN main.cells c ON c.seq = a.cell_seq WHERE c.job_seq = "  \
    "?1"

static int temp_tables(struct store *s)
{
    return store_exec(s, "CREATE TEMP TABLE IF NOT EXISTS prune_keep(commit_sha TEXT PRIMARY KEY) "
                         "WITHOUT ROWID;"
                         "CREATE TEMP TABLE IF NOT EXISTS prune_jobs(seq INTEGER PRIMARY KEY);"
                         "CREATE TEMP TABLE IF NOT EXISTS prune_blobs(hash TEXT PRIMARY KEY) "
                         "WITHOUT ROWID;"
                         "CREATE TEMP TABLE IF NOT EXISTS prune_gone(hash TEXT PRIMARY KEY) "
                         "WITHOUT ROWID;"
                         "DELETE FROM temp.prune_keep; DELETE FROM temp.prune_jobs;"
                         "DELETE FROM temp.prune_blobs; DELETE FROM temp.prune_gone;");
}

static int fill_keep(struct store *s, int keep, struct store_prune_report *r)
{
    sqlite3_stmt *st = NULL;
    int rc = store_exec(s, "DELETE FROM temp.prune_keep");
    if (rc == 0)
        rc = store_prepare(s, keep_sql, &st);
    if (rc)
        return rc;
    sqlite3_bind_int(st, 1, keep);
    rc = store_rc(s, sqlite3_step(st));
    sqlite3_finalize(st);
    st = NULL;
    if (rc)
        return rc;
    if ((rc = store_prepare(s,
                            "SELECT count(*), count(*) FILTER (WHERE commit_sha IN "
                            "(SELECT commit_sha FROM temp.prune_keep)) FROM main.jobs",
                            &st)) != 0)
        return rc;
    if (sqlite3_step(st) == SQLITE_ROW) {
        r->jobs = sqlite3_column_int64(st, 0);
        r->jobs_kept = sqlite3_column_int64(st, 1);
    } else {
        rc = -EIO;
    }
    sqlite3_finalize(st);
    return rc;
}

/* Runs a one-row query (binding ?1 to BIND when it has a parameter) and
 * reads its first one or two integer columns. */
static int one_row(struct store *s, const char *sql, int64_t bind, int64_t *a, int64_t *b)
{
    sqlite3_stmt *st = NULL;
    int rc = store_prepare(s, sql, &st);
    if (rc)
        return rc;
    if (sqlite3_bind_parameter_count(st) > 0)
        sqlite3_bind_int64(st, 1, bind);
    int src = sqlite3_step(st);
    if (src == SQLITE_ROW) {
        *a = sqlite3_column_int64(st, 0);
        if (b)
            *b = sqlite3_column_int64(st, 1);
    } else {
        rc = store_rc(s, src);
        rc = rc ? rc : -EIO;
    }
    sqlite3_finalize(st);
    return rc;
}

/* Keeps SQLite's message for the report before a rollback replaces it. */
static void note_error(struct store *s, int rc, struct store_prune_report *r)
{
    if (r->error[0])
        return;
    if (rc == -EIO || rc == -EBUSY || rc == -EEXIST || rc == -ENOMEM)
        snprintf(r->error, sizeof r->error, "%s", sqlite3_errmsg(s->db));
    else
        snprintf(r->error, sizeof r->error, "%s", strerror(-rc));
}

/*
 * Blob files nothing names: the files of blobs whose rows a prune deleted
 * while a backup held the lock, and the leftovers of an ingest transaction
 * that never committed (the file is written before its row). Ingest writes
 * blob files only inside its write transaction, so under the write lock
 * every file without a row is such an orphan. One subdirectory per
 * transaction keeps the lock short. Counts only when DRY.
 */
static int sweep_orphans(struct store *s, bool dry, struct store_prune_report *r)
{
    char top[PATH_MAX];
    sqlite3_stmt *st = NULL;
    int lock = -1, rc = 0;
    snprintf(top, sizeof top, "%s/blobs", s->data_dir);
    DIR *d = opendir(top);
    if (!d)
        return errno == ENOENT ? 0 : -errno;
    if (!dry && (lock = blob_lock(s->data_dir, LOCK_EX | LOCK_NB)) < 0) {
        closedir(d);
        return lock == -EAGAIN ? 0 : lock; /* a backup runs: next time */
    }
    if ((rc = store_prepare(s, "SELECT 1 FROM main.blobs WHERE hash = ?", &st)) != 0)
        goto out;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        char sub[PATH_MAX + 300];
        if (e->d_name[0] == '.' || strlen(e->d_name) != 2)
            continue;
        snprintf(sub, sizeof sub, "%s/%s", top, e->d_name);
        DIR *in = opendir(sub);
        if (!in)
            continue;
        if ((rc = store_begin(s)) != 0) {
            closedir(in);
            break;
        }
        struct dirent *f;
        while ((f = readdir(in)) != NULL) {
            if (f->d_name[0] == '.')
                continue;
            bool orphan = !is_blob_name(f->d_name);
            if (!orphan) {
                sqlite3_reset(st);
                sqlite3_bind_text(st, 1, f->d_name, -1, SQLITE_STATIC);
                int src = sqlite3_step(st);
                if (src != SQLITE_ROW && src != SQLITE_DONE) {
                    rc = store_rc(s, src);
                    break;
                }
                orphan = src == SQLITE_DONE;
            }
            if (!orphan)
                continue;
            char file[PATH_MAX + 600];
            struct stat sb;
            snprintf(file, sizeof file, "%s/%s", sub, f->d_name);
            if (stat(file, &sb) != 0 || !S_ISREG(sb.st_mode))
                continue;
            if (!dry && unlink(file) != 0)
                continue;
            r->orphans_deleted++;
            r->bytes_freed += (int64_t)sb.st_size;
        }
        closedir(in);
        sqlite3_reset(st);
        if (rc == 0)
            rc = store_commit(s);
        if (rc) {
            note_error(s, rc, r);
            store_rollback(s);
        }
    }
out:
    if (rc)
        note_error(s, rc, r);
    sqlite3_finalize(st);
    blob_unlock(lock);
    closedir(d);
    return rc;
}

/* Removes DATA/logs/NAME/ (DIR is DATA/logs) and counts its cell logs
 * and bytes; only counts when DRY. */
static void remove_log_dir(const char *dir, const char *name, bool dry,
                           struct store_prune_report *r)
{
    char sub[PATH_MAX + 300];
    snprintf(sub, sizeof sub, "%s/%s", dir, name);
    DIR *in = opendir(sub);
    struct dirent *f;
    while (in && (f = readdir(in)) != NULL) {
        char file[PATH_MAX + 600];
        struct stat sb;
        size_t n = strlen(f->d_name);
        snprintf(file, sizeof file, "%s/%s", sub, f->d_name);
        if (f->d_name[0] == '.' && (n == 1 || (n == 2 && f->d_name[1] == '.')))
            continue;
        if (lstat(file, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        if (!dry && unlink(file) != 0)
            continue;
        if (n > 4 && strcmp(f->d_name + n - 4, ".log") == 0)
            r->logs_deleted++;
        r->log_bytes_freed += (int64_t)sb.st_size;
    }
    if (in)
        closedir(in);
    if (!dry)
        rmdir(sub);
}

/*
 * Cell logs of the jobs not kept whole: DATA/logs/<job>/ goes as a whole.
 * No row names a log, so the database does not change; but the kept set
 * is recomputed under the write lock of each batch and the files are
 * removed while it is held, so a job posted meanwhile that names an old
 * commit as its control saves that commit's logs, exactly as it saves its
 * payloads. A job not kept has no cell queued or running, so none of its
 * logs is being written. A backup holds DATA/logs shared while it copies;
 * then nothing is deleted and the next run does it. Counts only when DRY.
 */
static int prune_logs(struct store *s, int keep, bool dry, const int *stop,
                      struct store_prune_report *r)
{
    char top[PATH_MAX];
    sqlite3_stmt *st = NULL;
    int lock = -1, rc = 0;
    bool more = true;
    snprintf(top, sizeof top, "%s/logs", s->data_dir);
    DIR *d = opendir(top);
    if (!d)
        return errno == ENOENT ? 0 : -errno;
    if (!dry && (lock = dir_lock(s->data_dir, "logs", LOCK_EX | LOCK_NB)) < 0) {
        closedir(d);
        return lock == -EAGAIN ? 0 : lock; /* a backup runs: next time */
    }
    while (rc == 0 && more) {
        int jobs = 0;
        if (stop && __atomic_load_n(stop, __ATOMIC_RELAXED)) {
            rc = -ECANCELED;
            break;
        }
        if ((rc = dry ? store_exec(s, "BEGIN") : store_begin(s)) != 0)
            break;
        more = false;
        if ((rc = fill_keep(s, keep, r)) == 0)
            rc = store_prepare(s,
                               "SELECT 1 FROM main.jobs WHERE id = ?1 AND commit_sha NOT IN "
                               "(SELECT commit_sha FROM temp.prune_keep)",
                               &st);
        struct dirent *e;
        while (rc == 0 && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.' || !is_id_name(e->d_name))
                continue;
            sqlite3_reset(st);
            sqlite3_bind_text(st, 1, e->d_name, -1, SQLITE_STATIC);
            int src = sqlite3_step(st);
            if (src == SQLITE_DONE)
                continue; /* kept, or not a job's directory */
            if (src != SQLITE_ROW) {
                rc = store_rc(s, src);
                break;
            }
            remove_log_dir(top, e->d_name, dry, r);
            if (++jobs >= PRUNE_TXN_JOBS) {
                more = true;
                break;
            }
        }
        sqlite3_finalize(st);
        st = NULL;
        if (rc == 0)
            rc = dry ? store_exec(s, "COMMIT") : store_commit(s);
        if (rc) {
            note_error(s, rc, r);
            store_rollback(s);
        }
    }
    blob_unlock(lock);
    closedir(d);
    return rc;
}

/*
 * A dry run computes the same answer without writing to the database:
 * every candidate job at once, then the blobs only they reference. It
 * writes temp tables only, which takes no lock on the database file.
 */
static int prune_dry(struct store *s, int keep, struct store_prune_report *r)
{
    sqlite3_stmt *st = NULL;
    int rc = store_exec(s, "BEGIN");
    if (rc)
        return rc;
    if ((rc = temp_tables(s)) != 0 || (rc = fill_keep(s, keep, r)) != 0)
        goto out;
    if ((rc = store_prepare(s, "INSERT INTO temp.prune_jobs(seq) " CANDIDATES, &st)) != 0)
        goto out;
    sqlite3_bind_int64(st, 1, 0);
    rc = store_rc(s, sqlite3_step(st));
    sqlite3_finalize(st);
    st = NULL;
    if (rc)
        goto out;
    if ((rc = store_exec(
             s, "INSERT OR IGNORE INTO temp.prune_blobs(hash) SELECT r.blob_hash FROM main.records "
                "r JOIN main.attempts a ON a.id = r.attempt_id JOIN main.cells c ON c.seq = "
                "a.cell_seq WHERE c.job_seq IN (SELECT seq FROM temp.prune_jobs) AND r.blob_hash "
                "IS NOT NULL")) != 0)
        goto out;
    if ((rc = one_row(s, "SELECT count(*) FROM temp.prune_jobs", 0, &r->jobs_pruned, NULL)) != 0)
        goto out;
    if ((rc = one_row(s,
                      "SELECT count(*) FROM main.records r JOIN main.attempts a ON a.id = "
                      "r.attempt_id JOIN main.cells c ON c.seq = a.cell_seq WHERE c.job_seq IN "
                      "(SELECT seq FROM temp.prune_jobs) AND r.blob_hash IS NOT NULL",
                      0, &r->records_detached, NULL)) != 0)
        goto out;
    /* A blob goes only when no record outside the pruned jobs names it. */
    rc = one_row(s,
                 "SELECT count(*), coalesce(sum(b.stored_size), 0) FROM main.blobs b WHERE "
                 "b.hash IN (SELECT hash FROM temp.prune_blobs) AND NOT EXISTS (SELECT 1 FROM "
                 "main.records r JOIN main.attempts a ON a.id = r.attempt_id JOIN main.cells c "
                 "ON c.seq = a.cell_seq WHERE r.blob_hash = b.hash AND c.job_seq NOT IN "
                 "(SELECT seq FROM temp.prune_jobs))",
                 0, &r->blobs_deleted, &r->bytes_freed);
out:
    if (rc)
        note_error(s, rc, r);
    store_exec(s, "COMMIT");
    store_rollback(s);
    if (rc == 0)
        rc = prune_logs(s, keep, true, NULL, r);
    return rc ? rc : sweep_orphans(s, true, r);
}

/* Drops the payload references of job SEQ's records and the rows of the
 * blobs nothing references any more, remembering their hashes in
 * temp.prune_gone for unlink_gone. Runs inside the caller's transaction. */
static int prune_job(struct store *s, int64_t seq, struct store_prune_report *r, int64_t *detached)
{
    sqlite3_stmt *st = NULL;
    int64_t nblobs = 0, nbytes = 0;
    int rc = store_exec(s, "DELETE FROM temp.prune_blobs");
    if (rc)
        return rc;
    if ((rc = store_prepare(s,
                            "INSERT OR IGNORE INTO temp.prune_blobs(hash) SELECT r.blob_hash FROM "
                            "main.records r WHERE r.attempt_id IN (" JOB_ATTEMPTS
                            ") AND r.blob_hash IS NOT NULL",
                            &st)) != 0)
        return rc;
    sqlite3_bind_int64(st, 1, seq);
    rc = store_rc(s, sqlite3_step(st));
    sqlite3_finalize(st);
    st = NULL;
    if (rc)
        return rc;
    if ((rc = store_prepare(s,
                            "UPDATE main.records SET blob_hash = NULL WHERE blob_hash IS NOT NULL "
                            "AND attempt_id IN (" JOB_ATTEMPTS ")",
                            &st)) != 0)
        return rc;
    sqlite3_bind_int64(st, 1, seq);
    rc = store_rc(s, sqlite3_step(st));
    sqlite3_finalize(st);
    st = NULL;
    if (rc)
        return rc;
    *detached = sqlite3_changes(s->db);
    /* Blobs are content-addressed and shared between jobs: after the
     * update, any record still naming one belongs to a job that keeps it. */
    if ((rc = one_row(s, "SELECT count(*), coalesce(sum(b.stored_size), 0) " UNREFERENCED, 0,
                      &nblobs, &nbytes)) != 0 ||
        (rc = store_exec(
             s, "INSERT OR IGNORE INTO temp.prune_gone(hash) SELECT b.hash " UNREFERENCED)) != 0 ||
        (rc = store_exec(s, "DELETE " UNREFERENCED)) != 0)
        return rc;
    r->jobs_pruned++;
    r->records_detached += *detached;
    r->blobs_deleted += nblobs;
    r->bytes_freed += nbytes;
    return 0;
}

/*
 * The files of the blob rows a committed batch deleted. Unlinking them
 * inside that batch would lose them if its commit then failed; after it,
 * under a new write lock, a file whose row is still absent cannot be in
 * use: ingest writes (or rewrites) a blob's file only inside its own write
 * transaction, and a row that came back names a file with the same
 * content. Under a backup's shared blob lock the files stay, as orphans
 * for the next sweep.
 */
static int unlink_gone(struct store *s, struct store_prune_report *r)
{
    sqlite3_stmt *st = NULL;
    int lock = blob_lock(s->data_dir, LOCK_EX | LOCK_NB);
    int rc = store_begin(s);
    if (rc)
        goto out;
    if (lock >= 0) {
        if ((rc = store_prepare(s,
                                "SELECT g.hash FROM temp.prune_gone g WHERE NOT EXISTS "
                                "(SELECT 1 FROM main.blobs b WHERE b.hash = g.hash)",
                                &st)) != 0)
            goto out;
        while (sqlite3_step(st) == SQLITE_ROW) {
            char path[PATH_MAX];
            store_blob_path(s, (const char *)sqlite3_column_text(st, 0), path, sizeof path);
            unlink(path);
        }
        sqlite3_finalize(st);
        st = NULL;
    }
    if ((rc = store_exec(s, "DELETE FROM temp.prune_gone")) == 0)
        rc = store_commit(s);
out:
    sqlite3_finalize(st);
    if (rc) {
        note_error(s, rc, r);
        store_rollback(s);
    }
    blob_unlock(lock);
    return rc;
}

/* One transaction of a real run: recomputes the kept set under the write
 * lock, then prunes candidate jobs after *LAST until the transaction is big
 * enough. *MORE is cleared when no candidate is left. */
static int prune_batch(struct store *s, int keep, int64_t *last, bool *more,
                       struct store_prune_report *r)
{
    sqlite3_stmt *st = NULL;
    int64_t records = 0, jobs = 0;
    struct store_prune_report before = *r;
    int rc = store_begin(s);
    if (rc)
        return rc;
    if ((rc = fill_keep(s, keep, r)) != 0)
        goto out;
    while (records < PRUNE_TXN_RECORDS && jobs < PRUNE_TXN_JOBS) {
        int64_t seq = 0, detached = 0;
        if ((rc = store_prepare(s, CANDIDATES " LIMIT 1", &st)) != 0)
            goto out;
        sqlite3_bind_int64(st, 1, *last);
        int src = sqlite3_step(st);
        if (src == SQLITE_ROW)
            seq = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        st = NULL;
        if (src == SQLITE_DONE) {
            *more = false;
            break;
        }
        if (src != SQLITE_ROW) {
            rc = store_rc(s, src);
            goto out;
        }
        if ((rc = prune_job(s, seq, r, &detached)) != 0)
            goto out;
        *last = seq;
        records += detached;
        jobs++;
    }
    rc = store_commit(s);
out:
    if (rc) {
        note_error(s, rc, r);
        store_rollback(s);
        /* Nothing of this batch happened (prune_gone is emptied by the
         * next run's temp_tables). */
        memcpy(before.error, r->error, sizeof before.error);
        before.jobs = r->jobs;
        before.jobs_kept = r->jobs_kept;
        *r = before;
        return rc;
    }
    return unlink_gone(s, r);
}

/*
 * The real run goes in short IMMEDIATE transactions. The kept set is
 * recomputed at the start of every one, under the write lock, so a job
 * posted meanwhile that names an old commit as its control saves that
 * commit before anything of it is touched. Then the cell logs of the jobs
 * not kept go (prune_logs), and orphan payload files are swept last.
 */
int store_prune(struct store *s, const struct store_prune_opts *o, struct store_prune_report *r)
{
    int64_t last = 0;
    bool more = true;
    int rc;
    memset(r, 0, sizeof *r);
    if (o->keep_heads_per_branch <= 0)
        return -EINVAL;
    if ((rc = store_flush(s)) != 0)
        return rc;
    if (o->dry_run)
        return prune_dry(s, o->keep_heads_per_branch, r);
    if ((rc = temp_tables(s)) != 0)
        return rc;
    while (rc == 0 && more) {
        if (o->stop && __atomic_load_n(o->stop, __ATOMIC_RELAXED))
            rc = -ECANCELED;
        else
            rc = prune_batch(s, o->keep_heads_per_branch, &last, &more, r);
    }
    if (rc == 0)
        rc = prune_logs(s, o->keep_heads_per_branch, false, o->stop, r);
    if (rc == 0)
        rc = sweep_orphans(s, false, r);
    /* On failure the temp tables stay as they are: clearing them would
     * replace the error store_errmsg() reports. */
    if (rc == 0)
        store_exec(s, "DELETE FROM temp.prune_keep; DELETE FROM temp.prune_blobs");
    return rc;
}
