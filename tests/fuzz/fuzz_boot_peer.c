/*
 * Fuzz target: a rank's check of what a dialer sends its peer listener in the ring exchange
 * (shoal_boot_peer_check, src/core/boot_ring.c): frame header and hello, the bytes a stranger
 * controls entirely. The input's first byte chooses the form:
 *
 *   even  the rest, as raw bytes (zero-padded or cut to SHOAL_BOOT_PEER_HELLO_BYTES)
 *   odd   a valid hello of rank 2 of 4 (built here with the job secret and the listener's
 *         nonce) with the rest XORed into it, so that mutations start from what passes
 *
 * Invariants: only an unchanged valid hello passes (a changed byte breaks the header, the
 * MAC or a claim the MAC covers); what passes names the listener's previous rank, the job's
 * size and identity, and proves the secret.
 */
#include "core/core.h"
#include "core/boot_proto.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_log();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t secret[SHOAL_SECRET_BYTES], lnonce[SHOAL_BOOT_NONCE], mac[SHOAL_HMAC_BYTES];
    uint8_t bytes[SHOAL_BOOT_PEER_HELLO_BYTES];
    shoal_boot_ident_t ident;
    shoal_boot_hello_t h;
    char why[160];
    shoal_status_t st;
    int changed = 0;

    if (size == 0) {
        return 0;
    }
    memset(secret, 0x5a, sizeof(secret));
    memset(lnonce, 0x3c, sizeof(lnonce));
    memset(&ident, 0, sizeof(ident));
    memset(ident.tenant, 0x11, sizeof(ident.tenant));
    memset(ident.job, 0x22, sizeof(ident.job));
    ident.epoch = 3;
    memset(bytes, 0, sizeof(bytes));
    if ((data[0] & 1) == 0) {
        memcpy(bytes, data + 1, SHOAL_MIN(size - 1, sizeof(bytes)));
        changed = 1; /* a stranger's bytes: passing would mean it guessed a MAC */
    } else {
        shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_HELLO,
                                .len = sizeof(shoal_boot_hello_t)};
        memset(&h, 0, sizeof(h));
        h.rank = 2;
        h.nranks = 4;
        h.ident = ident;
        memset(h.nonce, 0x77, sizeof(h.nonce));
        shoal_boot_peer_hello_mac(secret, lnonce, &h, h.mac);
        memcpy(bytes, &f, sizeof(f));
        memcpy(bytes + sizeof(f), &h, sizeof(h));
        for (size_t i = 1; i < size && i - 1 < sizeof(bytes); i++) {
            bytes[i - 1] ^= data[i];
            changed |= data[i] != 0;
        }
    }
    st = shoal_boot_peer_check(secret, &ident, 3, 4, lnonce, bytes, &h, why, sizeof(why));
    fuzz_require(st == SHOAL_OK || st == SHOAL_ERR_PROTOCOL || st == SHOAL_ERR_AUTH ||
                 st == SHOAL_ERR_PERMISSION || st == SHOAL_ERR_INVALID_ARG);
    fuzz_require(st == SHOAL_OK || strlen(why) > 0);
    fuzz_require((st == SHOAL_OK) == !changed);
    if (st == SHOAL_OK) {
        shoal_boot_peer_hello_mac(secret, lnonce, &h, mac);
        fuzz_require(memcmp(mac, h.mac, sizeof(mac)) == 0);
        fuzz_require(h.rank == 2 && h.nranks == 4 && h.ident.epoch == 3 &&
                     memcmp(&h.ident, &ident, sizeof(ident)) == 0);
    }
    return 0;
}
