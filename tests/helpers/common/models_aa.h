/*
 * tests/helpers/common/models_aa.h - what the suites of real framework
 * builds share (tests/test_models.c on Debian's torch, tests/test_official.c
 * on the official wheel): registering an interpreter as a build with the
 * example models of examples/models, the widths this host runs, and the
 * A/A run of third-party model code, whose every cell must end ok and whose
 * two runs must compare identical or nondeterministic with no outcome
 * change. Each call fails the running Criterion test on a miss.
 */
#ifndef CAPD_TESTS_MODELS_AA_H
#define CAPD_TESTS_MODELS_AA_H

#include <jansson.h>
#include <stddef.h>

#include "tests/helpers/common/testutil.h"

/* Registers PYTHON as build NAME on capd C, with examples/models of the
 * source tree as its model root; fails the test unless capd answers 201. */
void ma_register(const struct tu_capd *c, const char *name, const char *python);
/* The widths of default, avx2, avx512 that capd says this host runs, as the
 * contents of a JSON list ("\"default\",\"avx2\"") in BUF of SIZE bytes;
 * returns how many (at least one: the test fails otherwise). */
size_t ma_runnable_widths(const struct tu_capd *c, char *buf, size_t size);
/* Posts a job of MODELS × WIDTHS (contents of JSON lists) × forward and
 * backward on build BUILD of capd C, for COMMIT against CONTROL (or NULL),
 * with OPTIONS (a JSON object); returns its id (owned). */
char *ma_submit(const struct tu_capd *c, const char *build, const char *models, const char *widths,
                const char *commit, const char *control, const char *options);
/* The same for a job of MODELS × WIDTHS × forward in MODES (the contents
 * of a JSON list), numerics only (iterations 0), judged by the float64
 * reference (capture sample), with the members EXTRA adds to its options
 * ("" or ",\"replay\":\"off\""); waits for it (900 s at most) and returns
 * the finished job (owned). */
json_t *ma_modes_job(const struct tu_capd *c, const char *build, const char *models,
                     const char *widths, const char *modes, const char *commit, const char *control,
                     const char *extra);
/* On build BUILD of capd C: MODELS (the contents of a JSON list, N_MODELS
 * of them) at every width this host runs, forward and backward, once as
 * commit aaaa001 and again as aaaa002 against it. Checks that every cell
 * ends ok with its memory limit, peak and CPU time on the record, and that
 * the comparison of the two (perf gate off: timings are not the question)
 * passes with every cell identical or nondeterministic and no outcome
 * regression. */
void ma_models_aa(const struct tu_capd *c, const char *build, const char *models, size_t n_models);

#endif
