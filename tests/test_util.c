/* test_util.c: util/, the helpers below every other part (util/buf.h,
 * util/err.h, util/path.h, util/str.h, util/fs.h, util/clock.h, util/http.h,
 * util/cpuwrap.h, util/cellstate.h).
 *
 * Each limit is crossed by one byte, and each failure is checked to leave
 * what it was given unchanged. File-system tests work in a fresh temp dir.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers/common/testutil.h"
#include "util/buf.h"
#include "util/cellstate.h"
#include "util/clock.h"
#include "util/cpuwrap.h"
#include "util/err.h"
#include "util/fs.h"
#include "util/http.h"
#include "util/path.h"
#include "util/str.h"

/* ---- ubuf ---------------------------------------------------------------- */

Test(util, buf_add_grows_and_terminates)
{
    struct ubuf b;
    ubuf_init(&b, 1 << 20);
    cr_assert_null(b.p);
    for (int i = 0; i < 1000; i++)
        cr_assert_eq(ubuf_add(&b, "abcdefgh", 8), 0);
    cr_assert_eq(b.len, 8000);
    cr_assert_eq(b.p[8000], 0);
    cr_assert(b.cap <= b.max + 1);
    cr_assert_eq(memcmp(b.p + 7992, "abcdefgh", 8), 0);
    cr_assert_eq(ubuf_addc(&b, 'x'), 0);
    cr_assert_eq(ubuf_adds(&b, "yz"), 0);
    cr_assert_str_eq(b.p + 8000, "xyz");
    ubuf_free(&b);
    cr_assert_null(b.p);
    cr_assert_eq(b.len, 0);
    cr_assert_eq(b.max, 1 << 20);
}

Test(util, buf_past_max_is_e2big_and_unchanged)
{
    struct ubuf b;
    ubuf_init(&b, 10);
    cr_assert_eq(ubuf_add(&b, "0123456789", 10), 0); /* exactly the maximum */
    cr_assert_eq(b.cap, 11);
    cr_assert_eq(ubuf_addc(&b, 'x'), -E2BIG);
    cr_assert_eq(ubuf_add(&b, "x", 1), -E2BIG);
    cr_assert_eq(ubuf_addf(&b, "%d", 7), -E2BIG);
    cr_assert_eq(ubuf_reserve(&b, 1), -E2BIG);
    cr_assert_eq(b.len, 10);
    cr_assert_str_eq(b.p, "0123456789");
    cr_assert_eq(ubuf_add(&b, NULL, 0), 0);

    ubuf_setlen(&b, 5);
    cr_assert_str_eq(b.p, "01234");
    /* 5 + 6 is one past the maximum: refused whole, not cut at 10. */
    cr_assert_eq(ubuf_add(&b, "abcdef", 6), -E2BIG);
    cr_assert_eq(ubuf_addf(&b, "%s", "abcdef"), -E2BIG);
    cr_assert_str_eq(b.p, "01234");
    cr_assert_eq(ubuf_add(&b, "abcde", 5), 0);
    cr_assert_str_eq(b.p, "01234abcde");
    ubuf_free(&b);

    /* A size that would overflow len + n is refused, not wrapped. */
    ubuf_init(&b, SIZE_MAX - 1);
    cr_assert_eq(ubuf_add(&b, "ab", 2), 0);
    cr_assert_eq(ubuf_reserve(&b, SIZE_MAX - 2), -E2BIG);
    cr_assert_str_eq(b.p, "ab");
    ubuf_free(&b);
}

Test(util, buf_addf_formats_past_the_room)
{
    struct ubuf b;
    ubuf_init(&b, 100000);
    char big[5000];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = 0;
    cr_assert_eq(ubuf_addf(&b, "<%d>", 42), 0);
    cr_assert_eq(ubuf_addf(&b, "%s|%s", big, "end"), 0);
    cr_assert_eq(b.len, 4 + 4999 + 4);
    cr_assert_eq(strncmp(b.p, "<42>qqq", 7), 0);
    cr_assert_str_eq(b.p + b.len - 4, "|end");
    ubuf_free(&b);

    /* A format that does not fit the room and passes the maximum leaves
     * the terminator where it was. */
    ubuf_init(&b, 300);
    cr_assert_eq(ubuf_adds(&b, "head"), 0);
    cr_assert_eq(ubuf_addf(&b, "%s", big), -E2BIG);
    cr_assert_str_eq(b.p, "head");
    cr_assert_eq(b.len, 4);
    ubuf_free(&b);
}

Test(util, buf_reset_shift_take)
{
    struct ubuf b;
    ubuf_init(&b, 64);
    size_t n = 99;
    char *s = ubuf_take(&b, &n); /* nothing added: an empty string */
    cr_assert_not_null(s);
    cr_assert_str_eq(s, "");
    cr_assert_eq(n, 0);
    free(s);

    cr_assert_eq(ubuf_adds(&b, "hello world"), 0);
    ubuf_shift(&b, 6);
    cr_assert_str_eq(b.p, "world");
    cr_assert_eq(b.len, 5);
    ubuf_reset(&b);
    cr_assert_eq(b.len, 0);
    cr_assert_str_eq(b.p, "");
    cr_assert_eq(ubuf_reserve(&b, 10), 0);
    memcpy(b.p, "0123456789", 10);
    ubuf_setlen(&b, 10);
    cr_assert_str_eq(b.p, "0123456789");
    s = ubuf_take(&b, &n);
    cr_assert_str_eq(s, "0123456789");
    cr_assert_eq(n, 10);
    cr_assert_null(b.p);
    cr_assert_eq(b.len, 0);
    cr_assert_eq(b.max, 64);
    free(s);
}

/* ---- util_errf ----------------------------------------------------------- */

Test(util, errf_sets_message_and_returns_rc)
{
    char *err = NULL;
    cr_assert_eq(util_errf(&err, -EINVAL, "port %d of %s", 70000, "listen"), -EINVAL);
    cr_assert_str_eq(err, "port 70000 of listen");
    free(err);
    cr_assert_eq(util_errf(NULL, -ENOENT, "nobody asked %s", "for this"), -ENOENT);
    err = NULL;
    cr_assert_eq(util_errf(&err, 0, "rc 0 is passed through too"), 0);
    cr_assert_str_eq(err, "rc 0 is passed through too");
    free(err);
}

/* ---- util_path_join ------------------------------------------------------ */

Test(util, path_join_fits_and_refuses)
{
    char out[UTIL_PATH_MAX];
    cr_assert_eq(util_path_join(out, "/data", "capd.db"), 0);
    cr_assert_str_eq(out, "/data/capd.db");
    cr_assert_eq(util_path_join(out, "a/", "b"), 0);
    cr_assert_str_eq(out, "a//b"); /* exactly "%s/%s" */

    /* dir + '/' + name + NUL == UTIL_PATH_MAX: the longest that fits. */
    char dir[UTIL_PATH_MAX];
    memset(dir, 'd', UTIL_PATH_MAX - 3);
    dir[UTIL_PATH_MAX - 3] = 0;
    cr_assert_eq(util_path_join(out, dir, "n"), 0);
    cr_assert_eq(strlen(out), UTIL_PATH_MAX - 1);
    cr_assert_eq(util_path_join(out, dir, "nn"), -ENAMETOOLONG);
    cr_assert_str_eq(out, "");

    /* OUT may be DIR itself. */
    char p[UTIL_PATH_MAX] = "/x";
    cr_assert_eq(util_path_join(p, p, "y"), 0);
    cr_assert_str_eq(p, "/x/y");
}

/* ---- util_join ----------------------------------------------------------- */

Test(util, join_whole_names_or_none)
{
    char out[8] = "";
    size_t len = 0;
    cr_assert_eq(util_join(out, sizeof out, &len, ",", "ab"), 0);
    cr_assert_str_eq(out, "ab", "no separator before the first name");
    cr_assert_eq(util_join(out, sizeof out, &len, ",", "cd"), 0);
    cr_assert_str_eq(out, "ab,cd");
    cr_assert_eq(len, 5);

    /* "ab,cd,e" and its NUL fill the 8 bytes: the longest that fits. */
    cr_assert_eq(util_join(out, sizeof out, &len, ",", "ef"), -E2BIG);
    cr_assert_str_eq(out, "ab,cd", "a name that does not fit is not cut");
    cr_assert_eq(len, 5);
    cr_assert_eq(util_join(out, sizeof out, &len, ",", "e"), 0);
    cr_assert_str_eq(out, "ab,cd,e");

    char one[3] = "";
    len = 0;
    cr_assert_eq(util_join(one, sizeof one, &len, "&", NULL), 0, "NULL is the empty name");
    cr_assert_eq(util_join(one, sizeof one, &len, "&", "abc"), -E2BIG);
    cr_assert_str_eq(one, "");
    cr_assert_eq(len, 0);
    cr_assert_eq(util_join(one, sizeof one, &len, "&", "ab"), 0);
    cr_assert_str_eq(one, "ab");
}

/* ---- util/fs.h ----------------------------------------------------------- */

static char *tmp_file(const char *dir, const char *name, const char *body, size_t n)
{
    char *path = NULL;
    cr_assert(asprintf(&path, "%s/%s", dir, name) > 0);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert(fd >= 0);
    cr_assert_eq(util_write_all(fd, body, n), 0);
    close(fd);
    return path;
}

Test(util, mkdir_p_and_rm_tree)
{
    char *dir = tu_tmpdir();
    char deep[UTIL_PATH_MAX], leaf[UTIL_PATH_MAX];
    snprintf(deep, sizeof deep, "%s/a/b/c", dir);
    cr_assert_eq(util_mkdir_p(deep, 0750), 0);
    struct stat sb;
    cr_assert_eq(stat(deep, &sb), 0);
    cr_assert(S_ISDIR(sb.st_mode));
    mode_t um = umask(0);
    umask(um);
    cr_assert_eq(sb.st_mode & 0777, 0750 & ~um);
    cr_assert_eq(util_mkdir_p(deep, 0750), 0, "an existing directory is fine");
    free(tmp_file(deep, "f", "x", 1));

    /* A file in the way of a parent. */
    cr_assert_eq(util_path_join(leaf, deep, "f/g"), 0);
    cr_assert_eq(util_mkdir_p(leaf, 0750), -ENOTDIR);

    /* A path that does not fit is refused before any mkdir. */
    char big[UTIL_PATH_MAX + 10];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    cr_assert_eq(util_mkdir_p(big, 0750), -ENAMETOOLONG);
    cr_assert_eq(util_rm_tree(big), -ENAMETOOLONG);

    /* rm_tree does not follow a link out of the tree. */
    char outside[UTIL_PATH_MAX], link[UTIL_PATH_MAX], top[UTIL_PATH_MAX];
    snprintf(outside, sizeof outside, "%s/outside", dir);
    cr_assert_eq(util_mkdir_p(outside, 0750), 0);
    free(tmp_file(outside, "keep", "k", 1));
    snprintf(link, sizeof link, "%s/a/b/link", dir);
    cr_assert_eq(symlink(outside, link), 0);
    snprintf(top, sizeof top, "%s/a", dir);
    cr_assert_eq(util_rm_tree(top), 0);
    cr_assert_eq(stat(top, &sb), -1);
    cr_assert_eq(util_path_join(leaf, outside, "keep"), 0);
    cr_assert_eq(stat(leaf, &sb), 0, "the link's target survives");
    cr_assert_eq(util_rm_tree(top), 0, "a missing tree is not an error");

    cr_assert_eq(util_rm_tree(dir), 0);
    cr_assert_eq(stat(dir, &sb), -1);
    free(dir);
}

Test(util, slurp_reads_whole_and_refuses_past_max)
{
    char *dir = tu_tmpdir();
    char *path = tmp_file(dir, "ten", "0123456789", 10);
    char *s = NULL;
    size_t n = 0;
    cr_assert_eq(util_slurp(path, 10, &s, &n), 0); /* exactly the maximum */
    cr_assert_eq(n, 10);
    cr_assert_str_eq(s, "0123456789");
    free(s);
    s = (char *)1;
    cr_assert_eq(util_slurp(path, 9, &s, &n), -E2BIG);
    cr_assert_null(s);

    char *empty = tmp_file(dir, "empty", "", 0);
    cr_assert_eq(util_slurp(empty, 0, &s, NULL), 0);
    cr_assert_str_eq(s, "");
    free(s);

    char missing[UTIL_PATH_MAX];
    snprintf(missing, sizeof missing, "%s/missing", dir);
    cr_assert_eq(util_slurp(missing, 10, &s, &n), -ENOENT);
    cr_assert_null(s);
    cr_assert_eq(util_slurp(dir, 10, &s, &n), -EISDIR);

    /* A pipe has no size up front: the buffer grows, and the limit holds. */
    int pfd[2];
    cr_assert_eq(pipe2(pfd, O_CLOEXEC), 0);
    char chunk[10000];
    memset(chunk, 'p', sizeof chunk);
    cr_assert_eq(util_write_all(pfd[1], chunk, sizeof chunk), 0);
    close(pfd[1]);
    cr_assert_eq(util_slurp_fd(pfd[0], sizeof chunk, &s, &n), 0);
    cr_assert_eq(n, sizeof chunk);
    cr_assert_eq(s[n], 0);
    cr_assert_eq(memcmp(s, chunk, n), 0);
    free(s);
    close(pfd[0]);
    cr_assert_eq(pipe2(pfd, O_CLOEXEC), 0);
    cr_assert_eq(util_write_all(pfd[1], chunk, sizeof chunk), 0);
    close(pfd[1]);
    cr_assert_eq(util_slurp_fd(pfd[0], sizeof chunk - 1, &s, &n), -E2BIG);
    cr_assert_null(s);
    close(pfd[0]);

    /* /proc files report a size of 0 and still have contents. */
    cr_assert_eq(util_slurp("/proc/self/status", 1 << 20, &s, &n), 0);
    cr_assert(n > 0 && strstr(s, "Pid:"));
    free(s);

    free(path);
    free(empty);
    cr_assert_eq(util_rm_tree(dir), 0);
    free(dir);
}

Test(util, write_all_reports_errors)
{
    char *dir = tu_tmpdir();
    char *path = tmp_file(dir, "w", "abc", 3);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    cr_assert(fd >= 0);
    cr_assert_eq(util_write_all(fd, "x", 1), -EBADF);
    close(fd);
    cr_assert_eq(util_write_all(-1, "x", 1), -EBADF);
    cr_assert_eq(util_write_all(-1, "x", 0), 0, "nothing to write is no write");
    free(path);
    cr_assert_eq(util_rm_tree(dir), 0);
    free(dir);
}

/* ---- util/clock.h -------------------------------------------------------- */

Test(util, clocks_agree_and_advance)
{
    uint64_t ns0 = util_mono_ns();
    int64_t ms0 = util_mono_ms();
    usleep(20000);
    uint64_t ns1 = util_mono_ns();
    int64_t ms1 = util_mono_ms();
    cr_assert(ns1 - ns0 >= 20000000u, "%llu", (unsigned long long)(ns1 - ns0));
    cr_assert(ms1 - ms0 >= 19 && ms1 - ms0 < 5000, "%lld", (long long)(ms1 - ms0));
    cr_assert(llabs((long long)(ns1 / 1000000u) - (long long)ms1) <= 1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t wall = util_wall_ms();
    cr_assert(llabs(wall - ((int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000)) < 1000);
    cr_assert(wall > INT64_C(1700000000000)); /* after 2023 */
}

/* ---- util/http.h --------------------------------------------------------- */

Test(util, http_base_keeps_http_urls_without_trailing_slashes)
{
    char out[32];
    cr_assert_eq(util_http_base("http://127.0.0.1:8470", out, sizeof out), 0);
    cr_assert_str_eq(out, "http://127.0.0.1:8470");
    cr_assert_eq(util_http_base("HTTPS://capd.example/api//", out, sizeof out), 0);
    cr_assert_str_eq(out, "HTTPS://capd.example/api");
    cr_assert_eq(util_http_base("ftp://capd.example", out, sizeof out), -EINVAL);
    cr_assert_str_eq(out, "");
    cr_assert_eq(util_http_base("127.0.0.1:8470", out, sizeof out), -EINVAL);
    /* 31 bytes fit in 32; 32 do not, but trailing slashes do not count */
    cr_assert_eq(util_http_base("http://a.example/0123456789abcd/////", out, sizeof out), 0);
    cr_assert_str_eq(out, "http://a.example/0123456789abcd");
    cr_assert_eq(util_http_base("http://a.example/0123456789abcde", out, sizeof out),
                 -ENAMETOOLONG);
    cr_assert_str_eq(out, "");
}

Test(util, http_token_and_bearer)
{
    cr_assert(util_http_token_ok("abc-DEF_123.~+/="));
    cr_assert(util_http_token_ok("caf\xc3\xa9")); /* bytes past ASCII are the server's to judge */
    cr_assert_not(util_http_token_ok("a b"));
    cr_assert_not(util_http_token_ok("a\tb"));
    cr_assert_not(util_http_token_ok("ab\n"));
    cr_assert_not(util_http_token_ok("a\x7f"));
    char *h = util_http_bearer("t0k3n");
    cr_assert_str_eq(h, "Authorization: Bearer t0k3n");
    util_http_secret_free(h);
    util_http_secret_free(NULL);
}

/* ---- util/cpuwrap.h ------------------------------------------------------ */

Test(util, cpuwrap_peels_every_wrapping)
{
    static const struct {
        const char *path, *peeled;
        int depth;
    } cases[] = {
        {"Activation.cpp.DEFAULT.cpp", "Activation.cpp", 1},
        {"Activation.cpp.AVX2.cpp", "Activation.cpp", 1},
        {"UpSampleKernel.cpp.AVX2.cpp.DEFAULT.cpp.AVX512.cpp", "UpSampleKernel.cpp", 3},
        {"aten/src/ATen/native/cpu/X.cpp.SVE256.cpp", "aten/src/ATen/native/cpu/X.cpp", 1},
        {"a.cpp.Z_9.cpp", "a.cpp", 1},
        /* no wrapper: left whole */
        {"Activation.cpp", "Activation.cpp", 0},
        {"Activation.cpp.avx2.cpp", "Activation.cpp.avx2.cpp", 0}, /* lower case */
        {"Activation.cpp.2AVX.cpp", "Activation.cpp.2AVX.cpp", 0}, /* a digit first */
        {"Activation.h.AVX2.cpp", "Activation.h.AVX2.cpp", 0},     /* no .cpp under it */
        {".cpp.AVX2.cpp", ".cpp.AVX2.cpp", 0},                     /* no stem */
        {"AVX2.cpp", "AVX2.cpp", 0},
        {"dir.cpp.AVX2/X.cpp", "dir.cpp.AVX2/X.cpp", 0}, /* a directory is no wrapping */
        {"", "", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int depth = -1;
        size_t n = util_cpuwrap_peel(cases[i].path, &depth);
        cr_assert_eq(depth, cases[i].depth, "%s: depth %d", cases[i].path, depth);
        cr_assert_eq(n, strlen(cases[i].peeled), "%s: %zu", cases[i].path, n);
        cr_assert_eq(strncmp(cases[i].path, cases[i].peeled, n), 0, "%s", cases[i].path);
    }
    cr_assert_eq(util_cpuwrap_peel("X.cpp.AVX2.cpp", NULL), 5);
}

/* ---- util/cellstate.h ---------------------------------------------------- */

Test(util, cell_state_names_parse_back)
{
    for (unsigned i = 0; i < CELL_STATE_N; i++) {
        enum cell_state st = CELL_STATE_N;
        const char *name = cell_state_name((enum cell_state)i);
        cr_assert_not_null(name, "state %u has no name", i);
        cr_assert_eq(cell_state_parse(name, &st), 0, "%s", name);
        cr_assert_eq(st, (enum cell_state)i, "%s", name);
        cr_assert(cell_state_is(name, (enum cell_state)i), "%s", name);
        for (unsigned j = 0; j < i; j++)
            cr_assert_str_neq(name, cell_state_name((enum cell_state)j));
    }
    cr_assert_null(cell_state_name(CELL_STATE_N));
    cr_assert_str_eq(cell_state_name(CELL_PROTOCOL_ERROR), "protocol_error");
}

Test(util, cell_state_unknown_words_are_einval)
{
    const char *bad[] = {"", "OK", "ok ", " ok", "done", "oomx", "protocol", "other"};
    enum cell_state st = CELL_OOM;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(cell_state_parse(bad[i], &st), -EINVAL, "'%s'", bad[i]);
        cr_assert(!cell_state_is(bad[i], CELL_OK), "'%s'", bad[i]);
    }
    cr_assert_eq(cell_state_parse(NULL, &st), -EINVAL);
    cr_assert_eq(st, CELL_OOM, "a refused word leaves OUT as it was");
    cr_assert(!cell_state_is(NULL, CELL_OK));
    cr_assert(!cell_state_is("ok", CELL_STATE_N));
}

Test(util, cell_state_predicates)
{
    for (unsigned i = 0; i < CELL_STATE_N; i++) {
        enum cell_state st = (enum cell_state)i;
        cr_assert_eq(cell_state_final(st), st != CELL_QUEUED && st != CELL_RUNNING, "%u", i);
        if (cell_state_failure(st))
            cr_assert(cell_state_final(st), "a failure is final: %s", cell_state_name(st));
    }
    cr_assert(!cell_state_final(CELL_STATE_N));
    cr_assert(cell_state_failure(CELL_OOM));
    cr_assert(cell_state_failure(CELL_PROTOCOL_ERROR));
    cr_assert(!cell_state_failure(CELL_OK));
    cr_assert(!cell_state_failure(CELL_CANCELLED));
    cr_assert(!cell_state_failure(CELL_UNSUPPORTED));
    cr_assert(!cell_state_failure(CELL_INTERRUPTED));
}

/* The table and schema/openapi.yaml's CellState enum list the same states,
 * each once: a state added in one place only fails here. */
Test(util, cell_state_table_matches_openapi)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/schema/openapi.yaml", tu_bin("CAPD_SOURCE_DIR"));
    char *yaml = tu_slurp(path);
    cr_assert_not_null(yaml, "cannot read %s", path);
    char *at = strstr(yaml, "\n    CellState:\n");
    cr_assert_not_null(at, "no CellState schema in %s", path);
    at = strstr(at, "enum: [");
    cr_assert_not_null(at, "CellState has no enum list");
    at += strlen("enum: [");
    char *end = strchr(at, ']');
    cr_assert_not_null(end);
    *end = 0;
    bool seen[CELL_STATE_N] = {false};
    unsigned n = 0;
    for (char *save = NULL, *w = strtok_r(at, ", \n", &save); w;
         w = strtok_r(NULL, ", \n", &save)) {
        enum cell_state st;
        cr_assert_eq(cell_state_parse(w, &st), 0,
                     "openapi.yaml's CellState '%s' is not in util/cellstate.c", w);
        cr_assert(!seen[st], "openapi.yaml lists '%s' twice", w);
        seen[st] = true;
        n++;
    }
    for (unsigned i = 0; i < CELL_STATE_N; i++)
        cr_assert(seen[i], "util/cellstate.c's '%s' is not in openapi.yaml's CellState",
                  cell_state_name((enum cell_state)i));
    cr_assert_eq(n, CELL_STATE_N);
    free(yaml);
}
