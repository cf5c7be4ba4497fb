/*
 * tests/test_tls.c - capd serving HTTPS with --tls-cert/--tls-key (GnuTLS
 * through libmicrohttpd): a self-signed certificate made at run time with
 * the openssl CLI (certtool from gnutls-bin when openssl is missing), real
 * HTTPS requests through libcurl that verify it, plain HTTP refused on the
 * TLS port, capctl over https with --cacert, and the start-up errors.
 */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/helpers/common/testutil.h"

struct pki {
    char *dir, cert[300], key[300];
};

/* A self-signed certificate for 127.0.0.1 (subjectAltName IP, so libcurl's
 * host check passes) and its unencrypted key, under a fresh directory. */
static void make_pki(struct pki *p)
{
    p->dir = tu_tmpdir();
    cr_assert_not_null(p->dir);
    snprintf(p->cert, sizeof p->cert, "%s/cert.pem", p->dir);
    snprintf(p->key, sizeof p->key, "%s/key.pem", p->dir);
    int rc;
    if (tu_sh("command -v openssl >/dev/null") == 0) {
        rc = tu_sh("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 "
                   "-addext subjectAltName=IP:127.0.0.1 -keyout '%s' -out '%s' "
                   ">'%s/openssl.log' 2>&1",
                   p->key, p->cert, p->dir);
    } else {
        rc = tu_sh("cd '%s' && printf 'cn = 127.0.0.1\\nip_address = 127.0.0.1\\nexpiration_days = "
                   "2\\nca\\ntls_www_server\\n' > tmpl && certtool --generate-privkey "
                   "--key-type rsa --outfile '%s' >certtool.log 2>&1 && certtool "
                   "--generate-self-signed --load-privkey '%s' --template tmpl --outfile '%s' "
                   ">>certtool.log 2>&1",
                   p->dir, p->key, p->key, p->cert);
    }
    cr_assert_eq(rc, 0, "made a self-signed certificate in %s", p->dir);
}

static void free_pki(struct pki *p)
{
    tu_sh("rm -rf '%s'", p->dir);
    free(p->dir);
}

/* One GET with libcurl; CAFILE NULL means the system's CAs. Returns the
 * curl code and the status (0 when no HTTP reply came). */
static CURLcode get(const char *url, const char *cafile, long *status)
{
    CURL *h = curl_easy_init();
    FILE *null = fopen("/dev/null", "w");
    *status = 0;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 20L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, null);
    if (cafile)
        curl_easy_setopt(h, CURLOPT_CAINFO, cafile);
    CURLcode cc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    curl_easy_cleanup(h);
    fclose(null);
    return cc;
}

Test(tls, https_verified_and_plain_http_refused, .timeout = 120)
{
    struct pki p;
    make_pki(&p);
    const char *extra[] = {"--tls-cert", p.cert, "--tls-key", p.key, NULL};
    struct tu_capd c;
    cr_assert_eq(tu_capd_start(&c, NULL, extra), 0, "capd starts with TLS (see %s)", c.errlog);
    cr_assert(strncmp(c.base, "https://", 8) == 0, "the printed address is https: %s", c.base);
    snprintf(c.cacert, sizeof c.cacert, "%s", p.cert);

    /* A real HTTPS request, the server's certificate verified against the
     * one just made (peer and host name: libcurl's defaults). */
    long st = 0;
    json_t *h = tu_json(&c, "GET", "/healthz", NULL, &st);
    cr_assert_eq(st, 200, "GET /healthz over https");
    cr_assert_str_eq(json_string_value(json_object_get(h, "status")), "ok");
    json_decref(h);
    /* A write with a body goes through TLS too. */
    cr_assert_eq(tu_fake_build(&c, "fake", NULL), 201, "POST /v1/builds over https");
    char *job = tu_submit(&c, "fake", "fake:ok", NULL);
    cr_assert_not_null(job, "POST /v1/jobs over https");
    json_t *j = tu_wait_job(&c, job, 60);
    cr_assert_not_null(j);
    cr_assert_str_eq(
        json_string_value(json_object_get(json_array_get(json_object_get(j, "cells"), 0), "state")),
        "ok");
    json_decref(j);
    free(job);

    /* Verification is real: without the CA the same request fails. */
    char url[128];
    snprintf(url, sizeof url, "%s/healthz", c.base);
    CURLcode cc = get(url, NULL, &st);
    cr_assert(cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CACERT_BADFILE ||
                  cc == CURLE_SSL_CONNECT_ERROR,
              "an unknown self-signed certificate is refused (curl %d: %s)", cc,
              curl_easy_strerror(cc));
    cr_assert_eq(st, 0);
    /* Plain HTTP to the TLS port gets no HTTP reply at all. */
    snprintf(url, sizeof url, "http://127.0.0.1:%d/healthz", c.port);
    cc = get(url, NULL, &st);
    cr_assert_neq(cc, CURLE_OK, "plain HTTP to the TLS port fails");
    cr_assert_eq(st, 0, "no HTTP status over plain HTTP (got %ld)", st);
    /* ...and capd keeps serving HTTPS afterwards. */
    json_decref(tu_json(&c, "GET", "/healthz", NULL, &st));
    cr_assert_eq(st, 200);

    /* The start-up log names the scheme. */
    char *log = tu_slurp(c.errlog);
    cr_assert(strstr(log, "event=listening") && strstr(log, "scheme=https"), "%s", log);
    free(log);

    /* capctl talks https with --cacert, and with CAPD_CACERT; without a CA
     * it fails (exit 2) instead of talking to an unverified server. */
    char *bin = strdup(tu_bin("CAPD_BIN"));
    char capctl[512];
    snprintf(capctl, sizeof capctl, "%s/capctl", dirname(bin));
    free(bin);
    /* capctl finds its token in capd's data dir (CAPD_DATA_DIR). */
    char data_dir[300];
    snprintf(data_dir, sizeof data_dir, "%s/data", c.dir);
    setenv("CAPD_DATA_DIR", data_dir, 1);
    cr_assert_eq(tu_sh("'%s' --server '%s' --cacert '%s' builds list >'%s/ctl.out' 2>&1", capctl,
                       c.base, p.cert, p.dir),
                 0, "capctl --cacert over https (see %s/ctl.out)", p.dir);
    char *out = tu_slurp(strcat(strcpy(url, p.dir), "/ctl.out"));
    cr_assert(strstr(out, "fake"), "capctl lists the build: %s", out);
    free(out);
    cr_assert_eq(tu_sh("CAPD_CACERT='%s' '%s' --server '%s' builds show fake >/dev/null 2>&1",
                       p.cert, capctl, c.base),
                 0, "CAPD_CACERT");
    cr_assert_eq(
        tu_sh("CAPD_CACERT= '%s' --server '%s' builds list >/dev/null 2>&1", capctl, c.base), 2,
        "no CA: refused");
    cr_assert_eq(tu_sh("'%s' --server '%s' --cacert /nonexistent/ca.pem builds list "
                       ">'%s/ctl.err' 2>&1",
                       capctl, c.base, p.dir),
                 2, "an unreadable --cacert is a usage error");

    cr_assert_eq(tu_capd_stop(&c), 0);
    tu_sh("rm -rf '%s'", c.dir);
    free_pki(&p);
}

/* Runs capd with ARGS (a shell fragment) on a fresh data dir; returns the
 * exit status and its stderr. A capd that starts (wrongly) is stopped. */
static int run_capd(const char *dir, const char *args, char **err)
{
    int rc = tu_sh("timeout 20 '%s' --listen 127.0.0.1:0 --data-dir '%s/data' %s "
                   ">'%s/out' 2>'%s/err' </dev/null",
                   tu_bin("CAPD_BIN"), dir, args, dir, dir);
    char p[400];
    snprintf(p, sizeof p, "%s/err", dir);
    *err = tu_slurp(p);
    return rc;
}

Test(tls, bad_tls_settings_are_startup_errors, .timeout = 120)
{
    struct pki p;
    make_pki(&p);
    char *dir = tu_tmpdir(), *err = NULL, args[1400];
    tu_sh("chmod 0711 '%s'", dir); /* run_as_user must reach the data dir */

    snprintf(args, sizeof args, "--tls-cert /nonexistent/cert.pem --tls-key '%s'", p.key);
    cr_assert_eq(run_capd(dir, args, &err), 2, "a missing certificate: exit 2 (%s)", err);
    cr_assert(strstr(err, "tls_cert '/nonexistent/cert.pem' is not readable"), "%s", err);
    free(err);

    snprintf(args, sizeof args, "--tls-cert '%s'", p.cert);
    cr_assert_eq(run_capd(dir, args, &err), 2, "a certificate without a key (%s)", err);
    cr_assert(strstr(err, "TLS needs both tls_cert and tls_key"), "%s", err);
    free(err);

    /* Certificate and key swapped: named before GnuTLS sees them. */
    snprintf(args, sizeof args, "--tls-cert '%s' --tls-key '%s'", p.key, p.cert);
    cr_assert_eq(run_capd(dir, args, &err), 1, "swapped files (%s)", err);
    cr_assert(strstr(err, "is not a PEM file holding a '-----BEGIN CERTIFICATE-----' block"), "%s",
              err);
    free(err);

    /* A key that does not belong to the certificate: GnuTLS refuses. */
    cr_assert_eq(tu_sh("openssl genrsa -out '%s/other.pem' 2048 >/dev/null 2>&1 || certtool "
                       "--generate-privkey --outfile '%s/other.pem' >/dev/null 2>&1",
                       p.dir, p.dir),
                 0);
    snprintf(args, sizeof args, "--tls-cert '%s' --tls-key '%s/other.pem'", p.cert, p.dir);
    cr_assert_neq(run_capd(dir, args, &err), 0, "a key of another certificate (%s)", err);
    cr_assert(strstr(err, "cannot serve HTTPS"), "%s", err);
    free(err);

    /* Config file keys, and flags win over them. */
    char cfg[400];
    snprintf(cfg, sizeof cfg, "%s/capd.json", dir);
    FILE *f = fopen(cfg, "w");
    fprintf(f, "{\"tls_cert\": \"/nonexistent/c.pem\", \"tls_key\": \"%s\"}\n", p.key);
    fclose(f);
    snprintf(args, sizeof args, "--config '%s'", cfg);
    cr_assert_eq(run_capd(dir, args, &err), 2, "the file's tls_cert is used (%s)", err);
    cr_assert(strstr(err, "/nonexistent/c.pem"), "%s", err);
    free(err);
    const char *extra[] = {"--config", cfg, "--tls-cert", p.cert, NULL};
    struct tu_capd c;
    cr_assert_eq(tu_capd_start(&c, NULL, extra), 0, "--tls-cert wins over the file (see %s)",
                 c.errlog);
    cr_assert(strncmp(c.base, "https://", 8) == 0);
    snprintf(c.cacert, sizeof c.cacert, "%s", p.cert);
    long st = 0;
    json_decref(tu_json(&c, "GET", "/healthz", NULL, &st));
    cr_assert_eq(st, 200);
    cr_assert_eq(tu_capd_stop(&c), 0);

    tu_sh("rm -rf '%s' '%s'", dir, c.dir);
    free(dir);
    free_pki(&p);
}
