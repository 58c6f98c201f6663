/*
 * Settings that follow the machine (src/tune).
 *
 * The sizes and limits of the algorithms (pipeline chunk, shared-memory window, one-shot and
 * LL limits, the cost model's copy and reduction rates) used to be constants fitted on one
 * machine. Here they are derived from this machine's caches (hwloc, else sysfs) and a short
 * memory measurement (memcpy in cache and from memory, a float reduction), then overridden by
 * any explicit setting: SHOAL_* variables (environment > SHOAL_CONF_FILE) and 'set' lines of
 * SHOAL_TUNING_FILE. Every value keeps its source and a sentence saying why.
 *
 * Agreement: rank 0 of a communicator resolves the values once and sends them to every rank
 * (a binomial tree over the channels), so all ranks select the same algorithms and cut the
 * same chunks; a rank whose own explicit setting differs is told so once. Only rank 0
 * measures, and the measurement is cached per host and user in a file, so the ranks of a node
 * and later jobs reuse it.
 *
 * Transport sizes (shm ring slots, tcp striping threshold, UCX inline limit) are needed
 * before any channel exists: every rank resolves them locally and sends them in core's
 * round 0 (shoal_tl_sizes_t, core/tl.h, through the assembly's tl_sizes hook); the shm ring's
 * must agree between local peers, so every rank uses those of the lowest rank on its host;
 * the others are negotiated per pair by the transports (tcp the larger, ucx the smaller).
 * The ib ring's sizes follow the port the ib transport opens: the transport hands the port's
 * MTU and rate to shoal_tune_link_sizes (the assembly's link_sizes hook in its params, so
 * that neither core nor tune names ib) when it has opened its device; each rank derives its
 * own, the pair exchange already negotiates them (chunks of the smaller slot).
 *
 * Layering: tune uses util, reduce, topo (discovery, the tuning file) and core (channels);
 * coll reads the result (comm->coll->tune) where the config is finalized.
 */
#ifndef SHOAL_TUNE_H
#define SHOAL_TUNE_H

#include "core/tl.h"
#include "util/util.h"

#include <stdint.h>
#include <stdio.h>
#include <time.h>

struct shoal_comm;

/* What the derivation starts from. */
typedef enum {
    SHOAL_TUNE_BW_NONE = 0,    /* no bandwidth known (SHOAL_TUNE=0 or measurement failed) */
    SHOAL_TUNE_BW_MEASURED,    /* measured by this process */
    SHOAL_TUNE_BW_CACHED,      /* read from the per-host cache file */
    SHOAL_TUNE_BW_GIVEN,       /* SHOAL_TUNE_MACHINE */
    SHOAL_TUNE_BW_REFRESHED,   /* measured by this process, each rate the best of this and the
                                * per-host cache file's samples */
    SHOAL_TUNE_BW_GIVEN_SOME   /* SHOAL_TUNE_MACHINE gives some rates, the others measured or
                                * cached */
} shoal_tune_bw_src_t;

typedef struct {
    uint32_t l1d_kb, l2_kb, l3_kb; /* caches above PU 0; 0 unknown */
    int32_t ncores;
    int32_t cache_src;         /* SHOAL_TOPO_SRC_* (none, sysfs, hwloc) or SHOAL_TUNE_CACHE_GIVEN */
    int32_t bw_src;            /* shoal_tune_bw_src_t */
    uint32_t copy_cache_mbs;   /* memcpy of an L2-resident block, MB/s (1e6 B/s); 0 unknown */
    uint32_t copy_mem_mbs;     /* memcpy of buffers twice the L3, MB/s */
    uint32_t reduce_mem_mbs;   /* float32 sum of two inputs from memory, MB/s of the output */
    uint32_t tcp_rbuf_kb;      /* initial TCP receive buffer (SHOAL_TCP_RCVBUF, else the
                                * kernel's tcp_rmem default), KiB; 0 unknown */
} shoal_tune_machine_t;

#define SHOAL_TUNE_CACHE_GIVEN 3

/* The settings this module decides. */
typedef enum {
    SHOAL_TUNE_CHUNK = 0,        /* SHOAL_CHUNK_SIZE: ring/tree pipeline chunk, bytes */
    SHOAL_TUNE_SHM_WINDOW,       /* SHOAL_SHM_WINDOW: two-shot window, bytes */
    SHOAL_TUNE_SHM_ONESHOT_OWN,  /* SHOAL_SHM_ONESHOT_MAX, a core per rank */
    SHOAL_TUNE_SHM_ONESHOT_SHARED, /* SHOAL_SHM_ONESHOT_MAX, ranks outnumber cores */
    SHOAL_TUNE_SHM_LL_MAX,       /* SHOAL_SHM_LL_MAX: LL protocol limit, bytes */
    SHOAL_TUNE_COPY_MBS,         /* cost model: memory copy rate, MB/s */
    SHOAL_TUNE_REDUCE_MBS,       /* cost model: reduction rate (its large-message term), MB/s */
    /* Transport sizes: each rank resolves them locally before its transports start
     * (shoal_tune_tl_sizes); the shm ring's are then taken from the lowest rank of the host. */
    SHOAL_TUNE_SHM_SLOT_SIZE,    /* SHOAL_SHM_SLOT_SIZE: shm ring slot, bytes */
    SHOAL_TUNE_SHM_NSLOTS,       /* SHOAL_SHM_NSLOTS: shm ring slots per direction */
    SHOAL_TUNE_TCP_MIN_SPLIT,    /* SHOAL_TCP_MIN_SPLIT: striping threshold, bytes */
    SHOAL_TUNE_UCX_INLINE_MAX,   /* SHOAL_UCX_INLINE_MAX: payload sent with its header, bytes */
    SHOAL_TUNE_UCX_CMA_MIN,      /* SHOAL_UCX_CMA_MIN: smallest payload sent by single copy */
    /* Sizes that follow a port: the ib transport asks once it has opened its device
     * (shoal_tune_link_sizes through params->link_sizes); without a port, their defaults. */
    SHOAL_TUNE_IB_SLOT_SIZE,     /* SHOAL_IB_SLOT_SIZE: ring slot payload, bytes */
    SHOAL_TUNE_IB_NSLOTS,        /* SHOAL_IB_RING_SLOTS: receive ring slots per peer */
    SHOAL_TUNE_IB_SEND_SLOTS,    /* SHOAL_IB_SEND_SLOTS: bounce slots per peer */
    SHOAL_TUNE_NKNOBS
} shoal_tune_knob_t;

typedef enum {
    SHOAL_TUNE_SRC_DEFAULT = 0,  /* the fixed default: nothing to derive it from */
    SHOAL_TUNE_SRC_DERIVED,      /* from the caches and the measurement */
    SHOAL_TUNE_SRC_ENV,          /* a SHOAL_* environment variable */
    SHOAL_TUNE_SRC_FILE          /* SHOAL_CONF_FILE or a 'set' line of SHOAL_TUNING_FILE */
} shoal_tune_src_t;

#define SHOAL_TUNE_WHY_MAX 96

/* The resolved settings: identical on every rank of a communicator (sent by rank 0). */
typedef struct {
    shoal_tune_machine_t machine;  /* rank 0's */
    shoal_tl_link_t link;          /* the port the ib sizes follow (all 0: none) */
    uint64_t value[SHOAL_TUNE_NKNOBS];
    uint8_t src[SHOAL_TUNE_NKNOBS];
    char why[SHOAL_TUNE_NKNOBS][SHOAL_TUNE_WHY_MAX];
} shoal_tune_t;

/* SHOAL_* variables of this module (tune_config.c). */
typedef struct {
    int enable;                  /* SHOAL_TUNE */
    const char *machine;         /* SHOAL_TUNE_MACHINE */
    const char *cache_dir;       /* SHOAL_TUNE_CACHE_DIR */
} shoal_tune_config_t;
extern SHOAL_HIDDEN shoal_tune_config_t shoal_tune_config;

/* Knob names as shoal_info -t prints them, and the SHOAL_ variable (without the prefix)
 * that sets each one (NULL: only the tuning file's 'copy'/'reduce' lines). */
extern SHOAL_HIDDEN const char *const shoal_tune_knob_names[SHOAL_TUNE_NKNOBS];
extern SHOAL_HIDDEN const char *const shoal_tune_knob_vars[SHOAL_TUNE_NKNOBS];
SHOAL_HIDDEN const char *shoal_tune_src_name(int src);

/* Pure derivation from a machine profile: every knob DEFAULT or DERIVED, with its reason.
 * Deterministic: the same profile gives the same values on any host. */
SHOAL_HIDDEN void shoal_tune_derive(const shoal_tune_machine_t *m, shoal_tune_t *t);

/* Pure derivation of the ib sizes from a port (MTU, link rate, round trip, software or not):
 * the SHOAL_TUNE_IB_* knobs of t DEFAULT or DERIVED with their reason, the others untouched;
 * t->link = *l. */
SHOAL_HIDDEN void shoal_tune_derive_link(const shoal_tl_link_t *l, shoal_tune_t *t);

/* Explicit settings win over derived ones: the SHOAL_* variables (env, SHOAL_CONF_FILE),
 * then tuning-file text (SHOAL_TUNING_FILE's 'set NAME VALUE', 'copy'/'reduce' lines; NULL:
 * none). Returns SHOAL_ERR_INVALID_ARG if the tuning text has a malformed 'set' line (the
 * other settings are still applied). */
SHOAL_HIDDEN shoal_status_t shoal_tune_override(shoal_tune_t *t, const char *tuning_text);

/* This process's machine profile: SHOAL_TUNE_MACHINE fields, else discovery (mode =
 * SHOAL_TOPO_DISCOVERY) and the measurement (per-host cache file, else measured and saved).
 * Cached per process. With SHOAL_TUNE=0: caches only, no bandwidth. */
SHOAL_HIDDEN void shoal_tune_machine_local(int mode, shoal_tune_machine_t *m);
/* The measurement itself (a few ms to a few tens of ms), no cache involved; 0 on success. */
SHOAL_HIDDEN int shoal_tune_measure(const shoal_tune_machine_t *caches, shoal_tune_machine_t *m);

/* The per-host cache file's record: the best rates seen since `since`, over `samples`
 * measurements. */
typedef struct {
    uint32_t copy_cache_mbs, copy_mem_mbs, reduce_mem_mbs;
    time_t since;
    unsigned samples;
} shoal_tune_record_t;

/* A build whose code runs at another speed than the release build's (a sanitizer, no
 * optimisation) keeps its own file: its rates (ASan reduces at a tenth of the release
 * build's rate) must not become the release build's settings. */
#if defined(__SANITIZE_ADDRESS__)
#define SHOAL_TUNE_BUILD_TAG "-asan"
#elif defined(__SANITIZE_THREAD__)
#define SHOAL_TUNE_BUILD_TAG "-tsan"
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SHOAL_TUNE_BUILD_TAG "-asan"
#elif __has_feature(thread_sanitizer)
#define SHOAL_TUNE_BUILD_TAG "-tsan"
#endif
#endif
#if !defined(SHOAL_TUNE_BUILD_TAG) && !defined(__OPTIMIZE__)
#define SHOAL_TUNE_BUILD_TAG "-O0"
#endif
#ifndef SHOAL_TUNE_BUILD_TAG
#define SHOAL_TUNE_BUILD_TAG ""
#endif

/* The cache file of this host, user and build kind (a sanitizer build has its own); 0 ok. */
SHOAL_HIDDEN int shoal_tune_cache_file(char *buf, size_t len);

/* m's rates from the cache file at path (its caches must match m's), measured and saved when
 * the file is absent, expired, or its last write is an hour old (then the best of the old
 * and the new rates is kept). Sets m->bw_src. */
SHOAL_HIDDEN void shoal_tune_rates_at(const char *path, shoal_tune_machine_t *m);
/* Parse SHOAL_TUNE_MACHINE ("l2=1m l3=32m copy=9.5 copy_cache=40 reduce=8 tcp_rbuf=128k",
 * any subset; sizes with k/m/g, rates in GB/s) into m; returns a mask of the fields given
 * (bit 0 caches, bit 1 bandwidths, bit 2 tcp_rbuf) or -1 if malformed. */
SHOAL_HIDDEN int shoal_tune_machine_parse(const char *text, shoal_tune_machine_t *m);

/* Local resolution (shoal_info -t, rank 0 of a communicator): profile, derive, override. */
SHOAL_HIDDEN void shoal_tune_resolve_local(int mode, shoal_tune_t *t);
/* The same with a port (NULL: none): the ib sizes derived from it too. */
SHOAL_HIDDEN void shoal_tune_resolve(int mode, const shoal_tl_link_t *link, shoal_tune_t *t);

/* The ib transport's sizes for the port it opened (shoal_tl_params_t.link_sizes): derived
 * from the port unless SHOAL_TUNE=0, explicit settings (env, SHOAL_CONF_FILE, tuning file)
 * winning; the sources and reasons in sizes_p->why. */
SHOAL_HIDDEN void shoal_tune_link_sizes(const shoal_tl_link_t *link,
                                        shoal_tl_link_sizes_t *sizes_p);

/* The transport sizes of this process (shoal_tune_resolve_local's, SHOAL_TUNE=0: the fixed
 * defaults) for core's round 0 (see core/tl.h); cached per process. */
SHOAL_HIDDEN void shoal_tune_tl_sizes(shoal_tl_sizes_t *s);
/* The transport sizes of a resolved record. */
SHOAL_HIDDEN void shoal_tune_tl_sizes_of(const shoal_tune_t *t, shoal_tl_sizes_t *s);

/* Communicator agreement: rank 0 resolves, every rank gets rank 0's values. Uses
 * comm->seq once (same on every rank). */
SHOAL_HIDDEN shoal_status_t shoal_tune_comm_agree(struct shoal_comm *comm, shoal_tune_t *t);

/* The config field named name (without SHOAL_) in any module's table, and its storage. */
SHOAL_HIDDEN const shoal_cfg_field_t *shoal_tune_cfg_find(const char *name, void **dst_p);

/* 1 if a record received from rank 0 is sane (sources known, reasons terminated, rates
 * above 0, sizes below 1 TiB), else 0. */
SHOAL_HIDDEN int shoal_tune_record_check(const shoal_tune_t *t);

/* "# ..." lines for shoal_info -t: profile, then each knob with value, source, reason. */
SHOAL_HIDDEN void shoal_tune_print(const shoal_tune_t *t, FILE *fp);

#endif
