/*
 * Fuzz target: the bootstrap root's frame reader, fed a byte stream per client.
 *
 * The root runs without a listener (shoal_boot_root_new with listen_fd -1); each client is a
 * socketpair end the root writes its challenges, answers and tables to (drained and thrown
 * away here). The input is a sequence of records:
 *
 *   u8 op | u8 client (mod 4) | u16 length (little endian) | length bytes
 *
 *   op % 4 == 0  raw bytes, as if the client had sent them
 *   op % 4 == 1  a valid hello (built here with the job secret and the client's challenge)
 *                for rank bytes[0] % 4 of nranks bytes[1] % 4 + 1 (so the fuzzer reaches
 *                the authenticated rounds without guessing MACs)
 *   op % 4 == 2  an allgather frame of the record's bytes for round bytes[0] % 4, with a
 *                valid MAC under the client's session key (fixed-length kind when op & 4 is
 *                0, variable-length kind otherwise; the ring's kind, RING, when op & 8)
 *   op % 4 == 3  a bye with a valid MAC
 *
 * Links the shoal convenience library (libshoal_core.la: the hidden root and frame functions)
 * and OpenSSL libcrypto (through it), plus -lpthread.
 */
#include "core/core.h"
#include "core/boot_proto.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FZ_CLIENTS 4

typedef struct {
    int idx;                       /* root's client index, -1 if none */
    int peer;                      /* our end of the socketpair */
    uint8_t key[SHOAL_HMAC_BYTES]; /* session key once a valid hello was sent */
    uint64_t tx;
    int keyed;
} fz_client_t;

static void fz_drain(fz_client_t *c)
{
    uint8_t buf[65536];
    while (c->peer >= 0 && recv(c->peer, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
    }
}

static void fz_client_open(shoal_root_t *r, fz_client_t *c)
{
    struct sockaddr_storage ss;
    int sv[2];
    memset(&ss, 0, sizeof(ss));
    ss.ss_family = AF_INET;
    c->idx = -1;
    c->peer = -1;
    c->keyed = 0;
    c->tx = 0;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        return;
    }
    c->peer = sv[0];
    c->idx = shoal_boot_root_add_client(r, sv[1], &ss); /* closes sv[1] on failure */
}

static void fz_hello(shoal_root_t *r, const shoal_boot_uid_t *u, fz_client_t *c,
                     const uint8_t *b, size_t n)
{
    const uint8_t *nonce = shoal_boot_root_nonce(r, c->idx);
    struct {
        shoal_boot_frame_t f;
        shoal_boot_hello_t h;
    } msg;
    if (nonce == NULL) {
        return;
    }
    memset(&msg, 0, sizeof(msg));
    msg.f = (shoal_boot_frame_t){.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_HELLO,
                                 .len = sizeof(msg.h)};
    msg.h.nranks = n > 1 ? b[1] % 4 + 1 : 2;
    msg.h.rank = n > 0 ? b[0] % 4 : 0;
    msg.h.ident = u->ident;
    memset(msg.h.nonce, c->idx + 1, sizeof(msg.h.nonce));
    shoal_boot_hello_mac(u->secret, nonce, &msg.h, msg.h.mac);
    shoal_boot_session_key(u->secret, nonce, &msg.h, c->key);
    c->keyed = 1;
    c->tx = 0;
    (void)shoal_boot_root_feed(r, c->idx, (const uint8_t *)&msg, sizeof(msg));
}

static void fz_frame(shoal_root_t *r, fz_client_t *c, uint32_t type, uint32_t round,
                     const uint8_t *b, size_t n)
{
    shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = type, .len = (uint32_t)n,
                            .round = round};
    uint8_t digest[SHOAL_HMAC_BYTES], mac[SHOAL_BOOT_MAC];
    if (!c->keyed) {
        return;
    }
    shoal_boot_payload_digest(b, n, digest);
    shoal_boot_frame_mac(c->key, SHOAL_BOOT_DIR_UP, c->tx++, &f, digest, mac);
    if (shoal_boot_root_feed(r, c->idx, (const uint8_t *)&f, sizeof(f)) == SHOAL_OK &&
        (n == 0 || shoal_boot_root_feed(r, c->idx, b, n) == SHOAL_OK)) {
        (void)shoal_boot_root_feed(r, c->idx, mac, sizeof(mac));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    shoal_boot_uid_t u;
    shoal_root_t *r = NULL;
    fz_client_t cl[FZ_CLIENTS];

    if (!init) {
        setenv("SHOAL_DEBUG", "NONE", 0);
        setenv("SHOAL_TIMEOUT_MS", "50", 0); /* bounds any write to an undrained client */
        shoal_config_global_init();
        init = 1;
    }
    memset(&u, 0, sizeof(u));
    memset(u.secret, 0x5a, sizeof(u.secret));
    if (shoal_boot_root_new(&u, -1, 50, &r) != SHOAL_OK) {
        return 0;
    }
    for (int i = 0; i < FZ_CLIENTS; i++) {
        fz_client_open(r, &cl[i]);
    }
    while (size >= 4) {
        uint8_t op = data[0];
        fz_client_t *c = &cl[data[1] % FZ_CLIENTS];
        size_t n = (size_t)data[2] | (size_t)data[3] << 8;
        const uint8_t *b = data + 4;
        if (n > size - 4) {
            n = size - 4;
        }
        data += 4 + n;
        size -= 4 + n;
        if (c->idx < 0 || shoal_boot_root_nonce(r, c->idx) == NULL) {
            continue; /* refused or closed by the root */
        }
        switch (op % 4) {
        case 0:
            (void)shoal_boot_root_feed(r, c->idx, b, n);
            break;
        case 1:
            fz_hello(r, &u, c, b, n);
            break;
        case 2:
            fz_frame(r, c,
                     (op & 8) != 0   ? SHOAL_BOOT_RING
                     : (op & 4) != 0 ? SHOAL_BOOT_AGV
                                     : SHOAL_BOOT_AG,
                     n > 0 ? b[0] % 4 : 0, b, n);
            break;
        default:
            fz_frame(r, c, SHOAL_BOOT_BYE, 0, NULL, 0);
            break;
        }
        for (int i = 0; i < FZ_CLIENTS; i++) {
            fz_drain(&cl[i]);
        }
    }
    shoal_boot_root_free(r);
    for (int i = 0; i < FZ_CLIENTS; i++) {
        if (cl[i].peer >= 0) {
            close(cl[i].peer);
        }
    }
    return 0;
}
