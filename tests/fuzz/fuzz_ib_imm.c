/* Fuzz target: the IB transport's immediate data (shoal_ib_imm_decode,
 * transports/ib/ib_logic.c) driving the receiver's ring and the sender's credits as
 * shoal_ib_wc_recv does: returned credits, then a write into a slot, checked before the
 * slot's bookkeeping is touched. Input: two bytes for the ring size, then one 32-bit
 * immediate per completion; a set top byte of a second word consumes the oldest slot. */
#include "transports/ib/ib.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in_t in = {.p = data, .left = size};
    shoal_ib_ring_t rx;
    shoal_ib_credit_t tx;
    uint32_t nslots, *slot_len;
    uint8_t two[2];

    fuzz_take(&in, two, 2);
    nslots = 2 + ((uint32_t)two[0] | (uint32_t)two[1] << 8) % (SHOAL_IB_SLOTS_MAX - 1);
    /* exactly nslots entries, as the endpoint's slot_len/slot_flags arrays */
    slot_len = calloc(nslots, sizeof(*slot_len));
    fuzz_require(slot_len != NULL);
    shoal_ib_ring_init(&rx, nslots);
    shoal_ib_credit_init(&tx, nslots);
    /* the sender has used some slots, so credits may come back */
    for (uint32_t i = 0; i < nslots / 2; i++) {
        fuzz_require(shoal_ib_credit_take(&tx) >= 0);
    }
    while (in.left >= 4) {
        uint32_t v = fuzz_u32(&in), again;
        shoal_ib_imm_t imm;

        shoal_ib_imm_decode(v, &imm);
        fuzz_require(shoal_ib_imm_encode(&imm, &again) == 0 && again == v);
        if (shoal_ib_credit_grant(&tx, imm.credits) != 0) {
            break; /* SHOAL_ERR_PROTOCOL: more credits than slots in use */
        }
        fuzz_require(tx.avail <= tx.nslots);
        if (imm.kind == SHOAL_IB_IMM_CREDIT) {
            continue;
        }
        if (imm.kind != SHOAL_IB_IMM_DATA || shoal_ib_ring_arrive(&rx, imm.slot) != 0) {
            break; /* SHOAL_ERR_PROTOCOL */
        }
        slot_len[imm.slot] = v;
        fuzz_require(rx.filled <= rx.nslots);
        if (in.left >= 4 && in.p[3] & 0x80) {
            uint32_t head = rx.head;
            fuzz_u32(&in);
            fuzz_require(shoal_ib_ring_consume(&rx) == 0);
            slot_len[head] = 0;
            (void)shoal_ib_ring_take_owed(&rx, in.left % 64);
        }
    }
    free(slot_len);
    return 0;
}
