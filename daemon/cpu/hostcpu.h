/*
 * daemon/cpu/hostcpu.h - the host's CPU as capd sees it: its architecture, its
 * model name, its core count and the instruction-set features that decide
 * which widths (schema/widths.json "requires") a cell may run at here.
 *
 * Read once at start (hostcpu_init, before any thread): on x86 from CPUID,
 * with XGETBV for the register state the kernel enabled (a CPU that has
 * AVX-512 under a kernel that did not turn on its state cannot run it), and
 * cross-checked with the "flags" line of /proc/cpuinfo: a feature counts only
 * when both say so, because the kernel clears flags it disabled
 * (clearcpuid=, a hypervisor's mask) while CPUID may still report them. On
 * other architectures from the auxiliary vector and /proc/cpuinfo.
 *
 * Feature names are the kernel's /proc/cpuinfo spellings (avx2, fma,
 * avx512f, avx512bw, avx512vl, avx512dq, ...), so the runner's own check in
 * the child (runner/capd_runner/width.py) and a user reading
 * /proc/cpuinfo use the same words.
 *
 * cpu_features_hide (docs/configuration.md) removes named features from
 * capd's view after they are read: a host may be capped below what it has,
 * and a test on an AVX-512 host can take the "host lacks it" path. A name
 * that is not a known feature is an error, so a typo cannot silently hide
 * nothing.
 *
 * Thread safety: read-only after hostcpu_init returns.
 */
#ifndef CAPD_HOSTCPU_H
#define CAPD_HOSTCPU_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* Longest comma-separated feature list hostcpu_init takes (config key). */
#define HOSTCPU_MAX_HIDE 256

/*
 * Reads the host CPU and applies HIDE (comma-separated feature names, may be
 * NULL or empty). Logs what it read. Calling it again re-reads (tests).
 * -EINVAL with *err set (malloc'd) when HIDE names an unknown feature.
 */
int hostcpu_init(const char *hide, char **err);

/* Whether the host offers FEATURE (after hiding). */
bool hostcpu_has(const char *feature);

/* The machine name uname(2) reports (x86_64, aarch64, ppc64le, s390x). */
const char *hostcpu_arch(void);

/*
 * Appends to BUF the features of REQUIRES (a JSON array of names) this host
 * lacks, comma-separated ("avx512f, avx512bw"); BUF is "" when none is
 * missing. Returns the number missing.
 */
int hostcpu_missing(const json_t *requires, char *buf, size_t len);

/*
 * The host document for GET /v1/host: arch, model, cores (online and usable
 * by capd), features (every known feature and whether the host has it),
 * hidden (what cpu_features_hide removed) and source (how they were read).
 * A new reference.
 */
json_t *hostcpu_json(void);

#endif
