/* util/opts.c - see util/opts.h. */
#include "util/opts.h"

#include <errno.h>
#include <getopt.h>

int util_opts_parse(int argc, char **argv, int first, const struct util_opt *opts, size_t n,
                    const char **bad)
{
    struct option lo[UTIL_OPTS_MAX + 1] = {{0}};
    int o;

    if (n > UTIL_OPTS_MAX)
        return -E2BIG;
    for (size_t i = 0; i < n; i++) {
        lo[i].name = opts[i].name;
        lo[i].has_arg = opts[i].str ? required_argument : no_argument;
        lo[i].val = (int)i + 1;
    }
    optind = first;
    opterr = 0;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (o < 1 || (size_t)o > n) {
            *bad = argv[optind - 1];
            return -EINVAL;
        }
        const struct util_opt *opt = &opts[o - 1];
        if (opt->str)
            *opt->str = optarg;
        if (opt->on)
            *opt->on = true;
        if (opt->stop)
            return 1;
    }
    return 0;
}
