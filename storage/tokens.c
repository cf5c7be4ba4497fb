/*
 * storage/tokens.c - API bearer tokens: creation, checking, listing,
 * revocation, and which token created a job.
 *
 * A token reads "capd_<id>_<secret>": <id> is a public identifier
 * ('t' + 12 hex digits) that finds the row, <secret> is 32 bytes from
 * getrandom(2) in hex. The database keeps SHA-256 of the whole string and
 * nothing else, so a copy of capd.db grants nothing. Checking hashes the
 * presented token and compares the two digests in constant time; a
 * revoked or expired token is only reported as such once its secret has
 * matched, so guessing ids tells an attacker nothing.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "storage/store_int.h"
#include "util/cellstate.h"
#include "util/clock.h"

#define TOKEN_PREFIX       "capd_"
#define TOKEN_ID_LEN       13 /* 't' + 12 hex */
#define TOKEN_SECRET_BYTES 32

static const char *const scope_names[] = {"none", "read", "submit", "admin"};

const char *store_scope_name(int scope)
{
    return scope >= STORE_SCOPE_NONE && scope <= STORE_SCOPE_ADMIN ? scope_names[scope] : "none";
}

int store_scope_parse(const char *s)
{
    for (int i = STORE_SCOPE_READ; s && i <= STORE_SCOPE_ADMIN; i++)
        if (strcmp(s, scope_names[i]) == 0)
            return i;
    return -EINVAL;
}

static void to_hex(const unsigned char *p, size_t n, char *out)
{
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[p[i] >> 4];
        out[2 * i + 1] = hx[p[i] & 15];
    }
    out[2 * n] = 0;
}

static bool is_lower_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

/* Compares two equal-length strings without an early exit, so the time
 * taken does not depend on where they first differ. */
static bool ct_equal(const char *a, const char *b, size_t n)
{
    volatile unsigned char acc = 0;
    for (size_t i = 0; i < n; i++)
        acc |= (unsigned char)(a[i] ^ b[i]);
    return acc == 0;
}

/* SHA-256 of TOKEN in hex, as the database keeps it. */
static void digest_hex(const char *token, char dhex[65])
{
    unsigned char digest[32];
    store_sha256(token, strlen(token), digest);
    to_hex(digest, sizeof digest, dhex);
}

/* Whether column COL of ST holds SHA-256(TOKEN) in hex, compared in
 * constant time. */
static bool hash_matches(sqlite3_stmt *st, int col, const char *token)
{
    char dhex[65];
    digest_hex(token, dhex);
    const char *hash = (const char *)sqlite3_column_text(st, col);
    return hash && strlen(hash) == 64 && ct_equal(hash, dhex, 64);
}

static json_t *token_row(sqlite3_stmt *st)
{
    return json_pack("{s:o,s:o,s:o,s:o,s:o,s:o}", "id", store_col_str(st, 0), "name",
                     store_col_str(st, 1), "scope", store_col_str(st, 2), "created_at",
                     store_col_time(st, 3), "expires_at", store_col_time(st, 4), "revoked_at",
                     store_col_time(st, 5));
}

#define TOKEN_COLS "id, name, scope, created_at, expires_at, revoked_at"

static int token_get(struct store *s, const char *id, json_t **out)
{
    return store_get_row(s, "SELECT " TOKEN_COLS " FROM tokens WHERE id = ?", token_row, out, "t",
                         id);
}

int store_token_create(struct store *s, int scope, const char *name, int64_t expires_at,
                       char token_out[STORE_TOKEN_LEN + 1], json_t **info)
{
    unsigned char secret[TOKEN_SECRET_BYTES];
    char hex[2 * TOKEN_SECRET_BYTES + 1], dhex[65], id[16];
    int rc = -EIO;
    if (scope < STORE_SCOPE_READ || scope > STORE_SCOPE_ADMIN)
        return -EINVAL;
    /* A secret must never fall back to anything weaker: no randomness, no
     * token. GRND_NONBLOCK is not used, so this waits for the pool. */
    if (getrandom(secret, sizeof secret, 0) != (ssize_t)sizeof secret)
        return -EIO;
    to_hex(secret, sizeof secret, hex);
    /* An id collision (48 random bits) is a constraint error; try again. */
    for (int attempt = 0; attempt < 4; attempt++) {
        store_new_id('t', id);
        snprintf(token_out, STORE_TOKEN_LEN + 1, TOKEN_PREFIX "%.13s_%.64s", id, hex);
        digest_hex(token_out, dhex);
        /* An EXPIRES_AT of 0 or less stores NULL: the token never expires. */
        rc = store_run(s,
                       "INSERT INTO tokens(id, name, scope, hash, created_at, expires_at) "
                       "VALUES (?1,?2,?3,?4,?5,CASE WHEN ?6 > 0 THEN ?6 END)",
                       "ttttII", id, name ? name : "", store_scope_name(scope), dhex,
                       util_wall_ms(), expires_at);
        if (rc != -EEXIST)
            break;
    }
    if (rc)
        goto out;
    rc = info ? token_get(s, id, info) : 0;
out:
    if (rc)
        memset(token_out, 0, STORE_TOKEN_LEN + 1);
    memset(secret, 0, sizeof secret);
    memset(hex, 0, sizeof hex);
    return rc;
}

int store_token_check(struct store *s, const char *token, char id_out[16], int *scope_out)
{
    static const size_t plen = sizeof TOKEN_PREFIX - 1;
    char id[16];
    sqlite3_stmt *st = NULL;
    /* The shape is checked before anything is looked up, so junk never
     * reaches the database. */
    if (!token || strlen(token) != STORE_TOKEN_LEN || strncmp(token, TOKEN_PREFIX, plen) != 0 ||
        token[plen] != 't' || !is_lower_hex(token + plen + 1, TOKEN_ID_LEN - 1) ||
        token[plen + TOKEN_ID_LEN] != '_' ||
        !is_lower_hex(token + plen + TOKEN_ID_LEN + 1, 2 * TOKEN_SECRET_BYTES))
        return -ENOENT;
    memcpy(id, token + plen, TOKEN_ID_LEN);
    id[TOKEN_ID_LEN] = 0;
    int rc = store_query(
        s, &st, "SELECT hash, scope, expires_at, revoked_at FROM tokens WHERE id = ?", "t", id);
    if (rc || (rc = store_step(s, st)) != 0)
        goto out;
    if (!hash_matches(st, 0, token)) {
        rc = -ENOENT;
        goto out;
    }
    if (sqlite3_column_type(st, 3) != SQLITE_NULL) {
        rc = -EKEYREVOKED;
        goto out;
    }
    if (sqlite3_column_type(st, 2) != SQLITE_NULL &&
        sqlite3_column_int64(st, 2) <= util_wall_ms()) {
        rc = -EKEYEXPIRED;
        goto out;
    }
    int scope = store_scope_parse((const char *)sqlite3_column_text(st, 1));
    if (scope < 0) {
        rc = -EIO;
        goto out;
    }
    snprintf(id_out, 16, "%s", id);
    *scope_out = scope;
    rc = 0;
out:
    sqlite3_finalize(st);
    return rc;
}

int store_token_list(struct store *s, json_t **out)
{
    return store_list_all(s, "SELECT " TOKEN_COLS " FROM tokens ORDER BY created_at DESC, id",
                          token_row, "tokens", out);
}

int store_token_revoke(struct store *s, const char *id)
{
    int rc = store_run(s, "UPDATE tokens SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
                       "tI", id, util_wall_ms());
    if (rc == 0 && sqlite3_changes(s->db) == 0) {
        json_t *t = NULL;
        rc = token_get(s, id, &t);
        json_decref(t);
        rc = rc == 0 ? -EALREADY : rc;
    }
    return rc;
}

int store_job_token(struct store *s, const char *job_id, char id_out[16])
{
    sqlite3_stmt *st = NULL;
    int rc = store_query(s, &st, "SELECT token_id FROM jobs WHERE id = ?", "t", job_id);
    if (rc == 0 && (rc = store_step(s, st)) == 0) {
        const char *t = (const char *)sqlite3_column_text(st, 0);
        snprintf(id_out, 16, "%s", t ? t : "");
    }
    sqlite3_finalize(st);
    return rc;
}

/* ---- attempt tokens: "capd_at_<attempt id>_<64 hex>" ---- */

#define ATOKEN_PREFIX "capd_at_"

int store_attempt_token_create(struct store *s, int64_t attempt_id, int64_t expires_at,
                               char token_out[STORE_ATTEMPT_TOKEN_MAX])
{
    unsigned char secret[TOKEN_SECRET_BYTES];
    char hex[2 * TOKEN_SECRET_BYTES + 1], dhex[65];
    if (attempt_id <= 0 || expires_at <= 0)
        return -EINVAL;
    if (getrandom(secret, sizeof secret, 0) != (ssize_t)sizeof secret)
        return -EIO;
    to_hex(secret, sizeof secret, hex);
    snprintf(token_out, STORE_ATTEMPT_TOKEN_MAX, ATOKEN_PREFIX "%lld_%s", (long long)attempt_id,
             hex);
    digest_hex(token_out, dhex);
    int rc = store_run(s,
                       "INSERT OR REPLACE INTO attempt_tokens(attempt_id, hash, created_at, "
                       "expires_at) VALUES (?1, ?2, ?3, ?4)",
                       "ItII", attempt_id, dhex, util_wall_ms(), expires_at);
    if (rc)
        memset(token_out, 0, STORE_ATTEMPT_TOKEN_MAX);
    memset(secret, 0, sizeof secret);
    memset(hex, 0, sizeof hex);
    return rc;
}

/* The attempt id a token names, or -1 when it is not shaped like one. */
static int64_t atoken_attempt(const char *token)
{
    static const size_t plen = sizeof ATOKEN_PREFIX - 1;
    if (!token || strncmp(token, ATOKEN_PREFIX, plen) != 0)
        return -1;
    const char *p = token + plen, *us = strchr(p, '_');
    if (!us || us == p || us - p > 18 || strlen(us + 1) != 2 * TOKEN_SECRET_BYTES ||
        !is_lower_hex(us + 1, 2 * TOKEN_SECRET_BYTES))
        return -1;
    int64_t id = 0;
    for (; p < us; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        id = id * 10 + (*p - '0');
    }
    return id > 0 ? id : -1;
}

bool store_attempt_token_shaped(const char *token)
{
    return atoken_attempt(token) > 0;
}

int store_attempt_token_check(struct store *s, const char *token, struct store_attempt_ref *out)
{
    sqlite3_stmt *st = NULL;
    int64_t id = atoken_attempt(token);
    if (id <= 0)
        return -ENOENT;
    int rc = store_query(s, &st,
                         "SELECT t.hash, t.expires_at, a.state, a.n, c.id, c.state, c.attempts, "
                         "j.id FROM attempt_tokens t JOIN attempts a ON a.id = t.attempt_id "
                         "JOIN cells c ON c.seq = a.cell_seq JOIN jobs j ON j.seq = c.job_seq "
                         "WHERE t.attempt_id = ?",
                         "I", id);
    if (rc || (rc = store_step(s, st)) != 0)
        goto out;
    if (!hash_matches(st, 0, token)) {
        rc = -ENOENT;
        goto out;
    }
    memset(out, 0, sizeof *out);
    out->attempt_id = id;
    out->attempt = sqlite3_column_int(st, 3);
    snprintf(out->cell_id, sizeof out->cell_id, "%s", (const char *)sqlite3_column_text(st, 4));
    snprintf(out->job_id, sizeof out->job_id, "%s", (const char *)sqlite3_column_text(st, 7));
    snprintf(out->cell_state, sizeof out->cell_state, "%s",
             (const char *)sqlite3_column_text(st, 5));
    /* Open, its cell running this very attempt: anything else has ended. */
    const char *ast = (const char *)sqlite3_column_text(st, 2);
    if (!ast || strcmp(ast, "open") != 0 || !cell_state_is(out->cell_state, CELL_RUNNING) ||
        sqlite3_column_int(st, 6) != out->attempt)
        rc = -ESTALE;
    else if (sqlite3_column_int64(st, 1) <= util_wall_ms())
        rc = -EKEYEXPIRED;
out:
    sqlite3_finalize(st);
    return rc;
}

int store_attempt_slurm_job(struct store *s, int64_t attempt_id, struct store_slurm_job job)
{
    int rc = store_run(s,
                       "UPDATE attempt_tokens SET slurm_job = ?2, slurm_task = nullif(?3, -1) "
                       "WHERE attempt_id = ?1",
                       "III", attempt_id, (int64_t)job.job, (int64_t)job.task);
    return rc ? rc : store_flush(s);
}
