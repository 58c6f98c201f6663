/* Bootstrap wire frames, shared by the root (boot_root.c) and the client (boot.c). */
#ifndef SHOAL_BOOT_PROTO_H
#define SHOAL_BOOT_PROTO_H

#include "core/tl.h"

#define SHOAL_BOOT_FRAME_MAGIC 0x544f4253u /* "SBOT" */
#define SHOAL_BOOT_NONCE 32
#define SHOAL_BOOT_MAX_RANKS (1 << 20)
#define SHOAL_BOOT_MAX_BLOB (1 << 20)      /* bytes per rank per round */
#define SHOAL_BOOT_MAX_PENDING 64          /* unauthenticated connections held at once */

enum {
    SHOAL_BOOT_CHALLENGE = 1, /* root -> client: root nonce */
    SHOAL_BOOT_HELLO,         /* client -> root: shoal_boot_hello_t */
    SHOAL_BOOT_WELCOME,       /* root -> client: mac over the client nonce and rank */
    SHOAL_BOOT_REFUSED,       /* root -> client: round = status code; then close */
    SHOAL_BOOT_AG,            /* client -> root: blob; root -> client: all blobs */
    SHOAL_BOOT_BYE            /* client -> root: done with the bootstrap */
};

/* Host byte order: the bootstrap runs between hosts of one architecture. */
typedef struct {
    uint32_t magic;
    uint32_t type;
    uint32_t len;   /* payload bytes that follow */
    uint32_t round;
} shoal_boot_frame_t;

typedef struct {
    int32_t rank;
    int32_t nranks;
    uint8_t nonce[SHOAL_BOOT_NONCE];   /* client's challenge to the root */
    uint8_t mac[SHOAL_HMAC_BYTES];     /* HMAC(secret, "shoal-boot-hello" root nonce rank nranks nonce) */
} shoal_boot_hello_t;

SHOAL_HIDDEN void shoal_boot_hello_mac(const uint8_t *secret, const uint8_t *root_nonce,
                                       const shoal_boot_hello_t *h, uint8_t *mac);
SHOAL_HIDDEN void shoal_boot_welcome_mac(const uint8_t *secret, const uint8_t *client_nonce,
                                         int32_t rank, uint8_t *mac);

#endif
