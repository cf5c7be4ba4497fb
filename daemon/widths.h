/*
 * daemon/widths.h - the width table (schema/widths.json, compiled in) and
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
/* The whole table, for GET /v1/widths. Borrowed. */
json_t *widths_table(void);
/* The zoo list, for GET /v1/models. Borrowed. */
json_t *models_table(void);
bool model_in_zoo(const char *name);

#endif
