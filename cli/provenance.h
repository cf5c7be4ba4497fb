/*
 * cli/provenance.h - build provenance of a source tree, collected by
 * `capctl submit --source-tree DIR` and sent with the job.
 *
 * The classifiers are pure functions over one line of git output, so the
 * rules (docs/capctl.md, "Provenance findings") are unit-tested without a
 * repository. prov_collect() runs git (argv, never a shell: DIR is user
 * input) and applies them to a real tree.
 */
#ifndef CAPD_CLI_PROVENANCE_H
#define CAPD_CLI_PROVENANCE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

enum prov_kind {
    PROV_NONE = 0,
    PROV_GENERATED_SOURCE, /* untracked/ignored *.cpp.<CAP>.cpp dispatch wrapper */
    PROV_STALE_HEADER,     /* untracked/ignored Config.h / CUDAConfig.h under aten/src/ATen/ */
    PROV_DIRTY_SUBMODULE,  /* submodule off its recorded commit, uninitialized, conflicted or
                              modified */
};

/* Hard limits of what is collected and sent; they keep the job request far
 * below the server's default 1 MiB body limit. */
#define PROV_MAX_STATUS_LINES      10000
#define PROV_MAX_STATUS_BYTES      (512u * 1024u)
#define PROV_MAX_SUBMODULE_LINES   1000
#define PROV_MAX_SUBMODULE_BYTES   (128u * 1024u)
#define PROV_MAX_FINDINGS_PER_KIND 25
#define PROV_MAX_LINE              16384
#define PROV_MAX_PATH              4096

struct prov_finding {
    enum prov_kind kind;
    char path[PROV_MAX_PATH];
    char message[PROV_MAX_PATH + 512];
};

/* "generated_source", "stale_header", "dirty_submodule" (NULL for PROV_NONE). */
const char *prov_kind_name(enum prov_kind k);

/* Whether the file name NAME (no directory) is a generated per-CPU-capability
 * dispatch source: STEM.cpp followed by one or more ".CAP.cpp", CAP being an
 * upper-case capability name ([A-Z][A-Z0-9_]*: DEFAULT, AVX2, AVX512, VSX,
 * ZVECTOR, SVE256, ...). *DEPTH (may be NULL) gets how many times it was
 * wrapped: 1 for X.cpp.AVX2.cpp, 2 for X.cpp.DEFAULT.cpp.DEFAULT.cpp
 * (util/cpuwrap.h's rule, which compare/kernels.c shares). */
bool prov_is_generated_source(const char *name, int *depth);

/* Whether PATH (relative to the repository root) is a generated ATen config
 * header: Config.h or CUDAConfig.h anywhere under aten/src/ATen/. */
bool prov_is_stale_header(const char *path);

/* Decodes a path as git prints it: verbatim, or C-quoted ("a\tb", octal
 * escapes) when it has unusual bytes. Parses from S; *END (may be NULL) is
 * set past the path. Returns 0, or -EINVAL for a malformed quote, or
 * -ENAMETOOLONG when the path does not fit in OUT. Unquoted paths run to
 * the end of S, or to STOP when STOP is non-NULL and found. */
int prov_unquote_path(const char *s, const char *stop, char *out, size_t cap, const char **end);

/* Classifies one line of `git status --porcelain=v1` ("XY PATH" or
 * "XY ORIG -> PATH"). SUBMODULES (NSUB paths, may be NULL) are the
 * submodule paths of the tree. Returns 1 and fills *F for a finding, 0 for
 * a line that is not one, -EINVAL for a line that is not porcelain v1. */
int prov_classify_status_line(const char *line, const char *const *submodules, size_t nsub,
                              struct prov_finding *f);

/* Classifies one line of `git submodule status --recursive`
 * ("[ +-U]SHA PATH[ (DESCRIBE)]"). PATH_OUT (may be NULL) gets the
 * submodule's path. Returns 1 and fills *F for a dirty submodule (+, -, U),
 * 0 for a clean one, -EINVAL for a malformed line. */
int prov_classify_submodule_line(const char *line, struct prov_finding *f, char *path_out,
                                 size_t cap);

/* Runs git on DIR and builds the "provenance" object of a job request:
 * {"source_tree","git_toplevel","head","git_status":[...],
 *  "git_status_total","git_status_truncated","submodules":[...],
 *  "findings":[{"kind","path","message"}...],"finding_counts":{...}}.
 * Returns 0 and *OUT, or a negative errno and *ERR (malloc'd sentence). */
int prov_collect(const char *dir, json_t **out, char **err);

/* Sets BODY's commit_time and parents (at most PROV_MAX_PARENTS, capd's
 * limit) from git for COMMIT in DIR; -ENOENT when git does not know it. */
#define PROV_MAX_PARENTS 16
int prov_commit_order(const char *dir, const char *commit, json_t *body);

/* The commits after GOOD up to BAD along BAD's first parents, oldest
 * first (`git rev-list --first-parent --reverse GOOD..BAD` in DIR), for
 * capctl bisect; at most PROV_MAX_REVS (-E2BIG past it). 0 and *OUT, or a
 * negative errno and *ERR. */
#define PROV_MAX_REVS 100000
int prov_rev_list(const char *dir, const char *good, const char *bad, json_t **out, char **err);
#endif
