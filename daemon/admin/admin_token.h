/*
 * daemon/admin/admin_token.h - the first admin token of a new data dir.
 *
 * With auth_required (the default), a capd whose database holds no token at
 * all creates an admin token at start-up, stores only its hash (the token
 * store of `capd token create`), and writes the secret, alone on a line, to
 * DATA/admin.token: mode 0600, owned by capd's user, written to a temporary
 * file and renamed so a reader never sees half a token. The log gets the
 * path and the token id, never the secret. capctl reads the file when it
 * can (docs/capctl.md), so local use needs no manual step.
 *
 * While any token that is not revoked exists nothing is created: an
 * operator who ran `capd token create` before the first start, or who
 * deleted the file after copying the token elsewhere, keeps exactly the
 * tokens they made. (A database whose every token is revoked gets a new
 * file, as a new one would: capd is otherwise unusable.)
 */
#ifndef CAPD_ADMIN_TOKEN_H
#define CAPD_ADMIN_TOKEN_H

#include "daemon/config/config.h"

/* The file's name inside the data dir. */
#define ADMIN_TOKEN_FILE "admin.token"

/* Creates the token and its file when C->auth_required and the database
 * holds no token that is not revoked. 0 (also when there was nothing to do), or a negative
 * errno with *err set (malloc'd). */
int admin_token_bootstrap(const struct capd_config *c, char **err);

#endif
