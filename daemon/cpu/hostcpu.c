/*
 * daemon/cpu/hostcpu.c - reading the host CPU's features (daemon/cpu/hostcpu.h).
 */
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/utsname.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__aarch64__)
#include <sys/prctl.h>
#endif

#include "daemon/cpu/hostcpu.h"
#include "util/log.h"
#include "util/err.h"

/* Every feature a width may require, with the architecture it belongs to. */
static const struct feature {
    const char *name;
    const char *arch;
} features[] = {
    {"sse4_1", "x86_64"},      {"sse4_2", "x86_64"},   {"avx", "x86_64"},
    {"fma", "x86_64"},         {"f16c", "x86_64"},     {"avx2", "x86_64"},
    {"avx512f", "x86_64"},     {"avx512dq", "x86_64"}, {"avx512cd", "x86_64"},
    {"avx512bw", "x86_64"},    {"avx512vl", "x86_64"}, {"avx512_vnni", "x86_64"},
    {"avx512_bf16", "x86_64"}, {"amx_tile", "x86_64"}, {"amx_bf16", "x86_64"},
    {"amx_int8", "x86_64"},    {"vsx", "ppc64le"},     {"vxe", "s390x"},
    {"sve", "aarch64"},        {"sve256", "aarch64"},
};
#define NFEAT (sizeof features / sizeof features[0])

static struct {
    bool have[NFEAT];     /* what the host offers, after hiding */
    bool hidden[NFEAT];   /* removed by cpu_features_hide */
    bool disagree[NFEAT]; /* CPUID says yes, /proc/cpuinfo does not */
    char arch[sizeof(((struct utsname *)0)->machine)];
    char model[128];
    long cores_online, cores_usable;
    const char *source;
} host;

static int feature_index(const char *name, size_t len)
{
    for (size_t i = 0; i < NFEAT; i++)
        if (strlen(features[i].name) == len && memcmp(features[i].name, name, len) == 0)
            return (int)i;
    return -1;
}

static void set_have(const char *name, bool v)
{
    int i = feature_index(name, strlen(name));
    if (i >= 0)
        host.have[i] = v;
}

#if defined(__x86_64__) || defined(__i386__)
static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

/*
 * CPUID leaves 1 and 7, each AVX-class feature only when XCR0 says the
 * kernel saves its registers: YMM state (bits 1-2) for AVX, AVX2, FMA and
 * F16C; opmask and ZMM state (bits 5-7) as well for AVX-512; tile
 * configuration and data state (bits 17-18) as well for AMX.
 */
static void read_cpuid(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    uint64_t xcr0 = (c >> 27 & 1) ? xgetbv0() : 0;
    bool ymm = (xcr0 & 0x6) == 0x6, zmm = ymm && (xcr0 & 0xe0) == 0xe0;
    bool tiles = zmm && (xcr0 & 0x60000) == 0x60000;
    set_have("sse4_1", c >> 19 & 1);
    set_have("sse4_2", c >> 20 & 1);
    set_have("fma", ymm && (c >> 12 & 1));
    set_have("avx", ymm && (c >> 28 & 1));
    set_have("f16c", ymm && (c >> 29 & 1));
    if (__get_cpuid_max(0, NULL) < 7)
        return;
    __cpuid_count(7, 0, a, b, c, d);
    unsigned subleaves = a;
    set_have("avx2", ymm && (b >> 5 & 1));
    set_have("avx512f", zmm && (b >> 16 & 1));
    set_have("avx512dq", zmm && (b >> 17 & 1));
    set_have("avx512cd", zmm && (b >> 28 & 1));
    set_have("avx512bw", zmm && (b >> 30 & 1));
    set_have("avx512vl", zmm && (b >> 31 & 1));
    set_have("avx512_vnni", zmm && (c >> 11 & 1));
    set_have("amx_bf16", tiles && (d >> 22 & 1));
    set_have("amx_tile", tiles && (d >> 24 & 1));
    set_have("amx_int8", tiles && (d >> 25 & 1));
    if (subleaves >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        set_have("avx512_bf16", zmm && (a >> 5 & 1));
    }
    host.source = "cpuid+xgetbv, cross-checked with /proc/cpuinfo flags";
}
#else
/* The auxiliary vector's hardware capabilities, where the kernel puts the
 * vector units of these architectures. */
static void read_cpuid(void)
{
    unsigned long hw = getauxval(AT_HWCAP);
    (void)hw;
#if defined(__aarch64__)
    bool sve = hw & (1UL << 22); /* HWCAP_SVE */
    set_have("sve", sve);
#ifdef PR_SVE_GET_VL
    int vl = sve ? prctl(PR_SVE_GET_VL) : -1;
    set_have("sve256", vl >= 0 && (vl & 0xffff) >= 32);
#endif
#elif defined(__powerpc64__)
    set_have("vsx", hw & 0x00000080UL); /* PPC_FEATURE_HAS_VSX */
#elif defined(__s390x__)
    set_have("vxe", hw & 8192UL); /* HWCAP_S390_VXE */
#endif
    host.source = "getauxval(AT_HWCAP)";
}
#endif

/* The first processor's model name and flags from /proc/cpuinfo. On x86 a
 * feature CPUID reported but the flags lack is dropped (and remembered). */
static void read_proc_cpuinfo(void)
{
    FILE *f = fopen("/proc/cpuinfo", "re");
    char *line = NULL;
    size_t cap = 0;
    bool flags_seen = false;
    bool listed[NFEAT] = {false};
    while (f && getline(&line, &cap, f) > 0) {
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        size_t klen = strcspn(line, "\t:");
        char *v = colon + 1 + strspn(colon + 1, " \t");
        v[strcspn(v, "\n")] = 0;
        if (!host.model[0] && ((klen == 10 && strncmp(line, "model name", 10) == 0) ||
                               (klen == 3 && strncmp(line, "cpu", 3) == 0)))
            snprintf(host.model, sizeof host.model, "%s", v);
        if (!flags_seen && klen == 5 && strncmp(line, "flags", 5) == 0) {
            flags_seen = true;
            for (char *tok = strtok(v, " "); tok; tok = strtok(NULL, " ")) {
                int i = feature_index(tok, strlen(tok));
                if (i >= 0)
                    listed[i] = true;
            }
        }
    }
    free(line);
    if (f)
        fclose(f);
#if defined(__x86_64__) || defined(__i386__)
    for (size_t i = 0; flags_seen && i < NFEAT; i++) {
        if (host.have[i] && !listed[i]) {
            host.have[i] = false;
            host.disagree[i] = true;
        }
    }
    if (!flags_seen)
        host.source = "cpuid+xgetbv (no flags line in /proc/cpuinfo)";
#else
    (void)listed;
#endif
}

static int apply_hide(const char *hide, char **err)
{
    for (const char *p = hide; p && *p;) {
        p += strspn(p, ", ");
        size_t len = strcspn(p, ", ");
        if (!len)
            break;
        int i = feature_index(p, len);
        if (i < 0) {
            char known[512] = "";
            for (size_t k = 0; k < NFEAT; k++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", k ? ", " : "",
                         features[k].name);
            return util_errf(err, -EINVAL,
                             "cpu_features_hide: unknown CPU feature '%.*s' (known: %s)", (int)len,
                             p, known);
        }
        host.hidden[i] = true;
        host.have[i] = false;
        p += len;
    }
    return 0;
}

static void log_host(void)
{
    char have[512] = "", hidden[256] = "", dis[256] = "";
    for (size_t i = 0; i < NFEAT; i++) {
        char *b = host.have[i] ? have : host.hidden[i] ? hidden : host.disagree[i] ? dis : NULL;
        size_t sz = b == have ? sizeof have : b == hidden ? sizeof hidden : sizeof dis;
        if (b)
            snprintf(b + strlen(b), sz - strlen(b), "%s%s", *b ? "," : "", features[i].name);
    }
    log_info("host_cpu", "arch=%s model=%s cores=%ld usable=%ld features=%s hidden=%s source=%s",
             host.arch, log_q(host.model), host.cores_online, host.cores_usable, log_q(have),
             log_q(hidden), log_q(host.source));
    if (dis[0])
        log_warn("host_cpu_disagrees",
                 "cpuid_only=%s (CPUID reports them, /proc/cpuinfo does not: the kernel "
                 "disabled them; capd treats them as absent)",
                 log_q(dis));
}

int hostcpu_init(const char *hide, char **err)
{
    memset(&host, 0, sizeof host);
    struct utsname u;
    snprintf(host.arch, sizeof host.arch, "%s", uname(&u) == 0 ? u.machine : "unknown");
    host.source = "none";
    read_cpuid();
    read_proc_cpuinfo();
    host.cores_online = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    host.cores_usable =
        sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : host.cores_online;
    int rc = apply_hide(hide, err);
    if (rc == 0)
        log_host();
    return rc;
}

bool hostcpu_has(const char *feature)
{
    int i = feature ? feature_index(feature, strlen(feature)) : -1;
    return i >= 0 && host.have[i];
}

const char *hostcpu_arch(void)
{
    return host.arch;
}

int hostcpu_missing(const json_t *requires, char *buf, size_t len)
{
    size_t i;
    json_t *f;
    int n = 0;
    if (len)
        buf[0] = 0;
    json_array_foreach(requires, i, f)
    {
        const char *name = json_string_value(f);
        if (hostcpu_has(name))
            continue;
        size_t used = strlen(buf);
        if (used < len)
            snprintf(buf + used, len - used, "%s%s", n ? ", " : "", name ? name : "?");
        n++;
    }
    return n;
}

json_t *hostcpu_json(void)
{
    json_t *feat = json_object(), *hidden = json_array(), *dis = json_array();
    for (size_t i = 0; i < NFEAT; i++) {
        if (strcmp(features[i].arch, host.arch) != 0)
            continue;
        json_object_set_new(feat, features[i].name, json_boolean(host.have[i]));
        if (host.hidden[i])
            json_array_append_new(hidden, json_string(features[i].name));
        if (host.disagree[i])
            json_array_append_new(dis, json_string(features[i].name));
    }
    return json_pack("{s:s,s:s,s:I,s:I,s:o,s:o,s:o,s:s}", "arch", host.arch, "model", host.model,
                     "cores_online", (json_int_t)host.cores_online, "cores_usable",
                     (json_int_t)host.cores_usable, "features", feat, "hidden", hidden,
                     "cpuid_only", dis, "source", host.source);
}
