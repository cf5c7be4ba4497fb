/*
 * compare/environment.c - what else differs between the control and the head:
 * the runners' fingerprints, field by field.
 *
 * A fingerprint (docs/runner.md, "The env fingerprint") is flattened once,
 * when storage hands it in, into named fields with a group and a rank: the
 * torch version, each line of torch.__config__.show() and each of its build
 * settings, the library and thread lines of parallel_info, the CPU, the
 * allow-listed environment variables, the interpreter, the runner. Cells of a
 * side share the flattened copy of an equal fingerprint, so a comparison
 * diffs each distinct (control, head) pair of fingerprints once, however many
 * cells share it.
 *
 * The result lists the fields whose values differ, in the order a reviewer
 * should suspect them of changing the numbers: build configuration and
 * libraries first, then threads and the CPU, then the environment, the
 * interpreter and the runner. Within one side, cells whose interpreter, torch
 * or CPU disagree break the comparison's premise (one build on one machine)
 * and are flagged. Credential-like variables never reach the result: their
 * values are kept as a digest only, enough to say "changed".
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmp_int.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/*
 * Where a field belongs, by its name: exact names, or prefixes ending in
 * ".*". The rank is the table order, so the table reads as the ordering
 * rule. Lines of the build configuration and parallel_info are classified
 * again by what they name (see line_group).
 */
static const struct rule {
    const char *pattern;
    enum cmp__envgroup group;
} rules[] = {
    {"torch.version", G_BUILD},
    {"torch.git_version", G_BUILD},
    {"torch.debug", G_BUILD},
    {"torch.cuda", G_BUILD},
    {"torch.hip", G_BUILD},
    /* The libraries a GEMM or a factorization calls lead their group. */
    {"build_settings.BLAS_INFO", G_LIBS},
    {"build_settings.LAPACK_INFO", G_LIBS},
    /* What each library ran, as the runner read it back (docs/runner.md). */
    {"libraries.blas.*", G_LIBS},
    {"libraries.lapack.*", G_LIBS},
    {"libraries.onednn.*", G_LIBS},
    {"libraries.*", G_LIBS},
    {"build.*", G_BUILD},
    {"build_settings.*", G_BUILD},
    {"torch.cudnn", G_LIBS},
    {"torch.mkldnn", G_LIBS},
    {"torch.*", G_BUILD},
    {"torchvision", G_LIBS},
    {"parallel.*", G_THREADS},
    {"threads.*", G_THREADS},
    {"cpu.model", G_CPU},
    {"cpu.flags", G_CPU},
    {"cpu.*", G_CPU},
    {"cpu_capability", G_CPU},
    {"cpu_capability_raw", G_CPU},
    {"byteorder", G_CPU},
    {"device.*", G_CPU},
    {"env.*", G_ENV},
    {"python.*", G_PYTHON},
    {"platform", G_PYTHON},
    {"runner", G_RUNNER},
    {"stats_engine.*", G_RUNNER},
};

#define ORDER_STEP 10000 /* ranks of one rule: room for every line of a text */

/* Words that make a variable's value a credential, wherever they appear in its name. */
static const char *const secret_words[] = {"TOKEN",      "KEY",  "SECRET",  "PASSWORD", "PASSWD",
                                           "CREDENTIAL", "AUTH", "PRIVATE", "COOKIE"};

/* Names that libraries' lines of the build configuration carry. */
static const char *const lib_words[] = {"BLAS",   "LAPACK", "MKL",    "DNN",         "OPENMP",
                                        "NNPACK", "FBGEMM", "EIGEN",  "MATH KERNEL", "ONEAPI",
                                        "MAGMA",  "CUDNN",  "CUBLAS", "CUSPARSE"};

/*
 * Fields that must agree between all cells of one side: a different
 * interpreter, torch or CPU within a job means the job is not one build on
 * one machine. Width-dependent fields (the capability, its variables, the
 * device) legitimately differ between cells and are not among them.
 */
const char *const cmp__env_premise_fields[] = {
    "python.executable",
    "python.version",
    "python.implementation",
    "torch.version",
    "torch.git_version",
    "cpu.model",
    "cpu.flags",
    "cpu.machine",
    "platform",
    "runner",
};

const size_t cmp__env_n_premise_fields = NELEM(cmp__env_premise_fields);

const char *const cmp__env_group_names[] = {"build",       "libraries", "threads", "cpu",
                                            "environment", "python",    "runner",  "other"};

/* ------------------------------------------------------------- helpers */

static bool has_word(const char *s, const char *w)
{
    size_t n = strlen(w);
    for (; *s; s++)
        if (strncasecmp(s, w, n) == 0)
            return true;
    return false;
}

static bool any_word(const char *s, const char *const *words, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (has_word(s, words[i]))
            return true;
    return false;
}

/* A URL with a password in it ("https://user:pw@host/") is a credential too. */
static bool value_has_userinfo(const char *v)
{
    for (const char *p = strstr(v, "://"); p != NULL; p = strstr(p + 3, "://")) {
        const char *host = p + 3;
        size_t n = strcspn(host, "/@ :");
        if (host[n] == ':' && host[n + 1 + strcspn(host + n + 1, "/@ ")] == '@')
            return true;
    }
    return false;
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* A copy of at most CMP_MAX_ENV_VALUE bytes, cut on a UTF-8 boundary. */
static char *value_copy(const char *v, size_t n)
{
    static const char cut[] = " [cut]";
    bool over = n >= CMP_MAX_ENV_VALUE;
    if (over) {
        n = CMP_MAX_ENV_VALUE - sizeof(cut);
        while (n > 0 && ((unsigned char)v[n] & 0xC0) == 0x80)
            n--;
    }
    char *out = malloc(n + sizeof(cut));
    if (out == NULL)
        return NULL;
    memcpy(out, v, n);
    if (over)
        memcpy(out + n, cut, sizeof(cut));
    else
        out[n] = '\0';
    return out;
}

static void classify(const char *name, unsigned *group, unsigned *order)
{
    for (size_t i = 0; i < NELEM(rules); i++) {
        const char *p = rules[i].pattern;
        size_t n = strlen(p);
        bool prefix = n > 2 && strcmp(p + n - 2, ".*") == 0;
        if (prefix ? strncmp(name, p, n - 1) == 0 : strcmp(name, p) == 0) {
            *group = rules[i].group;
            *order = (unsigned)(i * ORDER_STEP);
            return;
        }
    }
    *group = G_OTHER;
    *order = (unsigned)(NELEM(rules) * ORDER_STEP);
}

/* ------------------------------------------------------------ flattening */

/*
 * Appends a field. sub is the line's index within its text (0 otherwise);
 * group_override, when not negative, replaces the rule's group.
 */
static int add_field(struct cmp__fp *fp, const char *name, const char *value, size_t vlen, int sub,
                     int group_override)
{
    if (strlen(name) >= CMP_MAX_ENV_NAME)
        return 0; /* no rule names such a field: leave it out */
    int rc = cmp__grow((void **)&fp->f, &fp->cap, fp->n + 1, sizeof(*fp->f), CMP_MAX_ENV_FIELDS);
    if (rc)
        return rc;
    struct cmp__envf *f = &fp->f[fp->n];
    memset(f, 0, sizeof(*f));
    classify(name, &f->group, &f->order);
    f->order += (unsigned)(sub < ORDER_STEP ? sub : ORDER_STEP - 1);
    if (group_override >= 0)
        f->group = (unsigned)group_override;
    f->secret =
        strncmp(name, "env.", 4) == 0 &&
        (any_word(name + 4, secret_words, NELEM(secret_words)) || value_has_userinfo(value));
    f->name = strdup(name);
    if (f->secret) {
        char digest[24];
        snprintf(digest, sizeof digest, "#%016llx", (unsigned long long)fnv1a(value));
        f->value = strdup(digest);
    } else {
        f->value = value_copy(value, vlen);
    }
    if (f->name == NULL || f->value == NULL) {
        free(f->name);
        free(f->value);
        return -ENOMEM;
    }
    fp->n++;
    return 0;
}

/* "GCC 12.2" names "GCC"; "Intel(R) MKL-DNN v2.6.3 (Git Hash N/A)" names
 * "Intel(R) MKL-DNN": the words before the first version-like word. */
static size_t line_key_len(const char *s)
{
    static const char *const stops[] = {"is", "not", "Version", "version", "for"};
    size_t i = 0, end = 0;
    while (s[i]) {
        size_t j = i;
        while (s[j] && s[j] != ' ')
            j++;
        const char *w = s + i;
        size_t wl = j - i;
        bool stop = isdigit((unsigned char)w[0]) || w[0] == '(' ||
                    (w[0] == 'v' && wl > 1 && isdigit((unsigned char)w[1]));
        for (size_t k = 0; !stop && k < NELEM(stops); k++)
            stop = strlen(stops[k]) == wl && strncmp(w, stops[k], wl) == 0;
        if (stop && end > 0)
            break;
        end = j;
        for (i = j; s[i] == ' ';)
            i++;
    }
    return end;
}

/*
 * A line's field: "key : value" and "key: value" name themselves (kv);
 * any other line is named by its leading words and keeps its whole text.
 * A name the text already used gets " #2", " #3"...
 */
static int add_line(struct cmp__fp *fp, const char *prefix, char *line, int sub, bool *kv,
                    int (*group_of)(const char *key, bool kv))
{
    char name[CMP_MAX_ENV_NAME];
    const char *key = line, *value = line;
    size_t klen;
    char *sep = strstr(line, " : ");
    size_t seplen = 3;
    if (sep == NULL) {
        sep = strstr(line, ": ");
        seplen = 2;
    }
    *kv = sep != NULL;
    if (sep != NULL) {
        klen = (size_t)(sep - line);
        value = sep + seplen;
    } else {
        klen = line_key_len(line);
    }
    while (klen > 0 && line[klen - 1] == ' ')
        klen--;
    if (klen == 0 || klen >= sizeof(name) - strlen(prefix) - 8)
        return 0;
    char keybuf[CMP_MAX_ENV_NAME];
    snprintf(keybuf, sizeof keybuf, "%.*s", (int)klen, key);
    snprintf(name, sizeof name, "%s%s", prefix, keybuf);
    for (int dup = 2;; dup++) {
        bool seen = false;
        for (size_t i = 0; i < fp->n && !seen; i++)
            seen = strcmp(fp->f[i].name, name) == 0;
        if (!seen)
            break;
        if (snprintf(name, sizeof name, "%s%s #%d", prefix, keybuf, dup) >= (int)sizeof name)
            return 0;
    }
    return add_field(fp, name, value, strlen(value), sub, group_of(keybuf, *kv));
}

static int config_group(const char *key, bool kv)
{
    (void)kv;
    if (has_word(key, "CPU capability"))
        return G_CPU;
    return any_word(key, lib_words, NELEM(lib_words)) ? G_LIBS : G_BUILD;
}

static int parallel_group(const char *key, bool kv)
{
    if (kv)
        return G_THREADS;
    return any_word(key, lib_words, NELEM(lib_words)) ? G_LIBS : G_THREADS;
}

/* "Build settings: BLAS_INFO=open, CXX_FLAGS=-O2 -g, USE_OPENMP=ON, " */
static int add_settings(struct cmp__fp *fp, const char *s, int sub)
{
    int rc = 0;
    while (rc == 0 && *s) {
        while (*s == ' ' || *s == ',')
            s++;
        size_t k = 0;
        while (isupper((unsigned char)s[k]) || isdigit((unsigned char)s[k]) || s[k] == '_')
            k++;
        if (k == 0 || s[k] != '=' || k >= CMP_MAX_ENV_NAME - 16)
            return 0; /* not a setting: the rest of the line is not ours to guess */
        const char *v = s + k + 1, *end = NULL;
        for (const char *q = strstr(v, ", "); q != NULL && end == NULL; q = strstr(q + 1, ", ")) {
            size_t m = 0;
            while (isupper((unsigned char)q[2 + m]) || isdigit((unsigned char)q[2 + m]) ||
                   q[2 + m] == '_')
                m++;
            if (m > 0 && q[2 + m] == '=')
                end = q;
        }
        size_t vlen = end ? (size_t)(end - v) : strlen(v);
        while (vlen > 0 && (v[vlen - 1] == ',' || v[vlen - 1] == ' '))
            vlen--;
        char name[CMP_MAX_ENV_NAME];
        snprintf(name, sizeof name, "build_settings.%.*s", (int)k, s);
        int group = any_word(name + 15, lib_words, NELEM(lib_words)) ? G_LIBS : G_BUILD;
        rc = add_field(fp, name, v, vlen, sub, group);
        s = end ? end : v + strlen(v);
    }
    return rc;
}

/*
 * torch.__config__.show() and parallel_info() as fields: one per line, the
 * build settings one per setting. Header lines ("PyTorch built with:",
 * "ATen/Parallel:") name nothing and are skipped.
 */
static int add_text(struct cmp__fp *fp, const char *text, bool config)
{
    int rc = 0, sub = 0;
    char *copy = strdup(text), *save = NULL;
    if (copy == NULL)
        return -ENOMEM;
    for (char *line = strtok_r(copy, "\n", &save); line != NULL && rc == 0;
         line = strtok_r(NULL, "\n", &save)) {
        while (*line == ' ' || *line == '\t')
            line++;
        if (line[0] == '-' && line[1] == ' ')
            line += 2;
        size_t n = strlen(line);
        while (n > 0 && (line[n - 1] == ' ' || line[n - 1] == '\r' || line[n - 1] == '\t'))
            line[--n] = '\0';
        if (n == 0 || line[n - 1] == ':')
            continue;
        sub++;
        bool kv;
        if (config && strncmp(line, "Build settings:", 15) == 0)
            rc = add_settings(fp, line + 15, sub);
        else
            rc = add_line(fp, config ? "build." : "parallel.", line, sub, &kv,
                          config ? config_group : parallel_group);
    }
    free(copy);
    return rc;
}

static int add_json(struct cmp__fp *fp, const char *name, const json_t *v)
{
    if (json_is_string(v))
        return add_field(fp, name, json_string_value(v), json_string_length(v), 0, -1);
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_SORT_KEYS);
    if (s == NULL)
        return -ENOMEM;
    int rc = add_field(fp, name, s, strlen(s), 0, -1);
    free(s);
    return rc;
}

static int by_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* cpu.flags as one field: the flags sorted and joined by spaces. */
static int add_flags(struct cmp__fp *fp, const char *name, const json_t *a)
{
    size_t n = json_array_size(a), len = 1, i;
    const json_t *x;
    json_array_foreach(a, i, x) len += json_string_length(x) + 1;
    const char **v = malloc((n + 1) * sizeof(*v));
    char *out = malloc(len);
    int rc = -ENOMEM;
    if (v == NULL || out == NULL)
        goto out;
    size_t k = 0, o = 0;
    json_array_foreach(a, i, x) if (json_is_string(x)) v[k++] = json_string_value(x);
    qsort(v, k, sizeof(*v), by_str);
    out[0] = '\0';
    for (i = 0; i < k; i++)
        o += (size_t)snprintf(out + o, len - o, "%s%s", i ? " " : "", v[i]);
    rc = add_field(fp, name, out, o, 0, -1);
out:
    free(v);
    free(out);
    return rc;
}

/*
 * The fingerprint, depth first. Objects nest into dotted names; the texts,
 * the CPU flags and the environment have their own rules; the config digest
 * is left out (its lines are compared one by one).
 */
static int walk(struct cmp__fp *fp, const char *prefix, const json_t *obj, int depth)
{
    const char *k;
    json_t *v;
    int rc = 0;
    if (depth > 8)
        return 0;
    json_object_foreach((json_t *)obj, k, v)
    {
        char name[CMP_MAX_ENV_NAME];
        if (snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", k) >=
            (int)sizeof name)
            continue;
        if (strcmp(name, "torch.config_sha256") == 0) {
            continue;
        } else if (strcmp(name, "torch.config") == 0 && json_is_string(v)) {
            rc = add_text(fp, json_string_value(v), true);
        } else if (strcmp(name, "torch.parallel_info") == 0 && json_is_string(v)) {
            rc = add_text(fp, json_string_value(v), false);
        } else if (strcmp(name, "cpu.flags") == 0 && json_is_array(v)) {
            rc = add_flags(fp, name, v);
        } else if (strcmp(name, "env") == 0 && json_is_object(v)) {
            const char *ek;
            json_t *ev;
            json_object_foreach(v, ek, ev)
            {
                char en[CMP_MAX_ENV_NAME];
                if (rc == 0 && json_is_string(ev) &&
                    snprintf(en, sizeof en, "env.%s", ek) < (int)sizeof en)
                    rc = add_json(fp, en, ev);
            }
        } else if (json_is_object(v)) {
            rc = walk(fp, name, v, depth + 1);
        } else {
            rc = add_json(fp, name, v);
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int field_by_name(const void *a, const void *b)
{
    return strcmp(((const struct cmp__envf *)a)->name, ((const struct cmp__envf *)b)->name);
}

static void fp_free(struct cmp__fp *fp)
{
    if (fp == NULL)
        return;
    for (size_t i = 0; i < fp->n; i++) {
        free(fp->f[i].name);
        free(fp->f[i].value);
    }
    free(fp->f);
    free(fp->canon);
    free(fp);
}

/* A flattened fingerprint, its fields sorted by name (the first of a repeated name kept). */
static int fp_build(const json_t *json, char *canon, struct cmp__fp **out)
{
    struct cmp__fp *fp = calloc(1, sizeof(*fp));
    if (fp == NULL)
        return -ENOMEM;
    int rc = walk(fp, "", json, 0);
    if (rc < 0) {
        fp_free(fp);
        return rc;
    }
    if (fp->n > 0) /* fp->f is NULL while no field was added */
        qsort(fp->f, fp->n, sizeof(*fp->f), field_by_name);
    size_t w = 0;
    for (size_t r = 0; r < fp->n; r++) {
        if (w > 0 && strcmp(fp->f[w - 1].name, fp->f[r].name) == 0) {
            free(fp->f[r].name);
            free(fp->f[r].value);
            continue;
        }
        fp->f[w++] = fp->f[r];
    }
    fp->n = w;
    fp->canon = canon;
    *out = fp;
    return 0;
}

void cmp__side_free_fingerprints(struct cmp_side *side)
{
    for (size_t i = 0; i < side->n_fps; i++)
        fp_free(side->fps[i]);
    free(side->fps);
    side->fps = NULL;
    side->n_fps = side->cap_fps = 0;
}

/*
 * Equal fingerprints are one entry of the side's table: cells of a job
 * mostly share theirs, and the diff then runs once per distinct pair. The
 * lookup is linear in the distinct fingerprints, which a job has few of.
 */
int cmp_cell_set_fingerprint(struct cmp_cell *cell, const json_t *fp)
{
    if (cell == NULL || !json_is_object(fp))
        return -EINVAL;
    struct cmp_side *side = cell->side;
    cell->fp = NULL;
    char *canon = json_dumps(fp, JSON_COMPACT | JSON_SORT_KEYS);
    if (canon == NULL)
        return -ENOMEM;
    if (strlen(canon) > CMP_MAX_FINGERPRINT) {
        free(canon);
        return -E2BIG;
    }
    for (size_t i = 0; i < side->n_fps; i++)
        if (strcmp(side->fps[i]->canon, canon) == 0) {
            cell->fp = side->fps[i];
            free(canon);
            return 0;
        }
    int rc = cmp__grow((void **)&side->fps, &side->cap_fps, side->n_fps + 1, sizeof(*side->fps),
                       SIZE_MAX / 2);
    if (rc) {
        free(canon);
        return rc;
    }
    struct cmp__fp *f = NULL;
    rc = fp_build(fp, canon, &f);
    if (rc < 0) {
        free(canon);
        return rc;
    }
    f->id = side->n_fps;
    side->fps[side->n_fps++] = f;
    cell->fp = f;
    return 0;
}

const struct cmp__envf *cmp__fp_field(const struct cmp__fp *fp, const char *name)
{
    size_t lo = 0, hi = fp->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(fp->f[mid].name, name);
        if (c == 0)
            return &fp->f[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}
