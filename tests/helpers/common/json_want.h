/*
 * tests/helpers/common/json_want.h - reading a JSON result by dotted path
 * (or the row of an array with a given member),
 * and checking a table of what its paths must hold, for the Criterion
 * tests (jw_expect_n fails the running test).
 */
#ifndef CAPD_TESTS_JSON_WANT_H
#define CAPD_TESTS_JSON_WANT_H

#include <jansson.h>
#include <stddef.h>

/* The value at PATH in ROOT, a dotted walk ("cells.0.first_divergence.key")
 * in which a number indexes an array; NULL where the walk ends early. */
json_t *jw_path(json_t *root, const char *path);
/* The string at PATH in ROOT, or "(none)" where there is none. */
const char *jw_str(json_t *root, const char *path);
/* The number at PATH in ROOT; fails the running test where there is none. */
double jw_num(json_t *root, const char *path);
/* The first object of array ARR whose member KEY is the string VALUE;
 * NULL where none is. */
json_t *jw_find(json_t *arr, const char *key, const char *value);

/*
 * What one path of a JSON result must hold: a string, an integer, a number
 * within eps, null, true, false, or nothing at all. A test lists them in a
 * table and jw_expect_all checks it in one loop; a miss fails the test with
 * the path, the value found there and the value wanted.
 */
enum jw_kind { JW_STR, JW_INT, JW_DBL, JW_NULL, JW_TRUE, JW_FALSE, JW_ABSENT };

struct jw_want {
    const char *path;
    enum jw_kind kind;
    const char *s;
    long long i;
    double d, eps;
};

/* One row of a table; JW_S .. JW_A fill the fields their kind reads. */
#define JW_ROW(p, k, s, i, d, e)                                                                   \
    {                                                                                              \
        (p), (k), (s), (i), (d), (e)                                                               \
    }
#define JW_S(p, v)    JW_ROW(p, JW_STR, v, 0, 0, 0)
#define JW_I(p, v)    JW_ROW(p, JW_INT, NULL, v, 0, 0)
#define JW_D(p, v, e) JW_ROW(p, JW_DBL, NULL, 0, v, e)
#define JW_N(p)       JW_ROW(p, JW_NULL, NULL, 0, 0, 0)
#define JW_T(p)       JW_ROW(p, JW_TRUE, NULL, 0, 0, 0)
#define JW_F(p)       JW_ROW(p, JW_FALSE, NULL, 0, 0, 0)
#define JW_A(p)       JW_ROW(p, JW_ABSENT, NULL, 0, 0, 0)

void jw_expect_n(json_t *root, const struct jw_want *w, size_t n);
#define jw_expect_all(root, w) jw_expect_n((root), (w), sizeof(w) / sizeof((w)[0]))

#endif
