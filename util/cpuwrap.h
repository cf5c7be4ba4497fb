/*
 * util/cpuwrap.h - the names of PyTorch's per-CPU-capability dispatch
 * wrappers, the one rule that capctl's provenance scan (cli/provenance.c)
 * and the comparison's kernel attribution (compare/kernels.c) both apply.
 *
 * PyTorch's codegen compiles each kernel file of aten/src/ATen/native/cpu/
 * once per capability through a wrapper named FILE.CAP.cpp
 * (Activation.cpp.DEFAULT.cpp, Activation.cpp.AVX2.cpp), CAP being an
 * upper-case capability name, [A-Z][A-Z0-9_]* (DEFAULT, AVX2, AVX512, VSX,
 * ZVECTOR, SVE256, ...). A rebuild over a tree that still holds them wraps
 * them again (Activation.cpp.DEFAULT.cpp.DEFAULT.cpp), so one name may
 * carry several wrappings. Peeling them off gives the kernel file the
 * wrapper compiles; a wrapper is a name that peels at least once and
 * keeps a non-empty stem ending in ".cpp". The rule reads the text alone
 * (a file name, or a path whose directories it leaves as they are) and
 * touches no file.
 */
#ifndef CAPD_UTIL_CPUWRAP_H
#define CAPD_UTIL_CPUWRAP_H

#include <stddef.h>

/* The length of PATH once every trailing ".CAP.cpp" is peeled off
 * (Activation.cpp.DEFAULT.cpp.AVX2.cpp -> the length of Activation.cpp);
 * strlen(PATH) when it is no wrapper. *DEPTH (may be NULL) gets how many
 * wrappings were peeled: 0 for no wrapper, 1 for X.cpp.AVX2.cpp, 2 for
 * X.cpp.DEFAULT.cpp.DEFAULT.cpp. */
size_t util_cpuwrap_peel(const char *path, int *depth);

#endif
