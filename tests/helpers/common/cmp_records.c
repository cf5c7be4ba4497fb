#include <criterion/criterion.h>
#include <string.h>

#include "tests/helpers/common/cmp_records.h"

static double pool[CREC_POOL_DOUBLES];
static size_t used;

struct cmp_cell *crec_cell(struct cmp_side *s, const char *model, const char *width,
                           const char *pass)
{
    struct cmp_cell *c;
    cr_assert_eq(cmp_side_add_cell(s, model, width, pass, &c), 0, "%s/%s/%s", model, width, pass);
    cr_assert_eq(cmp_cell_set_outcome(c, "ok"), 0);
    return c;
}

json_t *crec_compare(struct cmp_side *sc, struct cmp_side *sh)
{
    json_t *r = NULL;
    cr_assert_eq(cmp_compare(sc, sh, NULL, &r), 0);
    cmp_side_free(sc);
    cmp_side_free(sh);
    return r;
}

struct cmp_tensor crec_f64(const char *key, int64_t seq, const double *v, size_t n,
                           struct cmp_stats st, const char *hash, enum cmp_capture cap)
{
    struct cmp_tensor t = {0};
    t.key = key;
    t.seq = seq;
    t.dtype = "float64";
    t.ndim = 1;
    t.shape[0] = (int64_t)n;
    t.numel = (int64_t)n;
    t.stats = st;
    t.hash = hash;
    t.capture = cap;
    if (cap == CMP_CAPTURE_FULL) {
        cr_assert(used + n <= CREC_POOL_DOUBLES, "the record pool of %d values is full",
                  CREC_POOL_DOUBLES);
        memcpy(&pool[used], v, n * sizeof(double));
        t.payload = &pool[used];
        t.payload_len = n * sizeof(double);
        used += n;
    }
    return t;
}

void crec_add_f64(struct cmp_cell *c, const char *key, int64_t seq, const double *v, size_t n,
                  struct cmp_stats st, const char *hash, enum cmp_capture cap)
{
    struct cmp_tensor t = crec_f64(key, seq, v, n, st, hash, cap);
    cr_assert_eq(cmp_cell_add_tensor(c, &t), 0, "%s", key);
}

void crec_reset(void)
{
    used = 0;
}
