/* Bootstrap wire frames, shared by the root (boot_root.c) and the client (boot.c).
 *
 *   root   -> client  CHALLENGE  root nonce
 *   client -> root    HELLO      rank, nranks, client nonce, identity, HMAC(job secret, ...)
 *   root   -> client  WELCOME    HMAC(job secret, both nonces, rank, nranks, identity)
 *                     (or REFUSED: round = status, then close)
 * After the welcome both sides hold a session key, derived from the job secret, both nonces,
 * the rank and the identity. Every later frame (allgather rounds both ways, bye, failure
 * notices) is header | payload | HMAC(session key, direction, sequence number, header,
 * digest of the payload), so frames can be neither forged, nor replayed, nor reordered.
 */
#ifndef SHOAL_BOOT_PROTO_H
#define SHOAL_BOOT_PROTO_H

#include "core/boot.h"

#define SHOAL_BOOT_FRAME_MAGIC 0x544f4253u /* "SBOT" */
#define SHOAL_BOOT_NONCE 32
#define SHOAL_BOOT_MAC SHOAL_HMAC_BYTES   /* trailer of every frame after the handshake */
#define SHOAL_BOOT_MAX_RANKS (1 << 20)
#define SHOAL_BOOT_MAX_BLOB (1 << 20)      /* bytes per rank per round */
#define SHOAL_BOOT_MAX_PENDING 64          /* unauthenticated connections held at once */
/* The root evicts a pending connection for a newcomer only once it has waited this long;
 * until then newcomers wait in the listen backlog. Ranks that start together on a loaded
 * host answer their challenge late: evicting the oldest at once evicted real ranks 1350-1566
 * times in a 256-rank start on 2 CPUs (each one redialed, with an ERROR line). */
#define SHOAL_BOOT_EVICT_GRACE_MS 250
/* Pending connections one source address (not the root's own host) may hold: a newcomer
 * beyond it is refused at once as if evicted (the rank redials), so that one stranger cannot
 * hold every slot and, through the grace, keep the listen backlog full of its reconnections. */
#define SHOAL_BOOT_MAX_PENDING_SOURCE 16
/* A source against which the circuit breaker is open (tenant/breaker.h) may still hold one
 * pending connection at the root, whose hello must come within this. The root knows no
 * rank's address but its own host's: a co-tenant's failed hellos open the breaker against a
 * host that also runs a rank of the job, and that rank must still be able to prove itself
 * (a proof closes the breaker). A real rank answers its challenge at once. */
#define SHOAL_BOOT_PROBATION_MS 1000

enum {
    SHOAL_BOOT_CHALLENGE = 1, /* root -> client: root nonce */
    SHOAL_BOOT_HELLO,         /* client -> root: shoal_boot_hello_t */
    SHOAL_BOOT_WELCOME,       /* root -> client: mac over both nonces, rank and identity */
    SHOAL_BOOT_REFUSED,       /* root -> client before a welcome: round = status; then close */
    SHOAL_BOOT_AG,            /* client -> root: blob; root -> client: all blobs (MAC'd) */
    SHOAL_BOOT_BYE,           /* client -> root: done with the bootstrap (MAC'd) */
    SHOAL_BOOT_FAILED,        /* root -> client: the bootstrap failed, round = status (MAC'd) */
    SHOAL_BOOT_AGV,           /* client -> root: a record of any length up to MAX_BLOB; root ->
                               * client: per rank u32 length | record (MAC'd) */
    SHOAL_BOOT_RING           /* client -> root: its peer listener (SHOAL_BOOT_RING_REC bytes);
                               * root -> rank k: the records of ranks k-1 and k+1 (MAC'd) */
};

/* A rank's peer listener in a RING round: family u16 | port u16 (network order) | addr[16]. */
#define SHOAL_BOOT_RING_REC 20

/* Directions in the frame MAC. */
#define SHOAL_BOOT_DIR_UP 0   /* client -> root */
#define SHOAL_BOOT_DIR_DOWN 1 /* root -> client */

/* Host byte order: the bootstrap runs between hosts of one architecture. */
typedef struct {
    uint32_t magic;
    uint32_t type;
    uint32_t len;   /* payload bytes that follow (the MAC trailer not counted) */
    uint32_t round;
} shoal_boot_frame_t;

typedef struct {
    int32_t rank;
    int32_t nranks;
    uint8_t nonce[SHOAL_BOOT_NONCE];   /* client's challenge to the root */
    shoal_boot_ident_t ident;          /* tenant, job and epoch the rank is configured for */
    uint8_t mac[SHOAL_HMAC_BYTES];     /* HMAC(secret, "shoal-boot-hello" root nonce rank
                                          nranks nonce ident) */
} shoal_boot_hello_t;

SHOAL_HIDDEN void shoal_boot_hello_mac(const uint8_t *secret, const uint8_t *root_nonce,
                                       const shoal_boot_hello_t *h, uint8_t *mac);
SHOAL_HIDDEN void shoal_boot_welcome_mac(const uint8_t *secret, const uint8_t *root_nonce,
                                         const shoal_boot_hello_t *h, uint8_t *mac);
/* The session key of one joined connection. */
SHOAL_HIDDEN void shoal_boot_session_key(const uint8_t *secret, const uint8_t *root_nonce,
                                         const shoal_boot_hello_t *h,
                                         uint8_t key[SHOAL_HMAC_BYTES]);
/* Digest of a frame's payload (computed once for a table sent to every rank). */
SHOAL_HIDDEN void shoal_boot_payload_digest(const void *payload, size_t len,
                                            uint8_t digest[SHOAL_HMAC_BYTES]);
/* The MAC trailer of a frame after the handshake. */
SHOAL_HIDDEN void shoal_boot_frame_mac(const uint8_t key[SHOAL_HMAC_BYTES], int dir,
                                       uint64_t seq, const shoal_boot_frame_t *f,
                                       const uint8_t digest[SHOAL_HMAC_BYTES],
                                       uint8_t mac[SHOAL_BOOT_MAC]);

/* ---- the root's frame handling without sockets of its own (boot_root.c) ----
 * For fuzzing and tests: a root with no listener (listen_fd -1), clients added by fd (a
 * socketpair end; the root writes its challenges and answers there), and bytes fed as if
 * they had arrived from client i. Returns SHOAL_OK, or the status that fails the bootstrap
 * (then every joined rank has been told and closed). */
typedef struct shoal_root shoal_root_t;
SHOAL_HIDDEN shoal_status_t shoal_boot_root_new(const shoal_boot_uid_t *u, int listen_fd,
                                                int timeout_ms, shoal_root_t **r_p);
SHOAL_HIDDEN int shoal_boot_root_add_client(shoal_root_t *r, int fd,
                                            const struct sockaddr_storage *ss);
SHOAL_HIDDEN shoal_status_t shoal_boot_root_feed(shoal_root_t *r, int client,
                                                 const uint8_t *bytes, size_t n);
/* The challenge the root sent to client i (NULL when i is not a pending or joined client). */
SHOAL_HIDDEN const uint8_t *shoal_boot_root_nonce(shoal_root_t *r, int client);
SHOAL_HIDDEN void shoal_boot_root_free(shoal_root_t *r);
/* Test seam: called (when set) by a root about to answer a RING round, with every rank's
 * record (nranks * SHOAL_BOOT_RING_REC bytes, rank order; the answers are taken from it after
 * the call). NULL in every program but the adversarial tests. */
extern SHOAL_HIDDEN void (*shoal_boot_root_ring_hook)(int nranks, uint8_t *recs);

/* ---- the client (boot.c) and the ring exchange (boot_ring.c) ---- */

typedef struct shoal_boot_ring shoal_boot_ring_t;

struct shoal_boot {
    int fd;
    int rank;
    int nranks;
    int timeout_ms;
    const volatile int *abort_flag;
    uint32_t round;
    int keyed;                          /* session key known (hello sent) */
    int final;                          /* the root's answer ends the join: no redial */
    int evicted;                        /* the root refused the pending connection for a
                                         * newcomer: redialed without a warning */
    uint8_t key[SHOAL_HMAC_BYTES];
    uint64_t tx_seq;
    uint64_t rx_seq;
    int exchange;                       /* SHOAL_BOOT_EXCHANGE of this bootstrap */
    uint8_t secret[SHOAL_SECRET_BYTES]; /* the job secret (ring: proves the peer links) */
    shoal_boot_ident_t ident;
    shoal_boot_ring_t *ring;            /* the ring's links, made at its first round */
    int ring_failed;                    /* leave without a bye: the root tells every rank */
    char root_str[80];
    char error[256];
};

SHOAL_HIDDEN shoal_status_t shoal_boot_fail(shoal_boot_t *b, shoal_status_t st, const char *what);
SHOAL_HIDDEN shoal_status_t shoal_boot_read_frame(shoal_boot_t *b, int macd, uint32_t type,
                                                  void *payload, uint32_t len,
                                                  uint64_t deadline);
SHOAL_HIDDEN shoal_status_t shoal_boot_send_frame(shoal_boot_t *b, uint32_t type,
                                                  const void *payload, uint32_t len,
                                                  uint64_t deadline);
SHOAL_HIDDEN shoal_status_t shoal_sock_poll(int fd, short events, uint64_t deadline_ns,
                                            const volatile int *abort_flag);

/* The peer link of the ring (DESIGN.md, bootstrap): rank k dials rank k+1's listener, which
 * challenges it with a nonce; the dialer's hello (shoal_boot_hello_t: its rank, nranks, its
 * own nonce, identity) is MAC'd like a root hello under another label, the listener's welcome
 * likewise, and the link's key is derived from the job secret, both nonces, the rank and the
 * identity under its own label. Frames then as on the root link (dialer: DIR_UP). */
SHOAL_HIDDEN void shoal_boot_peer_hello_mac(const uint8_t *secret, const uint8_t *lnonce,
                                            const shoal_boot_hello_t *h, uint8_t *mac);
SHOAL_HIDDEN void shoal_boot_peer_welcome_mac(const uint8_t *secret, const uint8_t *lnonce,
                                              const shoal_boot_hello_t *h, uint8_t *mac);
SHOAL_HIDDEN void shoal_boot_peer_session_key(const uint8_t *secret, const uint8_t *lnonce,
                                              const shoal_boot_hello_t *h,
                                              uint8_t key[SHOAL_HMAC_BYTES]);
/* A listener's check of what a dialer sent after its challenge (frame header and hello,
 * SHOAL_BOOT_PEER_HELLO_BYTES): SHOAL_OK when it is rank (me - 1) mod nranks of this job
 * proving the secret (*h filled), else the refusal's status (PROTOCOL: not a hello; AUTH:
 * wrong proof; PERMISSION: another tenant, job or epoch; INVALID_ARG: another rank or size)
 * and a sentence in why. Pure: no socket, no log (fuzzed by tests/fuzz/fuzz_boot_peer.c). */
#define SHOAL_BOOT_PEER_HELLO_BYTES (sizeof(shoal_boot_frame_t) + sizeof(shoal_boot_hello_t))
SHOAL_HIDDEN shoal_status_t shoal_boot_peer_check(const uint8_t *secret,
                                                  const shoal_boot_ident_t *ident, int me,
                                                  int nranks, const uint8_t *lnonce,
                                                  const uint8_t *bytes, shoal_boot_hello_t *h,
                                                  char *why, size_t len);
/* Rounds over the ring (boot_ring.c), as shoal_boot_allgather / _allgatherv; the links are
 * made at the first (one RING round through the root). */
SHOAL_HIDDEN shoal_status_t shoal_boot_ring_allgather(shoal_boot_t *b, const void *in,
                                                      size_t len, void *out);
SHOAL_HIDDEN shoal_status_t shoal_boot_ring_allgatherv(shoal_boot_t *b, const void *in,
                                                       size_t len, uint8_t **table_p,
                                                       const uint8_t **ents, uint32_t *lens);
SHOAL_HIDDEN void shoal_boot_ring_close(shoal_boot_t *b);

#endif
