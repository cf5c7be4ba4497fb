/*
 * tests/test_deploy.c - what deploy/ and the install target promise
 * (docs/deploy.md):
 *
 *   - `cmake --install` into a temporary prefix gives a tree whose capd
 *     finds its runner and exec shim there, runs a real one-cell job with
 *     Debian's torch through the installed capctl, and uninstalls cleanly;
 *     the installed systemd unit passes `systemd-analyze verify`;
 *   - deploy/capd.json holds every key of the config table, with its
 *     default except the documented production settings, and capd starts
 *     with it;
 *   - deploy/Containerfile's runtime stage installs the package of every
 *     shared library the installed binaries link directly;
 *   - deploy/ci/capd-ci.sh registers, captures, compares, posts its report
 *     (to a stand-in for the GitHub API) and fails on a regression.
 *
 * Every test has the same .timeout: Criterion 2.4.1 leaks a record (which
 * LeakSanitizer reports in scripts/test) when tests with different
 * timeouts run side by side.
 */
#include <criterion/criterion.h>
#include <ctype.h>
#include <errno.h>
#include <libgen.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/config/config.h"
#include "tests/helpers/common/testutil.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    size_t got = fread(b, 1, (size_t)n, f);
    b[got] = 0;
    fclose(f);
    return b;
}

static char *pathf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *pathf(const char *fmt, ...)
{
    char *p = NULL;
    va_list ap;
    va_start(ap, fmt);
    cr_assert_geq(vasprintf(&p, fmt, ap), 0);
    va_end(ap);
    return p;
}

static bool exists(const char *path, mode_t type, bool exec)
{
    struct stat sb;
    return stat(path, &sb) == 0 && (sb.st_mode & S_IFMT) == type &&
           (!exec || access(path, X_OK) == 0);
}

/* The build tree ctest runs from: the directory of the capd it names. */
static char *build_dir(void)
{
    char *b = strdup(tu_bin("CAPD_BIN"));
    char *d = strdup(dirname(b));
    free(b);
    return d;
}

/* ---- the install target ---- */

Test(deploy, install_run_a_real_job_and_uninstall, .timeout = 600)
{
    char *top = tu_tmpdir();
    /* Cells run as nobody when the tests run as root: the installed runner
     * must be readable by it. */
    chmod(top, 0755);
    char *prefix = pathf("%s/prefix", top), *build = build_dir();
    cr_assert_eq(
        tu_sh("cmake --install '%s' --prefix '%s' >'%s/install.log' 2>&1", build, prefix, top), 0,
        "cmake --install (see %s/install.log)", top);
    cr_assert_eq(tu_sh("cp '%s/install_manifest.txt' '%s/manifest.txt'", build, top), 0);

    /* The FHS layout docs/deploy.md describes. */
    static const struct {
        const char *rel;
        bool exec;
    } want[] = {
        {"bin/capd", true},
        {"bin/capctl", true},
        {"libexec/capd/capd-exec", true},
        {"libexec/capd/capd-cell", true},
        {"libexec/capd/libcapd_analysis.so", false},
        {"share/capd/runner/capd_runner/__main__.py", false},
        {"share/capd/schema/001_init.sql", false},
        {"share/capd/schema/openapi.yaml", false},
        {"share/doc/capd/README.md", false},
        {"share/doc/capd/deploy.md", false},
        {"share/doc/capd/operations.md", false},
        {"share/doc/capd/examples/capd.json", false},
        {"share/doc/capd/examples/Containerfile", false},
        {"share/doc/capd/examples/ci/capd-ci.sh", true},
        {"share/doc/capd/examples/ci/github-actions.yml", false},
        {"lib/systemd/system/capd.service", false},
        {"lib/sysusers.d/capd.conf", false},
        {"etc/capd/capd.json", false},
        {"share/man/man8/capd.8", false},
        {"share/man/man1/capctl.1", false},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char *p = pathf("%s/%s", prefix, want[i].rel);
        cr_assert(exists(p, S_IFREG, want[i].exec), "installed: %s", p);
        free(p);
    }
    char *stray = pathf("%s/bin/capd-exec", prefix);
    cr_assert_not(exists(stray, S_IFREG, false), "the exec shim is not a user command");
    free(stray);
    char *pycache = pathf("%s/share/capd/runner/capd_runner/__pycache__", prefix);
    cr_assert_not(exists(pycache, S_IFDIR, false), "no build-tree bytecode installed");
    free(pycache);
    /* Whatever GPU probe the build has goes next to the shim. */
    char *probe = pathf("%s/capd-gpuinfo", build);
    if (exists(probe, S_IFREG, true)) {
        char *p = pathf("%s/libexec/capd/capd-gpuinfo", prefix);
        cr_assert(exists(p, S_IFREG, true), "installed: %s", p);
        free(p);
    }
    free(probe);
    /* The installed man pages render without a single groff warning, both
     * through groff directly and through man(1) as a user would read them. */
    static const char *const pages[] = {"share/man/man8/capd.8", "share/man/man1/capctl.1"};
    for (size_t i = 0; i < 2; i++) {
        cr_assert_eq(tu_sh("groff -man -Tutf8 -ww -z '%s/%s' 2>'%s/groff.err' && test ! -s "
                           "'%s/groff.err'",
                           prefix, pages[i], top, top),
                     0, "groff renders %s without warnings (see %s/groff.err)", pages[i], top);
        cr_assert_eq(tu_sh("MANWIDTH=80 man --warnings -l '%s/%s' >'%s/man.out' 2>'%s/man.err' "
                           "&& test ! -s '%s/man.err' && grep -q 'SYNOPSIS' '%s/man.out'",
                           prefix, pages[i], top, top, top, top),
                     0, "man -l renders %s without warnings (see %s/man.err)", pages[i], top);
    }

    /* The unit was rewritten for this prefix and is valid. */
    char *unit_path = pathf("%s/lib/systemd/system/capd.service", prefix);
    char *unit = slurp(unit_path);
    char *exec_line = pathf("ExecStart=%s/bin/capd --config %s/etc/capd/capd.json", prefix, prefix);
    cr_assert(strstr(unit, exec_line), "the unit starts the installed capd: %s", exec_line);
    if (access("/usr/bin/systemd-analyze", X_OK) == 0)
        cr_assert_eq(tu_sh("systemd-analyze verify '%s' >'%s/verify.log' 2>&1", unit_path, top), 0,
                     "systemd-analyze verify (see %s/verify.log)", top);
    else
        cr_log_warn("systemd-analyze is not installed: the unit was not verified");
    free(unit);
    free(unit_path);
    free(exec_line);
    /* The sysusers entry makes the user the sample config runs cells as. */
    if (access("/usr/bin/systemd-sysusers", X_OK) == 0) {
        cr_assert_eq(tu_sh("mkdir -p '%s/sysroot/etc' && systemd-sysusers --root='%s/sysroot' "
                           "'%s/lib/sysusers.d/capd.conf' >/dev/null 2>&1 && "
                           "grep -q '^capd-runner:' '%s/sysroot/etc/passwd'",
                           top, top, prefix, top),
                     0, "systemd-sysusers creates capd-runner");
    }

    /* The installed capd, started with no runner or shim paths, finds both
     * in the prefix and runs a real cell through the installed capctl. */
    char *capd = pathf("%s/bin/capd", prefix), *capctl = pathf("%s/bin/capctl", prefix);
    char *run = pathf("%s/run", top);
    cr_assert_eq(mkdir(run, 0711), 0);
    setenv("CAPD_BIN", capd, 1);
    struct tu_capd c;
    cr_assert_eq(tu_capd_start(&c, run, NULL), 0, "installed capd starts (see %s)", c.errlog);
    /* The log line comes just after the stdout line tu_capd_start read. */
    char *log = NULL;
    for (int i = 0; i < 100; i++) {
        free(log);
        log = slurp(c.errlog);
        if (log && strstr(log, "event=listening"))
            break;
        usleep(20 * 1000);
    }
    char *runner = pathf("runner_dir=%s/bin/../share/capd/runner", prefix);
    cr_assert(strstr(log, runner), "capd uses the installed runner (%s): %s", runner, log);
    free(log);
    free(runner);
    const char *py = getenv("CAPD_PYTHON") ? getenv("CAPD_PYTHON") : "/usr/bin/python3";
    /* capctl finds the admin token capd wrote in its data dir. */
    cr_assert_eq(tu_sh("CAPD_SERVER=%s CAPD_DATA_DIR='%s/data' '%s' builds register --name "
                       "debian-torch --python %s >'%s/register.out' 2>&1",
                       c.base, c.dir, capctl, py, top),
                 0, "capctl builds register");
    cr_assert_eq(tu_sh("CAPD_SERVER=%s CAPD_DATA_DIR='%s/data' '%s' submit --project pytorch "
                       "--commit 1111111 "
                       "--build debian-torch --models mlp --widths native --passes forward "
                       "--wait --wait-timeout 600 >'%s/job' 2>'%s/submit.err'",
                       c.base, c.dir, capctl, top, top),
                 0, "capctl submit --wait: every cell ok (see %s/submit.err)", top);
    char *jobf = pathf("%s/job", top), *job = slurp(jobf);
    job[strcspn(job, "\n")] = 0;
    char *jpath = pathf("/v1/jobs/%s", job);
    json_t *j = tu_json(&c, "GET", jpath, NULL, NULL);
    json_t *cell = json_array_get(json_object_get(j, "cells"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "done");
    cr_assert_str_eq(json_string_value(json_object_get(cell, "state")), "ok", "cell: %s",
                     json_string_value(json_object_get(cell, "reason")));
    cr_assert_eq(json_array_size(json_object_get(j, "cells")), 1);
    /* ...and names the installed native stats library to the cell. */
    char *cpath =
        pathf("/v1/jobs/%s/cells/%s", job, json_string_value(json_object_get(cell, "id")));
    json_t *full = tu_json(&c, "GET", cpath, NULL, NULL);
    json_t *engine = json_object_get(json_object_get(full, "fingerprint"), "stats_engine");
    char *lib = pathf("%s/bin/../libexec/capd/libcapd_analysis.so", prefix);
    cr_assert_str_eq(json_string_value(json_object_get(engine, "name")), "native",
                     "stats engine of the installed cell");
    cr_assert_str_eq(json_string_value(json_object_get(engine, "library")), lib);
    json_decref(full);
    free(cpath), free(lib);
    json_decref(j);
    cr_assert_eq(tu_capd_stop(&c), 0, "installed capd stops cleanly");
    free(jobf), free(job), free(jpath);

    /* Uninstalling removes every installed file and capd's own directories;
     * the operator's config in etc/ stays, as a removed package's would. */
    cr_assert_eq(tu_sh("cmake -DMANIFEST='%s/manifest.txt' -P '%s/cmake/uninstall.cmake' "
                       ">'%s/uninstall.log' 2>&1",
                       top, tu_bin("CAPD_SOURCE_DIR"), top),
                 0, "uninstall (see %s/uninstall.log)", top);
    cr_assert_eq(tu_sh("test \"$(cd '%s' && find . -type f)\" = ./etc/capd/capd.json", prefix), 0,
                 "only etc/capd/capd.json is left");
    static const char *const gone[] = {"share/capd", "libexec/capd", "share/doc/capd",
                                       "share/man/man8/capd.8"};
    for (size_t i = 0; i < 4; i++) {
        char *p = pathf("%s/%s", prefix, gone[i]);
        cr_assert_not(exists(p, S_IFDIR, false) || exists(p, S_IFREG, false), "%s removed", p);
        free(p);
    }
    tu_sh("rm -rf '%s'", top);
    free(capd), free(capctl), free(run), free(prefix), free(build), free(top);
}

/* ---- deploy/capd.json ---- */

Test(deploy, sample_config_has_every_key_with_its_default, .timeout = 600)
{
    int n = 0;
    while (config_key_name((size_t)n))
        n++;
    cr_assert_gt(n, 30, "the key table (%d keys)", n);
    char *sample = pathf("%s/deploy/capd.json", tu_bin("CAPD_SOURCE_DIR"));
    json_t *j = json_load_file(sample, JSON_REJECT_DUPLICATES, NULL);
    cr_assert(json_is_object(j));
    char *docs_path = pathf("%s/docs/configuration.md", tu_bin("CAPD_SOURCE_DIR"));
    char *docs = slurp(docs_path);
    char *man_path = pathf("%s/docs/man/capd.8", tu_bin("CAPD_SOURCE_DIR"));
    char *man = slurp(man_path);
    cr_assert_not_null(man, "%s", man_path);
    for (int i = 0; i < n; i++) {
        const char *key = config_key_name((size_t)i);
        cr_assert(json_object_get(j, key), "deploy/capd.json has '%s'", key);
        char *row = pathf("| `%s` |", key);
        cr_assert(strstr(docs, row), "docs/configuration.md has a row for '%s'", key);
        free(row);
        row = pathf("\n.B %s\n", key);
        cr_assert(strstr(man, row), "capd.8's CONFIGURATION KEYS has '%s'", key);
        free(row);
    }
    cr_assert_eq(json_object_size(j), (size_t)n, "and nothing else");

    /* Loaded over the defaults, it changes only the production settings
     * docs/deploy.md lists. */
    struct capd_config def, got;
    char *err = NULL;
    config_defaults(&def);
    config_defaults(&got);
    cr_assert_eq(config_load_file(&got, sample, &err), 0, "%s", err);
    cr_assert(got.auth_required, "production: auth_required");
    cr_assert(got.unshare_net, "production: unshare_net");
    cr_assert_str_eq(got.run_as_user, "capd-runner");
    got.auth_required = def.auth_required;
    got.unshare_net = def.unshare_net;
    memcpy(got.run_as_user, def.run_as_user, sizeof got.run_as_user);
    got.env_allow_n = def.env_allow_n;
    memcpy(got.env_allow, def.env_allow, sizeof got.env_allow);
    cr_assert_eq(memcmp(&def, &got, sizeof def), 0,
                 "every other value in deploy/capd.json is its default");
    json_decref(j);
    free(sample), free(docs), free(docs_path), free(man), free(man_path);
}

Test(deploy, capd_starts_with_the_sample_config, .timeout = 600)
{
    char *src = pathf("%s/deploy/capd.json", tu_bin("CAPD_SOURCE_DIR"));
    char *dir = tu_tmpdir();
    /* As root, capd-runner must exist (systemd-sysusers makes it); on a host
     * without it, the same file with run_as_user nobody. */
    char *cfg = src;
    if (geteuid() == 0 && !getpwnam("capd-runner")) {
        cfg = pathf("%s/capd.json", dir);
        cr_assert_eq(tu_sh("sed 's/\"capd-runner\"/\"nobody\"/' '%s' > '%s'", src, cfg), 0);
    }
    const char *extra[] = {"--config", cfg, NULL};
    struct tu_capd c;
    cr_assert_eq(tu_capd_start(&c, dir, extra), 0, "capd --config %s starts (see %s)", cfg,
                 c.errlog);
    long st = 0;
    json_t *h = tu_json(&c, "GET", "/healthz", NULL, &st);
    cr_assert_eq(st, 200);
    json_decref(h);
    /* The sample keeps authentication on. */
    tu_anonymous(&c);
    json_decref(tu_json(&c, "GET", "/v1/builds", NULL, &st));
    cr_assert_eq(st, 401, "auth_required from the sample is in force");
    cr_assert_eq(tu_capd_stop(&c), 0);
    if (cfg != src)
        free(cfg);
    tu_sh("rm -rf '%s'", dir);
    free(src), free(dir);
}

/* ---- deploy/Containerfile ---- */

/* The runtime stage's apt-get line must name the Debian package of every
 * library the installed binaries link directly (their DT_NEEDED), so a new
 * dependency cannot slip past the image. */
Test(deploy, containerfile_runtime_has_every_linked_library, .timeout = 600)
{
    if (access("/usr/bin/dpkg", X_OK) != 0 || access("/usr/bin/readelf", X_OK) != 0) {
        cr_log_warn("no dpkg/readelf: the Containerfile's packages were not checked");
        return;
    }
    char *cf = pathf("%s/deploy/Containerfile", tu_bin("CAPD_SOURCE_DIR"));
    char *text = slurp(cf);
    char *runtime = strstr(text, "FROM debian:bookworm-slim");
    cr_assert_not_null(runtime, "the runtime stage is bookworm-slim");
    char *build = build_dir(), *dir = tu_tmpdir();
    cr_assert_eq(tu_sh("cd '%s' && for b in capd capctl capd-exec capd-cell capd-gpuinfo "
                       "libcapd_analysis.so; do "
                       "[ -x \"$b\" ] || continue; "
                       "for so in $(readelf -d \"$b\" | sed -n 's/.*Shared library: "
                       "\\[\\(.*\\)\\]/\\1/p'); do "
                       "path=$(ldd \"$b\" | awk -v so=\"$so\" '$1 == so { print $3 }'); "
                       "[ -n \"$path\" ] || continue; "
                       "dpkg -S \"$(readlink -f \"$path\")\" 2>/dev/null || dpkg -S \"$path\"; "
                       "done; done | cut -d: -f1 | sort -u > '%s/pkgs'",
                       build, dir),
                 0);
    char *pf = pathf("%s/pkgs", dir), *pkgs = slurp(pf);
    int checked = 0;
    for (char *line = strtok(pkgs, "\n"); line; line = strtok(NULL, "\n")) {
        /* In every Debian image already, or sanitizer runtimes of a
         * -DCAPD_SANITIZE=ON build that no image ships. */
        if (strcmp(line, "libc6") == 0 || strcmp(line, "libgcc-s1") == 0 ||
            strncmp(line, "libasan", 7) == 0 || strncmp(line, "libubsan", 8) == 0 ||
            strncmp(line, "liblsan", 7) == 0 || strncmp(line, "libtsan", 7) == 0)
            continue;
        char *word = pathf(" %s ", line);
        char *word_nl = pathf(" %s\n", line);
        cr_assert(strstr(runtime, word) || strstr(runtime, word_nl),
                  "deploy/Containerfile's runtime stage installs %s", line);
        free(word), free(word_nl);
        checked++;
    }
    cr_assert_geq(checked, 5, "found the libraries (%d packages)", checked);
    tu_sh("rm -rf '%s'", dir);
    free(cf), free(text), free(build), free(dir), free(pf), free(pkgs);
}

/* ---- deploy/ci/capd-ci.sh ---- */

/* A stand-in for the GitHub API: keeps issue comments in memory and logs
 * each request as "METHOD PATH" (and the start of a body). */
static const char fake_github_py[] =
    "import json, sys\n"
    "from http.server import BaseHTTPRequestHandler, HTTPServer\n"
    "comments = []\n"
    "log = open(sys.argv[2], 'a', buffering=1)\n"
    "class H(BaseHTTPRequestHandler):\n"
    "    def reply(self, code, obj):\n"
    "        b = json.dumps(obj).encode()\n"
    "        self.send_response(code); self.send_header('Content-Type', 'application/json')\n"
    "        self.send_header('Content-Length', str(len(b))); self.end_headers(); "
    "self.wfile.write(b)\n"
    "    def body(self):\n"
    "        return json.loads(self.rfile.read(int(self.headers['Content-Length'])))\n"
    "    def do_GET(self):\n"
    "        log.write('GET ' + self.path.split('?')[0] + '\\n'); self.reply(200, comments)\n"
    "    def do_POST(self):\n"
    "        b = self.body(); comments.append({'id': len(comments) + 1, 'body': b['body']})\n"
    "        log.write('POST ' + self.path + ' ' + self.headers['Authorization'] + ' ' +\n"
    "                  b['body'].splitlines()[0] + '\\n'); self.reply(201, comments[-1])\n"
    "    def do_PATCH(self):\n"
    "        b = self.body(); cid = int(self.path.rsplit('/', 1)[1]); comments[cid - 1]['body'] = "
    "b['body']\n"
    "        log.write('PATCH ' + self.path + '\\n'); self.reply(200, comments[cid - 1])\n"
    "    def log_message(self, *a):\n"
    "        pass\n"
    "s = HTTPServer(('127.0.0.1', 0), H)\n"
    "open(sys.argv[1] + '.tmp', 'w').write(str(s.server_port))\n"
    "import os; os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "s.serve_forever()\n";

/* Runs deploy/ci/capd-ci.sh from the checkout TOP/src with the fake runner
 * as the build's interpreter; ENV adds variables, REGISTER more flags of
 * `capctl builds register`. Output in TOP/TAG.out, the report TOP/TAG.md. */
static int ci_run(const struct tu_capd *c, const char *top, const char *env,
                  const char *register_args, const char *tag)
{
    char *build = build_dir(), *fake = tu_helper("fake_runner");
    /* CI is given its tokens; here the first admin token does both jobs. */
    int rc = tu_sh("cd '%s/src' && env CAPD_SERVER=%s CAPD_ADMIN_TOKEN=%s CAPD_TOKEN=%s "
                   "CAPCTL='%s/capctl' PROJECT=p "
                   "BUILD_PYTHON='%s' REGISTER_ARGS='--model-root %s %s' MODELS=fake:ok "
                   "WIDTHS=avx2 PASSES=forward SUBMIT_ARGS='--capture sample' "
                   "REPORT='%s/%s.md' %s '%s/deploy/ci/capd-ci.sh' >'%s/%s.out' 2>&1",
                   top, c->base, c->token, c->token, build, fake, top, register_args, top, tag, env,
                   tu_bin("CAPD_SOURCE_DIR"), top, tag);
    free(build);
    free(fake);
    return rc;
}

Test(deploy, ci_script_compares_posts_and_fails_on_regression, .timeout = 600)
{
    char *top = tu_tmpdir();
    chmod(top, 0755); /* a model root: the cell user lists it */
    struct tu_capd c;
    cr_assert_eq(tu_capd_start(&c, NULL, NULL), 0);
    /* The checkout the build came from (provenance needs a git tree). */
    cr_assert_eq(tu_sh("mkdir -p '%s/src' && cd '%s/src' && git init -q && "
                       "git -c user.email=t@t -c user.name=t commit -q --allow-empty -m x",
                       top, top),
                 0);
    char *srv = pathf("%s/gh.py", top), *portf = pathf("%s/gh.port", top);
    FILE *f = fopen(srv, "w");
    fputs(fake_github_py, f);
    fclose(f);
    cr_assert_eq(tu_sh("python3 '%s' '%s' '%s/gh.log' >/dev/null 2>&1 & echo $! > '%s/gh.pid'", srv,
                       portf, top, top),
                 0);
    char *port = NULL;
    for (int i = 0; i < 100 && !(port = slurp(portf)); i++)
        usleep(50 * 1000);
    cr_assert_not_null(port, "the GitHub stand-in listens");
    char *gh = pathf("GITHUB_TOKEN=t0ken GITHUB_REPOSITORY=o/r PR_NUMBER=7 "
                     "GITHUB_API_URL=http://127.0.0.1:%s",
                     port);

    /* The control: a main-branch commit, no comparison. */
    cr_assert_eq(ci_run(&c, top, "COMMIT=aaaaaaa1 BRANCH=main", "", "control"), 0,
                 "control run (see %s/control.out)", top);
    /* A head that computes the same: pass, report posted. */
    char *env = pathf("COMMIT=bbbbbbb2 BRANCH=pr-7 CONTROL_COMMIT=aaaaaaa1 %s", gh);
    cr_assert_eq(ci_run(&c, top, env, "", "same"), 0, "same run (see %s/same.out)", top);
    free(env);
    char *p = pathf("%s/same.md", top), *md = slurp(p);
    cr_assert_not_null(md);
    cr_assert(strstr(md, "PASS") || strstr(md, "pass"), "report says pass: %s", md);
    free(p), free(md);
    /* A head whose build perturbs one tensor: regression, exit 1, the same
     * comment updated. */
    env = pathf("COMMIT=ccccccc3 BRANCH=pr-7 CONTROL_COMMIT=aaaaaaa1 %s", gh);
    cr_assert_eq(
        ci_run(&c, top, env, "--env FAKE_PERTURB_KEY=layer1.0.forward.output.0", "regress"), 1,
        "a regression fails the check (see %s/regress.out)", top);
    free(env);
    p = pathf("%s/regress.md", top);
    md = slurp(p);
    cr_assert_not_null(md);
    cr_assert(strstr(md, "REGRESSION") || strstr(md, "regression"), "report: %s", md);
    free(p), free(md);

    char *logp = pathf("%s/gh.log", top), *log = slurp(logp);
    cr_assert_not_null(log, "the GitHub stand-in was called");
    cr_assert(strstr(log, "POST /repos/o/r/issues/7/comments Bearer t0ken <!-- capd-report -->"),
              "the first report is a new comment with the marker: %s", log);
    cr_assert(strstr(log, "PATCH /repos/o/r/issues/comments/1"), "the second updates it: %s", log);
    cr_assert_null(strstr(strstr(log, "POST") + 4, "POST"), "only one comment: %s", log);
    tu_sh("kill $(cat '%s/gh.pid')", top);
    cr_assert_eq(tu_capd_stop(&c), 0);
    tu_sh("rm -rf '%s'", top);
    free(logp), free(log), free(gh), free(port), free(srv), free(portf), free(top);
}

/* ---- man pages and documented commands against the --help texts ---- */

/* The stdout of a shell command, run with the built binaries' directory
 * first in PATH (NULL when it fails). */
static char *output_of(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *output_of(const char *fmt, ...)
{
    char *cmd = NULL, *dir = tu_tmpdir(), *build = build_dir();
    va_list ap;
    va_start(ap, fmt);
    cr_assert_geq(vasprintf(&cmd, fmt, ap), 0);
    va_end(ap);
    int rc = tu_sh("PATH='%s':\"$PATH\" %s >'%s/out' 2>/dev/null", build, cmd, dir);
    char *p = pathf("%s/out", dir), *out = rc == 0 ? slurp(p) : NULL;
    tu_sh("rm -rf '%s'", dir);
    free(p), free(dir), free(build), free(cmd);
    return out;
}

static bool flag_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
}

/* Whether TEXT names the long flag FLAG ("--name") as a whole word. */
static bool has_flag(const char *text, const char *flag)
{
    size_t n = strlen(flag);
    for (const char *p = text; (p = strstr(p, flag)) != NULL; p++)
        if ((p == text || !flag_char(p[-1]) || p[-1] == ' ') && !flag_char(p[n]))
            return true;
    return false;
}

/* Calls FN for every long flag ("--word") TEXT names. */
static void each_flag(const char *text, void (*fn)(const char *flag, void *ud), void *ud)
{
    for (const char *p = text; (p = strstr(p, "--")) != NULL;) {
        size_t n = 2;
        while (flag_char(p[n]))
            n++;
        bool word_start = p == text || !flag_char(p[-1]) || p[-1] == ' ';
        if (word_start && n > 2 && p[2] >= 'a' && p[2] <= 'z' && n < 64) {
            char flag[64];
            snprintf(flag, sizeof flag, "%.*s", (int)n, p);
            fn(flag, ud);
        }
        p += n;
    }
}

/* A man page's source with roff's "\-" read as "-". */
static char *man_text(const char *name)
{
    char *p = pathf("%s/docs/man/%s", tu_bin("CAPD_SOURCE_DIR"), name), *t = slurp(p);
    cr_assert_not_null(t, "%s exists", p);
    char *w = t;
    for (const char *r = t; *r; r++) {
        if (r[0] == '\\' && r[1] == '-')
            r++;
        *w++ = *r;
    }
    *w = 0;
    free(p);
    return t;
}

struct drift {
    const char *page, *page_text, *help_text;
    int checked;
};

static void flag_in_page(const char *flag, void *ud)
{
    struct drift *d = ud;
    cr_assert(has_flag(d->page_text, flag), "%s documents %s, which --help prints", d->page, flag);
    d->checked++;
}

static void flag_in_help(const char *flag, void *ud)
{
    struct drift *d = ud;
    cr_assert(has_flag(d->help_text, flag), "%s names %s, which no --help prints", d->page, flag);
}

/* Every long flag that a --help text prints is in the man page, and every
 * flag the man page names is one some --help prints: the two cannot drift
 * apart silently. The commands' --help texts are what their parsers take
 * (each command's option table prints them). */
Test(deploy, man_pages_name_every_flag_of_the_help_texts, .timeout = 600)
{
    static const char *const capd_helps[] = {"capd --help", "capd db --help", "capd token --help"};
    static const char *const capctl_helps[] = {"capctl --help",
                                               "capctl builds --help",
                                               "capctl builds list --help",
                                               "capctl builds register --help",
                                               "capctl builds show --help",
                                               "capctl submit --help",
                                               "capctl status --help",
                                               "capctl wait --help",
                                               "capctl cancel --help",
                                               "capctl diff --help",
                                               "capctl widths --help",
                                               "capctl widths list --help",
                                               "capctl widths check --help",
                                               "capctl history --help",
                                               "capctl alerts --help",
                                               "capctl bisect --help",
                                               "capctl repro --help"};
    static const struct {
        const char *page;
        const char *const *helps;
        size_t n;
        int min_flags;
    } pages[] = {{"capd.8", capd_helps, 3, 14},
                 {"capctl.1", capctl_helps, sizeof capctl_helps / sizeof capctl_helps[0], 40}};
    for (size_t i = 0; i < 2; i++) {
        char *all = strdup("");
        for (size_t k = 0; k < pages[i].n; k++) {
            char *h = output_of("%s", pages[i].helps[k]), *both = NULL;
            cr_assert_not_null(h, "`%s` exits 0", pages[i].helps[k]);
            cr_assert_geq(asprintf(&both, "%s\n%s", all, h), 0);
            free(all), free(h);
            all = both;
        }
        struct drift d = {pages[i].page, man_text(pages[i].page), all, 0};
        each_flag(all, flag_in_page, &d);
        cr_assert_geq(d.checked, pages[i].min_flags, "the help texts of %s were read",
                      pages[i].page);
        each_flag(d.page_text, flag_in_help, &d);
        /* Every command of capctl's list has a section of its own. */
        if (strcmp(pages[i].page, "capctl.1") == 0) {
            static const char *const cmds[] = {"builds", "submit", "status",  "wait",   "cancel",
                                               "diff",   "widths", "history", "alerts", "bisect"};
            for (size_t k = 0; k < sizeof cmds / sizeof cmds[0]; k++) {
                char *sec = pathf("\n.SS \"%s ", cmds[k]);
                cr_assert(strstr(d.page_text, sec), "capctl.1 has a section for %s", cmds[k]);
                free(sec);
            }
        } else {
            static const char *const cmds[] = {"db backup",    "db vacuum",  "db prune",
                                               "token create", "token list", "token revoke"};
            for (size_t k = 0; k < 6; k++) {
                char *sec = pathf("\n.SS \"capd %s", cmds[k]);
                cr_assert(strstr(d.page_text, sec), "capd.8 has a section for %s", cmds[k]);
                free(sec);
            }
            /* capd --help lists every subcommand, not only the flags. */
            char *top = output_of("capd --help");
            cr_assert(top && strstr(top, "capd db backup|vacuum|prune") &&
                          strstr(top, "capd token create|list|revoke"),
                      "capd --help names capd db and capd token: %s", top ? top : "");
            free(top);
        }
        free((char *)d.page_text);
        free(all);
    }
}

/* capd.8 says which mode the data dir gets; it must be the mode capd
 * actually leaves it in (0750, and o+x on top when capd is root so that
 * run_as_user reaches its scratch dir). */
Test(deploy, man_page_states_the_data_dir_mode, .timeout = 120)
{
    struct tu_capd c;
    cr_assert_eq(tu_capd_start(&c, NULL, NULL), 0);
    char *data = pathf("%s/data", c.dir);
    struct stat sb;
    cr_assert_eq(stat(data, &sb), 0);
    unsigned want = geteuid() == 0 ? 0751 : 0750;
    cr_assert_eq(sb.st_mode & 07777, want, "data dir mode %04o", (unsigned)(sb.st_mode & 07777));
    char *page = man_text("capd.8");
    cr_assert(strstr(page, "Created when missing (mode 0750; capd running as root then adds o+x, "
                           "0751"),
              "capd.8 states both modes");
    free(page);
    free(data);
    cr_assert_eq(tu_capd_stop(&c), 0);
}

/* The help text that lists the flags of a documented command line: the
 * command and subcommand words after the program name pick it. */
static char *help_for(char **words, int n)
{
    int i = 1;
    bool capctl = strcmp(words[0], "capctl") == 0;
    /* capctl's global options may come first. */
    while (capctl && i < n && strncmp(words[i], "--", 2) == 0)
        i += strcmp(words[i], "--server") == 0 || strcmp(words[i], "--token") == 0 ? 2 : 1;
    const char *cmd = i < n && words[i][0] != '-' ? words[i] : NULL;
    const char *sub = cmd && i + 1 < n && words[i + 1][0] != '-' && strcmp(cmd, "builds") == 0
                          ? words[i + 1]
                          : NULL;
    if (!capctl)
        sub = NULL;
    if (!capctl && cmd && strcmp(cmd, "db") != 0 && strcmp(cmd, "token") != 0)
        cmd = NULL; /* capd's only words are db and token */
    char *h = output_of("%s %s %s --help", words[0], cmd ? cmd : "", sub ? sub : "");
    cr_assert_not_null(h, "`%s %s %s --help` exits 0: a documented command exists", words[0],
                       cmd ? cmd : "", sub ? sub : "");
    if (capctl) { /* the global options apply to every command */
        char *g = output_of("capctl --help"), *both = NULL;
        cr_assert_geq(asprintf(&both, "%s\n%s", h, g), 0);
        free(h), free(g);
        h = both;
    }
    return h;
}

/*
 * The command lines of the user documentation's ```sh blocks that run capd
 * or capctl use only commands and flags those programs take. Lines are
 * joined at a trailing backslash; a leading `sudo`, `$ ` or VAR=value and
 * a build directory before the program name are skipped; the command ends
 * at a pipe, redirection, `&&`, `;`, `&` or comment.
 */
Test(deploy, documented_commands_use_only_flags_the_programs_take, .timeout = 600)
{
    static const char *const docs[] = {"README.md", "docs/getting-started.md",
                                       "docs/troubleshooting.md", "docs/operations.md",
                                       "docs/concepts.md"};
    int checked = 0;
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        char *p = pathf("%s/%s", tu_bin("CAPD_SOURCE_DIR"), docs[i]), *t = slurp(p);
        cr_assert_not_null(t, "%s exists", p);
        bool in_sh = false;
        char line[8192] = "";
        for (char *save = NULL, *l = strtok_r(t, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
            if (strncmp(l, "```", 3) == 0) {
                in_sh = !in_sh && strcmp(l, "```sh") == 0;
                line[0] = 0;
                continue;
            }
            if (!in_sh)
                continue;
            size_t n = strlen(line), ln = strlen(l);
            snprintf(line + n, sizeof line - n, "%s", l);
            if (ln > 0 && l[ln - 1] == '\\') {
                line[strlen(line) - 1] = ' ';
                continue;
            }
            /* The words point into CMD, so LINE can start the next one. */
            char cmd[sizeof line], *words[128];
            int nw = 0;
            snprintf(cmd, sizeof cmd, "%s", line);
            line[0] = 0;
            for (char *s2 = NULL, *w = strtok_r(cmd, " \t", &s2); w && nw < 128;
                 w = strtok_r(NULL, " \t", &s2)) {
                if (*w == '#' || *w == '|' || *w == '>' || *w == '<' || *w == '&' || *w == ';' ||
                    strcmp(w, "2>&1") == 0)
                    break;
                if (nw == 0 && (strcmp(w, "sudo") == 0 || strcmp(w, "$") == 0 ||
                                (strchr(w, '=') && w[0] != '-')))
                    continue;
                words[nw++] = w;
            }
            if (nw == 0)
                continue;
            const char *prog = strrchr(words[0], '/') ? strrchr(words[0], '/') + 1 : words[0];
            if (strcmp(prog, "capd") != 0 && strcmp(prog, "capctl") != 0)
                continue;
            words[0] = (char *)prog;
            char *help = help_for(words, nw);
            for (int k = 1; k < nw; k++) {
                char flag[64];
                if (strncmp(words[k], "--", 2) != 0)
                    continue;
                snprintf(flag, sizeof flag, "%.*s", (int)strcspn(words[k], "="), words[k]);
                cr_assert(has_flag(help, flag), "%s: `%s ... %s`: no such flag in its --help",
                          docs[i], prog, flag);
            }
            free(help);
            checked++;
        }
        free(t), free(p);
    }
    cr_assert_geq(checked, 20, "documented command lines were found (%d)", checked);
}
