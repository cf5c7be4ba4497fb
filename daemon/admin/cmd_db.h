/*
 * daemon/admin/cmd_db.h - `capd db backup|vacuum|prune`: database care straight
 * on the database (docs/operations.md). Backup and prune are safe while
 * capd runs; vacuum refuses while cells run unless forced.
 */
#ifndef CAPD_CMD_DB_H
#define CAPD_CMD_DB_H

/* ARGV[0] is "db". Returns the process exit status: 0, 1 on failure,
 * 2 on bad usage. */
int cmd_db(int argc, char **argv);

#endif
