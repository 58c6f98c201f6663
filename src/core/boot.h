/* Bootstrap: the rendezvous root and the client side used by every rank. */
#ifndef SHOAL_BOOT_H
#define SHOAL_BOOT_H

#include "core/tl.h"

#include <netinet/in.h>
#include <sys/socket.h>

#define SHOAL_UID_MAGIC 0x49554853u /* "SHUI" */

/* Decoded unique id. */
typedef struct {
    struct sockaddr_storage root;
    socklen_t root_len;
    uint8_t secret[SHOAL_SECRET_BYTES];
} shoal_boot_uid_t;

SHOAL_HIDDEN void shoal_boot_uid_encode(const shoal_boot_uid_t *u, shoal_uid_t *uid);
SHOAL_HIDDEN shoal_status_t shoal_boot_uid_decode(const shoal_uid_t *uid, shoal_boot_uid_t *u);
SHOAL_HIDDEN shoal_status_t shoal_boot_uid_from_hex(const char *hex, shoal_uid_t *uid);

/* Starts a root listening on bind_addr (port 0: any) and serving one communicator of any size
 * in a detached thread; fills u (address + fresh secret unless keep_secret). The thread ends
 * once every rank has finished init, or on error/timeout. */
SHOAL_HIDDEN shoal_status_t shoal_boot_root_start(const struct sockaddr_storage *bind_addr,
                                                  socklen_t len, int keep_secret,
                                                  shoal_boot_uid_t *u);

/* Client: connection to the root of one communicator during its init. */
typedef struct shoal_boot shoal_boot_t;
SHOAL_HIDDEN shoal_status_t shoal_boot_connect(const shoal_boot_uid_t *u, int rank, int nranks,
                                               int timeout_ms, const volatile int *abort_flag,
                                               shoal_boot_t **boot_p);
/* Every rank gives len bytes; out receives nranks * len bytes in rank order. Authenticated
 * in both directions with the job secret. */
SHOAL_HIDDEN shoal_status_t shoal_boot_allgather(shoal_boot_t *boot, const void *in, size_t len,
                                                 void *out);
SHOAL_HIDDEN shoal_status_t shoal_boot_barrier(shoal_boot_t *boot);
SHOAL_HIDDEN void shoal_boot_close(shoal_boot_t *boot);
SHOAL_HIDDEN const char *shoal_boot_error(shoal_boot_t *boot);

/* Socket helpers shared by the bootstrap (deadline-bounded, abort-aware). */
SHOAL_HIDDEN shoal_status_t shoal_sock_write_all(int fd, const void *buf, size_t len,
                                                 uint64_t deadline_ns,
                                                 const volatile int *abort_flag);
SHOAL_HIDDEN shoal_status_t shoal_sock_read_all(int fd, void *buf, size_t len,
                                                uint64_t deadline_ns,
                                                const volatile int *abort_flag);
/* Address to listen on / publish: SHOAL_SOCKET_IFNAME rules; loopback fallback. */
SHOAL_HIDDEN shoal_status_t shoal_boot_pick_addr(struct sockaddr_storage *ss, socklen_t *len_p);
SHOAL_HIDDEN void shoal_sockaddr_str(const struct sockaddr_storage *ss, char *buf, size_t len);

#endif
