/* Bootstrap: the rendezvous root and the client side used by every rank. */
#ifndef SHOAL_BOOT_H
#define SHOAL_BOOT_H

#include "core/tl.h"
#include "tenant/tenant.h"

#include <netinet/in.h>
#include <sys/socket.h>

#define SHOAL_UID_MAGIC 0x49554853u /* "SHUI" */
#define SHOAL_UID_VERSION 2
#define SHOAL_BOOT_DIGEST 16        /* bytes of a keyed tenant or job name digest */

/* The identity a join proves besides the secret: digests of the tenant and job names (names
 * do not fit a unique id) and the epoch. The hello's MAC binds them to the job secret. */
typedef struct {
    uint8_t tenant[SHOAL_BOOT_DIGEST];
    uint8_t job[SHOAL_BOOT_DIGEST];
    uint64_t epoch;
} shoal_boot_ident_t;

/* Decoded unique id (or SHOAL_ROOT + SHOAL_SECRET, or a split child's derived values). */
typedef struct {
    struct sockaddr_storage root;
    socklen_t root_len;
    uint8_t secret[SHOAL_SECRET_BYTES];
    shoal_boot_ident_t ident;
} shoal_boot_uid_t;

/* Layout (version 2): magic u32 | version u16 | family u16 | port u16 (network order) |
 * zero u16 | addr[16] | secret[32] | epoch u64 (little endian) | tenant digest[16] |
 * job digest[16] | zero. */
SHOAL_HIDDEN void shoal_boot_uid_encode(const shoal_boot_uid_t *u, shoal_uid_t *uid);
SHOAL_HIDDEN shoal_status_t shoal_boot_uid_decode(const shoal_uid_t *uid, shoal_boot_uid_t *u);
SHOAL_HIDDEN shoal_status_t shoal_boot_uid_from_hex(const char *hex, shoal_uid_t *uid);
/* Exactly 2 * len hex digits (no sign, space or prefix) into out; nothing logged (the text may
 * be a secret). SHOAL_ERR_INVALID_ARG otherwise. */
SHOAL_HIDDEN shoal_status_t shoal_boot_hex_decode(const char *hex, uint8_t *out, size_t len);
/* SHOAL_ROOT's "host:port" or "[ipv6]:port" into host (NUL-terminated) and a port 1..65535
 * (decimal, no leading zero);
 * SHOAL_ERR_INVALID_ARG for anything else. Pure: resolves nothing. */
SHOAL_HIDDEN shoal_status_t shoal_boot_root_split(const char *spec, char *host, size_t hostlen,
                                                  uint16_t *port_p);

/* The digests of an identity. */
SHOAL_HIDDEN shoal_status_t shoal_boot_ident_make(const shoal_tenant_id_t *id,
                                                  shoal_boot_ident_t *out);
/* SHOAL_OK when mine matches want; else SHOAL_ERR_PERMISSION and a sentence in why naming
 * the field that differs (id: this rank's names, for the sentence). Logs nothing. */
SHOAL_HIDDEN shoal_status_t shoal_boot_ident_check(const shoal_boot_ident_t *want,
                                                   const shoal_boot_ident_t *mine,
                                                   const shoal_tenant_id_t *id, char *why,
                                                   size_t len);

/* Where a root listens: SHOAL_BOOT_BIND=loopback (or local_only: every rank on this host)
 * gives 127.0.0.1; auto the address shoal_boot_pick_addr chooses; any every interface (the
 * chosen address is published). *bind_any_p: listen on every interface. */
SHOAL_HIDDEN shoal_status_t shoal_boot_listen_addr(int local_only, struct sockaddr_storage *ss,
                                                   socklen_t *len_p, int *bind_any_p);

/* Starts a root listening on addr (port 0: any; every interface when bind_any) and serving
 * one communicator of any size in a thread of its own. u holds the job secret and the identity
 * (the caller's); the root's address and port are filled in. The thread ends once every rank
 * has finished init, or on error/timeout after telling every rank. timeout_ms (< 0: none):
 * how long it waits without progress, the communicator's timeout where it is known. */
SHOAL_HIDDEN shoal_status_t shoal_boot_root_start(const struct sockaddr_storage *addr,
                                                  socklen_t len, int bind_any, int timeout_ms,
                                                  shoal_boot_uid_t *u);
/* Which root a communicator joined: its address and a tag derived from the job secret (an
 * ended root's port may be bound again by another root of this process). */
typedef struct {
    struct sockaddr_storage addr;
    socklen_t len;
    uint8_t tag[16];
} shoal_boot_root_key_t;

SHOAL_HIDDEN void shoal_boot_root_key(const shoal_boot_uid_t *u, shoal_boot_root_key_t *k);
/* Waits for the thread of the root this process started for k to end: up to grace_ms for the
 * ranks' last frames, then, with stop, it is stopped (without, left running). Nothing when
 * no such root runs here. A communicator calls it at destroy, so that no root thread still
 * uses libcrypto when the application's exit handlers run; after a failed init without
 * stop, since the root may still have ranks to tell. */
SHOAL_HIDDEN void shoal_boot_root_wait(const shoal_boot_root_key_t *k, int grace_ms, int stop);
/* A rank of this process failed its init with the id of the root k, if this process runs
 * it: the root tells the joined ranks at once and the ranks still to come when they say
 * hello (SHOAL_ERR_PEER_FAILED), instead of leaving them to their timeout. */
SHOAL_HIDDEN void shoal_boot_root_fail(const shoal_boot_root_key_t *k);
/* A rank of this process joins the root k (if this process runs it) with timeout_ms (< 0:
 * none): the root's idle timeout is raised to it, never lowered. The id of
 * shoal_get_unique_id waits SHOAL_TIMEOUT_MS without progress; a rank of a communicator made
 * with a longer cfg.timeout_ms that came later than that, but in time, found the root gone
 * and every rank failed. */
SHOAL_HIDDEN void shoal_boot_root_extend(const shoal_boot_root_key_t *k, int timeout_ms);
/* Test seam: called (when set) with the address of every root started, once its thread
 * answers and before the caller goes on (tells its ranks where the root is), so that a test
 * can try the root to the end while no rank has joined. NULL in every program but the
 * adversarial tests. */
extern SHOAL_HIDDEN void (*shoal_boot_root_started_hook)(const shoal_boot_uid_t *u);

/* Client: connection to the root of one communicator during its init. u->ident is the
 * identity this rank proves. */
typedef struct shoal_boot shoal_boot_t;
SHOAL_HIDDEN shoal_status_t shoal_boot_connect(const shoal_boot_uid_t *u, int rank, int nranks,
                                               int timeout_ms, const volatile int *abort_flag,
                                               shoal_boot_t **boot_p);
/* Every rank gives len bytes; out receives nranks * len bytes in rank order. Every frame is
 * MAC'd with the connection's session key and checked before out is believed. */
SHOAL_HIDDEN shoal_status_t shoal_boot_allgather(shoal_boot_t *boot, const void *in, size_t len,
                                                 void *out);
/* Every rank gives a record of its own length (at most SHOAL_BOOT_MAX_BLOB bytes); *table_p
 * receives (malloc'd, the caller frees it) the table of every rank's record, and ents[k] /
 * lens[k] (nranks entries each) point at rank k's record in it. MAC'd like every round. */
SHOAL_HIDDEN shoal_status_t shoal_boot_allgatherv(shoal_boot_t *boot, const void *in,
                                                  size_t len, uint8_t **table_p,
                                                  const uint8_t **ents, uint32_t *lens);
/* Splits a variable-length round's table (per rank: u32 little-endian length | record) into
 * ents/lens; SHOAL_ERR_PROTOCOL unless it holds exactly nranks records. */
SHOAL_HIDDEN shoal_status_t shoal_boot_table_v_parse(const uint8_t *table, size_t len,
                                                     int nranks, const uint8_t **ents,
                                                     uint32_t *lens);
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
/* Address to publish: the first interface matching SHOAL_SOCKET_IFNAME (NCCL syntax); without
 * it the first IPv4 interface that is up and not loopback (docker bridges last); loopback
 * when nothing else is up. */
SHOAL_HIDDEN shoal_status_t shoal_boot_pick_addr(struct sockaddr_storage *ss, socklen_t *len_p);
SHOAL_HIDDEN void shoal_sockaddr_str(const struct sockaddr_storage *ss, char *buf, size_t len);

#endif
