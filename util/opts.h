/*
 * util/opts.h - the long options of a command, from a table.
 *
 * A command describes its options as an array of struct util_opt: each is
 * `--NAME VALUE`, stored as a pointer into argv, or a flag `--NAME` that
 * sets a bool. util_opts_parse() reads them with getopt_long(3) (no short
 * options, no message of its own) and stops at the first option marked
 * `stop` (--help), so what follows it is not judged. A command has at most
 * UTIL_OPTS_MAX options; a longer table is -E2BIG.
 */
#ifndef CAPD_UTIL_OPTS_H
#define CAPD_UTIL_OPTS_H

#include <stdbool.h>
#include <stddef.h>

#define UTIL_OPTS_MAX 16 /* options in one command's table */

struct util_opt {
    const char *name; /* without the leading "--" */
    const char **str; /* takes a value, stored here; or NULL */
    bool *on;         /* a flag, set true here; or NULL */
    bool stop;        /* parsing ends once this option is seen */
};

/* Reads ARGV from index FIRST against the N options of OPTS. 0 when every
 * option was read, 1 when one marked `stop` ended it, -EINVAL with the
 * offending argument in *BAD on an unknown option or a missing value, or
 * -E2BIG when N exceeds UTIL_OPTS_MAX. Uses getopt's global state: the
 * operands left start at optind. */
int util_opts_parse(int argc, char **argv, int first, const struct util_opt *opts, size_t n,
                    const char **bad);

#endif
