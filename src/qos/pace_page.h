/* The rates page: the rate the node agent gives one tenant's communicators on this host
 * (DESIGN.md section 7, QoS). This header is the contract between the agent (writer) and the
 * library (reader): plain C, no library internals, so the agent includes it without linking
 * libshoal.
 *
 * Where it lives: a file the agent keeps at a path the job is told (SHOAL_QOS_RATES, e.g.
 * /run/shoal/qos/%t.rate, %t = the tenant), or, later, a memfd handed back in the agent's
 * registration reply; the library opens it read-only and reads it with pread, never through a
 * mapping, so a writer may also truncate and rewrite it in place (a load from a mapping past a
 * truncated file's end is SIGBUS); SHOAL_QOS_RATES_PAGE_BYTES long.
 *
 * Writer protocol (one writer, the agent): a seqlock on gen. To change the rate: store gen + 1
 * (odd), then rate and burst, then gen + 2 (even), each store with release. The writer also
 * bumps gen by 2 at least once a second even when nothing changes (the heartbeat): the library
 * takes a gen that has not moved for SHOAL_QOS_RATES_TIMEOUT as a dead agent (see below), by
 * its own clock, so the two processes need no common clock. heartbeat_ns (CLOCK_REALTIME of
 * the last bump) is for people and tools only.
 *
 * Reader (the library, between chunks, at most every SHOAL_QOS_PACE_CHECK_NS): one read of
 * magic, version and gen (a file rewritten in place with another magic or version is no
 * page: not read); when gen changed and is even, the rate and burst, then gen again (retry
 * later if it moved, or if the file was too short). A dead agent (gen still for the timeout,
 * or the page gone) leaves the last rate in force until the timeout, then full speed (the
 * hard cap SHOAL_QOS_RATE_MAX still applies): a job is never stalled by an agent.
 */
#ifndef SHOAL_QOS_PACE_PAGE_H
#define SHOAL_QOS_PACE_PAGE_H

#include <stdint.h>

#define SHOAL_QOS_RATES_MAGIC 0x54525153u /* "SQRT" */
#define SHOAL_QOS_RATES_VERSION 1
#define SHOAL_QOS_RATES_PAGE_BYTES 4096

typedef struct {
    uint32_t magic;          /* SHOAL_QOS_RATES_MAGIC */
    uint32_t version;        /* SHOAL_QOS_RATES_VERSION */
    uint64_t gen;            /* seqlock and heartbeat: odd while the writer changes the rate */
    uint64_t rate;           /* bytes per second each communicator of the tenant may send on
                              * this host; 0 = no limit from the agent */
    uint64_t burst;          /* bytes; 0 = the library's SHOAL_QOS_BURST */
    uint64_t heartbeat_ns;   /* CLOCK_REALTIME of the writer's last bump (informational) */
    uint64_t spare[11];
} shoal_qos_rates_page_t;

_Static_assert(sizeof(shoal_qos_rates_page_t) <= SHOAL_QOS_RATES_PAGE_BYTES,
               "rates page too large");

#endif
