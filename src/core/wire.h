/* The fixed header that starts every message between processes. */
#ifndef SHOAL_WIRE_H
#define SHOAL_WIRE_H

#include "util/util.h"

#define SHOAL_WIRE_MAGIC 0x4c4f4853u /* "SHOL" little-endian */
#define SHOAL_WIRE_VERSION 1
#define SHOAL_WIRE_HDR_BYTES 32

typedef enum {
    SHOAL_WIRE_DATA = 1,   /* payload of a posted send */
    SHOAL_WIRE_ABORT = 2,  /* sender's communicator failed; chunk = rank that caused it */
} shoal_wire_type_t;

/* Host-order view; encoded little-endian into 32 bytes by shoal_wire_encode(). */
typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t type;     /* shoal_wire_type_t */
    uint32_t comm_id;
    uint32_t seq;      /* collective sequence number on the communicator */
    uint32_t step;     /* algorithm step */
    uint32_t chunk;    /* chunk index within the step */
    uint64_t length;   /* payload bytes that follow */
} shoal_wire_hdr_t;

SHOAL_HIDDEN void shoal_wire_encode(const shoal_wire_hdr_t *h, uint8_t out[SHOAL_WIRE_HDR_BYTES]);
SHOAL_HIDDEN void shoal_wire_decode(const uint8_t in[SHOAL_WIRE_HDR_BYTES], shoal_wire_hdr_t *h);
/* Validates a received header against the expected one (magic, version, type, comm, seq,
 * step, chunk, length). Returns SHOAL_OK, or SHOAL_ERR_PROTOCOL with a sentence in why.
 * A SHOAL_WIRE_ABORT header from the right communicator returns SHOAL_ERR_PEER_FAILED. */
SHOAL_HIDDEN shoal_status_t shoal_wire_check(const shoal_wire_hdr_t *expect,
                                             const shoal_wire_hdr_t *got, char *why,
                                             size_t whylen);
/* The rank an abort notice blames (its chunk field), or -1 for any other header. The caller
 * checks the range against its communicator. */
SHOAL_HIDDEN int shoal_wire_culprit(const shoal_wire_hdr_t *got);

#endif
