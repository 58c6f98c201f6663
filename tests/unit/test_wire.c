/* Wire header codec and validation; unique-id codec. */
#include "core/boot.h"
#include "core/wire.h"
#include "tests/tap.h"

#include <arpa/inet.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static shoal_wire_hdr_t test_wire_hdr(void)
{
    return (shoal_wire_hdr_t){.magic = SHOAL_WIRE_MAGIC, .version = SHOAL_WIRE_VERSION,
                              .type = SHOAL_WIRE_DATA, .comm_id = 0xdeadbeef, .seq = 7,
                              .step = 3, .chunk = 11, .length = 0x123456789aULL};
}

static void test_wire_roundtrip(void)
{
    shoal_wire_hdr_t h = test_wire_hdr(), g;
    uint8_t buf[SHOAL_WIRE_HDR_BYTES];
    char why[128];

    shoal_wire_encode(&h, buf);
    tap_is_int(buf[0], 'S', "magic encodes little-endian 'S'");
    tap_is_int(buf[24], 0x9a, "length low byte first");
    shoal_wire_decode(buf, &g);
    tap_ok(memcmp(&h, &g, sizeof(h)) == 0, "decode(encode(h)) == h");
    tap_is_int(shoal_wire_check(&h, &g, why, sizeof(why)), SHOAL_OK, "matching header accepted");
}

static void test_wire_rejects(void)
{
    struct {
        const char *what;
        size_t off;      /* byte to corrupt */
        uint8_t val;
        shoal_status_t want;
    } cases[] = {
        {"bad magic", 0, 0x00, SHOAL_ERR_PROTOCOL},
        {"bad version", 4, 0x7f, SHOAL_ERR_PROTOCOL},
        {"other communicator", 8, 0x01, SHOAL_ERR_PROTOCOL},
        {"wrong sequence", 12, 0x08, SHOAL_ERR_PROTOCOL},
        {"wrong step", 16, 0x04, SHOAL_ERR_PROTOCOL},
        {"wrong chunk", 20, 0x0c, SHOAL_ERR_PROTOCOL},
        {"wrong length", 24, 0x9b, SHOAL_ERR_PROTOCOL},
        {"absurd length", 31, 0xff, SHOAL_ERR_PROTOCOL},
        {"unknown type", 6, 0x09, SHOAL_ERR_PROTOCOL},
    };
    shoal_wire_hdr_t h = test_wire_hdr(), g;
    uint8_t buf[SHOAL_WIRE_HDR_BYTES];
    char why[160]; /* the shm transport's; tcp and ucx have 192 */

    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(cases); i++) {
        shoal_wire_encode(&h, buf);
        buf[cases[i].off] = cases[i].val;
        shoal_wire_decode(buf, &g);
        why[0] = '\0';
        tap_is_int(shoal_wire_check(&h, &g, why, sizeof(why)), cases[i].want, "%s rejected (%s)",
                   cases[i].what, why);
    }
    /* A message of an earlier call (one the ranks' differing arguments left unreceived: a
     * broadcast whose ranks named different roots) and one of another length say what the
     * likely cause is; they read as the failure of the peer alone. A later sequence number
     * is no leftover; sequence numbers wrap. */
    g = h;
    g.seq = h.seq - 1;
    tap_ok(shoal_wire_check(&h, &g, why, sizeof(why)) == SHOAL_ERR_PROTOCOL &&
               strstr(why, "of an earlier call (seq 6, step 3, chunk 11)") != NULL &&
               strstr(why, "different roots or counts?") != NULL,
           "a message of an earlier call says so: %s", why);
    g.seq = h.seq + 1;
    tap_ok(shoal_wire_check(&h, &g, why, sizeof(why)) == SHOAL_ERR_PROTOCOL &&
               strstr(why, "earlier") == NULL, "a later one does not: %s", why);
    {
        shoal_wire_hdr_t h0 = h;
        h0.seq = 0;
        g.seq = 0xffffffffu;
        tap_ok(shoal_wire_check(&h0, &g, why, sizeof(why)) == SHOAL_ERR_PROTOCOL &&
                   strstr(why, "of an earlier call") != NULL, "across the wrap too: %s", why);
    }
    g = h;
    g.length = h.length + 4;
    tap_ok(shoal_wire_check(&h, &g, why, sizeof(why)) == SHOAL_ERR_PROTOCOL &&
               strstr(why, "different counts or dtypes") != NULL,
           "another length names counts and dtypes: %s", why);
    /* An abort notice from the same communicator names the culprit. */
    g = h;
    g.type = SHOAL_WIRE_ABORT;
    g.chunk = 5;
    g.length = 0;
    tap_is_int(shoal_wire_check(&h, &g, why, sizeof(why)), SHOAL_ERR_PEER_FAILED,
               "abort notice -> peer failed");
    tap_ok(strstr(why, "rank 5") != NULL, "abort notice names the culprit: %s", why);
    tap_is_int(shoal_wire_culprit(&g), 5, "the culprit decodes as data");
    g.chunk = 0x80000000u;
    tap_is_int(shoal_wire_culprit(&g), -1, "a culprit past INT32_MAX is none");
    tap_is_int(shoal_wire_culprit(&h), -1, "a data header blames nobody");
    /* Random bytes are never accepted. */
    srand(1);
    int accepted = 0;
    for (int i = 0; i < 100000; i++) {
        for (int j = 0; j < SHOAL_WIRE_HDR_BYTES; j++) {
            buf[j] = (uint8_t)rand();
        }
        shoal_wire_decode(buf, &g);
        accepted += shoal_wire_check(&h, &g, why, sizeof(why)) == SHOAL_OK;
    }
    tap_is_int(accepted, 0, "100000 random headers: none accepted");
}

static void test_uid(void)
{
    shoal_boot_uid_t u, v;
    shoal_uid_t uid;
    char hex[2 * SHOAL_UID_BYTES + 1];
    struct sockaddr_in *s4 = (struct sockaddr_in *)&u.root;

    memset(&u, 0, sizeof(u));
    s4->sin_family = AF_INET;
    s4->sin_port = htons(4242);
    s4->sin_addr.s_addr = htonl(0x7f000001);
    u.root_len = sizeof(*s4);
    for (int i = 0; i < SHOAL_SECRET_BYTES; i++) {
        u.secret[i] = (uint8_t)(i * 7 + 1);
    }
    shoal_boot_uid_encode(&u, &uid);
    tap_is_int(shoal_boot_uid_decode(&uid, &v), SHOAL_OK, "uid decodes");
    tap_ok(memcmp(&u.root, &v.root, sizeof(*s4)) == 0 && memcmp(u.secret, v.secret, 32) == 0,
           "uid round trip keeps address and secret");
    for (int i = 0; i < SHOAL_UID_BYTES; i++) {
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)uid.internal[i]);
    }
    memset(&uid, 0, sizeof(uid));
    tap_is_int(shoal_boot_uid_from_hex(hex, &uid), SHOAL_OK, "hex uid parses");
    tap_is_int(shoal_boot_uid_decode(&uid, &v), SHOAL_OK, "hex uid decodes");
    hex[10] = 'z';
    tap_is_int(shoal_boot_uid_from_hex(hex, &uid), SHOAL_ERR_INVALID_ARG, "non-hex rejected");
    tap_is_int(shoal_boot_uid_from_hex("abcd", &uid), SHOAL_ERR_INVALID_ARG, "short hex rejected");
    memset(&uid, 0x5a, sizeof(uid));
    tap_is_int(shoal_boot_uid_decode(&uid, &v), SHOAL_ERR_INVALID_ARG, "garbage uid rejected");
}

int main(void)
{
    shoal_config_global_init();
    test_wire_roundtrip();
    test_wire_rejects();
    test_uid();
    return tap_done();
}
