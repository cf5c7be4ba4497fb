/*
 * storage/options.h - a job's cell options, typed. schema/options.json is
 * their one table (ranges, defaults, docs); the build turns it into
 * options_gen.h (cmake/options.cmake), from which struct cell_options and
 * its defaults come, so no default is written anywhere else. The API
 * validates a job against the table and stores every option resolved
 * (api/api_options.c); storage reads them back into this struct once,
 * when a cell is claimed (store_cell_run.opts), and the scheduler, the
 * executors and the spec writer read the struct.
 *
 * memory_max_bytes is no row of the table (it is bounded by the host's
 * cell_memory_max_bytes, checked by its own code): 0 when the job sets
 * none.
 */
#ifndef CAPD_STORAGE_OPTIONS_H
#define CAPD_STORAGE_OPTIONS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "options_gen.h"

struct cell_options {
#define X(name, lo, hi, def, text) int64_t name;
    CAPD_OPTIONS_INT(X)
#undef X
#define X(name, def, values) char name[CAPD_OPTION_ENUM_MAX];
    CAPD_OPTIONS_ENUM(X)
#undef X
    int64_t memory_max_bytes;
};

/* The table's defaults into OUT. */
void cell_options_defaults(struct cell_options *out);

/*
 * OPTIONS (a stored job's "options" object; NULL reads as {}) into OUT:
 * each option as stored, an option missing or of the wrong type (a job
 * stored before the option existed) as the table's default, an enum
 * value too long for its array as its default too (the API only stores
 * the table's values).
 */
void cell_options_read(const json_t *options, struct cell_options *out);

#endif
