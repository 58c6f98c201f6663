/* Out-of-band TCP helper for transports that need a side channel to set up their connections
 * (ib: queue pair numbers). Listener on a chosen interface (NCCL's SOCKET_IFNAME syntax),
 * blocking-with-deadline connect/accept/transfer that watch an abort flag, and a mutual
 * HMAC-SHA256 challenge-response over the job secret, the same idea as the tcp transport's
 * handshake (transports/tcp/tcp_conn.c):
 *   connector -> hello (magic, version, comm_id, from, to) + nonce_c (32 bytes)
 *   acceptor  -> nonce_a
 *   connector -> HMAC(secret, label "-con" | comm | nonce_c | nonce_a | from | to)
 *   acceptor  -> HMAC(secret, label "-acc" | comm | nonce_c | nonce_a | from | to), only once
 *                the connector's proof checked out: verify first, then prove.
 * Each side proves the secret over both nonces, so neither proof can be replayed or reflected,
 * and a stranger never obtains a proof of the acceptor's.
 * The acceptor (shoal_oob_acceptor_*) serves several handshakes at once: a new connection must
 * send its hello within SHOAL_SOCKET_HELLO_TIMEOUT and finish within 5 s; when its slots are
 * full the oldest unauthenticated connection is closed; the circuit breaker
 * (src/tenant/breaker.h) refuses sources that keep failing. shoal_oob_connect_auth reconnects
 * when it is closed early (evicted).
 */
#ifndef SHOAL_OOB_H
#define SHOAL_OOB_H

#include "core/tl.h" /* SHOAL_SECRET_BYTES */

#include <poll.h>
#include <stdint.h>
#include <sys/socket.h>

#define SHOAL_OOB_SLOTS 16           /* handshakes the acceptor serves at once */

#define SHOAL_OOB_ADDR_BYTES 24
#define SHOAL_OOB_NAME_MAX 64
#define SHOAL_OOB_NONCE_BYTES 32

typedef struct {
    uint16_t family;          /* AF_INET or AF_INET6 */
    uint16_t port;
    uint32_t scope_id;
    uint8_t ip[16];
} shoal_oob_addr_t;

typedef struct {
    const uint8_t *secret;    /* SHOAL_SECRET_BYTES */
    const char *label;        /* "shoal-ib": domain separation between users */
    uint32_t comm_id;
    uint32_t self;            /* our rank */
    const volatile int *abort_flag;
} shoal_oob_auth_t;

/* 1 if ifname matches spec ("eth,ib" prefixes, "^" excludes, "=" exact). */
SHOAL_HIDDEN void shoal_oob_addr_encode(const shoal_oob_addr_t *a,
                                        uint8_t out[SHOAL_OOB_ADDR_BYTES]);
SHOAL_HIDDEN int shoal_oob_addr_decode(const uint8_t in[SHOAL_OOB_ADDR_BYTES],
                                       shoal_oob_addr_t *a);
SHOAL_HIDDEN void shoal_oob_addr_str(const shoal_oob_addr_t *a, char *buf, size_t len);
/* Listens on the first interface matching ifspec (NULL/"": first non-loopback up, else lo),
 * port chosen by the kernel. */
SHOAL_HIDDEN shoal_status_t shoal_oob_listen(const char *ifspec, int *fd_p,
                                             shoal_oob_addr_t *a);
/* Connects, retrying refusals until the deadline. TIMEOUT, ABORTED or TRANSPORT. */
SHOAL_HIDDEN shoal_status_t shoal_oob_connect(const shoal_oob_addr_t *a, uint64_t deadline_ns,
                                              const volatile int *abort_flag, int *fd_p);
SHOAL_HIDDEN shoal_status_t shoal_oob_accept(int lfd, uint64_t deadline_ns,
                                             const volatile int *abort_flag, int *fd_p);
/* Moves exactly len bytes. PEER_FAILED on EOF/reset, TIMEOUT, ABORTED. */
SHOAL_HIDDEN shoal_status_t shoal_oob_send(int fd, const void *buf, size_t len,
                                           uint64_t deadline_ns, const volatile int *abort_flag);
SHOAL_HIDDEN shoal_status_t shoal_oob_recv(int fd, void *buf, size_t len, uint64_t deadline_ns,
                                           const volatile int *abort_flag);
/* The handshake. AUTH if the other side cannot prove the secret. */
SHOAL_HIDDEN shoal_status_t shoal_oob_auth_connect(int fd, const shoal_oob_auth_t *a,
                                                   uint32_t peer, uint64_t deadline_ns);
/* expect(arg, rank): 1 if that rank may connect now, 0 if not (refused, counted against the
 * source by the circuit breaker), SHOAL_OOB_EXPECT_LATER: a peer we are dialing ourselves
 * (closed quietly; lazy connections, ib_lazy.c). *peer_p: the proven rank. */
#define SHOAL_OOB_EXPECT_LATER 2
SHOAL_HIDDEN shoal_status_t shoal_oob_auth_accept(int fd, const shoal_oob_auth_t *a,
                                                  int (*expect)(void *arg, uint32_t rank),
                                                  void *arg, uint32_t *peer_p,
                                                  uint64_t deadline_ns, char *why, size_t len);

/* connect + handshake; reconnects (within the deadline) when the acceptor closes the
 * connection before the handshake finished; SHOAL_ERR_AUTH after SHOAL_OOB_AUTH_TRIES closes
 * right after our proof, or when the acceptor's proof is wrong. */
SHOAL_HIDDEN shoal_status_t shoal_oob_connect_auth(const shoal_oob_addr_t *addr,
                                                   const shoal_oob_auth_t *a, uint32_t peer,
                                                   uint64_t deadline_ns, int *fd_p);

/* A non-blocking dial (lazy connections, driven from a progress path): connect, then the
 * connector's side of the handshake, one step at a time. */
typedef struct {
    int state;                /* internal */
    int fd;                   /* -1 when closed */
    int refused;              /* the connect was refused (no listener: the process is gone) */
    int proved;               /* our proof went out (a close after it: the proof refused) */
    int err;                  /* connect()'s immediate error, reported by the first step */
    uint32_t peer;
    size_t off, len;
    uint8_t buf[64];
    uint8_t nc[SHOAL_OOB_NONCE_BYTES], na[SHOAL_OOB_NONCE_BYTES];
} shoal_oob_dial_t;

/* Starts connecting to addr (the fd is non-blocking). SHOAL_OK, or SYSTEM / TRANSPORT. */
SHOAL_HIDDEN shoal_status_t shoal_oob_dial_start(shoal_oob_dial_t *d, const shoal_oob_addr_t *addr,
                                                 const shoal_oob_auth_t *a, uint32_t peer);
/* As far as it goes without blocking: 1 authenticated (d->fd is then the caller's), 0 not yet,
 * -1 failed with *st_p: PEER_FAILED (refused: d->refused; closed early, before or after our
 * proof: d->proved), AUTH (the acceptor's proof is wrong), TRANSPORT or SYSTEM. The dial is
 * closed on failure. */
SHOAL_HIDDEN int shoal_oob_dial_step(shoal_oob_dial_t *d, const shoal_oob_auth_t *a,
                                     shoal_status_t *st_p);
/* POLLIN or POLLOUT: what the dial waits for. */
SHOAL_HIDDEN short shoal_oob_dial_events(const shoal_oob_dial_t *d);
SHOAL_HIDDEN void shoal_oob_dial_close(shoal_oob_dial_t *d);

/* The concurrent acceptor on a listening socket lfd (not owned). a is copied; a->secret must
 * outlive it. */
typedef struct shoal_oob_acceptor shoal_oob_acceptor_t;
SHOAL_HIDDEN shoal_status_t shoal_oob_acceptor_create(int lfd, const shoal_oob_auth_t *a,
                                                      int (*expect)(void *arg, uint32_t rank),
                                                      void *arg, shoal_oob_acceptor_t **acc_p);
/* A peer is expected from this address: the circuit breaker never refuses it (until destroy). */
SHOAL_HIDDEN void shoal_oob_acceptor_trust(shoal_oob_acceptor_t *acc,
                                           const shoal_oob_addr_t *addr);
/* An accepted connection fd (non-blocking) from src takes a handshake slot, evicting the
 * oldest unauthenticated one when all are taken: 1, the acceptor now owns fd; 0 if no slot
 * could be freed (fd is still the caller's). acceptor_next accepts from lfd through this; the
 * fuzz target tests/fuzz/fuzz_oob_hs.c hands it one end of a socketpair. */
SHOAL_HIDDEN int shoal_oob_acceptor_add(shoal_oob_acceptor_t *acc, int fd,
                                        const struct sockaddr_storage *src);
/* The next authenticated connection (expect() said yes at the hello and again at the end):
 * its fd (non-blocking, now the caller's) and rank. TIMEOUT, ABORTED or SYSTEM. */
SHOAL_HIDDEN shoal_status_t shoal_oob_acceptor_next(shoal_oob_acceptor_t *acc,
                                                    uint64_t deadline_ns, uint32_t *peer_p,
                                                    int *fd_p);
SHOAL_HIDDEN void shoal_oob_acceptor_destroy(shoal_oob_acceptor_t *acc);
/* Handshakes under way (their sockets are the acceptor's: a caller that sleeps on its own fds
 * sleeps on these too, see shoal_oob_acceptor_pollfds). */
SHOAL_HIDDEN int shoal_oob_acceptor_busy(const shoal_oob_acceptor_t *acc);
/* The sockets of the handshakes under way and what each waits for (POLLIN or POLLOUT), at
 * most max of them (SHOAL_OOB_SLOTS is every one): how many were written. The listener is
 * not among them. */
SHOAL_HIDDEN int shoal_oob_acceptor_pollfds(const shoal_oob_acceptor_t *acc, struct pollfd *p,
                                            int max);

#endif
