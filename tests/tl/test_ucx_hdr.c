/* The ucx transport's check of an arrived HDR message (shoal_ucx_hdr_check, ucx.h "Messages"):
 * an inline payload behind the 12-byte short header (seq, step, chunk) is accepted only with
 * exactly the expected identity and length; a larger payload's HDR message is the 32-byte
 * wire header, alone or with a single-copy descriptor where those are accepted; the limit
 * between the two is inline_max itself; an abort notice names its culprit. */
#include "core/wire.h"
#include "tests/tap.h"
#include "transports/ucx/ucx.h"

#include <stdio.h>
#include <string.h>

#define INLINE_MAX 64

static shoal_wire_hdr_t expect_hdr(uint64_t len)
{
    return (shoal_wire_hdr_t){.magic = SHOAL_WIRE_MAGIC, .version = SHOAL_WIRE_VERSION,
                              .type = SHOAL_WIRE_DATA, .comm_id = 0x5a5a0001u, .seq = 70000,
                              .step = 3, .chunk = 9, .length = len};
}

/* A short-header message of len payload bytes for (seq, step, chunk); its length. */
static size_t short_msg(uint8_t *out, uint32_t seq, uint32_t step, uint32_t chunk, size_t len)
{
    shoal_put_le(out, seq, 4);
    shoal_put_le(out + 4, step, 4);
    shoal_put_le(out + 8, chunk, 4);
    memset(out + SHOAL_UCX_SHORT_HDR_BYTES, 0xab, len);
    return SHOAL_UCX_SHORT_HDR_BYTES + len;
}

static shoal_status_t check(const shoal_wire_hdr_t *h, const uint8_t *buf, size_t rlen, int cma_ok,
                            uint64_t *cma_p, int *culprit_p, char *why, size_t whylen)
{
    why[0] = '\0';
    return shoal_ucx_hdr_check(h, buf, rlen, INLINE_MAX, cma_ok, cma_p, why, whylen,
                               culprit_p);
}

static void test_short(void)
{
    uint8_t buf[256];
    char why[160];
    uint64_t cma = 1;
    int culprit = 7;
    shoal_wire_hdr_t h = expect_hdr(8);
    size_t n = short_msg(buf, h.seq, h.step, h.chunk, 8);
    struct {
        const char *what;
        uint32_t seq, step, chunk;
    } wrong[] = {
        {"seq", h.seq + 1, h.step, h.chunk},
        {"step", h.seq, h.step + 1, h.chunk},
        {"chunk", h.seq, h.step, h.chunk ^ 0x100},
    };

    tap_is_int(n, 20, "an 8-byte payload travels in a 20-byte message");
    tap_ok(check(&h, buf, n, 1, &cma, &culprit, why, sizeof(why)) == SHOAL_OK && cma == 0 &&
               culprit == -1,
           "the expected short header and payload are accepted (no descriptor, no culprit)");
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(wrong); i++) {
        n = short_msg(buf, wrong[i].seq, wrong[i].step, wrong[i].chunk, 8);
        tap_ok(check(&h, buf, n, 0, &cma, &culprit, why, sizeof(why)) == SHOAL_ERR_PROTOCOL &&
                   strstr(why, "expected (seq 70000, step 3, chunk 9)") != NULL,
               "another %s: SHOAL_ERR_PROTOCOL (%s)", wrong[i].what, why);
    }
    n = short_msg(buf, h.seq, h.step, h.chunk, 8);
    tap_ok(check(&h, buf, n - 1, 0, &cma, &culprit, why, sizeof(why)) == SHOAL_ERR_PROTOCOL &&
               check(&h, buf, n + 1, 0, &cma, &culprit, why, sizeof(why)) ==
                   SHOAL_ERR_PROTOCOL &&
               strstr(why, "21 bytes carry a 8-byte message") != NULL,
           "a payload a byte short or long: SHOAL_ERR_PROTOCOL (%s)", why);
    tap_ok(check(&h, buf, 4, 0, &cma, &culprit, why, sizeof(why)) == SHOAL_ERR_PROTOCOL,
           "a message shorter than the short header: SHOAL_ERR_PROTOCOL (%s)", why);
    /* the full wire header in front of an inline payload is not the format */
    shoal_wire_encode(&h, buf);
    memset(buf + SHOAL_WIRE_HDR_BYTES, 0, 8);
    tap_ok(check(&h, buf, SHOAL_WIRE_HDR_BYTES + 8, 1, &cma, &culprit, why, sizeof(why)) ==
               SHOAL_ERR_PROTOCOL,
           "a 32-byte wire header before an inline payload: SHOAL_ERR_PROTOCOL (%s)", why);
    h = expect_hdr(0);
    n = short_msg(buf, h.seq, h.step, h.chunk, 0);
    tap_ok(n == SHOAL_UCX_SHORT_HDR_BYTES &&
               check(&h, buf, n, 0, &cma, &culprit, why, sizeof(why)) == SHOAL_OK,
           "a 0-byte payload: the short header alone");
    h = expect_hdr(INLINE_MAX);
    n = short_msg(buf, h.seq, h.step, h.chunk, INLINE_MAX);
    tap_ok(check(&h, buf, n, 0, &cma, &culprit, why, sizeof(why)) == SHOAL_OK,
           "a payload of exactly inline_max bytes: short header");
}

static void test_full(void)
{
    uint8_t buf[256];
    char why[160];
    uint64_t cma = 1;
    int culprit = 7;
    shoal_wire_hdr_t h = expect_hdr(INLINE_MAX + 1), a;
    uint8_t *d = buf + SHOAL_WIRE_HDR_BYTES;
    shoal_status_t st;

    shoal_wire_encode(&h, buf);
    tap_ok(check(&h, buf, SHOAL_WIRE_HDR_BYTES, 0, &cma, &culprit, why, sizeof(why)) ==
               SHOAL_OK && cma == 0,
           "above inline_max: the 32-byte wire header alone is accepted (a DATA message "
           "follows)");
    tap_ok(check(&h, buf, SHOAL_UCX_SHORT_HDR_BYTES + INLINE_MAX + 1, 0, &cma, &culprit, why,
                 sizeof(why)) == SHOAL_ERR_PROTOCOL,
           "above inline_max, a message of short-header length: SHOAL_ERR_PROTOCOL (%s)", why);
    shoal_put_le(d, SHOAL_UCX_CMA_MAGIC, 4);
    shoal_put_le(d + 4, 0, 4);
    shoal_put_le(d + 8, 0x7f0012345000ull, 8);
    tap_ok(check(&h, buf, SHOAL_WIRE_HDR_BYTES + SHOAL_UCX_CMA_DESC_BYTES, 1, &cma, &culprit,
                 why, sizeof(why)) == SHOAL_OK && cma == 0x7f0012345000ull,
           "a single-copy descriptor where accepted: its address");
    tap_ok(check(&h, buf, SHOAL_WIRE_HDR_BYTES + SHOAL_UCX_CMA_DESC_BYTES, 0, &cma, &culprit,
                 why, sizeof(why)) == SHOAL_ERR_PROTOCOL && cma == 0,
           "a single-copy descriptor where not accepted: SHOAL_ERR_PROTOCOL (%s)", why);
    buf[0] ^= 1;
    tap_ok(check(&h, buf, SHOAL_WIRE_HDR_BYTES, 0, &cma, &culprit, why, sizeof(why)) ==
               SHOAL_ERR_PROTOCOL && strstr(why, "magic") != NULL,
           "a bad magic: SHOAL_ERR_PROTOCOL (%s)", why);
    a = h;
    a.type = SHOAL_WIRE_ABORT;
    a.chunk = 5;
    a.length = 0;
    shoal_wire_encode(&a, buf);
    st = check(&h, buf, SHOAL_WIRE_HDR_BYTES, 0, &cma, &culprit, why, sizeof(why));
    tap_ok(st == SHOAL_ERR_PEER_FAILED && culprit == 5,
           "an abort notice's header: SHOAL_ERR_PEER_FAILED, culprit %d (%s)", culprit, why);
}

int main(void)
{
    tap_plan(16);
    test_short();
    test_full();
    return tap_done();
}
