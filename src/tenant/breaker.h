/* Circuit breaker on the join listeners (DESIGN.md section 7): failed authentications are
 * counted per source address (the IP, without the port) in a sliding window; a source that
 * keeps failing (SHOAL_TENANT_BREAKER_FAILS within SHOAL_TENANT_BREAKER_WINDOW) is refused
 * for SHOAL_TENANT_BREAKER_COOLDOWN: its connections are closed at accept, before they take a
 * handshake slot or cost an HMAC. Refusals are logged once per source per minute, with counts.
 * One table per process, shared by every communicator and listener (thread-safe).
 *
 * A real rank of the job is never refused. Before it proves the secret, a real rank cannot be
 * told from a stranger on the same host (the premise of tenancy: tenants share hosts), so
 * refusing by address alone could refuse the rank. Therefore:
 *  - the listeners trust the published addresses of the peers they expect
 *    (shoal_tenant_breaker_trust) while they accept: the breaker never opens against a
 *    trusted address. A stranger there is held off by what bounds every unauthenticated
 *    connection instead (a short hello deadline, eviction of the oldest unauthenticated
 *    connection when the slots are full), which costs the real rank at most a reconnect;
 *  - the bootstrap root expects no address but its own host's: a co-tenant's failures open
 *    the breaker against a host that runs a rank of the job too. So the root refuses an open
 *    source at accept only while it holds a pending connection there; one at a time is still
 *    challenged, with a short hello deadline (SHOAL_BOOT_PROBATION_MS, core/boot_proto.h),
 *    and the rank's proof closes the breaker;
 *  - a source that proves the secret (shoal_tenant_breaker_note_ok) is a host of the job:
 *    its failures are forgotten and an open breaker against it is closed;
 *  - the breaker only acts on new connections; an authenticated connection is never cut.
 * So the breaker sheds the load of hosts that run no rank of the job (port scans, another
 * tenant's hosts) and the slot eviction keeps co-located strangers from starving the job. */
#ifndef SHOAL_TENANT_BREAKER_H
#define SHOAL_TENANT_BREAKER_H

#include "util/util.h"

#include <sys/socket.h>

typedef struct {
    unsigned fails;        /* SHOAL_TENANT_BREAKER_FAILS: failures in the window that open it;
                            * 0 disables the breaker (failures are still counted) */
    int window_ms;         /* SHOAL_TENANT_BREAKER_WINDOW */
    int cooldown_ms;       /* SHOAL_TENANT_BREAKER_COOLDOWN */
} shoal_tenant_breaker_config_t;

extern SHOAL_HIDDEN shoal_tenant_breaker_config_t shoal_tenant_breaker_config;
extern const shoal_cfg_table_t shoal_tenant_breaker_cfg_table;

/* Process-wide counters, for the metering work to export. */
typedef struct {
    uint64_t failed;       /* failed authentications, all sources */
    uint64_t refused;      /* connections refused because a breaker was open */
    uint64_t opened;       /* times a breaker opened */
    unsigned open_now;     /* sources refused right now */
    unsigned sources;      /* sources tracked */
} shoal_tenant_breaker_stats_t;

/* One source's counters. */
typedef struct {
    char addr[48];         /* the IP, as text */
    uint64_t failed;       /* failed authentications since tracked */
    uint64_t refused;      /* connections refused */
    unsigned recent;       /* failures within the window now */
    int open;              /* 1 while refused */
    int trusted;           /* 1 while a listener expects a peer there */
} shoal_tenant_breaker_source_t;

/* 1: serve this new connection; 0: refuse it (close at once). Logs refusals once per source
 * per minute with the number refused since the last line. */
SHOAL_HIDDEN int shoal_tenant_breaker_admit(const struct sockaddr *src);
/* A failed authentication from src (bad hello, wrong proof, no hello in time, evicted before
 * proving anything). Returns 1 when the caller should log the failure in full (the first one
 * from this source in a minute; for sources the table cannot hold, every entry being
 * trusted, the first of all of them in a minute), 0 when it should only trace it. */
SHOAL_HIDDEN int shoal_tenant_breaker_note_fail(const struct sockaddr *src);
/* src proved the secret: forget its failures, close its breaker. */
SHOAL_HIDDEN void shoal_tenant_breaker_note_ok(const struct sockaddr *src);
/* 1 if connections from src are refused now (no side effect). */
SHOAL_HIDDEN int shoal_tenant_breaker_is_open(const struct sockaddr *src);
/* A listener expects a peer at addr (+1) or no longer does (-1). Counted: several
 * communicators may trust one address. */
SHOAL_HIDDEN void shoal_tenant_breaker_trust(const struct sockaddr *addr, int delta);
/* 1 if a and b are the same source as the breaker counts them (the IP, an IPv4-mapped IPv6
 * address as IPv4, no port); 0 otherwise or if either is not an IP address. */
SHOAL_HIDDEN int shoal_tenant_breaker_same_source(const struct sockaddr *a,
                                                  const struct sockaddr *b);
/* Snapshot of the counters; sources: up to max entries (may be NULL), count in *n_p. */
SHOAL_HIDDEN void shoal_tenant_breaker_stats(shoal_tenant_breaker_stats_t *stats,
                                             shoal_tenant_breaker_source_t *sources, size_t max,
                                             size_t *n_p);
/* Forgets every source (tests). */
SHOAL_HIDDEN void shoal_tenant_breaker_reset(void);

#endif
