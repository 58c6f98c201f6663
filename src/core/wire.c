/* Wire header codec and validation. */
#include "core/wire.h"

#include <stdio.h>
#include <string.h>

#define shoal_put_le32(p, v) shoal_put_le((p), (v), 4)
#define shoal_get_le32(p) ((uint32_t)shoal_get_le((p), 4))

void shoal_wire_encode(const shoal_wire_hdr_t *h, uint8_t out[SHOAL_WIRE_HDR_BYTES])
{
    shoal_put_le32(out + 0, h->magic);
    shoal_put_le32(out + 4, (uint32_t)h->version | ((uint32_t)h->type << 16));
    shoal_put_le32(out + 8, h->comm_id);
    shoal_put_le32(out + 12, h->seq);
    shoal_put_le32(out + 16, h->step);
    shoal_put_le32(out + 20, h->chunk);
    shoal_put_le32(out + 24, (uint32_t)h->length);
    shoal_put_le32(out + 28, (uint32_t)(h->length >> 32));
}

void shoal_wire_decode(const uint8_t in[SHOAL_WIRE_HDR_BYTES], shoal_wire_hdr_t *h)
{
    uint32_t vt = shoal_get_le32(in + 4);
    h->magic = shoal_get_le32(in + 0);
    h->version = (uint16_t)(vt & 0xffff);
    h->type = (uint16_t)(vt >> 16);
    h->comm_id = shoal_get_le32(in + 8);
    h->seq = shoal_get_le32(in + 12);
    h->step = shoal_get_le32(in + 16);
    h->chunk = shoal_get_le32(in + 20);
    h->length = (uint64_t)shoal_get_le32(in + 24) | ((uint64_t)shoal_get_le32(in + 28) << 32);
}

shoal_status_t shoal_wire_check(const shoal_wire_hdr_t *expect, const shoal_wire_hdr_t *got,
                                char *why, size_t whylen)
{
    if (got->magic != SHOAL_WIRE_MAGIC) {
        snprintf(why, whylen, "bad magic 0x%08x", got->magic);
        return SHOAL_ERR_PROTOCOL;
    }
    if (got->version != SHOAL_WIRE_VERSION) {
        snprintf(why, whylen, "wire version %u, expected %u", got->version, SHOAL_WIRE_VERSION);
        return SHOAL_ERR_PROTOCOL;
    }
    if (got->comm_id != expect->comm_id) {
        snprintf(why, whylen, "message for communicator %08x on communicator %08x",
                 got->comm_id, expect->comm_id);
        return SHOAL_ERR_PROTOCOL;
    }
    if (got->type == SHOAL_WIRE_ABORT) {
        snprintf(why, whylen, "peer aborted: its communicator failed because of rank %u",
                 got->chunk);
        return SHOAL_ERR_PEER_FAILED;
    }
    if (got->type != expect->type) {
        snprintf(why, whylen, "message type %u, expected %u", got->type, expect->type);
        return SHOAL_ERR_PROTOCOL;
    }
    /* A peer that follows the protocol sends these wrong only when the ranks' calls differ:
     * a message of an earlier call that this rank never received (a broadcast whose ranks
     * named different roots: a rank that took itself for the root received nothing, and its
     * next call finds the message), or of another length (another count or dtype). The
     * sentence says so, first (transports prefix it into 160-192 bytes): alone it read as a
     * failure of the peer it names. */
    if (got->seq != expect->seq || got->step != expect->step || got->chunk != expect->chunk) {
        int earlier = (int32_t)(got->seq - expect->seq) < 0;
        snprintf(why, whylen, "message %s(seq %u, step %u, chunk %u), expected (seq %u, step %u, "
                 "chunk %u)%s", earlier ? "of an earlier call " : "", got->seq, got->step,
                 got->chunk, expect->seq, expect->step, expect->chunk,
                 earlier ? ": did the ranks pass it different roots or counts?" : "");
        return SHOAL_ERR_PROTOCOL;
    }
    if (got->length != expect->length) {
        snprintf(why, whylen, "message of %llu bytes, expected %llu; did the ranks pass "
                 "different counts or dtypes?", (unsigned long long)got->length,
                 (unsigned long long)expect->length);
        return SHOAL_ERR_PROTOCOL;
    }
    return SHOAL_OK;
}

int shoal_wire_culprit(const shoal_wire_hdr_t *got)
{
    if (got->magic != SHOAL_WIRE_MAGIC || got->type != SHOAL_WIRE_ABORT ||
        got->chunk > (uint32_t)INT32_MAX) {
        return -1;
    }
    return (int)got->chunk;
}
