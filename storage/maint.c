/*
 * storage/maint.c - database care: the size of the database, the running
 * cells a careful operator checks first, and vacuum; and what backup.c and
 * prune.c share about the files beside the database: the locks on
 * DATA/blobs and DATA/logs and the names capd gives the files there.
 *
 * Backup (backup.c) and retention (prune.c) are safe while capd runs and
 * also cover the per-cell logs under DATA/logs. A vacuum holds the write
 * lock for its whole run, which is why `capd db vacuum` refuses while
 * cells run unless forced.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/store_int.h"
#include "util/path.h"

/* A blob file name (records.c): 's' and 64 hex digits (SHA-256), or 'x'
 * and 32 (XXH3-128, the names of blobs stored before SHA-256 keys). */
bool store__is_blob_name(const char *n)
{
    size_t len = strlen(n);
    if (!((n[0] == 's' && len == 65) || (n[0] == 'x' && len == 33)))
        return false;
    for (size_t i = 1; i < len; i++)
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
int store__dir_lock(const char *data_dir, const char *sub, int how)
{
    char dir[UTIL_PATH_MAX];
    int rc = util_path_join(dir, data_dir, sub);
    if (rc)
        return rc;
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

void store__dir_unlock(int fd)
{
    if (fd >= 0)
        close(fd); /* releases the flock */
}

/* A job or cell id as it may appear in a path under DATA/logs: capd's ids
 * are letters and digits; anything else (a dot, a slash) is not ours. */
bool store__is_id_name(const char *n)
{
    if (!*n || strlen(n) > 64)
        return false;
    for (; *n; n++)
        if (!((*n >= '0' && *n <= '9') || (*n >= 'a' && *n <= 'z') || (*n >= 'A' && *n <= 'Z') ||
              *n == '-' || *n == '_'))
            return false;
    return true;
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
