/* Fuzz target: the TCP transport's handshake state machine (transports/tcp/tcp_conn.c): one
 * handshake slot of connect_all, the acceptor's or the connector's, driven by
 * shoal_tcp_hs_drive over a socketpair whose other end sends the input's bytes (the
 * stranger), in chunks, with the slot driven after each chunk so that partial reads happen.
 * The job: 4 ranks, a communicator id and a secret drawn at random per process (the fuzzer
 * cannot forge a proof). Input: 6 control bytes, then the stranger's bytes (at most 4 KiB):
 *   c0 bit 0  the slot is the acceptor (0) or the connector (1)
 *      bit 1  honest: the target knows the secret and puts the right proof in place of the
 *             input's bytes there (acceptor: bytes 56..87, the connector's proof; connector:
 *             bytes 32..63, the acceptor's), so that the steps after the proof run too
 *      bit 2  the stranger shuts its side after its last byte (EOF), the slot is driven again
 *      bit 3  acceptor: a last drive after the slot's deadline
 *   c1        our rank (bits 0-1), sockets per peer - 1 (bits 2-3), bit 4: connections at
 *             first use (SHOAL_CONNECT=lazy: a lower rank may connect too)
 *   c2        bit 7: one socket is established already: peer index bits 4-5, socket bits 0-3
 *             bit 6: acceptor, honest: the socket the hello names gets established (by
 *             another slot) while this one waits for the proof
 *   c3        connector: the peer (bits 4-5) and the socket (bits 0-3) of the slot
 *   c4, c5    chunk lengths (each % 64 + 1, alternately); chunks also end at 32 and 56, where
 *             the honest proofs start.
 * Invariants: without the right proof nothing is established and the acceptor sends nothing
 * but its 32-byte challenge (verify first, then prove); with it, a valid hello and the whole
 * proof, the socket is established as the socket the hello named, and each side's proof is
 * HMAC(secret) over the transcript; a refused or closed slot releases its socket; the
 * acceptor never fails connect_all; an acceptor slot is gone after its deadline. */
#include "transports/tcp/tcp_hs.h"
#include "tests/fuzz/fuzz.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#define FUZZ_RANKS 4
#define FUZZ_COMM 0x5ca1ab1eu
#define FUZZ_DUMMY_FD 1000000 /* "established" in ep->fds, never a real descriptor */
#define FUZZ_MAX_STREAM 4096

static uint8_t fuzz_secret[SHOAL_SECRET_BYTES];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_log();
    if (shoal_random_bytes(fuzz_secret, sizeof(fuzz_secret)) != SHOAL_OK) {
        abort();
    }
    return 0;
}

typedef struct {
    int fd;               /* the stranger's end */
    uint8_t got[256];     /* what the slot sent */
    size_t ngot;
} fuzz_peer_t;

static void fuzz_drain(fuzz_peer_t *p)
{
    for (;;) {
        uint8_t tmp[256];
        ssize_t r = recv(p->fd, tmp, sizeof(tmp), MSG_DONTWAIT);
        if (r <= 0) {
            return;
        }
        for (ssize_t i = 0; i < r; i++) {
            if (p->ngot < sizeof(p->got)) {
                p->got[p->ngot] = tmp[i];
            }
            p->ngot++;
        }
    }
}

static void fuzz_proof(const char *label, const uint8_t *nc, const uint8_t *na, uint32_t from,
                       uint32_t to, uint32_t sock_idx, uint32_t nsocks,
                       uint8_t out[SHOAL_HMAC_BYTES])
{
    shoal_tcp_transcript_t t = {.comm_id = FUZZ_COMM, .nonce_c = nc, .nonce_a = na,
                                .from = from, .to = to, .sock_idx = sock_idx, .nsocks = nsocks};
    fuzz_require(shoal_tcp_proof(fuzz_secret, label, &t, out) == SHOAL_OK);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in_t in = {.p = data, .left = size};
    uint8_t c[6], s[FUZZ_MAX_STREAM];
    shoal_tl_ctx_t ctx;
    shoal_ep_t eps[FUZZ_RANKS - 1];
    shoal_tcp_hs_t hs;
    shoal_tcp_conn_t conn;
    fuzz_peer_t peer = {.fd = -1};
    int sv[2], connector, honest, rank, nsocks, lazy, raced = 0;
    size_t slen, sent = 0, ci = 0;
    uint64_t t0 = shoal_time_ns();

    fuzz_take(&in, c, sizeof(c));
    slen = SHOAL_MIN(in.left, sizeof(s));
    fuzz_take(&in, s, slen);
    connector = c[0] & 1;
    honest = (c[0] >> 1) & 1;
    rank = c[1] & 3;
    nsocks = ((c[1] >> 2) & 3) + 1;
    lazy = (c[1] >> 4) & 1;

    memset(&ctx, 0, sizeof(ctx));
    ctx.rank = rank;
    ctx.comm_id = FUZZ_COMM;
    memcpy(ctx.secret, fuzz_secret, sizeof(ctx.secret));
    ctx.timeout_ms = 1000;
    ctx.listen_fd = -1;
    ctx.epfd = -1;
    ctx.nsocks = (unsigned)nsocks;
    ctx.eps = eps;
    ctx.neps = FUZZ_RANKS - 1;
    memset(eps, 0, sizeof(eps));
    for (int i = 0, r = 0; r < FUZZ_RANKS; r++) {
        if (r == rank) {
            continue;
        }
        eps[i].ctx = &ctx;
        eps[i].peer = r;
        eps[i].nsocks = nsocks;
        for (int k = 0; k < SHOAL_TCP_MAX_SOCKS; k++) {
            eps[i].fds[k] = -1;
        }
        snprintf(eps[i].name, sizeof(eps[i].name), "192.0.2.%d:7000", r + 1);
        i++;
    }
    if (c[2] & 0x80) {
        eps[((c[2] >> 4) & 3) % ctx.neps].fds[(c[2] & 15) % nsocks] = FUZZ_DUMMY_FD;
    }
    memset(&conn, 0, sizeof(conn));
    conn.ctx = &ctx;
    conn.slots = &hs;
    conn.nslots = 1;
    conn.nneeded = 1;
    conn.lazy = lazy;
    conn.read_ns = 1000000000ull;
    conn.hello_ns = 100000000ull;
    conn.status = SHOAL_OK;

    /* a failure here is a descriptor leaked by an earlier input */
    fuzz_require(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
    peer.fd = sv[1];
    memset(&hs, 0, sizeof(hs));
    if (connector) {
        hs.fd = sv[0];
        hs.ep_idx = ((c[3] >> 4) & 3) % ctx.neps;
        hs.sock_idx = (c[3] & 15) % nsocks;
        shoal_tcp_hs_hello(&conn, &hs);
    } else {
        struct sockaddr_storage ss;
        struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
        memset(&ss, 0, sizeof(ss));
        sin->sin_family = AF_INET;
        sin->sin_port = htons(40000);
        sin->sin_addr.s_addr = htonl(0xc0000263u); /* 192.0.2.99, the stranger */
        shoal_tcp_hs_accepted(&conn, &hs, sv[0], &ss, "192.0.2.99:40000");
    }
    fuzz_require(conn.status == SHOAL_OK);

    /* The connector speaks first; the acceptor just finds nothing to read. */
    shoal_tcp_hs_drive(&conn, &hs, t0);
    fuzz_drain(&peer);
    if (connector) {
        shoal_tcp_hello_t h;
        fuzz_require(peer.ngot == SHOAL_TCP_HELLO_BYTES && hs.state == SHOAL_TCP_HS_C_CHAL);
        shoal_tcp_hello_decode(peer.got, &h);
        fuzz_require(h.magic == SHOAL_TCP_HELLO_MAGIC && h.version == SHOAL_TCP_HELLO_VERSION &&
                     h.length == SHOAL_TCP_HELLO_BYTES && h.comm_id == FUZZ_COMM &&
                     h.rank == (uint32_t)rank && h.sock_idx == (uint32_t)hs.sock_idx &&
                     h.nsocks == (uint32_t)nsocks);
        if (honest && slen >= 64) {
            fuzz_proof("shoal-tcp-ack", h.nonce, s, (uint32_t)rank,
                       (uint32_t)eps[hs.ep_idx].peer, h.sock_idx, h.nsocks, s + 32);
        }
    } else {
        fuzz_require(peer.ngot == 0 && hs.state == SHOAL_TCP_HS_A_HELLO);
    }

    while (sent < slen && hs.state != SHOAL_TCP_HS_FREE && hs.state != SHOAL_TCP_HS_RETRY &&
           conn.status == SHOAL_OK) {
        size_t n = (size_t)c[4 + (ci++ & 1)] % 64 + 1, end = SHOAL_MIN(sent + n, slen);
        for (size_t cut = 32; cut <= 56; cut += 24) {
            if (sent < cut && end > cut) {
                end = cut;
            }
        }
        if (!connector && honest && sent == 56 && slen >= 88 && peer.ngot >= 32) {
            /* the slot sent its challenge: the connector's proof over the hello we sent */
            shoal_tcp_hello_t h;
            shoal_tcp_hello_decode(s, &h);
            fuzz_proof("shoal-tcp", h.nonce, peer.got, h.rank, (uint32_t)rank, h.sock_idx,
                       h.nsocks, s + 56);
            if ((c[2] & 0x40) && hs.state == SHOAL_TCP_HS_A_PROOF) {
                shoal_ep_t *ep = &eps[hs.ep_idx];
                fuzz_require(ep->peer == (int)h.rank && ep->fds[h.sock_idx] < 0);
                ep->fds[h.sock_idx] = FUZZ_DUMMY_FD;
                raced = 1;
            }
        }
        ssize_t w = send(peer.fd, s + sent, end - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w <= 0) {
            break; /* the slot closed its end */
        }
        sent += (size_t)w;
        shoal_tcp_hs_drive(&conn, &hs, t0);
        fuzz_drain(&peer);
    }
    if ((c[0] & 4) && hs.state != SHOAL_TCP_HS_FREE && hs.state != SHOAL_TCP_HS_RETRY &&
        conn.status == SHOAL_OK) {
        shutdown(peer.fd, SHUT_WR);
        shoal_tcp_hs_drive(&conn, &hs, t0);
        fuzz_drain(&peer);
        if (conn.nestablished == 0) {
            /* a closed connection never stays in a slot */
            fuzz_require(hs.fd < 0 && (hs.state == SHOAL_TCP_HS_FREE ||
                                       hs.state == SHOAL_TCP_HS_RETRY));
        }
    }
    if (!connector && (c[0] & 8)) {
        shoal_tcp_hs_drive(&conn, &hs, hs.time_ns);
        fuzz_require(hs.state == SHOAL_TCP_HS_FREE);
    }

    if (!connector) {
        shoal_tcp_hello_t h;
        shoal_tcp_hello_decode(s, &h);
        int ep_idx = -1;
        for (int i = 0; i < ctx.neps; i++) {
            if ((uint32_t)eps[i].peer == h.rank) {
                ep_idx = i;
            }
        }
        /* the hello the acceptor had to accept (the socket it names was free then) */
        int valid = slen >= SHOAL_TCP_HELLO_BYTES && h.magic == SHOAL_TCP_HELLO_MAGIC &&
                    h.version == SHOAL_TCP_HELLO_VERSION &&
                    h.length == SHOAL_TCP_HELLO_BYTES && h.comm_id == FUZZ_COMM &&
                    ep_idx >= 0 && (lazy ? h.rank != (uint32_t)rank : h.rank > (uint32_t)rank) &&
                    h.nsocks == (uint32_t)nsocks &&
                    h.sock_idx < (uint32_t)nsocks &&
                    (eps[ep_idx].fds[h.sock_idx] != FUZZ_DUMMY_FD || raced);
        int proved = honest && valid && slen >= 88;
        fuzz_require(conn.status == SHOAL_OK);
        /* the challenge only answers a hello that checked out */
        fuzz_require(peer.ngot == 0 || valid);
        /* verify first, then prove: a stranger gets the challenge and nothing more */
        fuzz_require(peer.ngot <= SHOAL_TCP_CHALLENGE_BYTES || proved);
        if (proved) {
            uint8_t ack[SHOAL_HMAC_BYTES];
            fuzz_require(peer.ngot == SHOAL_TCP_CHALLENGE_BYTES + SHOAL_HMAC_BYTES);
            fuzz_proof("shoal-tcp-ack", h.nonce, peer.got, h.rank, (uint32_t)rank, h.sock_idx,
                       h.nsocks, ack);
            fuzz_require(memcmp(ack, peer.got + SHOAL_TCP_CHALLENGE_BYTES, sizeof(ack)) == 0);
        }
        if (conn.nestablished == 1) {
            fuzz_require(proved && !raced && hs.state == SHOAL_TCP_HS_FREE &&
                         eps[ep_idx].fds[h.sock_idx] == sv[0] && eps[ep_idx].nestablished == 1);
        } else {
            /* a proved connector is established, unless its socket was taken meanwhile */
            fuzz_require(!proved || raced);
        }
    } else {
        if (peer.ngot > SHOAL_TCP_HELLO_BYTES) {
            /* our proof, only once the whole challenge came, over the transcript */
            uint8_t want[SHOAL_HMAC_BYTES];
            shoal_tcp_hello_t h;
            shoal_tcp_hello_decode(peer.got, &h);
            fuzz_require(sent >= SHOAL_TCP_CHALLENGE_BYTES &&
                         peer.ngot == SHOAL_TCP_HELLO_BYTES + SHOAL_HMAC_BYTES);
            fuzz_proof("shoal-tcp", h.nonce, s, (uint32_t)rank,
                       (uint32_t)eps[hs.ep_idx].peer, h.sock_idx, h.nsocks, want);
            fuzz_require(memcmp(want, peer.got + SHOAL_TCP_HELLO_BYTES, sizeof(want)) == 0);
        }
        if (conn.nestablished == 1) {
            fuzz_require(honest && sent >= 64 && conn.status == SHOAL_OK &&
                         eps[hs.ep_idx].fds[hs.sock_idx] == sv[0]);
        } else if (sent >= 64) {
            /* the whole answer came and was wrong */
            fuzz_require(!honest && conn.status == SHOAL_ERR_AUTH);
        } else {
            fuzz_require(conn.status == SHOAL_OK);
        }
    }

    close(peer.fd);
    if (hs.fd >= 0) {
        close(hs.fd);
    }
    for (int i = 0; i < ctx.neps; i++) {
        for (int k = 0; k < SHOAL_TCP_MAX_SOCKS; k++) {
            if (eps[i].fds[k] >= 0 && eps[i].fds[k] != FUZZ_DUMMY_FD) {
                close(eps[i].fds[k]);
            }
        }
    }
    shoal_secret_wipe(ctx.secret, sizeof(ctx.secret));
    return 0;
}
