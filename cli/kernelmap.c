/*
 * cli/kernelmap.c - the kernel map of a PyTorch source tree
 * (cli/kernelmap.h says what it is and where it comes from).
 */
#include "cli/kernelmap.h"

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/provenance.h"
#include "util/fs.h"

#define NATIVE "aten/src/ATen/native"

/* ------------------------------------------------------------ blanking */

/* Skips a quoted literal starting at s[i] (the quote), blanking its
 * contents; returns the index past the closing quote. */
static size_t blank_literal(char *s, size_t n, size_t i)
{
    char q = s[i++];
    while (i < n && s[i] != q && s[i] != '\n') {
        if (s[i] == '\\' && i + 1 < n && s[i + 1] != '\n')
            s[i++] = ' ';
        s[i++] = ' ';
    }
    return i < n && s[i] == q ? i + 1 : i;
}

void kmap_blank(char *s, size_t n)
{
    bool line_start = true;
    size_t i = 0;
    while (i < n) {
        char c = s[i];
        if (line_start && c == '#') {
            /* a preprocessor line, with its continuations */
            while (i < n && s[i] != '\n') {
                if (s[i] == '\\' && i + 1 < n && s[i + 1] == '\n')
                    s[i++] = ' ';
                s[i++] = ' ';
            }
            continue;
        }
        if (c == '/' && i + 1 < n && s[i + 1] == '/') {
            while (i < n && s[i] != '\n')
                s[i++] = ' ';
            continue;
        }
        if (c == '/' && i + 1 < n && s[i + 1] == '*') {
            s[i++] = ' ';
            s[i++] = ' ';
            while (i < n && !(s[i] == '*' && i + 1 < n && s[i + 1] == '/')) {
                if (s[i] != '\n')
                    s[i] = ' ';
                i++;
            }
            for (int k = 0; k < 2 && i < n; k++)
                s[i++] = ' ';
            continue;
        }
        if (c == '"' || c == '\'') {
            i = blank_literal(s, n, i);
            line_start = false;
            continue;
        }
        if (c == '\n')
            line_start = true;
        else if (c != ' ' && c != '\t' && c != '\r')
            line_start = false;
        i++;
    }
}

/* ----------------------------------------------------------- tokenising */

static bool id_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool id_char(char c)
{
    return id_start(c) || (c >= '0' && c <= '9');
}

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

/* The next identifier at or after p (which is never inside one): its start
 * and *len; NULL at the end. A run that begins with a digit is a number. */
static const char *next_id(const char *p, size_t *len)
{
    while (*p) {
        if (!id_char(*p)) {
            p++;
            continue;
        }
        const char *e = p;
        while (id_char(*e))
            e++;
        if (id_start(*p)) {
            *len = (size_t)(e - p);
            return p;
        }
        p = e;
    }
    return NULL;
}

/* Reads one identifier at p (after blanks) into out; the position after it, or NULL. */
static const char *read_id(const char *p, char *out, size_t cap)
{
    p = skip_ws(p);
    size_t n = 0;
    while (id_char(p[n]))
        n++;
    if (n == 0 || n >= cap)
        return NULL;
    memcpy(out, p, n);
    out[n] = 0;
    return p + n;
}

/* p at an opening bracket; the position past its match, or NULL. */
static const char *match(const char *p, char open, char close)
{
    int depth = 0;
    for (; *p; p++) {
        if (*p == open)
            depth++;
        else if (*p == close && --depth == 0)
            return p + 1;
    }
    return NULL;
}

static bool is_register_macro(const char *s, size_t n)
{
    static const char suffix[] = "DISPATCH";
    size_t sl = sizeof suffix - 1;
    bool prefix = (n > 9 && memcmp(s, "REGISTER_", 9) == 0) ||
                  (n > 14 && memcmp(s, "ALSO_REGISTER_", 14) == 0);
    if (!prefix || n < sl || memcmp(s + n - sl, suffix, sl) != 0)
        return false;
    for (size_t i = 0; i + 4 <= n; i++)
        if (memcmp(s + i, "_NO_", 4) == 0)
            return false;
    return true;
}

/* Appends string S to array A unless it is there already. */
static int add_unique(json_t *a, const char *s)
{
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) if (strcmp(json_string_value(v), s) == 0) return 0;
    return json_array_append_new(a, json_string(s)) ? -ENOMEM : 0;
}

/* The array at obj[key], made when absent. */
static json_t *array_at(json_t *obj, const char *key)
{
    json_t *a = json_object_get(obj, key);
    if (a == NULL && (a = json_array()) != NULL && json_object_set_new(obj, key, a))
        a = NULL;
    return a;
}

static int add_to(json_t *obj, const char *key, const char *s)
{
    json_t *a = array_at(obj, key);
    return a ? add_unique(a, s) : -ENOMEM;
}

/* -------------------------------------------------------- registrations */

int kmap_registrations(const char *src, const char *file, json_t *stubs)
{
    const char *p = src;
    size_t n;
    char stub[256];
    while ((p = next_id(p, &n)) != NULL) {
        const char *at = p;
        p += n;
        if (!is_register_macro(at, n))
            continue;
        const char *q = skip_ws(p);
        if (*q != '(' || (q = read_id(q + 1, stub, sizeof stub)) == NULL)
            continue;
        if (json_object_get(stubs, stub) == NULL &&
            json_object_set_new(stubs, stub, json_string(file)))
            return -ENOMEM;
        p = q;
    }
    return 0;
}

/* -------------------------------------------------------------- the yaml */

/* Whether the comma-separated dispatch keys in [s, e) name CPU. */
static bool keys_have_cpu(const char *s, const char *e)
{
    while (s < e) {
        while (s < e && (*s == ' ' || *s == ','))
            s++;
        const char *k = s;
        while (s < e && *s != ',' && *s != ' ')
            s++;
        if (s - k == 3 && memcmp(k, "CPU", 3) == 0)
            return true;
    }
    return false;
}

struct yaml_state {
    char op[256];
    int dispatch_indent; /* -1 when not inside a dispatch: block */
};

/* One line of the yaml (without its newline). */
static int yaml_line(struct yaml_state *st, const char *l, json_t *fns, json_t *delegates)
{
    int indent = 0;
    while (l[indent] == ' ')
        indent++;
    const char *t = l + indent;
    if (*t == 0 || *t == '#')
        return 0;
    if (strncmp(t, "- func:", 7) == 0) {
        st->dispatch_indent = -1;
        if (!read_id(t + 7, st->op, sizeof st->op)) /* the base op of name.overload(...) */
            st->op[0] = 0;
        return 0;
    }
    if (st->op[0] == 0)
        return 0;
    if (st->dispatch_indent >= 0 && indent > st->dispatch_indent) {
        const char *colon = strchr(t, ':');
        char fn[256];
        if (colon && keys_have_cpu(t, colon) && read_id(colon + 1, fn, sizeof fn))
            return add_to(fns, st->op, fn);
        return 0;
    }
    st->dispatch_indent = -1;
    if (strncmp(t, "dispatch:", 9) == 0)
        st->dispatch_indent = indent;
    else if (strncmp(t, "structured_delegate:", 20) == 0) {
        char base[256];
        if (read_id(t + 20, base, sizeof base) && strcmp(base, st->op) != 0)
            return add_to(delegates, st->op, base);
    }
    return 0;
}

int kmap_yaml(const char *yaml, json_t *fns)
{
    struct yaml_state st = {.op = "", .dispatch_indent = -1};
    json_t *delegates = json_object();
    char line[4096];
    int rc = delegates ? 0 : -ENOMEM;

    for (const char *p = yaml; rc == 0 && *p;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n < sizeof line) { /* a longer line is no entry of interest */
            memcpy(line, p, n);
            line[n] = 0;
            rc = yaml_line(&st, line, fns, delegates);
        }
        p += n + (e != NULL);
    }
    /* An op with a structured delegate runs the delegate's kernel. */
    const char *op;
    json_t *bases;
    json_object_foreach(delegates, op, bases)
    {
        size_t i, j;
        json_t *b, *fn;
        json_array_foreach(bases, i, b)
        {
            json_array_foreach(json_object_get(fns, json_string_value(b)), j, fn)
            {
                if (rc == 0)
                    rc = add_to(fns, op, json_string_value(fn));
            }
        }
    }
    json_decref(delegates);
    return rc;
}

/* ------------------------------------------------------------ the calls */

/* The stubs a body [b, e) calls, into CALLS[fn]. */
static int body_calls(const char *b, const char *e, const char *fn, const json_t *stubs,
                      json_t *calls)
{
    char name[256];
    size_t n;
    for (const char *p = b; (p = next_id(p, &n)) != NULL && p < e; p += n) {
        if (n >= sizeof name)
            continue;
        memcpy(name, p, n);
        name[n] = 0;
        if (json_object_get(stubs, name) && *skip_ws(p + n) == '(') {
            int rc = add_to(calls, fn, name);
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* p past a function's name: its body's braces [*b, *e) when what follows is
 * a parameter list, qualifiers and '{' (a definition); false otherwise. */
static bool definition_body(const char *p, const char **b, const char **e)
{
    p = skip_ws(p);
    if (*p != '(' || (p = match(p, '(', ')')) == NULL)
        return false;
    for (;;) {
        p = skip_ws(p);
        size_t n = 0;
        while (id_char(p[n]))
            n++;
        if (n == 0)
            break;
        p += n; /* const, noexcept, override */
    }
    if (*p != '{')
        return false;
    *b = p;
    return (*e = match(p, '{', '}')) != NULL;
}

int kmap_calls(const char *src, const json_t *wanted, const json_t *stubs, json_t *calls)
{
    const char *p = src, *b, *e;
    size_t n;
    char name[256];
    while ((p = next_id(p, &n)) != NULL) {
        const char *after = p + n;
        if (n >= sizeof name) {
            p = after;
            continue;
        }
        memcpy(name, p, n);
        name[n] = 0;
        if (strcmp(name, "TORCH_IMPL_FUNC") == 0) {
            const char *q = skip_ws(after);
            if (*q != '(' || (q = read_id(q + 1, name, sizeof name)) == NULL ||
                *(q = skip_ws(q)) != ')') {
                p = after;
                continue;
            }
            after = q + 1;
        }
        if (json_object_get(wanted, name) && definition_body(after, &b, &e)) {
            int rc = body_calls(b, e, name, stubs, calls);
            if (rc)
                return rc;
            p = e;
            continue;
        }
        p = after;
    }
    return 0;
}

/* ------------------------------------------------------------ the files */

struct kmap_walk {
    char native[4096]; /* absolute path of the native directory */
    char rel[4096];    /* the same, relative to the top level */
    long scanned, skipped;
};

/* Reads PATH whole (NUL-terminated) into *OUT; 1 when it is too big or
 * unreadable (skipped), 0 when read, -ENOMEM. */
static int read_source(const char *path, char **out, size_t *len)
{
    int rc = util_slurp(path, KMAP_MAX_FILE_BYTES, out, len);
    return rc == -ENOMEM ? rc : rc != 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The *.cpp files of DIR, generated wrappers left out, sorted; *N of them. */
static int list_sources(const char *dir, char ***names, size_t *n)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    size_t cap = 0;
    *names = NULL;
    *n = 0;
    if (d == NULL)
        return 0;
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        if (l < 5 || strcmp(de->d_name + l - 4, ".cpp") != 0 ||
            prov_is_generated_source(de->d_name, NULL))
            continue;
        if (*n == cap) {
            char **g = realloc(*names, (cap = cap ? cap * 2 : 64) * sizeof *g);
            if (g == NULL)
                break;
            *names = g;
        }
        if (((*names)[*n] = strdup(de->d_name)) == NULL)
            break;
        (*n)++;
    }
    bool failed = de != NULL;
    closedir(d);
    if (*n)
        qsort(*names, *n, sizeof **names, cmp_names);
    return failed ? -ENOMEM : 0;
}

/* Runs EACH on every source of SUB ("cpu" or "") under the native dir. */
static int each_source(struct kmap_walk *s, const char *sub,
                       int (*each)(void *ud, const char *text, const char *rel), void *ud)
{
    char dir[8192], path[8192], rel[8192];
    char **names;
    size_t n;
    if (snprintf(dir, sizeof dir, "%s%s%s", s->native, *sub ? "/" : "", sub) >= (int)sizeof dir)
        return -ENAMETOOLONG;
    int rc = list_sources(dir, &names, &n);
    for (size_t i = 0; i < n; i++) {
        char *text = NULL;
        size_t len = 0;
        int r = 1;
        /* a path too long to name is skipped like a file too big to read */
        if (rc == 0 && s->scanned < KMAP_MAX_FILES &&
            snprintf(path, sizeof path, "%s/%s", dir, names[i]) < (int)sizeof path &&
            snprintf(rel, sizeof rel, "%s/%s%s%s", s->rel, sub, *sub ? "/" : "", names[i]) <
                (int)sizeof rel)
            r = read_source(path, &text, &len);
        if (r < 0)
            rc = r;
        else if (r == 0) {
            s->scanned++;
            kmap_blank(text, len);
            rc = each(ud, text, rel);
        } else
            s->skipped++;
        free(text);
        free(names[i]);
    }
    free(names);
    return rc;
}

struct kmap_found {
    json_t *stubs, *fns, *wanted, *calls;
};

static int on_cpu_source(void *ud, const char *text, const char *rel)
{
    return kmap_registrations(text, rel, ((struct kmap_found *)ud)->stubs);
}

static int on_native_source(void *ud, const char *text, const char *rel)
{
    struct kmap_found *c = ud;
    (void)rel;
    return kmap_calls(text, c->wanted, c->stubs, c->calls);
}

/* Finds the native directory at TOP or one level below it. */
static bool find_native(const char *top, struct kmap_walk *s)
{
    struct stat st;
    snprintf(s->native, sizeof s->native, "%s/" NATIVE, top);
    snprintf(s->rel, sizeof s->rel, NATIVE);
    if (stat(s->native, &st) == 0 && S_ISDIR(st.st_mode))
        return true;
    DIR *d = opendir(top);
    struct dirent *de;
    bool found = false;
    while (d && !found && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        snprintf(s->native, sizeof s->native, "%s/%s/" NATIVE, top, de->d_name);
        snprintf(s->rel, sizeof s->rel, "%s/" NATIVE, de->d_name);
        found = stat(s->native, &st) == 0 && S_ISDIR(st.st_mode);
    }
    if (d)
        closedir(d);
    return found;
}

/* The map's "ops": for each op whose CPU functions call a registered stub. */
static int map_ops(const struct kmap_found *c, json_t *map)
{
    json_t *ops = json_object();
    const char **names = malloc((json_object_size(c->fns) + 1) * sizeof *names);
    size_t n = 0, total = 0;
    const char *op;
    json_t *fns;
    int rc = -ENOMEM;
    if (ops == NULL || names == NULL)
        goto out;
    json_object_foreach(c->fns, op, fns) names[n++] = op;
    qsort(names, n, sizeof *names, cmp_names);
    for (size_t i = 0; i < n; i++) {
        json_t *stubs = json_array(), *fn, *s;
        const char *first_fn = NULL;
        size_t j, k;
        if (stubs == NULL)
            goto out;
        json_array_foreach(json_object_get(c->fns, names[i]), j, fn)
        {
            json_array_foreach(json_object_get(c->calls, json_string_value(fn)), k, s)
            {
                if (first_fn == NULL)
                    first_fn = json_string_value(fn);
                if (add_unique(stubs, json_string_value(s)))
                    goto out;
            }
        }
        if (first_fn != NULL && ++total <= KMAP_MAX_OPS) {
            const char *stub = json_string_value(json_array_get(stubs, 0));
            char key[300];
            snprintf(key, sizeof key, "aten::%s", names[i]);
            json_t *e = json_pack("{s:s, s:s, s:O, s:s}", "kind", "stub", "stub", stub, "file",
                                  json_object_get(c->stubs, stub), "cpu_function", first_fn);
            if (e && json_array_size(stubs) > 1 && json_object_set(e, "stubs", stubs))
                json_decref(e), e = NULL;
            if (e == NULL || json_object_set_new(ops, key, e)) {
                json_decref(stubs);
                goto out;
            }
        }
        json_decref(stubs);
    }
    rc = json_object_set_new(map, "ops_total", json_integer((json_int_t)total)) ||
                 json_object_set_new(map, "ops_truncated", json_boolean(total > KMAP_MAX_OPS)) ||
                 json_object_set(map, "ops", ops)
             ? -ENOMEM
             : 0;
out:
    json_decref(ops);
    free(names);
    return rc;
}

/* Reads native_functions.yaml and the sources into C. */
static int collect_tree(struct kmap_walk *s, struct kmap_found *c, const char **note)
{
    char path[8192], *yaml = NULL;
    size_t len;
    const char *fn;
    json_t *v;
    int rc = each_source(s, "cpu", on_cpu_source, c);
    if (rc)
        return rc;
    snprintf(path, sizeof path, "%s/native_functions.yaml", s->native);
    if ((rc = read_source(path, &yaml, &len)) != 0) {
        *note = "native_functions.yaml is missing, unreadable or too big: no op is mapped";
        return rc < 0 ? rc : 0;
    }
    rc = kmap_yaml(yaml, c->fns);
    free(yaml);
    json_object_foreach(c->fns, fn, v)
    {
        size_t i;
        json_t *f;
        json_array_foreach(v, i, f)
        {
            if (rc == 0 && json_object_set(c->wanted, json_string_value(f), json_true()))
                rc = -ENOMEM;
        }
    }
    return rc ? rc : each_source(s, "", on_native_source, c);
}

int kmap_scan(const char *top, json_t **out, char **err)
{
    struct kmap_walk s = {.scanned = 0};
    struct kmap_found c = {json_object(), json_object(), json_object(), json_object()};
    const char *note = NULL;
    json_t *map = NULL;
    int rc = -ENOMEM;

    *out = NULL;
    if (!find_native(top, &s)) {
        rc = 0;
        goto out;
    }
    if (!c.stubs || !c.fns || !c.wanted || !c.calls || (rc = collect_tree(&s, &c, &note)) != 0)
        goto out;
    map = json_pack("{s:i, s:s, s:I, s:I, s:I, s:I}", "format", 1, "root", s.rel,
                    "stubs_registered", (json_int_t)json_object_size(c.stubs), "cpu_functions",
                    (json_int_t)json_object_size(c.wanted), "files_scanned", (json_int_t)s.scanned,
                    "files_skipped", (json_int_t)s.skipped);
    rc = -ENOMEM;
    if (map == NULL || (note && json_object_set_new(map, "note", json_string(note))) ||
        (rc = map_ops(&c, map)) != 0)
        goto out;
    *out = map;
    map = NULL;
out:
    if (rc && err && !*err && asprintf(err, "kernel map of %s: %s", top, strerror(-rc)) < 0)
        *err = NULL;
    json_decref(map);
    json_decref(c.stubs);
    json_decref(c.fns);
    json_decref(c.wanted);
    json_decref(c.calls);
    return rc;
}

int kmap_attach(json_t *prov, const char *top, char **err)
{
    json_t *map = NULL;
    int rc = kmap_scan(top, &map, err);
    if (rc == 0 && map && json_object_set_new(prov, "kernel_map", map))
        rc = -ENOMEM;
    return rc;
}
