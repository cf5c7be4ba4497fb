/*
 * tests/helpers/common/gelu.h - the gelumlp user model and its control and
 * perturbed-GELU builds (tests/helpers/common/gelu.c), for the tests at
 * granularity op. Each call fails the running test when capd refuses.
 */
#ifndef CAPD_TESTS_GELU_H
#define CAPD_TESTS_GELU_H

#include <jansson.h>

#include "tests/helpers/common/testutil.h"

/* How long one job of gelumlp cells may take. */
#define GELU_JOB_S 900

/* A job of gelumlp at WIDTH, forward, granularity op, 2 iterations, of
 * BUILD at COMMIT with CONTROL (may be NULL) and PROVENANCE (a JSON
 * object's text, or NULL); its id (malloc'd). */
char *gelu_submit(struct tu_capd *c, const char *build, const char *commit, const char *control,
                  const char *width, const char *provenance);
/* The same of MODEL: "gelumlp:noisy" is fc1 then a module that scales its
 * input by a factor read from the clock, different in every run. */
char *gelu_submit_model(struct tu_capd *c, const char *model, const char *build, const char *commit,
                        const char *control, const char *width, const char *provenance);
/* The same with OPTIONS (more "name":value pairs of the job's options,
 * after iterations 2 and warmup 0) in place of granularity op and replay
 * off. */
char *gelu_submit_opts(struct tu_capd *c, const char *model, const char *build, const char *commit,
                       const char *control, const char *width, const char *provenance,
                       const char *options);
/* Starts C with the builds "control" and "gelu" of interpreter PYTHON
 * (EXTRA_ENV: more "name":"value" pairs for gelu's env, or ""); the widest
 * width the host runs, where gelu's GELU is perturbed. */
const char *gelu_start(struct tu_capd *c, const char *python, const char *extra_env);
/* gelu_start, then a control job (commit C1) and a job of the gelu build
 * (C2) paired with it, both waited for; returns the width. */
const char *gelu_pair(struct tu_capd *c, const char *python, const char *extra_env, const char *c1,
                      const char *c2, char **j1, char **j2);
/* GETs PATH of C, which must answer 200, and returns the reply's cell of
 * gelumlp:factory at WIDTH, forward, which must be there; *RESULT owns
 * the reply. */
json_t *gelu_cell(const struct tu_capd *c, const char *path, const char *width, json_t **result);

#endif
