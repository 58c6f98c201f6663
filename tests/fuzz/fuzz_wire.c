/* Fuzz target: the 32-byte wire header that starts every message between processes
 * (src/core/wire.c). Input: the received header, then the fields of the header the receiver
 * expects (seq, step, chunk, length, comm_id, type) and the size of the sentence buffer. */
#include "core/wire.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in_t in = {.p = data, .left = size};
    uint8_t raw[SHOAL_WIRE_HDR_BYTES], again[SHOAL_WIRE_HDR_BYTES];
    shoal_wire_hdr_t got, expect = {.magic = SHOAL_WIRE_MAGIC, .version = SHOAL_WIRE_VERSION};
    char why[200];
    size_t whylen;
    shoal_status_t st;

    fuzz_take(&in, raw, sizeof(raw));
    shoal_wire_decode(raw, &got);
    shoal_wire_encode(&got, again);
    fuzz_require(memcmp(raw, again, sizeof(raw)) == 0);

    expect.seq = fuzz_u32(&in);
    expect.step = fuzz_u32(&in);
    expect.chunk = fuzz_u32(&in);
    expect.length = fuzz_u32(&in);
    expect.length |= (uint64_t)fuzz_u32(&in) << 32;
    expect.comm_id = fuzz_u32(&in);
    expect.type = (uint16_t)fuzz_u32(&in);
    whylen = fuzz_u32(&in) % (sizeof(why) + 1);

    memset(why, 0x55, sizeof(why));
    st = shoal_wire_check(&expect, &got, why, whylen);
    fuzz_require(st == SHOAL_OK || st == SHOAL_ERR_PROTOCOL || st == SHOAL_ERR_PEER_FAILED);
    if (st == SHOAL_OK) {
        fuzz_require(got.magic == SHOAL_WIRE_MAGIC && got.version == SHOAL_WIRE_VERSION &&
                     got.comm_id == expect.comm_id && got.type == expect.type &&
                     got.seq == expect.seq && got.step == expect.step &&
                     got.chunk == expect.chunk && got.length == expect.length);
    } else if (whylen > 0) {
        fuzz_require(memchr(why, '\0', whylen) != NULL);
    }
    if (whylen < sizeof(why)) {
        fuzz_require((uint8_t)why[whylen] == 0x55); /* nothing written past whylen */
    }
    if (st == SHOAL_ERR_PEER_FAILED) {
        fuzz_require(got.type == SHOAL_WIRE_ABORT && got.comm_id == expect.comm_id);
    }
    /* the header always checks against itself, unless it is an abort notice */
    if (got.magic == SHOAL_WIRE_MAGIC && got.version == SHOAL_WIRE_VERSION &&
        got.type != SHOAL_WIRE_ABORT) {
        fuzz_require(shoal_wire_check(&got, &got, why, sizeof(why)) == SHOAL_OK);
    }
    return 0;
}
