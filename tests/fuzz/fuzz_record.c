/*
 * tests/fuzz/fuzz_record.c - libFuzzer target for the record decoder: the
 * tensor-header fast path of daemon/frame/frame_fast.c, differentially against the
 * jansson path, and the decoded records handed to the comparison engine.
 *
 * The input is a stream after a fixed hello frame. It is parsed twice,
 * once with the fast path and once without; frame.h promises both accept
 * exactly the same headers, so the two runs must agree on every return
 * code and on every decoded field. Each tensor the parser accepts becomes
 * a cmp_tensor (from the validated fields, the stats and the payload) on
 * both sides of a comparison, which then runs: whatever a runner can get
 * past the parser must not break the engine.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmp.h"
#include "daemon/frame/frame.h"

#define FUZZ_TARGET "fuzz_record"
#include "tests/fuzz/fuzz_check.h"

static const char hello[] = "{\"kind\":\"hello\",\"protocol\":1,\"runner\":\"fuzz\"}\n";

static const struct frame_limits lim = {
    .max_header = 8192, .max_payload = 65536, .max_frames = 256, .max_total_payload = 1 << 18};

struct run {
    uint64_t digest;
    struct cmp_cell *ctl, *head;
    void *payloads[256];
    int npayloads;
};

static void mix(uint64_t *h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        *h ^= b[i];
        *h *= 1099511628211ULL;
    }
}

static void mix_s(uint64_t *h, const char *s)
{
    if (s)
        mix(h, s, strlen(s) + 1);
}

static void mix_d(uint64_t *h, double d)
{
    if (isnan(d))
        d = NAN; /* one NaN pattern: the paths may produce different ones */
    mix(h, &d, sizeof d);
}

static int on_frame(void *ud, const struct frame *f)
{
    struct run *r = ud;
    mix(&r->digest, &f->kind, sizeof f->kind);
    mix(&r->digest, &f->nbytes, sizeof f->nbytes);
    if (f->kind != FRAME_TENSOR)
        return 0;
    const struct frame_tensor *t = &f->tensor;
    struct frame_stats st;
    CHECK(frame_tensor_stats(f, &st) == 0);
    mix(&r->digest, &t->seq, sizeof t->seq);
    mix(&r->digest, t->key, t->key_len);
    mix_s(&r->digest, t->dtype);
    mix_s(&r->digest, t->hash);
    mix(&r->digest, &t->capture, sizeof t->capture);
    mix(&r->digest, &t->ndim, sizeof t->ndim);
    mix(&r->digest, t->shape, sizeof t->shape[0] * (size_t)t->ndim);
    mix(&r->digest, &t->numel, sizeof t->numel);
    mix_d(&r->digest, st.min);
    mix_d(&r->digest, st.max);
    mix_d(&r->digest, st.mean);
    mix_d(&r->digest, st.std);
    mix_d(&r->digest, st.l2);
    mix(&r->digest, &st.nan, sizeof st.nan * 4);
    if (!r->ctl)
        return 0;
    /* The engine borrows payloads: keep a copy for the run. */
    void *copy = NULL;
    if (f->nbytes && r->npayloads < 256) {
        copy = malloc(f->nbytes);
        CHECK(copy);
        memcpy(copy, f->payload, f->nbytes);
        r->payloads[r->npayloads++] = copy;
    }
    struct cmp_tensor ct;
    memset(&ct, 0, sizeof ct);
    ct.key = t->key;
    ct.seq = t->seq;
    ct.dtype = t->dtype;
    ct.ndim = t->ndim > CMP_MAX_NDIM ? CMP_MAX_NDIM : t->ndim;
    for (int i = 0; i < ct.ndim; i++)
        ct.shape[i] = t->shape[i];
    ct.numel = t->numel;
    ct.stats.has_finite = !isnan(st.min);
    ct.stats.min = st.min;
    ct.stats.max = st.max;
    ct.stats.mean = st.mean;
    ct.stats.std = st.std;
    ct.stats.l2 = st.l2;
    ct.stats.nan = st.nan;
    ct.stats.pinf = st.pinf;
    ct.stats.ninf = st.ninf;
    ct.stats.zeros = st.zeros;
    ct.hash = t->hash;
    ct.capture = !copy                              ? CMP_CAPTURE_NONE
                 : t->capture == FRAME_CAPTURE_FULL ? CMP_CAPTURE_FULL
                                                    : CMP_CAPTURE_SAMPLE;
    ct.payload = copy;
    ct.payload_len = copy ? (size_t)f->nbytes : 0;
    int rc = cmp_cell_add_tensor(r->ctl, &ct);
    CHECK(rc == 0 || rc == -EINVAL || rc == -ENOMEM);
    /* The head sees the same record with its last payload byte flipped, so
     * the engine computes differences rather than only hash equality. */
    if (copy && r->npayloads < 256) {
        unsigned char *c2 = malloc(f->nbytes);
        CHECK(c2);
        memcpy(c2, copy, f->nbytes);
        c2[f->nbytes - 1] ^= 0x40;
        r->payloads[r->npayloads++] = c2;
        ct.payload = c2;
        ct.hash = "0000000000000000";
    }
    rc = cmp_cell_add_tensor(r->head, &ct);
    CHECK(rc == 0 || rc == -EINVAL || rc == -ENOMEM);
    return 0;
}

static int parse(const uint8_t *data, size_t size, bool fast, struct run *r, int *fin)
{
    struct frame_parser *p = NULL;
    CHECK(frame_parser_new(&lim, on_frame, r, &p) == 0);
    frame_parser_set_fast_path(p, fast);
    int rc = frame_feed(p, hello, sizeof hello - 1);
    if (rc == 0)
        rc = frame_feed(p, data, size);
    *fin = frame_finish(p);
    mix(&r->digest, &rc, sizeof rc);
    uint64_t n = frame_count(p);
    mix(&r->digest, &n, sizeof n);
    frame_parser_free(p);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct run a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    struct cmp_side *ctl = NULL, *head = NULL;
    CHECK(cmp_side_new(&ctl) == 0 && cmp_side_new(&head) == 0);
    CHECK(cmp_side_add_cell(ctl, "m", "avx2", "forward", &a.ctl) == 0);
    CHECK(cmp_side_add_cell(head, "m", "avx2", "forward", &a.head) == 0);
    cmp_cell_set_outcome(a.ctl, "ok");
    cmp_cell_set_outcome(a.head, "ok");
    int fa, fb;
    int ra = parse(data, size, true, &a, &fa);
    int rb = parse(data, size, false, &b, &fb);
    if (ra != rb || fa != fb || a.digest != b.digest) {
        fprintf(stderr, "fuzz_record: fast path and jansson disagree: feed %d/%d finish %d/%d\n",
                ra, rb, fa, fb);
        abort();
    }
    json_t *res = NULL;
    int rc = cmp_compare(ctl, head, NULL, &res);
    CHECK(rc == 0 || rc == -ENOMEM);
    CHECK(rc != 0 || json_is_object(res));
    json_decref(res);
    cmp_side_free(ctl);
    cmp_side_free(head);
    for (int i = 0; i < a.npayloads; i++)
        free(a.payloads[i]);
    return 0;
}
