/* Fuzz target: the IB transport's connection information from a peer
 * (transports/ib/ib_ctx.c): its published address (shoal_ib_addr_decode, with the
 * out-of-band address inside) and the queue pair and ring it sends over the out-of-band
 * channel (shoal_ib_pair_decode), then the credit state the sender sets up from the ring it
 * accepts (the same limits as shoal_ib_ep_rts). Input: the 64-byte address, then the
 * 40-byte pair information. */
#include "transports/ib/ib_verbs.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in_t in = {.p = data, .left = size};
    uint8_t pin[SHOAL_IB_PAIR_BYTES], pout[SHOAL_IB_PAIR_BYTES];
    shoal_ib_addr_t a, b;
    shoal_ib_pair_t p, q;
    size_t alen = SHOAL_MIN(size, (size_t)SHOAL_IB_ADDR_BYTES);

    /* the address: exactly the bytes the peer published, whatever their number */
    if (shoal_ib_addr_decode(size > 0 ? data : NULL, size > SHOAL_IB_ADDR_BYTES ? size : alen,
                             &a) == 0) {
        uint8_t again[SHOAL_IB_ADDR_BYTES];
        char name[SHOAL_OOB_NAME_MAX];
        shoal_ib_addr_encode(&a, again);
        fuzz_require(shoal_ib_addr_decode(again, sizeof(again), &b) == 0);
        fuzz_require(b.port == a.port && b.mtu == a.mtu && b.lid == a.lid &&
                     memcmp(b.gid, a.gid, 16) == 0 && b.oob.port == a.oob.port &&
                     b.oob.family == a.oob.family);
        shoal_oob_addr_str(&a.oob, name, sizeof(name));
        fuzz_require(memchr(name, '\0', sizeof(name)) != NULL);
        (void)shoal_ib_mtu_negotiate(a.mtu, 5, 0, name, sizeof(name));
    }
    in.p += alen;
    in.left -= alen;

    fuzz_take(&in, pin, sizeof(pin));
    shoal_ib_pair_decode(pin, &p);
    shoal_ib_pair_encode(&p, pout);
    shoal_ib_pair_decode(pout, &q);
    fuzz_require(p.qpn == q.qpn && p.psn == q.psn && p.ring_addr == q.ring_addr &&
                 p.rkey == q.rkey && p.nslots == q.nslots && p.slot_size == q.slot_size);
    if (p.nslots >= 2 && p.nslots <= SHOAL_IB_SLOTS_MAX && p.slot_size >= 4096) {
        shoal_ib_credit_t c;
        shoal_ib_credit_init(&c, p.nslots);
        for (uint32_t i = 0; i < p.nslots; i++) {
            int slot = shoal_ib_credit_take(&c);
            fuzz_require(slot >= 0 && (uint32_t)slot < p.nslots);
        }
        fuzz_require(shoal_ib_credit_take(&c) == -1);
    }
    return 0;
}
