/*
 * runner/native/blake2b.h - BLAKE2b (RFC 7693) for 16-byte digests, the
 * content hash of capd's runner protocol (docs/protocol.md). Header-only:
 * shared by the runner's native library (runner/native/capd_pipe.c) and
 * the tests' fake runner, and checked against Python's hashlib.blake2b by
 * runner/tests/test_native_pipe.py.
 */
#ifndef CAPD_BLAKE2B_H
#define CAPD_BLAKE2B_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct b2b {
    uint64_t h[8], t[2];
    uint8_t b[128];
    size_t c;
};

static const uint64_t b2b_iv[8] = {
    0x6A09E667F3BCC908ull, 0xBB67AE8584CAA73Bull, 0x3C6EF372FE94F82Bull, 0xA54FF53A5F1D36F1ull,
    0x510E527FADE682D1ull, 0x9B05688C2B3E6C1Full, 0x1F83D9ABFB41BD6Bull, 0x5BE0CD19137E2179ull,
};

/* The message schedule of the ten distinct rounds; rounds 10 and 11 take
 * rows 0 and 1 again (RFC 7693 section 3.2: SIGMA[i mod 10]). */
static const uint8_t b2b_sigma[10][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
};

static inline uint64_t rotr64(uint64_t x, unsigned n)
{
    return (x >> n) | (x << (64 - n));
}

#define B2B_G(a, b, c, d, x, y)                                                                    \
    do {                                                                                           \
        v[a] = v[a] + v[b] + (x);                                                                  \
        v[d] = rotr64(v[d] ^ v[a], 32);                                                            \
        v[c] = v[c] + v[d];                                                                        \
        v[b] = rotr64(v[b] ^ v[c], 24);                                                            \
        v[a] = v[a] + v[b] + (y);                                                                  \
        v[d] = rotr64(v[d] ^ v[a], 16);                                                            \
        v[c] = v[c] + v[d];                                                                        \
        v[b] = rotr64(v[b] ^ v[c], 63);                                                            \
    } while (0)

static inline void b2b_compress(struct b2b *ctx, const uint8_t *blk, bool last)
{
    uint64_t v[16], m[16];

    for (int i = 0; i < 8; i++) {
        v[i] = ctx->h[i];
        v[i + 8] = b2b_iv[i];
    }
    v[12] ^= ctx->t[0];
    v[13] ^= ctx->t[1];
    if (last)
        v[14] = ~v[14];
    for (int i = 0; i < 16; i++) {
        uint64_t w = 0;

        for (int k = 7; k >= 0; k--)
            w = (w << 8) | blk[8 * i + k];
        m[i] = w;
    }
    /* Unrolled, the message schedule is constant and v stays in registers
     * (about 1.5x the speed of the rolled loop). */
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) {
        const uint8_t *s = b2b_sigma[i % 10];

        B2B_G(0, 4, 8, 12, m[s[0]], m[s[1]]);
        B2B_G(1, 5, 9, 13, m[s[2]], m[s[3]]);
        B2B_G(2, 6, 10, 14, m[s[4]], m[s[5]]);
        B2B_G(3, 7, 11, 15, m[s[6]], m[s[7]]);
        B2B_G(0, 5, 10, 15, m[s[8]], m[s[9]]);
        B2B_G(1, 6, 11, 12, m[s[10]], m[s[11]]);
        B2B_G(2, 7, 8, 13, m[s[12]], m[s[13]]);
        B2B_G(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++)
        ctx->h[i] ^= v[i] ^ v[i + 8];
}

static inline void b2b_count(struct b2b *ctx, size_t n)
{
    ctx->t[0] += n;
    if (ctx->t[0] < n)
        ctx->t[1]++;
}

static inline void b2b_init(struct b2b *ctx, size_t outlen)
{
    memcpy(ctx->h, b2b_iv, sizeof(ctx->h));
    ctx->h[0] ^= 0x01010000ull ^ outlen;
    ctx->t[0] = ctx->t[1] = 0;
    ctx->c = 0;
}

/* The last block must be compressed with the final flag, so a full buffer is
 * only compressed once more input is known to follow. */
static inline void b2b_update(struct b2b *ctx, const void *in, size_t n)
{
    const uint8_t *p = in;

    while (n) {
        size_t take;

        if (ctx->c == 128) {
            b2b_count(ctx, 128);
            b2b_compress(ctx, ctx->b, false);
            ctx->c = 0;
        }
        if (ctx->c == 0 && n > 128) {
            b2b_count(ctx, 128);
            b2b_compress(ctx, p, false);
            p += 128;
            n -= 128;
            continue;
        }
        take = 128 - ctx->c < n ? 128 - ctx->c : n;
        memcpy(ctx->b + ctx->c, p, take);
        ctx->c += take;
        p += take;
        n -= take;
    }
}

static inline void b2b_final_hex16(struct b2b *ctx, char out[33])
{
    static const char hx[] = "0123456789abcdef";

    b2b_count(ctx, ctx->c);
    memset(ctx->b + ctx->c, 0, 128 - ctx->c);
    b2b_compress(ctx, ctx->b, true);
    for (int i = 0; i < 16; i++) {
        uint8_t byte = (uint8_t)(ctx->h[i / 8] >> (8 * (i % 8)));

        out[2 * i] = hx[byte >> 4];
        out[2 * i + 1] = hx[byte & 15];
    }
    out[32] = '\0';
}

static inline void b2b_hex16(const void *in, size_t n, char out[33])
{
    struct b2b ctx;

    b2b_init(&ctx, 16);
    b2b_update(&ctx, in, n);
    b2b_final_hex16(&ctx, out);
}

#endif
