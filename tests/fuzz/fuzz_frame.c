/*
 * tests/fuzz/fuzz_frame.c - libFuzzer target for the runner-protocol
 * parser (daemon/frame/frame.h) as the supervisor drives it: a byte stream that
 * arrives in pieces of arbitrary size.
 *
 * The first input byte picks the piece size (1..97) and whether the tensor
 * fast path is on; the rest is the stream. Besides the sanitizers, the
 * target checks the parser's promises: no frame past max_frames, no
 * payload past max_payload or past the total, a payload pointer exactly
 * when nbytes > 0, errors sticky, and frame_finish idempotent.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/frame/frame.h"

#define FUZZ_TARGET "fuzz_frame"
#include "tests/fuzz/fuzz_check.h"

static const struct frame_limits lim = {
    .max_header = 4096, .max_payload = 65536, .max_frames = 512, .max_total_payload = 1 << 18};

struct seen {
    uint64_t frames, payload;
};

static int on_frame(void *ud, const struct frame *f)
{
    struct seen *s = ud;
    s->frames++;
    s->payload += f->nbytes;
    CHECK(f->index == s->frames);
    CHECK(s->frames <= lim.max_frames);
    CHECK(f->nbytes <= lim.max_payload);
    CHECK(s->payload <= lim.max_total_payload);
    CHECK((f->payload != NULL) == (f->nbytes > 0));
    CHECK(f->hdr_len < lim.max_header);
    /* What the supervisor and storage touch: the header tree (parsed
     * lazily for tensors), the stats, the kind's name. */
    json_t *h = frame_header(f);
    CHECK(h == NULL || json_is_object(h));
    if (f->kind == FRAME_TENSOR) {
        struct frame_stats st;
        CHECK(frame_tensor_stats(f, &st) == 0);
        CHECK(f->tensor.key && strlen(f->tensor.key) == f->tensor.key_len);
        CHECK(f->tensor.ndim >= 0 && f->tensor.ndim <= FRAME_MAX_NDIM);
        volatile unsigned char sink = 0;
        for (uint64_t i = 0; i < f->nbytes; i += 4096)
            sink ^= f->payload[i];
        (void)sink;
    }
    (void)frame_kind_name(f->kind);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t piece = 1 + data[0] % 97;
    bool fast = data[0] & 0x80;
    data++;
    size--;
    struct seen s = {0, 0};
    struct frame_parser *p = NULL;
    CHECK(frame_parser_new(&lim, on_frame, &s, &p) == 0);
    frame_parser_set_fast_path(p, fast);
    int rc = 0;
    for (size_t o = 0; o < size && rc == 0; o += piece)
        rc = frame_feed(p, data + o, size - o < piece ? size - o : piece);
    if (rc) {
        CHECK(rc == -EPROTO || rc == -ENOMEM);
        CHECK(frame_error(p)[0] != 0);
        CHECK(frame_feed(p, "x", 1) == rc); /* sticky */
    }
    int fin = frame_finish(p);
    CHECK(fin == 0 || fin == -ENODATA || fin == -EPROTO || fin == -ENOMEM);
    CHECK(frame_finish(p) == fin);
    CHECK(frame_count(p) == s.frames);
    CHECK(frame_payload_bytes(p) == s.payload);
    if (fin == 0)
        CHECK(frame_saw_end(p));
    frame_parser_free(p);
    return 0;
}
