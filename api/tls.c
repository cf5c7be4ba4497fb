/*
 * api/tls.c - the certificate and key capd serves HTTPS with
 * (libmicrohttpd's GnuTLS backend): handed to MHD as PEM text read here at
 * start-up, so capd needs the files readable only then.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/api_int.h"
#include "util/err.h"
#include "util/fs.h"

/* A certificate or key file larger than this is not PEM meant for us. */
#define API_TLS_FILE_MAX (1 << 20)

/* Reads a whole PEM file into a NUL-terminated buffer and checks that it
 * holds what its name says (MARK), so a swapped or wrong file is named at
 * start-up instead of surfacing as GnuTLS's generic refusal. */
static int read_pem(const char *key, const char *path, const char *mark, char **out, char **err)
{
    int rc = -EINVAL;
    char *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = util_errf(err, -errno, "%s '%s' cannot be read: %s", key, path, strerror(errno));
        goto out;
    }
    if ((rc = util_slurp_fd(fd, API_TLS_FILE_MAX, &buf, NULL)) != 0) {
        if (rc != -ENOMEM)
            rc = util_errf(err, -EINVAL, "%s '%s' cannot be read or is larger than %d bytes", key,
                           path, API_TLS_FILE_MAX);
        goto out;
    }
    if (!strstr(buf, mark)) {
        rc = util_errf(err, -EINVAL, "%s '%s' is not a PEM file holding a '%s' block", key, path,
                       mark);
        goto out;
    }
    *out = buf;
    buf = NULL;
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    return rc;
}

/* The key's bytes are not left behind in freed memory. */
static void free_secret(char *p)
{
    if (!p)
        return;
    memset(p, 0, strlen(p));
    free(p);
}

int api_tls_load(const struct capd_config *cfg, char **cert, char **key, char **err)
{
    int rc;
    *cert = *key = NULL;
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
        return util_errf(err, -ENOTSUP,
                         "tls_cert is set but this libmicrohttpd was built without TLS "
                         "support (GnuTLS); use a TLS-terminating proxy instead");
    if ((rc = read_pem("tls_cert", cfg->tls_cert, "-----BEGIN CERTIFICATE-----", cert, err)) != 0 ||
        (rc = read_pem("tls_key", cfg->tls_key, "PRIVATE KEY-----", key, err)) != 0) {
        api_tls_free(*cert, *key);
        *cert = *key = NULL;
        return rc;
    }
    return 0;
}

void api_tls_free(char *cert, char *key)
{
    free(cert);
    free_secret(key);
}
