/*
 * daemon/cpu/widths.h - the width table (schema/widths.json, compiled in) and
 * the model zoo list (schema/models.json). Both are data, documented in
 * docs/widths.md and docs/runner.md.
 */
#ifndef CAPD_WIDTHS_H
#define CAPD_WIDTHS_H

#include <jansson.h>
#include <stdbool.h>

/* Parses the embedded tables once; safe to call from any thread after the
 * first call has returned (main calls it before starting threads). */
int widths_init(void);

/* The width's environment variables, or NULL for an unknown width. */
json_t *width_env(const char *name);
/* The whole table as compiled in. Borrowed. */
json_t *widths_table(void);
/* The table for GET /v1/widths: every row with runnable_here and missing
 * (the features or arch this host lacks for it). A new reference. */
json_t *widths_table_here(void);
/* Field FIELD of width NAME's row ("isa": the widest instruction level any
 * library may run at it, "effective": the ATen capability the runner must
 * read back; either may be JSON null), or NULL for an unknown width or
 * field. Borrowed. */
json_t *width_field(const char *name, const char *field);
/* The features the width needs on the host ("requires"), or NULL for an
 * unknown width. Borrowed. */
json_t *width_requires(const char *name);
/*
 * Whether this host (daemon/cpu/hostcpu.h, after cpu_features_hide) can run
 * width NAME: its arch is the host's (or "any") and the host has every
 * feature it requires. When not, WHY gets the reason a cell's record
 * carries ("this host's CPU lacks avx512f, avx512bw (needed by width
 * avx512)") and MISSING the bare list ("avx512f,avx512bw", or "arch:ppc64le"
 * for a width of another architecture). An unknown width is not runnable.
 */
bool width_runnable(const char *name, char *why, size_t wlen, char *missing, size_t mlen);
/* The zoo list, for GET /v1/models. Borrowed. */
json_t *models_table(void);
bool model_in_zoo(const char *name);

#endif
