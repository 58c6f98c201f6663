/* TCP transport: non-blocking sockets, one epoll fd per context, NSOCKS sockets per peer with
 * large messages striped across them, an HMAC challenge-response on every socket. */
#ifndef SHOAL_TCP_H
#define SHOAL_TCP_H

#include "core/tl.h"

#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#define SHOAL_TCP_MAX_SOCKS 16
/* A payload up to this size is read with its header in one system call (tcp_ep.c). */
#define SHOAL_TCP_RX_STAGE 4096
#define SHOAL_TCP_ADDR_MAGIC 0x50435453u   /* "STCP" */
#define SHOAL_TCP_HELLO_MAGIC 0x4f4c4548u  /* "HELO" */
#define SHOAL_TCP_HELLO_VERSION 2
#define SHOAL_TCP_NONCE_BYTES 32
#define SHOAL_TCP_HELLO_BYTES (24 + SHOAL_TCP_NONCE_BYTES)
#define SHOAL_TCP_CHALLENGE_BYTES SHOAL_TCP_NONCE_BYTES
#define SHOAL_TCP_NAME_MAX 64              /* "[ipv6]:port" */

/* ---- config (tcp_config.c) ------------------------------------------------------------ */

typedef enum {
    SHOAL_TCP_FAMILY_ANY = 0,
    SHOAL_TCP_FAMILY_INET,
    SHOAL_TCP_FAMILY_INET6,
} shoal_tcp_family_t;

typedef struct {
    const char *ifname;    /* SHOAL_SOCKET_IFNAME, NULL = automatic */
    int family;            /* shoal_tcp_family_t, SHOAL_SOCKET_FAMILY */
    unsigned nsocks;       /* SHOAL_SOCKET_NSOCKS */
    size_t min_split;      /* SHOAL_TCP_MIN_SPLIT */
    size_t sndbuf;         /* SHOAL_TCP_SNDBUF, 0 = kernel default */
    size_t rcvbuf;         /* SHOAL_TCP_RCVBUF, 0 = kernel default */
    int hello_timeout_ms;  /* SHOAL_SOCKET_HELLO_TIMEOUT: a new connection's hello deadline */
} shoal_tcp_config_t;

extern SHOAL_HIDDEN shoal_tcp_config_t shoal_tcp_config;
extern const shoal_cfg_table_t shoal_tcp_cfg_table;

/* ---- wire formats of the connection setup ---------------------------------------------- */

/* What address() publishes (little-endian fixed layout, see shoal_tcp_addr_encode). */
typedef struct {
    uint16_t family;       /* AF_INET or AF_INET6 */
    uint16_t port;
    uint32_t scope_id;
    uint8_t ip[16];        /* 4 bytes used for AF_INET */
    uint32_t nsocks;       /* this rank's SHOAL_SOCKET_NSOCKS */
    uint64_t min_split;    /* this rank's SHOAL_TCP_MIN_SPLIT */
    uint32_t pid;
} shoal_tcp_addr_t;
#define SHOAL_TCP_ADDR_BYTES 48

/* The connector's first message on every socket. */
typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t length;       /* must be SHOAL_TCP_HELLO_BYTES */
    uint32_t comm_id;
    uint32_t rank;         /* connector's rank */
    uint32_t sock_idx;
    uint32_t nsocks;       /* sockets the connector opens to this peer */
    uint8_t nonce[SHOAL_TCP_NONCE_BYTES]; /* the connector's fresh nonce */
} shoal_tcp_hello_t;

/* What both proofs of a socket's handshake cover: each side's fresh nonce and everything the
 * socket is for, so that no proof is valid for another run, pair, socket or direction. */
typedef struct {
    uint32_t comm_id;
    const uint8_t *nonce_c;  /* connector's, from its hello */
    const uint8_t *nonce_a;  /* acceptor's challenge */
    uint32_t from, to;       /* connector's and acceptor's ranks */
    uint32_t sock_idx, nsocks;
} shoal_tcp_transcript_t;

SHOAL_HIDDEN void shoal_tcp_addr_encode(const shoal_tcp_addr_t *a, uint8_t *out);
SHOAL_HIDDEN int shoal_tcp_addr_decode(const void *in, size_t len, shoal_tcp_addr_t *a);
SHOAL_HIDDEN void shoal_tcp_addr_sockaddr(const shoal_tcp_addr_t *a, struct sockaddr_storage *ss,
                                          socklen_t *len_p);
SHOAL_HIDDEN void shoal_tcp_sockaddr_str(const struct sockaddr *sa, char *buf, size_t len);
SHOAL_HIDDEN void shoal_tcp_hello_encode(const shoal_tcp_hello_t *h,
                                         uint8_t out[SHOAL_TCP_HELLO_BYTES]);
SHOAL_HIDDEN void shoal_tcp_hello_decode(const uint8_t in[SHOAL_TCP_HELLO_BYTES],
                                         shoal_tcp_hello_t *h);
/* HMAC-SHA256(secret, label | 0 | comm_id | nonce_c | nonce_a | from | to | sock_idx |
 * nsocks). label (the direction) is "shoal-tcp" for the connector's proof and
 * "shoal-tcp-ack" for the acceptor's answer. */
SHOAL_HIDDEN shoal_status_t shoal_tcp_proof(const uint8_t *secret, const char *label,
                                            const shoal_tcp_transcript_t *t,
                                            uint8_t out[SHOAL_HMAC_BYTES]);

/* ---- objects ----------------------------------------------------------------------------- */

struct shoal_ep {
    shoal_tl_ctx_t *ctx;
    int peer;                          /* global rank */
    int nsocks;                        /* min of both sides' NSOCKS */
    size_t min_split;                  /* max of both sides' TCP_MIN_SPLIT */
    int fds[SHOAL_TCP_MAX_SOCKS];      /* -1 until established */
    int nestablished;
    char name[SHOAL_TCP_NAME_MAX];     /* peer's listening address, for messages */
    uint8_t addr_raw[SHOAL_TCP_ADDR_BYTES]; /* peer's address as published */
    shoal_status_t status;             /* SHOAL_OK until the endpoint fails */
    int culprit;                       /* with status: the rank blamed (abort notice), or -1 */
    char why[192];                     /* cause of the failure */
    /* send queue: the head is in flight */
    shoal_tl_req_t *sq_head, *sq_tail;
    uint8_t shdr[SHOAL_WIRE_HDR_BYTES];
    size_t shdr_off;
    size_t soff[SHOAL_TCP_MAX_SOCKS];  /* bytes of each stripe sent */
    /* receive queue: the head is being filled */
    shoal_tl_req_t *rq_head, *rq_tail;
    uint8_t rhdr[SHOAL_WIRE_HDR_BYTES];
    size_t rhdr_off;
    size_t roff[SHOAL_TCP_MAX_SOCKS];  /* bytes of each stripe received */
};

#define SHOAL_TCP_EVENTS 64

struct shoal_tcp_conn;

struct shoal_tl_ctx {
    /* A small payload read with its header, held until the header is checked: one per
     * context, not per endpoint (a stage holds bytes only within the call that read the
     * header, which checks it and copies them out before returning; one thread progresses
     * a context at a time). */
    uint8_t rstage[SHOAL_TCP_RX_STAGE];
    int rank;
    uint32_t comm_id;
    uint8_t secret[SHOAL_SECRET_BYTES];
    int timeout_ms;
    const volatile int *abort_flag;
    int listen_fd;                     /* -1 after ready() */
    int epfd;
    shoal_tcp_addr_t addr;             /* our own listening address */
    char name[SHOAL_TCP_NAME_MAX];
    unsigned nsocks;
    size_t min_split;
    size_t sndbuf, rcvbuf;
    int qos_priority;                  /* SO_PRIORITY of every socket, -1: leave it */
    int qos_dscp;                      /* DSCP (IP_TOS / IPV6_TCLASS = dscp << 2), -1: leave it */
    uint64_t qos_rate_max;             /* bytes/s per peer, spread over its sockets; 0: none */
    shoal_ep_t *eps;
    int neps;
    int npending;                      /* requests queued on all endpoints */
    /* Lazy connections (SHOAL_CONNECT): the handshakes live on between progress calls. */
    int lazy;
    struct shoal_tcp_conn *conn;       /* lazy: handshake slots, NULL before connect_all */
    int nconnected;                    /* lazy: endpoints with every socket established */
    unsigned idle_polls;               /* lazy: progress calls since the listener was looked at */
    struct epoll_event events[SHOAL_TCP_EVENTS];
};

/* tcp_ctx.c */
SHOAL_HIDDEN shoal_status_t shoal_tcp_socket_setopts(shoal_tl_ctx_t *ctx, int fd, int data);
/* The communicator's QoS marks on a socket: SO_PRIORITY and DSCP, and with rate > 0
 * SO_MAX_PACING_RATE (bytes/s). A refusal is one warning per kind, never an error. */
SHOAL_HIDDEN void shoal_tcp_socket_qos(shoal_tl_ctx_t *ctx, int fd, uint64_t rate);
SHOAL_HIDDEN void shoal_tcp_epoll_drain(shoal_tl_ctx_t *ctx);

/* tcp_ep.c: connection setup and data path */
SHOAL_HIDDEN shoal_status_t shoal_tcp_connect_all(shoal_tl_ctx_t *ctx, const int *peers,
                                                  int npeers, const void *const *addrs,
                                                  const size_t *addr_lens, shoal_ep_t **eps_p);
/* Lazy contexts: accepts and drives handshakes, starts the connections of endpoints with
 * queued requests; returns the endpoints newly connected. Never blocks. */
SHOAL_HIDDEN int shoal_tcp_lazy_progress(shoal_tl_ctx_t *ctx);
/* Handshakes still in flight (wait_fd must not eat their edges). */
SHOAL_HIDDEN int shoal_tcp_lazy_busy(shoal_tl_ctx_t *ctx);
/* The context failed: every handshake under way, ours or a peer's, is dropped (closed). One
 * finished now would give the peer a connection that no message ever comes on, and its
 * requests would wait for their timeout; closed, they fail at once (its connector is refused
 * by the closed listener). */
SHOAL_HIDDEN void shoal_tcp_lazy_stop(shoal_tl_ctx_t *ctx);
SHOAL_HIDDEN void shoal_tcp_lazy_fini(shoal_tl_ctx_t *ctx);
SHOAL_HIDDEN shoal_status_t shoal_tcp_ep_isend(shoal_ep_t *ep, shoal_tl_req_t *req);
SHOAL_HIDDEN shoal_status_t shoal_tcp_ep_irecv(shoal_ep_t *ep, shoal_tl_req_t *req);
SHOAL_HIDDEN int shoal_tcp_ep_progress(shoal_ep_t *ep);
/* The peer went away: if its last words, an abort notice, wait unread at a message boundary
 * of socket 0 (we were only sending to it, or had not read from it yet), say whom it blamed
 * ("; its communicator failed because of rank N" in buf): the rank, or -1. Best effort,
 * never blocks. */
SHOAL_HIDDEN int shoal_tcp_ep_last_words(shoal_ep_t *ep, char *buf, size_t len);
/* culprit: the rank the failure is blamed on (an abort notice), or -1. */
SHOAL_HIDDEN int shoal_tcp_ep_fail(shoal_ep_t *ep, shoal_status_t status, int culprit,
                                   const char *why);
/* The abort notice naming culprit, after the message under way if it is finished by
 * deadline (shoal_time_ns). */
SHOAL_HIDDEN void shoal_tcp_ep_send_abort(shoal_ep_t *ep, int culprit, uint64_t deadline);
SHOAL_HIDDEN void shoal_tcp_ep_close(shoal_ep_t *ep);

#endif
