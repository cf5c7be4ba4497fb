/*
 * daemon/admin/cmd_token.h - `capd token create|list|revoke`: API token
 * administration straight on the database, which is how the first admin
 * token comes to exist. Safe while capd runs (SQLite WAL, busy timeout).
 */
#ifndef CAPD_CMD_TOKEN_H
#define CAPD_CMD_TOKEN_H

/* ARGV[0] is "token". Returns the process exit status: 0, 1 on failure,
 * 2 on bad usage. */
int cmd_token(int argc, char **argv);

#endif
