/*
 * cli/kernelmap.h - the kernel map of a PyTorch source tree: which
 * DispatchStub, registered in which file under aten/src/ATen/native/cpu/,
 * each aten operator's CPU function calls.
 *
 * `capctl submit --source-tree DIR` builds it with the provenance scan and
 * sends it as provenance.kernel_map; the comparison prefers it to the table
 * shipped with capd (docs/compare.md, "Kernel attribution"), because it is
 * read from the very tree the build came from. The map is derived from
 * three things (docs/capctl.md, "The kernel map"):
 *
 * - the registrations: REGISTER_DISPATCH(stub, ...) and its arch variants
 *   (ALSO_REGISTER_AVX512_DISPATCH, ...), not the REGISTER_NO_* ones, in
 *   native/cpu/ (every .cpp), generated wrappers left out: stub -> file;
 * - native_functions.yaml: each `- func:` entry's `dispatch:` function for
 *   the CPU key, and `structured_delegate:` (the op runs its delegate's
 *   kernel): op -> CPU functions;
 * - the definitions of those functions in native/ (every .cpp)
 *   (`name(...) {` or `TORCH_IMPL_FUNC(name)(...) {`): the registered stubs
 *   each body calls.
 *
 * An op whose CPU function calls no registered stub directly (BLAS,
 * oneDNN, a helper that calls the stub) is not in the map; the table still
 * names it. The scanner reads C++ as text with comments, literals and
 * preprocessor lines blanked; it is a map of what the tree says, not a
 * compiler's view.
 */
#ifndef CAPD_CLI_KERNELMAP_H
#define CAPD_CLI_KERNELMAP_H

#include <jansson.h>
#include <stddef.h>

#define KMAP_MAX_FILE_BYTES (8u * 1024u * 1024u) /* a larger source file is skipped, counted */
#define KMAP_MAX_FILES      4000                 /* sources read; the rest are skipped, counted */
#define KMAP_MAX_OPS        1000                 /* ops sent; ops_truncated says when cut */
#define KMAP_MAX_DEPTH      1 /* the native tree at DIR or one directory below it */

/* Blanks, in place, what is not code in a C++ source of N bytes: comments,
 * string and character literals and preprocessor lines become spaces
 * (newlines stay), so a commented-out registration is not one. */
void kmap_blank(char *s, size_t n);

/* Adds each stub that blanked source SRC registers to STUBS (object
 * stub -> FILE; the first registration of a stub wins). Returns 0 or
 * -ENOMEM. */
int kmap_registrations(const char *src, const char *file, json_t *stubs);

/* Reads native_functions.yaml text YAML into FNS: object base op name
 * ("gelu") -> array of the CPU functions of its overloads and delegates.
 * Returns 0 or -ENOMEM. */
int kmap_yaml(const char *yaml, json_t *fns);

/* For each function of WANTED (object name -> anything) defined in blanked
 * source SRC, appends the stubs of STUBS its body calls to CALLS (object
 * function -> array of stubs, each once). Returns 0 or -ENOMEM. */
int kmap_calls(const char *src, const json_t *wanted, const json_t *stubs, json_t *calls);

/* Scans the tree whose git top level is TOP. *OUT gets
 * {"format":1,"root","ops":{"aten::gelu":{"kind":"stub","stub","file",
 * "cpu_function"[,"stubs"]}},"ops_total","ops_truncated",
 * "stubs_registered","cpu_functions","files_scanned","files_skipped"
 * [,"note"]}, or NULL when TOP holds no aten/src/ATen/native (at TOP or
 * KMAP_MAX_DEPTH below). Returns 0, or a negative errno and *ERR. */
int kmap_scan(const char *top, json_t **out, char **err);

/* kmap_scan(TOP) into PROV's "kernel_map" (nothing when the tree has no
 * native directory). Returns 0, or a negative errno and *ERR. */
int kmap_attach(json_t *prov, const char *top, char **err);

#endif
