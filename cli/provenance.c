/*
 * cli/provenance.c - what `capctl submit --source-tree DIR` finds in a
 * source tree before its build is trusted.
 *
 * The problem this exists for (see DESIGN.md): PyTorch's per-CPU-capability
 * codegen writes wrappers such as Activation.cpp.DEFAULT.cpp inside
 * aten/src/ATen/native/cpu/; wiping build/ never removes them and every
 * rebuild wraps them again. Stale generated config headers and dirty
 * submodules do the same kind of damage. These rules are documented in
 * docs/capctl.md; keep the two in step.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/provenance.h"

#include "cli/kernelmap.h"
#include "util/cpuwrap.h"

#ifndef CAPD_VERSION
#define CAPD_VERSION "unknown"
#endif

extern char **environ;

const char *prov_kind_name(enum prov_kind k)
{
    static const char *const names[] = {
        [PROV_GENERATED_SOURCE] = "generated_source",
        [PROV_STALE_HEADER] = "stale_header",
        [PROV_DIRTY_SUBMODULE] = "dirty_submodule",
    };
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : NULL;
}

/* util/cpuwrap.h's rule, which compare/kernels.c applies to the same
 * names when it attributes a divergence to a kernel file. */
bool prov_is_generated_source(const char *name, int *depth)
{
    int d;
    util_cpuwrap_peel(name, &d);
    if (depth)
        *depth = d;
    return d > 0;
}

bool prov_is_stale_header(const char *path)
{
    static const char dir[] = "aten/src/ATen/";
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (strcmp(base, "Config.h") != 0 && strcmp(base, "CUDAConfig.h") != 0)
        return false;
    /* The directory must be a whole path component sequence: at the start
     * or right after a '/', and before the file name. */
    for (const char *p = path; (p = strstr(p, dir)) != NULL; p++)
        if ((p == path || p[-1] == '/') && p + sizeof dir - 1 <= base)
            return true;
    return false;
}

int prov_unquote_path(const char *s, const char *stop, char *out, size_t cap, const char **end)
{
    size_t o = 0;
    if (*s != '"') {
        const char *e = stop ? strstr(s, stop) : NULL;
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n + 1 > cap)
            return -ENAMETOOLONG;
        memcpy(out, s, n);
        out[n] = 0;
        if (end)
            *end = s + n;
        return 0;
    }
    s++;
    for (;;) {
        char c = *s++;
        if (c == 0)
            return -EINVAL;
        if (c == '"')
            break;
        if (c == '\\') {
            c = *s++;
            switch (c) {
            case 'a':
                c = '\a';
                break;
            case 'b':
                c = '\b';
                break;
            case 't':
                c = '\t';
                break;
            case 'n':
                c = '\n';
                break;
            case 'v':
                c = '\v';
                break;
            case 'f':
                c = '\f';
                break;
            case 'r':
                c = '\r';
                break;
            case '"':
            case '\\':
                break;
            default:
                if (c >= '0' && c <= '3' && s[0] >= '0' && s[0] <= '7' && s[1] >= '0' &&
                    s[1] <= '7') {
                    c = (char)((c - '0') * 64 + (s[0] - '0') * 8 + (s[1] - '0'));
                    s += 2;
                } else {
                    return -EINVAL;
                }
            }
            if (c == 0)
                return -EINVAL;
        }
        if (o + 1 >= cap)
            return -ENAMETOOLONG;
        out[o++] = c;
    }
    out[o] = 0;
    if (end)
        *end = s;
    return 0;
}

static bool status_char(char c)
{
    return c && strchr(" MTADRCU?!", c) != NULL;
}

int prov_classify_status_line(const char *line, const char *const *submodules, size_t nsub,
                              struct prov_finding *f)
{
    char x, y;
    const char *end;
    int rc, depth;
    memset(f, 0, sizeof *f);
    if (strlen(line) < 4 || line[2] != ' ' || !status_char(line[0]) || !status_char(line[1]))
        return -EINVAL;
    x = line[0];
    y = line[1];
    bool renamed = x == 'R' || x == 'C';
    rc = prov_unquote_path(line + 3, renamed ? " -> " : NULL, f->path, sizeof f->path, &end);
    if (rc)
        return rc;
    if (renamed) {
        if (strncmp(end, " -> ", 4) != 0)
            return -EINVAL;
        rc = prov_unquote_path(end + 4, NULL, f->path, sizeof f->path, &end);
        if (rc)
            return rc;
    }
    if (*end != 0 || f->path[0] == 0)
        return -EINVAL;

    if ((x == '?' && y == '?') || (x == '!' && y == '!')) {
        const char *how = x == '?' ? "untracked" : "ignored";
        const char *slash = strrchr(f->path, '/');
        const char *base = slash ? slash + 1 : f->path;
        if (prov_is_generated_source(base, &depth)) {
            char times[48] = "";
            if (depth > 1)
                snprintf(times, sizeof times, " (wrapped %d times)", depth);
            f->kind = PROV_GENERATED_SOURCE;
            snprintf(f->message, sizeof f->message,
                     "%s generated dispatch source %s%s in the source tree: rebuilds wrap it "
                     "again (duplicate DispatchStub definitions) or link its stale kernels; "
                     "delete it",
                     how, f->path, times);
            return 1;
        }
        if (prov_is_stale_header(f->path)) {
            f->kind = PROV_STALE_HEADER;
            snprintf(f->message, sizeof f->message,
                     "%s generated header %s in the source tree: a stale copy can shadow the "
                     "one the build generates; delete it",
                     how, f->path);
            return 1;
        }
        return 0;
    }
    for (size_t i = 0; i < nsub; i++) {
        if (submodules[i] && strcmp(submodules[i], f->path) == 0) {
            f->kind = PROV_DIRTY_SUBMODULE;
            snprintf(f->message, sizeof f->message,
                     "submodule %s has local changes (git status '%c%c'): modified or untracked "
                     "files, or a commit other than the recorded one",
                     f->path, x, y);
            return 1;
        }
    }
    return 0;
}

int prov_classify_submodule_line(const char *line, struct prov_finding *f, char *path_out,
                                 size_t cap)
{
    memset(f, 0, sizeof *f);
    char st = line[0];
    if (st == 0 || !strchr(" +-U", st))
        return -EINVAL;
    const char *sha = line + 1;
    size_t h = strspn(sha, "0123456789abcdefABCDEF");
    if (h < 7 || sha[h] != ' ')
        return -EINVAL;
    const char *path = sha + h + 1;
    size_t n = strlen(path);
    /* Drop the trailing " (describe)" that initialized submodules have. */
    if (n && path[n - 1] == ')') {
        const char *q = NULL;
        for (const char *p = path; (p = strstr(p, " (")) != NULL; p++)
            q = p;
        if (q)
            n = (size_t)(q - path);
    }
    if (n == 0 || n >= sizeof f->path)
        return -EINVAL;
    memcpy(f->path, path, n);
    f->path[n] = 0;
    if (path_out) {
        if (n >= cap)
            return -ENAMETOOLONG;
        memcpy(path_out, f->path, n + 1);
    }
    switch (st) {
    case '+':
        snprintf(f->message, sizeof f->message,
                 "submodule %s is checked out at %.12s, not at the commit the superproject "
                 "records",
                 f->path, sha);
        break;
    case '-':
        snprintf(f->message, sizeof f->message,
                 "submodule %s is not initialized (git submodule update --init --recursive)",
                 f->path);
        break;
    case 'U':
        snprintf(f->message, sizeof f->message, "submodule %s has merge conflicts", f->path);
        break;
    default:
        return 0;
    }
    f->kind = PROV_DIRTY_SUBMODULE;
    return 1;
}

/* ---- collection ---- */

/* A JSON string of S; bytes that are not valid UTF-8 (git prints such
 * names octal-quoted, but a decoded path may hold them) become '?'. */
static json_t *jstr_lossy(const char *s)
{
    json_t *j = json_string(s);
    if (j)
        return j;
    char *c = strdup(s);
    if (!c)
        return NULL;
    for (char *p = c; *p; p++)
        if ((unsigned char)*p >= 0x80 || (unsigned char)*p < 0x20)
            *p = '?';
    j = json_string(c);
    free(c);
    return j;
}

static void set_err(char **err, const char *fmt, const char *a, const char *b)
{
    if (asprintf(err, fmt, a, b) < 0)
        *err = NULL;
}

/* One git child: what run_git() opened, all of it released by git_close(). */
struct git_proc {
    const char *argv[16];
    char **envp;
    FILE *errf; /* git's stderr, read back for the error text */
    FILE *in;   /* git's stdout */
    int out[2];
    pid_t pid;
    posix_spawn_file_actions_t fa;
    bool fa_init;
};

/* "git -C DIR ARGS..." (at most 12 ARGS) and the caller's environment,
 * plus: no optional locks (status must not write the index of a tree a
 * build may be using), no prompts, and messages in English for the error
 * text. */
static int git_prepare(struct git_proc *g, const char *dir, const char *const *args)
{
    int a = 0;
    g->argv[a++] = "git";
    g->argv[a++] = "-C";
    g->argv[a++] = dir;
    for (int i = 0; args[i] && a < 15; i++)
        g->argv[a++] = args[i];
    g->argv[a] = NULL;
    size_t n = 0;
    while (environ[n])
        n++;
    g->envp = calloc(n + 4, sizeof *g->envp);
    if (!g->envp)
        return -ENOMEM;
    size_t e = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "GIT_OPTIONAL_LOCKS=", 19) && strncmp(environ[i], "LC_ALL=", 7) &&
            strncmp(environ[i], "GIT_TERMINAL_PROMPT=", 20))
            g->envp[e++] = environ[i];
    g->envp[e++] = "GIT_OPTIONAL_LOCKS=0";
    g->envp[e++] = "GIT_TERMINAL_PROMPT=0";
    g->envp[e++] = "LC_ALL=C";
    g->envp[e] = NULL;
    return 0;
}

/* Starts git with stdin from /dev/null, stdout into a pipe read through
 * g->in and stderr into a temporary file. */
static int git_spawn(struct git_proc *g)
{
    g->errf = tmpfile();
    if (!g->errf || pipe2(g->out, O_CLOEXEC) != 0)
        return -EIO;
    posix_spawn_file_actions_init(&g->fa);
    g->fa_init = true;
    posix_spawn_file_actions_addopen(&g->fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&g->fa, g->out[1], 1);
    posix_spawn_file_actions_adddup2(&g->fa, fileno(g->errf), 2);
    int src = posix_spawnp(&g->pid, "git", &g->fa, NULL, (char *const *)g->argv, g->envp);
    close(g->out[1]);
    g->out[1] = -1;
    if (src != 0) {
        g->pid = -1;
        return -src;
    }
    g->in = fdopen(g->out[0], "r");
    if (!g->in)
        return -EIO;
    g->out[0] = -1;
    return 0;
}

/* Feeds each line of git's stdout to ON_LINE until it fails (the rest is
 * still read, so git is never blocked on a full pipe); a line over
 * PROV_MAX_LINE is skipped and counted in *LONG_LINES. Returns ON_LINE's
 * first non-zero result, or 0. */
static int git_read_lines(FILE *in, int (*on_line)(void *ud, const char *line), void *ud,
                          size_t *long_lines)
{
    char *line = malloc(PROV_MAX_LINE + 2);
    bool skipping = false;
    int cb_rc = 0;
    if (!line)
        return -EIO;
    while (fgets(line, PROV_MAX_LINE + 2, in)) {
        size_t l = strlen(line);
        bool complete = l > 0 && line[l - 1] == '\n';
        if (skipping) {
            skipping = !complete;
            continue;
        }
        if (!complete && l > PROV_MAX_LINE) {
            skipping = true;
            if (long_lines)
                (*long_lines)++;
            continue;
        }
        if (complete)
            line[--l] = 0;
        if (cb_rc == 0)
            cb_rc = on_line(ud, line);
    }
    free(line);
    return cb_rc;
}

/* Waits for git: its exit status (0..255, 128+N for signal N), with the
 * first line of its stderr in ERRTEXT (may be NULL). */
static int git_reap(struct git_proc *g, char *errtext, size_t errcap)
{
    int st = 0;
    while (waitpid(g->pid, &st, 0) < 0 && errno == EINTR)
        ;
    g->pid = -1;
    if (errtext && errcap) {
        fflush(g->errf);
        rewind(g->errf);
        if (fgets(errtext, (int)errcap, g->errf))
            errtext[strcspn(errtext, "\n")] = 0;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void git_close(struct git_proc *g)
{
    if (g->pid > 0)
        while (waitpid(g->pid, NULL, 0) < 0 && errno == EINTR)
            ;
    if (g->fa_init)
        posix_spawn_file_actions_destroy(&g->fa);
    if (g->in)
        fclose(g->in);
    if (g->out[0] >= 0)
        close(g->out[0]);
    if (g->out[1] >= 0)
        close(g->out[1]);
    if (g->errf)
        fclose(g->errf);
    free(g->envp);
}

/* Runs "git -C DIR ARGS..." with stdout read line by line into ON_LINE
 * (lines longer than PROV_MAX_LINE are skipped and counted in *LONG_LINES).
 * Returns git's exit status (0..255), or a negative errno when git could
 * not be run or ON_LINE failed. *ERRTEXT (may be NULL) gets the first line
 * of git's stderr. */
static int run_git(const char *dir, const char *const *args,
                   int (*on_line)(void *ud, const char *line), void *ud, size_t *long_lines,
                   char *errtext, size_t errcap)
{
    struct git_proc g = {.out = {-1, -1}, .pid = -1};
    int rc;
    if (errtext && errcap)
        errtext[0] = 0;
    if ((rc = git_prepare(&g, dir, args)) != 0 || (rc = git_spawn(&g)) != 0)
        goto out;
    int cb_rc = git_read_lines(g.in, on_line, ud, long_lines);
    rc = git_reap(&g, errtext, errcap);
    if (cb_rc < 0)
        rc = cb_rc;
out:
    git_close(&g);
    return rc;
}

struct collect {
    json_t *findings;
    size_t listed[4], total[4];
    char first_dropped[4][PROV_MAX_PATH];
    char **subs;     /* submodule paths */
    bool *sub_dirty; /* a dirty_submodule finding was made for subs[i] */
    size_t nsub;
    json_t *lines; /* the array being filled */
    size_t nlines, bytes, total_lines, max_lines, max_bytes;
    char single[PROV_MAX_PATH]; /* for one-line commands */
};

static int add_finding(struct collect *c, const struct prov_finding *f)
{
    size_t k = (size_t)f->kind;
    if (f->kind == PROV_DIRTY_SUBMODULE) {
        for (size_t i = 0; i < c->nsub; i++) {
            if (strcmp(c->subs[i], f->path) == 0) {
                if (c->sub_dirty[i])
                    return 0;
                c->sub_dirty[i] = true;
            }
        }
    }
    c->total[k]++;
    if (c->listed[k] >= PROV_MAX_FINDINGS_PER_KIND) {
        if (c->total[k] == PROV_MAX_FINDINGS_PER_KIND + 1)
            snprintf(c->first_dropped[k], sizeof c->first_dropped[k], "%s", f->path);
        return 0;
    }
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "kind", json_string(prov_kind_name(f->kind))) ||
        json_object_set_new(o, "path", jstr_lossy(f->path)) ||
        json_object_set_new(o, "message", jstr_lossy(f->message)) ||
        json_array_append_new(c->findings, o))
        return -ENOMEM;
    c->listed[k]++;
    return 0;
}

/* Keeps a line for the request while both the line and byte budgets last;
 * the total is always counted so truncation can be reported. */
static int keep_line(struct collect *c, const char *line)
{
    size_t l = strlen(line) + 4; /* quotes, comma, and some escaping slack */
    c->total_lines++;
    if (c->nlines >= c->max_lines || c->bytes + l > c->max_bytes)
        return 0;
    if (json_array_append_new(c->lines, jstr_lossy(line)))
        return -ENOMEM;
    c->nlines++;
    c->bytes += l;
    return 0;
}

static int on_submodule(void *ud, const char *line)
{
    struct collect *c = ud;
    struct prov_finding *f = malloc(sizeof *f);
    char *path = malloc(PROV_MAX_PATH);
    int rc = -ENOMEM;
    if (!f || !path)
        goto out;
    if ((rc = keep_line(c, line)) != 0)
        goto out;
    int k = prov_classify_submodule_line(line, f, path, PROV_MAX_PATH);
    rc = 0;
    if (k < 0)
        goto out;
    char **ns = realloc(c->subs, (c->nsub + 1) * sizeof *ns);
    bool *nd = ns ? realloc(c->sub_dirty, (c->nsub + 1) * sizeof *nd) : NULL;
    if (ns)
        c->subs = ns;
    if (nd)
        c->sub_dirty = nd;
    if (!ns || !nd) {
        rc = -ENOMEM;
        goto out;
    }
    c->subs[c->nsub] = path;
    c->sub_dirty[c->nsub] = false;
    c->nsub++;
    path = NULL;
    if (k == 1)
        rc = add_finding(c, f);
out:
    free(f);
    free(path);
    return rc;
}

static int on_status(void *ud, const char *line)
{
    struct collect *c = ud;
    struct prov_finding *f = malloc(sizeof *f);
    int rc = -ENOMEM;
    if (!f)
        return rc;
    if ((rc = keep_line(c, line)) == 0 &&
        prov_classify_status_line(line, (const char *const *)c->subs, c->nsub, f) == 1)
        rc = add_finding(c, f);
    free(f);
    return rc;
}

static int on_single(void *ud, const char *line)
{
    struct collect *c = ud;
    if (!c->single[0])
        snprintf(c->single, sizeof c->single, "%s", line);
    return 0;
}

static int on_first_line(void *ud, const char *line)
{
    char *buf = ud;
    if (!buf[0])
        snprintf(buf, 1200, "%s", line);
    return 0;
}

/*
 * The commit order fields of a job (docs/history.md): COMMIT's committer
 * time and parents from `git log -1 --format='%cI %P'` in DIR, set on
 * BODY as commit_time and parents. A commit git does not know leaves
 * BODY as it was and returns -ENOENT.
 */
int prov_commit_order(const char *dir, const char *commit, json_t *body)
{
    char line[1200] = "";
    const char *const args[] = {"log", "-1", "--format=%cI %P", commit, "--", NULL};
    int rc = run_git(dir, args, on_first_line, line, NULL, NULL, 0);
    if (rc != 0 || !line[0])
        return rc < 0 ? rc : -ENOENT;
    char *save = NULL, *tok = strtok_r(line, " ", &save);
    json_t *parents = json_array();
    json_object_set_new(body, "commit_time", json_string(tok));
    while ((tok = strtok_r(NULL, " ", &save)) && json_array_size(parents) < PROV_MAX_PARENTS)
        json_array_append_new(parents, json_string(tok));
    json_object_set_new(body, "parents", parents);
    return 0;
}

/* The tree's root (TOP) from DIR made absolute (*ABS, malloc'd): -EINVAL
 * with *ERR when DIR is not in a git work tree. */
static int find_toplevel(const char *dir, struct collect *c, char **abs, char *top, char **err)
{
    static const char *const a_top[] = {"rev-parse", "--show-toplevel", NULL};
    char errtext[512];
    *abs = realpath(dir, NULL);
    if (!*abs) {
        int rc = -errno;
        set_err(err, "--source-tree %s: %s", dir, strerror(-rc));
        return rc;
    }
    int rc = run_git(*abs, a_top, on_single, c, NULL, errtext, sizeof errtext);
    if (rc < 0) {
        set_err(err, "--source-tree: cannot run git: %s%s", strerror(-rc), "");
        return rc;
    }
    if (rc != 0 || !c->single[0]) {
        set_err(err, "--source-tree %s is not a git work tree (%s)", dir,
                errtext[0] ? errtext : "git rev-parse failed");
        return -EINVAL;
    }
    snprintf(top, PROV_MAX_PATH, "%s", c->single);
    return 0;
}

/* Runs one listing command of git (ARGS) in TOP into LINES, within its
 * line and byte budgets; ON_LINE classifies each line. WHAT names the
 * command in *ERR when git fails. */
static int collect_lines(struct collect *c, const char *top, const char *const *args,
                         int (*on_line)(void *ud, const char *line), json_t *lines,
                         size_t max_lines, size_t max_bytes, const char *what, size_t *long_lines,
                         char **err)
{
    char errtext[512];
    c->lines = lines;
    c->nlines = c->bytes = c->total_lines = 0;
    c->max_lines = max_lines;
    c->max_bytes = max_bytes;
    int rc = run_git(top, args, on_line, c, long_lines, errtext, sizeof errtext);
    if (rc == 0)
        return 0;
    if (asprintf(err, "--source-tree: %s failed in %s (%s)", what, top,
                 rc < 0 ? strerror(-rc) : errtext) < 0)
        *err = NULL;
    return rc < 0 ? rc : -EIO;
}

/* Findings past the per-kind cap are summed up in one more finding of
 * that kind, so a comparison's warnings stay readable. */
static int add_dropped_findings(struct collect *c)
{
    for (int k = 1; k < 4; k++) {
        if (c->total[k] <= c->listed[k])
            continue;
        char msg[PROV_MAX_PATH + 200];
        snprintf(msg, sizeof msg, "%zu more %s findings not listed (the first: %s)",
                 c->total[k] - c->listed[k], prov_kind_name((enum prov_kind)k),
                 c->first_dropped[k]);
        json_t *o = json_pack("{s:s,s:o,s:o}", "kind", prov_kind_name((enum prov_kind)k), "path",
                              jstr_lossy(c->first_dropped[k]), "message", jstr_lossy(msg));
        if (!o || json_array_append_new(c->findings, o))
            return -ENOMEM;
    }
    return 0;
}

/* What the two listings left, as the job's "provenance" object. */
struct listing {
    json_t *status, *subs;
    size_t sub_total;
    bool sub_trunc;
    size_t long_lines;
};

static json_t *prov_object(const struct collect *c, const struct listing *l, const char *abs,
                           const char *top, const char *head)
{
    json_t *counts =
        json_pack("{s:I,s:I,s:I}", "generated_source", (json_int_t)c->total[1], "stale_header",
                  (json_int_t)c->total[2], "dirty_submodule", (json_int_t)c->total[3]);
    json_t *prov = json_pack(
        "{s:o,s:o,s:o,s:O,s:I,s:b,s:O,s:I,s:b,s:I,s:O,s:O,s:s}", "source_tree", jstr_lossy(abs),
        "git_toplevel", jstr_lossy(top), "head", head[0] ? json_string(head) : json_null(),
        "git_status", l->status, "git_status_total", (json_int_t)c->total_lines,
        "git_status_truncated", c->nlines < c->total_lines, "submodules", l->subs,
        "submodules_total", (json_int_t)l->sub_total, "submodules_truncated", l->sub_trunc,
        "long_lines_skipped", (json_int_t)l->long_lines, "findings", c->findings, "finding_counts",
        counts, "collected_by", "capctl " CAPD_VERSION);
    json_decref(counts);
    return prov;
}

int prov_collect(const char *dir, json_t **out, char **err)
{
    static const char *const a_head[] = {"rev-parse", "--verify", "-q", "HEAD", NULL};
    static const char *const a_sub[] = {"submodule", "status", "--recursive", NULL};
    /* -uall lists each untracked file (a wholly untracked directory would
     * otherwise hide its generated files behind one "?? dir/" line);
     * --ignored=matching lists ignored files but not the contents of an
     * ignored directory such as build/. */
    static const char *const a_st[] = {"status", "--porcelain=v1", "--ignored=matching",
                                       "--untracked-files=all", NULL};
    struct collect c;
    struct listing l = {0};
    char top[PROV_MAX_PATH], head[128];
    char *abs = NULL;
    int rc;

    memset(&c, 0, sizeof c);
    *out = NULL;
    *err = NULL;
    if ((rc = find_toplevel(dir, &c, &abs, top, err)) != 0)
        goto out;
    c.single[0] = 0;
    rc = run_git(top, a_head, on_single, &c, NULL, NULL, 0);
    snprintf(head, sizeof head, "%.*s", (int)sizeof head - 1, rc == 0 ? c.single : ""); /* a hash */

    rc = -ENOMEM;
    c.findings = json_array();
    l.subs = json_array();
    l.status = json_array();
    if (!c.findings || !l.subs || !l.status)
        goto out;
    /* Submodules first: the status classifier needs their paths. */
    rc = collect_lines(&c, top, a_sub, on_submodule, l.subs, PROV_MAX_SUBMODULE_LINES,
                       PROV_MAX_SUBMODULE_BYTES, "git submodule status", &l.long_lines, err);
    if (rc != 0)
        goto out;
    l.sub_total = c.total_lines;
    l.sub_trunc = c.nlines < c.total_lines;
    rc = collect_lines(&c, top, a_st, on_status, l.status, PROV_MAX_STATUS_LINES,
                       PROV_MAX_STATUS_BYTES, "git status", &l.long_lines, err);
    if (rc != 0 || (rc = add_dropped_findings(&c)) != 0)
        goto out;
    *out = prov_object(&c, &l, abs, top, head);
    rc = *out ? kmap_attach(*out, top, err) : -ENOMEM;
    if (rc && *out) {
        json_decref(*out);
        *out = NULL;
    }
out:
    if (rc && !*err)
        set_err(err, "--source-tree %s: %s", dir, strerror(rc < 0 ? -rc : EIO));
    json_decref(l.status);
    json_decref(l.subs);
    json_decref(c.findings);
    for (size_t i = 0; i < c.nsub; i++)
        free(c.subs[i]);
    free(c.subs);
    free(c.sub_dirty);
    free(abs);
    return rc;
}

static int on_rev(void *ud, const char *line)
{
    json_t *list = ud;
    if (json_array_size(list) >= PROV_MAX_REVS)
        return -E2BIG;
    return line[0] ? json_array_append_new(list, json_string(line)) : 0;
}

/* The first-parent line from GOOD (left out) to BAD, oldest first, from
 * `git rev-list --first-parent --reverse GOOD..BAD` in DIR. */
int prov_rev_list(const char *dir, const char *good, const char *bad, json_t **out, char **err)
{
    char range[300], errtext[512];
    snprintf(range, sizeof range, "%s..%s", good, bad);
    const char *const args[] = {"rev-list", "--first-parent", "--reverse", range, "--", NULL};
    json_t *list = json_array();
    int rc = run_git(dir, args, on_rev, list, NULL, errtext, sizeof errtext);
    if (rc != 0) {
        char why[600];
        if (rc == -E2BIG)
            snprintf(why, sizeof why, "lists more than %d commits", PROV_MAX_REVS);
        else
            snprintf(why, sizeof why, "failed: %s", rc < 0 ? strerror(-rc) : errtext);
        set_err(err, "git rev-list %s %s", range, why);
        json_decref(list);
        return rc < 0 ? rc : -EINVAL;
    }
    *out = list;
    return 0;
}
