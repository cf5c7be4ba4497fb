/*
 * daemon/child/cellenv.h - the environment a cell of a build gets.
 *
 * One construction for every interpreter capd has started for a cell: the
 * cell's own (daemon/attempt/sup.c) and the control build's timing processes that a
 * paired head cell starts itself (daemon/attempt/reference.h, docs/compare.md
 * "Paired timing").
 */
#ifndef CAPD_CELLENV_H
#define CAPD_CELLENV_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "daemon/config/config.h"

/*
 * The environment of a cell of BUILD (a build row: env) running SPEC
 * (width, options.threads, device_env) in SCRATCH with its spec at
 * SPEC_PATH, as a JSON object of strings. In order of precedence from low
 * to high: the allow-listed part of capd's own, the build's variables, the
 * width's variables, then what capd itself must set (the GPU cell's device,
 * spec path, runner on the path). NULL when out of memory.
 */
json_t *cellenv_object(const struct capd_config *cfg, json_t *build, json_t *spec,
                       const char *scratch, const char *spec_path);

/* ENV (an object of strings) as a NULL-terminated "K=V" array for exec;
 * NULL when out of memory. Free with cellenv_free. */
char **cellenv_strv(json_t *env);
void cellenv_free(char **v);

/* ENV (a NULL-terminated "K=V" array) less the entries DROP is true of,
 * the strings shared and not copied, with SPARE free slots after the kept
 * ones (*KEPT of them) and then room for the NULL, which ends it already.
 * Free the array alone, with free(3); NULL when out of memory. */
char **cellenv_without(char *const *env, bool (*drop)(const char *kv), size_t spare, size_t *kept);

#endif
