/* TCP transport: the handshake slots of connect_all (tcp_conn.c). One slot per socket being
 * set up, a connection we make or one we accepted, each a small state machine driven by
 * non-blocking transfers (see the protocol at the top of tcp_conn.c). Shared with
 * tests/fuzz/fuzz_tcp_hs.c, which drives single slots with a stranger's bytes. */
#ifndef SHOAL_TCP_HS_H
#define SHOAL_TCP_HS_H

#include "transports/tcp/tcp.h"

typedef enum {
    SHOAL_TCP_HS_FREE = 0,
    SHOAL_TCP_HS_RETRY,      /* connector: waiting to connect (again) */
    SHOAL_TCP_HS_CONNECTING, /* connector: non-blocking connect in flight */
    SHOAL_TCP_HS_C_HELLO,    /* connector: sending the hello */
    SHOAL_TCP_HS_C_CHAL,     /* connector: reading the challenge */
    SHOAL_TCP_HS_C_PROOF,    /* connector: sending its proof */
    SHOAL_TCP_HS_C_ACK,      /* connector: reading the acceptor's proof */
    SHOAL_TCP_HS_A_HELLO,    /* acceptor: reading the hello */
    SHOAL_TCP_HS_A_CHAL,     /* acceptor: sending the challenge */
    SHOAL_TCP_HS_A_PROOF,    /* acceptor: reading the proof */
    SHOAL_TCP_HS_A_ACK,      /* acceptor: sending its proof */
} shoal_tcp_hs_state_t;

typedef struct {
    int state;
    int fd;
    int ep_idx;                  /* -1 until known */
    int sock_idx;
    size_t off, len;             /* transfer within buf */
    uint8_t buf[64];
    uint8_t nc[SHOAL_TCP_NONCE_BYTES]; /* connector's nonce */
    uint8_t na[SHOAL_TCP_NONCE_BYTES]; /* acceptor's nonce (the challenge) */
    uint64_t time_ns;            /* acceptor: deadline; RETRY: when to connect */
    uint64_t start_ns;           /* acceptor: when accepted (the oldest is evicted first) */
    int retries;
    int early_closes;            /* connector: closed by the acceptor before its proof */
    int auth_closes;             /* connector: closed by the acceptor right after our proof */
    char from[SHOAL_TCP_NAME_MAX]; /* acceptor: the remote address */
    struct sockaddr_storage src; /* acceptor: the remote address, for the circuit breaker */
} shoal_tcp_hs_t;

typedef struct shoal_tcp_conn {
    shoal_tl_ctx_t *ctx;
    shoal_tcp_hs_t *slots;
    int nslots;
    int maxslots;                /* lazy: slots grow up to this many */
    int lazy;                    /* connections at first use: either side may connect */
    int busy;                    /* lazy: slots in use after the last drive (0: skip them) */
    char why[224];               /* the sentence of status */
    int nneeded, nestablished;
    uint64_t read_ns;            /* whole-handshake deadline of accepted sockets */
    uint64_t hello_ns;           /* hello deadline of accepted sockets */
    shoal_status_t status;       /* first fatal error */
    shoal_log_limit_t accept_warn; /* accept()'s failures, logged once a second */
    shoal_accept_stall_t accept_stall; /* accept() failing for want of a resource */
} shoal_tcp_conn_t;

/* An accepted connection fd from src (named from) takes slot hs: it must send its hello within
 * conn->hello_ns. */
SHOAL_HIDDEN void shoal_tcp_hs_accepted(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs, int fd,
                                        const struct sockaddr_storage *src, const char *from);
/* Connector slot hs (fd connected, ep_idx and sock_idx set): picks its nonce and queues the
 * hello. */
SHOAL_HIDDEN void shoal_tcp_hs_hello(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs);
/* Moves hs as far as its socket allows at time now: transfers, checks, refusal (the slot
 * is freed and its fd closed), establishment (the fd becomes a data socket of its endpoint,
 * conn->nestablished grows), or a fatal error in conn->status. */
SHOAL_HIDDEN void shoal_tcp_hs_drive(shoal_tcp_conn_t *conn, shoal_tcp_hs_t *hs, uint64_t now);

#endif
