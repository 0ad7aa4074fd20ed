/*
 * fuzz_reader.c: libFuzzer harness for the stream decoder (proto/frame.c).
 *
 * The input is the byte stream a peer sends, preceded by one control byte
 * that chooses how it arrives: in pieces of (control % 61) + 1 bytes,
 * alternately through gift_reader_feed and the zero-copy
 * gift_reader_reserve / gift_reader_commit path (bit 7 of the control byte
 * picks which comes first). After every piece every complete frame is taken
 * out; at the end gift_reader_eof is called. The limits are small (1 KiB of
 * header, 4 KiB of payload) so that the size checks are reachable, or, with
 * bit 6 set, 64 KiB each, so that headers that unpack to more than the
 * 4 KiB header arena (a Declare of many tensors) reach its oversize path.
 * Bit 5 sets handshake_frames = 2 (the first two frames carry no payload).
 *
 * Invariants checked (abort() on violation, which libFuzzer reports):
 * a frame's payload lies inside the bytes given; the reader never buffers
 * more than it was given; errors are sticky; the buffer never grows past
 * 16 + max_header + max_frame + one piece.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gift_proto.h"
#include "gift_proto_internal.h"

#define MAX_HEADER_SMALL 1024u
#define MAX_FRAME_SMALL 4096u
#define MAX_BIG 65536u

static uint32_t MAX_HEADER;
static uint32_t MAX_FRAME;

static void check(int cond)
{
    if (!cond)
        abort();
}

static int drain(gift_reader_t *r, size_t *frames)
{
    gift_frame_t f;
    int rc;

    while ((rc = gift_reader_next(r, &f)) == 1) {
        check(f.env != NULL && f.env->msg_case != GIFT__ENVELOPE__MSG__NOT_SET);
        check(f.header_len > 0 && f.header_len <= MAX_HEADER);
        check(f.payload_len <= MAX_FRAME);
        check((f.payload_len == 0) == (f.payload == NULL));
        if (f.payload_len > 0) {
            /* Touch every payload byte: ASan checks they are in the buffer. */
            volatile uint8_t x = 0;
            for (uint64_t i = 0; i < f.payload_len; i++)
                x ^= f.payload[i];
            (void)x;
        }
        (void)gift_msg_name(f.env);
        (*frames)++;
    }
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gift_limits_t lim;
    gift_reader_t *r;
    size_t piece, off = 0, frames = 0;
    int zero_copy, rc = 0, err = 0;

    if (size < 1)
        return 0;
    piece = (size_t)(data[0] % 61) + 1;
    zero_copy = data[0] >> 7;
    MAX_HEADER = (data[0] & 0x40) ? MAX_BIG : MAX_HEADER_SMALL;
    MAX_FRAME = (data[0] & 0x40) ? MAX_BIG : MAX_FRAME_SMALL;
    lim.max_header_bytes = MAX_HEADER;
    lim.max_frame_bytes = MAX_FRAME;
    lim.handshake_frames = (data[0] & 0x20) ? 2 : 0;
    data++;
    size--;
    if ((r = gift_reader_new(&lim)) == NULL)
        return 0;
    while (off < size) {
        size_t n = size - off < piece ? size - off : piece;
        if (zero_copy) {
            uint8_t *p = NULL;
            size_t avail = 0;
            rc = gift_reader_reserve(r, n, &p, &avail);
            if (rc == 0) {
                check(p != NULL);
                if (avail == 0)
                    break; /* the reader holds as much as it may: the caller stops reading */
                if (n > avail)
                    n = avail;
                memcpy(p, data + off, n);
                gift_reader_commit(r, n);
            }
        } else {
            rc = gift_reader_feed(r, data + off, n);
        }
        if (rc < 0)
            break;
        off += n;
        zero_copy = !zero_copy;
        check(gift_reader_buffered(r) <= off);
        check(gift__reader_capacity(r) <=
              GIFT_PREAMBLE_BYTES + MAX_HEADER + MAX_FRAME + 4096 + piece);
        if ((rc = drain(r, &frames)) < 0)
            break;
    }
    if (rc < 0 && rc != GIFT_ENOMEM) {
        /* Sticky: every later call reports the same error. */
        err = rc;
        gift_frame_t f;
        check(gift_reader_next(r, &f) == err);
        check(gift_reader_feed(r, "x", 1) == err);
        check(gift_reader_eof(r) == err);
        check(err == GIFT_EBADMAGIC || err == GIFT_EHDRSIZE || err == GIFT_EFRAMESIZE ||
              err == GIFT_EPROTO || err == GIFT_EBADHEADER);
    } else {
        rc = gift_reader_eof(r);
        check(rc == 0 || rc == GIFT_ETRUNCATED);
        check((rc == 0) == (gift_reader_buffered(r) == 0));
    }
    gift_reader_free(r);
    return 0;
}
