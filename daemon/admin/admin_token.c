/*
 * daemon/admin/admin_token.c - the first admin token of a new data dir (see
 * daemon/admin/admin_token.h for what and why).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/admin/admin_token.h"
#include "util/log.h"
#include "storage/store.h"
#include "util/err.h"
#include "util/fs.h"

/* Writes TOKEN and a newline to PATH through PATH.tmp (0600, O_EXCL after
 * removing a stale temporary, never following a link), fsyncs and renames.
 * 0 or -errno. */
static int write_token_file(const char *path, const char *token)
{
    char tmp[1200];
    int rc = 0;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    size_t n = strlen(token);
    if (write(fd, token, n) != (ssize_t)n || write(fd, "\n", 1) != 1 || fsync(fd) != 0)
        rc = errno ? -errno : -EIO;
    return util_tmp_finish(fd, rc, tmp, path);
}

int admin_token_bootstrap(const struct capd_config *c, char **err)
{
    struct store *s = NULL;
    json_t *list = NULL, *info = NULL;
    char token[STORE_TOKEN_LEN + 1] = "";
    char path[1100];
    int rc = 0;
    if (!c->auth_required)
        return 0;
    snprintf(path, sizeof path, "%s/%s", c->data_dir, ADMIN_TOKEN_FILE);
    if ((rc = store_open(c->data_dir, false, &s, err)) != 0)
        goto out;
    if ((rc = store_token_list(s, &list)) != 0) {
        util_errf(err, rc, "cannot read the token table (%d)", rc);
        goto out;
    }
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(list, "tokens"), i, t)
    {
        if (json_is_null(json_object_get(t, "revoked_at")))
            goto out; /* a usable token exists: nothing to do */
    }
    if ((rc = store_token_create(s, STORE_SCOPE_ADMIN, "admin (first start)", 0, token, &info)) !=
        0) {
        util_errf(err, rc, "cannot create the first admin token (%d)", rc);
        goto out;
    }
    const char *id = json_string_value(json_object_get(info, "id"));
    if ((rc = write_token_file(path, token)) != 0) {
        /* A token nobody can read is revoked, so the next start tries again. */
        store_token_revoke(s, id);
        util_errf(err, rc, "cannot write %s: %s", path, strerror(-rc));
        goto out;
    }
    log_info("admin_token_created", "id=%s path=%s", id, log_q(path));
    fprintf(stderr, "capd: created the first admin token %s; its secret is in %s (mode 0600)\n", id,
            path);
out:
    memset(token, 0, sizeof token);
    json_decref(info);
    json_decref(list);
    store_close(s);
    return rc;
}
