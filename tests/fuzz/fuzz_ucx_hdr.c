/* Fuzz target: the UCX transport's check of an arrived HDR message (shoal_ucx_hdr_check,
 * transports/ucx/ucx_ep.c) and the inline copy it guards. Input: 16 bytes for the posted
 * receive (seq, step, chunk and whether single-copy descriptors are accepted, length) and the
 * transport's inline limit, then the message as UCX delivered it (header and inline payload,
 * or a single-copy descriptor). An inline payload follows a 12-byte short header, a larger
 * one's HDR message is the 32-byte wire header (and a descriptor). */
#include "transports/ucx/ucx.h"
#include "tests/fuzz/fuzz.h"

#define FUZZ_UCX_INLINE_MAX 8192

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in_t in = {.p = data, .left = size};
    shoal_wire_hdr_t expect = {.magic = SHOAL_WIRE_MAGIC, .version = SHOAL_WIRE_VERSION,
                               .type = SHOAL_WIRE_DATA, .comm_id = 0x5a5a0001u};
    uint32_t lim, chunk;
    uint64_t cma_addr = 1;
    int cma_ok;
    size_t inline_max, rlen, room;
    uint8_t *msg;
    char why[160];
    int culprit;
    shoal_status_t st;

    expect.seq = fuzz_u32(&in);
    expect.step = fuzz_u32(&in) & 0xff;
    chunk = fuzz_u32(&in);
    expect.chunk = chunk & 0xff;
    cma_ok = (chunk >> 8) & 1;
    lim = fuzz_u32(&in);
    expect.length = lim >> 16;               /* the receive's size */
    inline_max = (lim & 0xffff) % (FUZZ_UCX_INLINE_MAX + 1);
    /* the slot buffer (header + inline_max, at least a descriptor): UCX truncates longer
     * messages */
    room = SHOAL_WIRE_HDR_BYTES + SHOAL_MAX(inline_max, (size_t)SHOAL_UCX_CMA_DESC_BYTES);
    rlen = SHOAL_MIN(in.left, room);
    msg = malloc(rlen > 0 ? rlen : 1);
    fuzz_require(msg != NULL);
    memcpy(msg, in.p, rlen);

    st = shoal_ucx_hdr_check(&expect, msg, rlen, inline_max, cma_ok, &cma_addr, why,
                             sizeof(why), &culprit);
    fuzz_require(st != SHOAL_OK || culprit == -1);
    /* a descriptor only where accepted, only above the inline limit, never a wrapping range */
    fuzz_require(cma_addr == 0 || (st == SHOAL_OK && cma_ok && expect.length > inline_max &&
                                   cma_addr + expect.length > cma_addr));
    if (st == SHOAL_OK) {
        if (expect.length <= inline_max) {
            /* the receive's buffer is exactly the posted length */
            uint8_t *dst = malloc(expect.length > 0 ? expect.length : 1);
            fuzz_require(dst != NULL);
            fuzz_require(rlen == SHOAL_UCX_SHORT_HDR_BYTES + expect.length);
            memcpy(dst, msg + SHOAL_UCX_SHORT_HDR_BYTES, expect.length);
            free(dst);
        } else {
            fuzz_require(rlen == SHOAL_WIRE_HDR_BYTES ||
                         (cma_addr != 0 &&
                          rlen == SHOAL_WIRE_HDR_BYTES + SHOAL_UCX_CMA_DESC_BYTES));
        }
    } else {
        fuzz_require(st == SHOAL_ERR_PROTOCOL || st == SHOAL_ERR_PEER_FAILED);
        fuzz_require(memchr(why, '\0', sizeof(why)) != NULL);
    }
    free(msg);
    return 0;
}
