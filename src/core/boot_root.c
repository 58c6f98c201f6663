/*
 * The rendezvous root: one thread per communicator being created. It serves joins and
 * allgather rounds from a single poll loop; every socket is non-blocking, every frame is
 * validated (and after the handshake authenticated) before it is believed, and the whole
 * thing gives up after SHOAL_TIMEOUT_MS without progress.
 *
 * Received bytes go through one state machine (shoal_root_rx_target / shoal_root_rx_advance),
 * fed either by recv() on the client's socket or by shoal_boot_root_feed() (fuzzing, tests).
 *
 * A failure of the bootstrap (a joined rank that misbehaves or leaves) is told to every rank:
 * the joined ones at once with an authenticated FAILED frame, the ones still to come when
 * their hello arrives, so that no rank waits for its timeout.
 */
#include "core/core.h"
#include "core/boot_proto.h"
#include "tenant/breaker.h"

#include <arpa/inet.h>

#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define SHOAL_ROOT_TOLD (-2) /* rank_cl[k]: rank k was told that the bootstrap failed */

typedef enum {
    SHOAL_ROOT_CL_FREE = 0,
    SHOAL_ROOT_CL_PENDING, /* challenged, waiting for hello */
    SHOAL_ROOT_CL_JOINED,
    SHOAL_ROOT_CL_DONE     /* said bye */
} shoal_root_cl_state_t;

typedef struct {
    int fd;
    shoal_root_cl_state_t state;
    int rank;
    char peer[64];
    struct sockaddr_storage addr;       /* the source, for the circuit breaker */
    uint64_t deadline_ns;               /* handshake deadline while pending */
    uint64_t since_ns;                  /* accepted at (pending: the eviction's grace) */
    uint8_t nonce[SHOAL_BOOT_NONCE];    /* our challenge */
    uint8_t key[SHOAL_HMAC_BYTES];      /* session key once joined */
    uint64_t rx_seq;                    /* frames received / sent since the welcome */
    uint64_t tx_seq;
    shoal_boot_frame_t hdr;             /* frame being read */
    size_t hdr_have;
    uint8_t hello[sizeof(shoal_boot_hello_t)];
    size_t payload_have;                /* of the hello, or of this rank's table slot */
    uint8_t mac[SHOAL_BOOT_MAC];
    size_t mac_have;
    uint32_t round_sent;                /* rounds this rank has contributed */
    uint8_t *blob;                      /* a variable-length round: this rank's record ... */
    uint32_t blob_len;                  /* ... of the length its header announced */
} shoal_root_client_t;

struct shoal_root {
    struct shoal_root_live *live;       /* its entry among this process's roots (a thread's) */
    int listen_fd;
    uint8_t secret[SHOAL_SECRET_BYTES];
    shoal_boot_ident_t ident;           /* the job's identity: every hello must prove it */
    int timeout_ms;
    int nranks;                         /* 0 until the first valid hello */
    int joined;
    int done;
    shoal_root_client_t *cl;            /* [ncl] */
    int ncl;
    int *rank_cl;                       /* [nranks]: client index of each rank, -1, or TOLD */
    uint32_t round;                     /* current allgather round */
    uint32_t blob_len;                  /* this round's per-rank length, fixed by ... */
    int blob_set;                       /* ... the round's first header (with its kind) */
    uint32_t round_type;                /* SHOAL_BOOT_AG or _RING (one length), or _AGV */
    int have;                           /* contributions to this round */
    uint8_t *table;                     /* nranks * blob_len */
    unsigned refused;
    uint64_t bytes_in, bytes_out;       /* every byte read from / written to a client */
    shoal_status_t failed;              /* the bootstrap's failure being told, or SHOAL_OK */
    int told;                           /* ranks told about it (or done before it) */
    int failed_here;                    /* a rank of this process failed its init: tell the
                                         * ranks still to come too, even before any came */
    /* Addresses of this host that the breaker trusts while the root runs (breaker.h): the
     * ranks of the root's own host connect from them, and must never be refused. */
    struct sockaddr_storage trusted[3];
    int ntrusted;
    shoal_accept_stall_t accept_stall; /* accept() failing for want of a resource */
    shoal_log_limit_t accept_warn;
};

static void shoal_root_client_close(shoal_root_t *r, int i)
{
    shoal_root_client_t *c = &r->cl[i];
    if (c->fd >= 0) {
        close(c->fd);
    }
    free(c->blob);
    shoal_secret_wipe(c->key, sizeof(c->key));
    memset(c, 0, sizeof(*c));
    c->fd = -1;
}

/* Refuses client i with why. An eviction (a pending connection's slot given to a newcomer
 * after SHOAL_BOOT_EVICT_GRACE_MS) is no failed authentication: it is traced only and not
 * counted against the source, so that the ranks of a host that starts many at once never
 * open the breaker against it (the root's final line counts every refusal). */
static void shoal_root_refuse_as(shoal_root_t *r, int i, shoal_status_t why, const char *what,
                                 int eviction)
{
    shoal_root_client_t *c = &r->cl[i];
    shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_REFUSED,
                            .len = 0, .round = (uint32_t)(int32_t)why};
    r->refused++;
    /* A stranger that keeps failing opens the breaker against its address; its refusals are
     * logged in full once per source per minute, traced otherwise. */
    if (eviction) {
        shoal_trace(BOOT, "root evicted the pending connection from %s for a newcomer (%u "
                    "refused so far)", c->peer, r->refused);
    } else if (c->state != SHOAL_ROOT_CL_PENDING || c->addr.ss_family == AF_UNSPEC ||
               shoal_tenant_breaker_note_fail((const struct sockaddr *)&c->addr)) {
        shoal_error(BOOT, "root refused connection from %s: %s (%u refused so far)", c->peer,
                    what, r->refused);
    } else {
        shoal_trace(BOOT, "root refused connection from %s: %s (%u refused so far)", c->peer,
                    what, r->refused);
    }
    /* Best effort; never wait on a stranger. */
    (void)!send(c->fd, &f, sizeof(f), MSG_NOSIGNAL | MSG_DONTWAIT);
    shoal_root_client_close(r, i);
}

static void shoal_root_refuse(shoal_root_t *r, int i, shoal_status_t why, const char *what)
{
    shoal_root_refuse_as(r, i, why, what, 0);
}

/* An authenticated frame to a joined client (or one whose hello was just verified). */
static shoal_status_t shoal_root_send(shoal_root_t *r, shoal_root_client_t *c, uint32_t type,
                                      const void *payload, uint32_t len, const uint8_t *digest,
                                      uint64_t deadline)
{
    shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = type, .len = len,
                            .round = r->round};
    uint8_t mac[SHOAL_BOOT_MAC], d[SHOAL_HMAC_BYTES];
    shoal_status_t st;

    if (type == SHOAL_BOOT_FAILED) {
        f.round = (uint32_t)(int32_t)r->failed;
    }
    if (digest == NULL) {
        shoal_boot_payload_digest(payload, len, d);
        digest = d;
    }
    shoal_boot_frame_mac(c->key, SHOAL_BOOT_DIR_DOWN, c->tx_seq++, &f, digest, mac);
    r->bytes_out += sizeof(f) + (size_t)len + sizeof(mac);
    st = shoal_sock_write_all(c->fd, &f, sizeof(f), deadline, NULL);
    if (st == SHOAL_OK && len > 0) {
        st = shoal_sock_write_all(c->fd, payload, len, deadline, NULL);
    }
    if (st == SHOAL_OK) {
        st = shoal_sock_write_all(c->fd, mac, sizeof(mac), deadline, NULL);
    }
    return st;
}

/* The bootstrap failed: tell every joined rank (best effort, briefly), close them, and keep
 * listening only to tell the ranks still to come. */
static void shoal_root_fail(shoal_root_t *r, shoal_status_t st)
{
    uint64_t deadline = shoal_deadline_ns(200);
    r->failed = st;
    shoal_warn(BOOT, "root: bootstrap failed (%s); telling every rank", shoal_strerror(st));
    for (int i = 0; i < r->ncl; i++) {
        shoal_root_client_t *c = &r->cl[i];
        if (c->state != SHOAL_ROOT_CL_JOINED && c->state != SHOAL_ROOT_CL_DONE) {
            continue;
        }
        if (c->state == SHOAL_ROOT_CL_JOINED) {
            (void)shoal_root_send(r, c, SHOAL_BOOT_FAILED, NULL, 0, NULL, deadline);
        }
        if (r->rank_cl[c->rank] != SHOAL_ROOT_TOLD) {
            r->rank_cl[c->rank] = SHOAL_ROOT_TOLD;
            r->told++;
        }
        shoal_root_client_close(r, i);
    }
    r->have = 0;
    r->blob_set = 0;
}

static int shoal_root_add_client_slot(shoal_root_t *r)
{
    int i, pending = 0, slot = -1;
    for (i = 0; i < r->ncl; i++) {
        if (r->cl[i].state == SHOAL_ROOT_CL_PENDING) {
            pending++;
        } else if (r->cl[i].state == SHOAL_ROOT_CL_FREE && slot < 0) {
            slot = i;
        }
    }
    if (pending >= SHOAL_BOOT_MAX_PENDING) {
        /* Evict the oldest stranger rather than refuse the newcomer: idle connections must
         * not be able to lock real ranks out (a real rank answers its challenge at once, and
         * redials if it is evicted anyway). The oldest by acceptance, as shoal_root_room
         * counts the grace: by deadline, a connection on probation (a shorter one) went
         * first even within its grace. */
        int oldest = -1;
        for (i = 0; i < r->ncl; i++) {
            if (r->cl[i].state == SHOAL_ROOT_CL_PENDING &&
                (oldest < 0 || r->cl[i].since_ns < r->cl[oldest].since_ns)) {
                oldest = i;
            }
        }
        /* SHOAL_ERR_TIMEOUT, as for "no hello in time": the rank redials without a fuss */
        shoal_root_refuse_as(r, oldest, SHOAL_ERR_TIMEOUT,
                             "evicted: too many unauthenticated connections", 1);
        if (slot < 0) {
            slot = oldest;
        }
    }
    if (slot < 0) {
        shoal_root_client_t *ncl = realloc(r->cl, sizeof(*ncl) * (size_t)(r->ncl + 16));
        if (ncl == NULL) {
            return -1;
        }
        r->cl = ncl;
        for (i = r->ncl; i < r->ncl + 16; i++) {
            memset(&r->cl[i], 0, sizeof(r->cl[i]));
            r->cl[i].fd = -1;
        }
        slot = r->ncl;
        r->ncl += 16;
    }
    return slot;
}

int shoal_boot_root_add_client(shoal_root_t *r, int fd, const struct sockaddr_storage *ss)
{
    int slot = shoal_root_add_client_slot(r);
    if (slot < 0) {
        close(fd);
        return -1;
    }
    shoal_root_client_t *c = &r->cl[slot];
    c->fd = fd;
    c->state = SHOAL_ROOT_CL_PENDING;
    c->rank = -1;
    c->since_ns = shoal_time_ns();
    c->deadline_ns = shoal_deadline_ns(r->timeout_ms < 0 ? 60000 : SHOAL_MIN(r->timeout_ms, 60000));
    shoal_sockaddr_str(ss, c->peer, sizeof(c->peer));
    c->addr = *ss;
    if (shoal_random_bytes(c->nonce, sizeof(c->nonce)) != SHOAL_OK) {
        shoal_root_client_close(r, slot);
        return -1;
    }
    shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_CHALLENGE,
                            .len = SHOAL_BOOT_NONCE, .round = 0};
    uint8_t msg[sizeof(f) + SHOAL_BOOT_NONCE];
    memcpy(msg, &f, sizeof(f));
    memcpy(msg + sizeof(f), c->nonce, SHOAL_BOOT_NONCE);
    /* A fresh socket's buffer always takes 48 bytes. */
    r->bytes_out += sizeof(msg);
    if (send(fd, msg, sizeof(msg), MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof(msg)) {
        shoal_root_client_close(r, slot);
        return -1;
    }
    return slot;
}

/* Whether a newcomer may be accepted now: a pending slot is free, or the oldest pending
 * connection has had its SHOAL_BOOT_EVICT_GRACE_MS (it is evicted for the newcomer). If not,
 * *wait_ms is how long until it has; newcomers wait in the listen backlog meanwhile. */
static int shoal_root_room(const shoal_root_t *r, int *wait_ms)
{
    uint64_t oldest = UINT64_MAX, due, now;
    int pending = 0;
    for (int i = 0; i < r->ncl; i++) {
        if (r->cl[i].state == SHOAL_ROOT_CL_PENDING) {
            pending++;
            oldest = SHOAL_MIN(oldest, r->cl[i].since_ns);
        }
    }
    if (pending < SHOAL_BOOT_MAX_PENDING) {
        return 1;
    }
    due = oldest + (uint64_t)SHOAL_BOOT_EVICT_GRACE_MS * 1000000ull;
    now = shoal_time_ns();
    if (now >= due) {
        return 1;
    }
    *wait_ms = (int)((due - now + 999999) / 1000000);
    return 0;
}

/* The pending connections that src holds now. */
static int shoal_root_source_pending(const shoal_root_t *r, const struct sockaddr_storage *src)
{
    int n = 0;
    for (int i = 0; i < r->ncl; i++) {
        n += r->cl[i].state == SHOAL_ROOT_CL_PENDING &&
             shoal_tenant_breaker_same_source((const struct sockaddr *)src,
                                              (const struct sockaddr *)&r->cl[i].addr);
    }
    return n;
}

/* Whether src may take a pending slot now: the root's own host always (its ranks start
 * together), another source while it holds fewer than SHOAL_BOOT_MAX_PENDING_SOURCE. */
static int shoal_root_source_room(const shoal_root_t *r, const struct sockaddr_storage *src)
{
    const struct sockaddr *sa = (const struct sockaddr *)src;
    for (int t = 0; t < r->ntrusted; t++) {
        if (shoal_tenant_breaker_same_source(sa, (const struct sockaddr *)&r->trusted[t])) {
            return 1;
        }
    }
    return shoal_root_source_pending(r, src) < SHOAL_BOOT_MAX_PENDING_SOURCE;
}

static void shoal_root_accept(shoal_root_t *r)
{
    int one = 1, wait_ms;
    while (shoal_root_room(r, &wait_ms)) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        int held, probation, slot;
        int fd = accept4(r->listen_fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int err = errno;
            unsigned missed;
            if (err == EINTR || err == ECONNABORTED) {
                continue;
            }
            /* Out of descriptors (EMFILE, ENFILE) or memory, accept() fails again at every
             * pass while the connection waits in the backlog, whose listener stays readable:
             * the root logged each one, spinning (80000 lines in 500 ms). Once a second now;
             * while stalled, the thread sleeps instead of polling the listener. */
            (void)shoal_accept_stall_note(&r->accept_stall, err);
            if (err != EAGAIN && err != EWOULDBLOCK &&
                shoal_log_limit_pass(&r->accept_warn, 1000000000ull, &missed)) {
                shoal_warn(BOOT, "root accept(fd %d) failed: %s (%u more failures not logged)",
                           r->listen_fd, strerror(err), missed);
            }
            return;
        }
        (void)shoal_accept_stall_note(&r->accept_stall, 0);
        /* A source that kept failing is refused at accept (and logged) by the breaker only
         * while it holds a pending connection here; else this one is challenged, with a short
         * hello deadline (SHOAL_BOOT_PROBATION_MS). The root cannot tell a host of the job
         * from a stranger's before a proof: refused outright, a rank whose co-tenant had
         * failed 8 hellos could not join for the whole cool-down. */
        held = shoal_root_source_pending(r, &ss);
        if (held > 0 && !shoal_tenant_breaker_admit((const struct sockaddr *)&ss)) {
            close(fd);
            continue;
        }
        probation = held == 0 && shoal_tenant_breaker_is_open((const struct sockaddr *)&ss);
        if (!shoal_root_source_room(r, &ss)) {
            /* As an eviction (TIMEOUT: a real rank redials), not counted against the source:
             * a remote host may start more ranks at once than its share. */
            shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_REFUSED,
                                    .len = 0, .round = (uint32_t)(int32_t)SHOAL_ERR_TIMEOUT};
            char peer[64];
            r->refused++;
            shoal_sockaddr_str(&ss, peer, sizeof(peer));
            shoal_trace(BOOT, "root refused a connection from %s: it holds %d unauthenticated "
                        "connections already (%u refused so far)", peer,
                        SHOAL_BOOT_MAX_PENDING_SOURCE, r->refused);
            (void)!send(fd, &f, sizeof(f), MSG_NOSIGNAL | MSG_DONTWAIT);
            close(fd);
            continue;
        }
        /* Header, payload and MAC go out as separate writes: no Nagle delay between them. */
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        slot = shoal_boot_root_add_client(r, fd, &ss);
        if (slot >= 0 && probation) {
            r->cl[slot].deadline_ns = shoal_deadline_ns(SHOAL_BOOT_PROBATION_MS);
        }
    }
}

/* A hello whose proof holds: does it fit the job? SHOAL_OK or the refusal's status. */
static shoal_status_t shoal_root_hello_fits(shoal_root_t *r, const shoal_boot_hello_t *h,
                                            char *what, size_t len)
{
    if (!shoal_memeq_ct(h->ident.tenant, r->ident.tenant, sizeof(r->ident.tenant))) {
        snprintf(what, len, "rank %d knows the job secret but is configured for another "
                 "tenant", h->rank);
        return SHOAL_ERR_PERMISSION;
    }
    if (!shoal_memeq_ct(h->ident.job, r->ident.job, sizeof(r->ident.job))) {
        snprintf(what, len, "rank %d knows the job secret but is configured for another job",
                 h->rank);
        return SHOAL_ERR_PERMISSION;
    }
    if (h->ident.epoch != r->ident.epoch) {
        snprintf(what, len, "rank %d is of epoch %llu, the job of epoch %llu", h->rank,
                 (unsigned long long)h->ident.epoch, (unsigned long long)r->ident.epoch);
        return SHOAL_ERR_PERMISSION;
    }
    /* Last: only a rank of this tenant, job and epoch can be a launch error of this job. */
    if (h->nranks <= 0 || h->nranks > SHOAL_BOOT_MAX_RANKS || h->rank < 0 ||
        h->rank >= h->nranks || (r->nranks != 0 && h->nranks != r->nranks)) {
        snprintf(what, len, "rank %d of %d does not fit a job of %d ranks", h->rank, h->nranks,
                 r->nranks);
        return SHOAL_ERR_INVALID_ARG;
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_root_rank_table(shoal_root_t *r, int nranks)
{
    r->rank_cl = malloc(sizeof(int) * (size_t)nranks);
    if (r->rank_cl == NULL) {
        shoal_error(BOOT, "root: cannot allocate the table of %d ranks", nranks);
        return SHOAL_ERR_NO_MEMORY;
    }
    for (int k = 0; k < nranks; k++) {
        r->rank_cl[k] = -1;
    }
    r->nranks = nranks;
    return SHOAL_OK;
}

/* Mutual authentication: verify the client's proof, answer with ours. Returns SHOAL_OK (also
 * when a stranger was refused), or a status that fails the whole bootstrap. */
static shoal_status_t shoal_root_on_hello(shoal_root_t *r, int i)
{
    shoal_root_client_t *c = &r->cl[i];
    shoal_boot_hello_t h;
    uint8_t mac[SHOAL_HMAC_BYTES];
    char what[160];
    shoal_status_t st;

    memcpy(&h, c->hello, sizeof(h));
    shoal_boot_hello_mac(r->secret, c->nonce, &h, mac);
    if (!shoal_memeq_ct(mac, h.mac, sizeof(mac))) {
        shoal_root_refuse(r, i, SHOAL_ERR_AUTH, "wrong job secret (bad HMAC proof)");
        return SHOAL_OK;
    }
    st = shoal_root_hello_fits(r, &h, what, sizeof(what));
    if (st != SHOAL_OK) {
        shoal_root_refuse(r, i, st, what);
        /* A rank of this job whose size or rank number does not fit (SHOAL_NRANKS set apart
         * on one host): a launch error, as a rank joining twice is. The job cannot form;
         * its ranks that joined waited their whole timeout for it. They are told now. */
        return st == SHOAL_ERR_INVALID_ARG && r->nranks != 0 && r->failed == SHOAL_OK
                   ? SHOAL_ERR_INVALID_ARG
                   : SHOAL_OK;
    }
    if (r->nranks == 0) {
        SHOAL_CHECK(shoal_root_rank_table(r, h.nranks));
    }
    c->rank = h.rank;
    shoal_boot_session_key(r->secret, c->nonce, &h, c->key);
    if (r->failed != SHOAL_OK) {
        /* A rank of the job that comes late: it learns the failure now, not at its timeout. */
        (void)shoal_root_send(r, c, SHOAL_BOOT_FAILED, NULL, 0, NULL, shoal_deadline_ns(200));
        if (r->rank_cl[h.rank] != SHOAL_ROOT_TOLD) {
            r->rank_cl[h.rank] = SHOAL_ROOT_TOLD;
            r->told++;
        }
        shoal_root_client_close(r, i);
        return SHOAL_OK;
    }
    if (r->rank_cl[h.rank] >= 0) {
        /* Two processes that both know the secret claim one rank: a launch error (or a
         * stolen secret). Neither can be trusted to be the real one: fail the job now. */
        shoal_error(BOOT, "root: rank %d joined twice (from %s, then from %s)", h.rank,
                    r->cl[r->rank_cl[h.rank]].peer, c->peer);
        c->state = SHOAL_ROOT_CL_JOINED;
        return SHOAL_ERR_INVALID_ARG;
    }
    shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_WELCOME,
                            .len = SHOAL_HMAC_BYTES, .round = 0};
    uint8_t msg[sizeof(f) + SHOAL_HMAC_BYTES];
    shoal_boot_welcome_mac(r->secret, c->nonce, &h, mac);
    memcpy(msg, &f, sizeof(f));
    memcpy(msg + sizeof(f), mac, sizeof(mac));
    r->bytes_out += sizeof(msg);
    if (shoal_sock_write_all(c->fd, msg, sizeof(msg), shoal_deadline_ns(r->timeout_ms), NULL) !=
        SHOAL_OK) {
        shoal_root_client_close(r, i);
        return SHOAL_OK;
    }
    c->state = SHOAL_ROOT_CL_JOINED;
    c->round_sent = r->round;
    if (c->addr.ss_family != AF_UNSPEC) {
        shoal_tenant_breaker_note_ok((const struct sockaddr *)&c->addr);
    }
    r->rank_cl[h.rank] = i;
    r->joined++;
    shoal_trace(BOOT, "root: rank %d of %d joined from %s", h.rank, h.nranks, c->peer);
    return SHOAL_OK;
}

/* The round's first header fixes its length; the table is sized once, before any payload of
 * the round has arrived. */
static shoal_status_t shoal_root_round_begin(shoal_root_t *r, uint32_t type, uint32_t len)
{
    size_t total = (size_t)r->nranks * len;
    r->round_type = type;
    if (type == SHOAL_BOOT_AGV) {
        /* Every rank's record has its own length and buffer (shoal_root_blob_begin). */
        r->blob_set = 1;
        return SHOAL_OK;
    }
    uint8_t *t = realloc(r->table, total > 0 ? total : 1);
    if (t == NULL) {
        shoal_error(BOOT, "root: cannot allocate %zu bytes for round %u", total, r->round);
        return SHOAL_ERR_NO_MEMORY;
    }
    r->table = t;
    r->blob_len = len;
    r->blob_set = 1;
    return SHOAL_OK;
}

/* A rank's record of a variable-length round: a buffer of exactly the length its header
 * announced (checked against SHOAL_BOOT_MAX_BLOB), before any byte of it is read. */
static shoal_status_t shoal_root_blob_begin(shoal_root_t *r, shoal_root_client_t *c)
{
    uint8_t *b = realloc(c->blob, c->hdr.len > 0 ? c->hdr.len : 1);
    if (b == NULL) {
        shoal_error(BOOT, "root: cannot allocate %u bytes for rank %d in round %u", c->hdr.len,
                    c->rank, r->round);
        return SHOAL_ERR_NO_MEMORY;
    }
    c->blob = b;
    c->blob_len = c->hdr.len;
    return SHOAL_OK;
}

/* The table of a variable-length round: per rank, in rank order, u32 length (little endian)
 * and the record. Only the records' bytes: a rank with 60 bytes to say sends 60, not the
 * largest size any transport might need. */
static shoal_status_t shoal_root_table_v(shoal_root_t *r, uint32_t *len_p)
{
    size_t total = 0, off = 0;
    uint8_t *t;
    for (int k = 0; k < r->nranks; k++) {
        total += 4 + (size_t)r->cl[r->rank_cl[k]].blob_len;
    }
    if (total > UINT32_MAX) {
        shoal_error(BOOT, "root: round %u's table of %zu bytes is too large", r->round, total);
        return SHOAL_ERR_INVALID_ARG;
    }
    t = realloc(r->table, total > 0 ? total : 1);
    if (t == NULL) {
        shoal_error(BOOT, "root: cannot allocate %zu bytes for round %u", total, r->round);
        return SHOAL_ERR_NO_MEMORY;
    }
    r->table = t;
    for (int k = 0; k < r->nranks; k++) {
        shoal_root_client_t *c = &r->cl[r->rank_cl[k]];
        shoal_put_le(t + off, c->blob_len, 4);
        if (c->blob_len > 0) {
            memcpy(t + off + 4, c->blob, c->blob_len);
        }
        off += 4 + (size_t)c->blob_len;
        free(c->blob);
        c->blob = NULL;
        c->blob_len = 0;
    }
    *len_p = (uint32_t)total;
    return SHOAL_OK;
}

void (*shoal_boot_root_ring_hook)(int nranks, uint8_t *recs);

/* A RING round: rank k hears only of its ring neighbours, the records of ranks k-1 and k+1
 * (2 * SHOAL_BOOT_RING_REC bytes): the root's bytes grow with n, not n^2. */
static shoal_status_t shoal_root_ring_answer(shoal_root_t *r, uint64_t deadline)
{
    uint8_t pair[2 * SHOAL_BOOT_RING_REC];
    size_t rl = r->blob_len;
    if (shoal_boot_root_ring_hook != NULL) {
        shoal_boot_root_ring_hook(r->nranks, r->table);
    }
    for (int k = 0; k < r->nranks; k++) {
        shoal_root_client_t *c = &r->cl[r->rank_cl[k]];
        int prev = (k + r->nranks - 1) % r->nranks, next = (k + 1) % r->nranks;
        shoal_status_t st;
        memcpy(pair, r->table + (size_t)prev * rl, rl);
        memcpy(pair + rl, r->table + (size_t)next * rl, rl);
        st = shoal_root_send(r, c, SHOAL_BOOT_RING, pair, (uint32_t)(2 * rl), NULL, deadline);
        if (st != SHOAL_OK) {
            shoal_error(BOOT, "root: sending round %u to rank %d (%s) failed: %s", r->round, k,
                        c->peer, shoal_strerror(st));
            return SHOAL_ERR_PEER_FAILED;
        }
    }
    return SHOAL_OK;
}

/* The round's table to every rank (one digest for all). */
static shoal_status_t shoal_root_send_table(shoal_root_t *r, uint32_t len, uint64_t deadline)
{
    uint8_t digest[SHOAL_HMAC_BYTES];
    shoal_boot_payload_digest(r->table, len, digest);
    for (int k = 0; k < r->nranks; k++) {
        shoal_root_client_t *c = &r->cl[r->rank_cl[k]];
        shoal_status_t st = shoal_root_send(r, c, r->round_type, r->table, len, digest,
                                            deadline);
        if (st != SHOAL_OK) {
            shoal_error(BOOT, "root: sending round %u to rank %d (%s) failed: %s", r->round, k,
                        c->peer, shoal_strerror(st));
            return SHOAL_ERR_PEER_FAILED;
        }
    }
    return SHOAL_OK;
}

/* Every rank contributed: send the table to all (a RING round: each its neighbours'), start
 * the next round. */
static shoal_status_t shoal_root_round_finish(shoal_root_t *r)
{
    uint32_t len = (uint32_t)((size_t)r->nranks * r->blob_len);
    uint64_t deadline = shoal_deadline_ns(r->timeout_ms);

    if (r->round_type == SHOAL_BOOT_AGV) {
        SHOAL_CHECK(shoal_root_table_v(r, &len));
    }
    if (r->round_type == SHOAL_BOOT_RING) {
        SHOAL_CHECK(shoal_root_ring_answer(r, deadline));
    } else {
        SHOAL_CHECK(shoal_root_send_table(r, len, deadline));
    }
    r->round++;
    r->have = 0;
    r->blob_len = 0;
    r->blob_set = 0;
    return SHOAL_OK;
}

/* Validates a complete frame header against what this client may send now. */
static shoal_status_t shoal_root_check_hdr(shoal_root_t *r, shoal_root_client_t *c,
                                           const char **why)
{
    const shoal_boot_frame_t *h = &c->hdr;
    if (h->magic != SHOAL_BOOT_FRAME_MAGIC) {
        *why = "garbage (bad frame magic)";
        return SHOAL_ERR_PROTOCOL;
    }
    if (c->state == SHOAL_ROOT_CL_PENDING) {
        if (h->type != SHOAL_BOOT_HELLO || h->len != sizeof(shoal_boot_hello_t)) {
            *why = "expected a hello of the right size";
            return SHOAL_ERR_PROTOCOL;
        }
        return SHOAL_OK;
    }
    if (h->type == SHOAL_BOOT_BYE && h->len == 0) {
        return SHOAL_OK;
    }
    if ((h->type != SHOAL_BOOT_AG && h->type != SHOAL_BOOT_AGV && h->type != SHOAL_BOOT_RING) ||
        h->round != r->round || (h->type == SHOAL_BOOT_RING && h->len != SHOAL_BOOT_RING_REC) ||
        c->round_sent != r->round || h->len > SHOAL_BOOT_MAX_BLOB) {
        *why = "allgather frame out of order or too large";
        return SHOAL_ERR_PROTOCOL;
    }
    if (r->blob_set && h->type != r->round_type) {
        *why = "allgather frame of another kind than the round's";
        return SHOAL_ERR_PROTOCOL;
    }
    if (r->blob_set && h->type != SHOAL_BOOT_AGV && h->len != r->blob_len) {
        *why = "allgather frame of another length than the round's";
        return SHOAL_ERR_PROTOCOL;
    }
    if (r->done > 0) {
        *why = "allgather round after a rank already left the bootstrap";
        return SHOAL_ERR_PEER_FAILED;
    }
    return SHOAL_OK;
}

/* A header is complete. SHOAL_OK, or a status that fails the bootstrap. */
static shoal_status_t shoal_root_on_hdr(shoal_root_t *r, int i)
{
    shoal_root_client_t *c = &r->cl[i];
    const char *why = NULL;
    shoal_status_t st = shoal_root_check_hdr(r, c, &why);

    if (st != SHOAL_OK) {
        if (c->state == SHOAL_ROOT_CL_PENDING) {
            shoal_root_refuse(r, i, SHOAL_ERR_PROTOCOL, why);
            return SHOAL_OK;
        }
        shoal_error(BOOT, "root: rank %d (%s) sent a bad frame in round %u: %s (%u bytes, "
                    "type %u)", c->rank, c->peer, r->round, why, c->hdr.len, c->hdr.type);
        return st;
    }
    if (c->state == SHOAL_ROOT_CL_JOINED &&
        (c->hdr.type == SHOAL_BOOT_AG || c->hdr.type == SHOAL_BOOT_AGV ||
         c->hdr.type == SHOAL_BOOT_RING) &&
        !r->blob_set) {
        SHOAL_CHECK(shoal_root_round_begin(r, c->hdr.type, c->hdr.len));
    }
    if (c->state == SHOAL_ROOT_CL_JOINED && c->hdr.type == SHOAL_BOOT_AGV) {
        return shoal_root_blob_begin(r, c);
    }
    return SHOAL_OK;
}

/* A joined client's frame is complete, MAC included. */
static shoal_status_t shoal_root_on_frame(shoal_root_t *r, int i)
{
    shoal_root_client_t *c = &r->cl[i];
    uint8_t digest[SHOAL_HMAC_BYTES], mac[SHOAL_BOOT_MAC];
    const uint8_t *payload = c->hdr.type == SHOAL_BOOT_AG || c->hdr.type == SHOAL_BOOT_RING
                                 ? r->table + (size_t)c->rank * r->blob_len
                                 : c->hdr.type == SHOAL_BOOT_AGV ? c->blob : NULL;

    shoal_boot_payload_digest(payload, c->hdr.len, digest);
    shoal_boot_frame_mac(c->key, SHOAL_BOOT_DIR_UP, c->rx_seq, &c->hdr, digest, mac);
    if (!shoal_memeq_ct(mac, c->mac, sizeof(mac))) {
        shoal_error(BOOT, "root: a frame on the connection of rank %d (%s) fails its MAC "
                    "(tampered, replayed or reordered) in round %u", c->rank, c->peer, r->round);
        return SHOAL_ERR_AUTH;
    }
    c->rx_seq++;
    if (c->hdr.type == SHOAL_BOOT_BYE) {
        if (r->have > 0 && c->round_sent == r->round) {
            shoal_error(BOOT, "root: rank %d (%s) left in round %u, which others began",
                        c->rank, c->peer, r->round);
            return SHOAL_ERR_PEER_FAILED;
        }
        c->state = SHOAL_ROOT_CL_DONE;
        r->done++;
        return SHOAL_OK;
    }
    c->round_sent++;
    if (++r->have == r->nranks && r->joined == r->nranks) {
        return shoal_root_round_finish(r);
    }
    return SHOAL_OK;
}

/* Where the next bytes from client c go, and how many belong to the current frame. */
static uint8_t *shoal_root_rx_target(shoal_root_t *r, shoal_root_client_t *c, size_t *want_p)
{
    if (c->hdr_have < sizeof(c->hdr)) {
        *want_p = sizeof(c->hdr) - c->hdr_have;
        return (uint8_t *)&c->hdr + c->hdr_have;
    }
    if (c->state == SHOAL_ROOT_CL_PENDING) {
        *want_p = sizeof(c->hello) - c->payload_have; /* the header said exactly that */
        return c->hello + c->payload_have;
    }
    if (c->payload_have < c->hdr.len) { /* AG: the round's length; AGV: the blob's */
        *want_p = c->hdr.len - c->payload_have;
        if (c->hdr.type == SHOAL_BOOT_AGV) {
            return c->blob + c->payload_have;
        }
        return r->table + (size_t)c->rank * r->blob_len + c->payload_have;
    }
    *want_p = sizeof(c->mac) - c->mac_have;
    return c->mac + c->mac_have;
}

/* n bytes arrived at the target. SHOAL_OK (the client may have been refused and closed), or
 * a status that fails the bootstrap. */
static shoal_status_t shoal_root_rx_advance(shoal_root_t *r, int i, size_t n)
{
    shoal_root_client_t *c = &r->cl[i];
    if (c->hdr_have < sizeof(c->hdr)) {
        c->hdr_have += n;
        if (c->hdr_have < sizeof(c->hdr)) {
            return SHOAL_OK;
        }
        c->payload_have = 0;
        c->mac_have = 0;
        return shoal_root_on_hdr(r, i);
    }
    if (c->state == SHOAL_ROOT_CL_PENDING) {
        c->payload_have += n;
        if (c->payload_have < sizeof(c->hello)) {
            return SHOAL_OK;
        }
        c->hdr_have = 0;
        return shoal_root_on_hello(r, i);
    }
    if (c->payload_have < c->hdr.len) {
        c->payload_have += n;
        return SHOAL_OK;
    }
    c->mac_have += n;
    if (c->mac_have < sizeof(c->mac)) {
        return SHOAL_OK;
    }
    c->hdr_have = 0;
    return shoal_root_on_frame(r, i);
}

static int shoal_root_client_live(const shoal_root_client_t *c)
{
    return c->state == SHOAL_ROOT_CL_PENDING || c->state == SHOAL_ROOT_CL_JOINED;
}

shoal_status_t shoal_boot_root_feed(shoal_root_t *r, int i, const uint8_t *bytes, size_t n)
{
    shoal_status_t st = SHOAL_OK;
    if (i < 0 || i >= r->ncl) {
        return SHOAL_ERR_INVALID_ARG;
    }
    while (n > 0 && st == SHOAL_OK && shoal_root_client_live(&r->cl[i])) {
        size_t want, k;
        uint8_t *dst = shoal_root_rx_target(r, &r->cl[i], &want);
        k = SHOAL_MIN(want, n);
        memcpy(dst, bytes, k);
        bytes += k;
        n -= k;
        st = shoal_root_rx_advance(r, i, k);
    }
    if (st != SHOAL_OK && r->failed == SHOAL_OK) {
        shoal_root_fail(r, st);
    }
    return st;
}

/* Reads what is available from client i. Returns SHOAL_OK, or a fatal bootstrap error (a
 * joined rank misbehaved or left): then every rank must be told. */
static shoal_status_t shoal_root_read(shoal_root_t *r, int i)
{
    shoal_root_client_t *c = &r->cl[i];
    while (shoal_root_client_live(c)) {
        size_t want;
        uint8_t *dst = shoal_root_rx_target(r, c, &want);
        ssize_t n = recv(c->fd, dst, want, MSG_DONTWAIT);
        shoal_status_t st;

        if (n == 0) {
            if (c->state == SHOAL_ROOT_CL_PENDING) {
                shoal_root_refuse(r, i, SHOAL_ERR_PROTOCOL, "closed before a complete hello");
                return SHOAL_OK;
            }
            shoal_error(BOOT, "root: rank %d (%s) left during bootstrap", c->rank, c->peer);
            return SHOAL_ERR_PEER_FAILED;
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                return SHOAL_OK;
            }
            if (c->state == SHOAL_ROOT_CL_PENDING) {
                /* a reset (a scanner's close with SO_LINGER 0) is a failed hello like a close:
                 * closed quietly, a stranger churned the slots without opening the breaker */
                shoal_root_refuse(r, i, SHOAL_ERR_PROTOCOL, "reset before a complete hello");
                return SHOAL_OK;
            }
            shoal_error(BOOT, "root: read from rank %d (%s) failed: %s", c->rank, c->peer,
                        strerror(errno));
            return SHOAL_ERR_PEER_FAILED;
        }
        r->bytes_in += (uint64_t)n;
        st = shoal_root_rx_advance(r, i, (size_t)n);
        if (st != SHOAL_OK) {
            return st;
        }
    }
    return SHOAL_OK;
}

const uint8_t *shoal_boot_root_nonce(shoal_root_t *r, int i)
{
    if (i < 0 || i >= r->ncl || !shoal_root_client_live(&r->cl[i])) {
        return NULL;
    }
    return r->cl[i].nonce;
}

/* The breaker never opens against this host's loopback addresses nor the address the root
 * publishes: the ranks of the root's host connect from them. */
static void shoal_root_trust(shoal_root_t *r, const struct sockaddr_storage *published)
{
    struct sockaddr_in lo4 = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct sockaddr_in6 lo6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    memcpy(&r->trusted[0], &lo4, sizeof(lo4));
    memcpy(&r->trusted[1], &lo6, sizeof(lo6));
    r->ntrusted = 2;
    if (published->ss_family == AF_INET || published->ss_family == AF_INET6) {
        r->trusted[r->ntrusted++] = *published;
    }
    for (int t = 0; t < r->ntrusted; t++) {
        shoal_tenant_breaker_trust((const struct sockaddr *)&r->trusted[t], +1);
    }
}

shoal_status_t shoal_boot_root_new(const shoal_boot_uid_t *u, int listen_fd, int timeout_ms,
                                   shoal_root_t **r_p)
{
    shoal_root_t *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    r->listen_fd = listen_fd;
    r->timeout_ms = timeout_ms;
    memcpy(r->secret, u->secret, sizeof(r->secret));
    r->ident = u->ident;
    shoal_root_trust(r, &u->root);
    *r_p = r;
    return SHOAL_OK;
}

void shoal_boot_root_free(shoal_root_t *r)
{
    for (int i = 0; i < r->ncl; i++) {
        if (r->cl[i].fd >= 0 || r->cl[i].state != SHOAL_ROOT_CL_FREE) {
            shoal_root_client_close(r, i);
        }
    }
    free(r->cl);
    free(r->rank_cl);
    free(r->table);
    if (r->listen_fd >= 0) {
        close(r->listen_fd);
    }
    for (int t = 0; t < r->ntrusted; t++) {
        shoal_tenant_breaker_trust((const struct sockaddr *)&r->trusted[t], -1);
    }
    shoal_secret_wipe(r->secret, sizeof(r->secret));
    free(r);
}

/* The thread's work is over: every rank done, or (after a failure) every rank told. */
static int shoal_root_finished(const shoal_root_t *r)
{
    if (r->failed != SHOAL_OK && r->failed_here) {
        /* every rank told but the one that failed here (it never joined) */
        return r->nranks > 0 && r->told >= r->nranks - 1;
    }
    if (r->failed != SHOAL_OK) {
        return r->nranks == 0 || r->told >= r->nranks;
    }
    return r->nranks != 0 && r->done == r->nranks;
}

/* One pass over the clients after poll(). */
static shoal_status_t shoal_root_serve(shoal_root_t *r)
{
    for (int i = 0; i < r->ncl; i++) {
        shoal_root_client_t *c = &r->cl[i];
        shoal_status_t st;
        if (c->fd < 0 || !shoal_root_client_live(c)) {
            continue;
        }
        if (c->state == SHOAL_ROOT_CL_PENDING && shoal_deadline_passed(c->deadline_ns)) {
            shoal_root_refuse(r, i, SHOAL_ERR_TIMEOUT, "no hello in time");
            continue;
        }
        st = shoal_root_read(r, i);
        if (st != SHOAL_OK) {
            return st;
        }
    }
    return SHOAL_OK;
}

/* ---- the roots this process runs ------------------------------------------------------- */

/* A root's thread must be over before the process's exit handlers run: it verifies the
 * ranks' last frames with libcrypto, whose atexit handler (OPENSSL_cleanup) frees what
 * HMAC uses. A rank that returned from main while the root still read the others' byes
 * crashed in its exit (tests/unit/test_boot_v, 2 runs in 300). So every root is listed
 * here; the communicator that used it waits for its thread at destroy
 * (shoal_boot_root_wait), finished threads are joined at the next start, and the exit stops
 * the others (shoal_roots_atexit). */
typedef struct shoal_root_live {
    struct shoal_root_live *next;
    pthread_t tid;
    shoal_boot_root_key_t key;
    int stop_efd;                 /* written to ask the thread to stop at once */
    int stop;                     /* atomic */
    int fail;                     /* atomic: a rank of this process failed its init */
    int over;                     /* under shoal_roots_lock: the thread's work is over */
    int timeout_ms;               /* atomic: the idle timeout, raised by shoal_boot_root_extend */
    pid_t pid;                    /* the process that runs the thread */
    int listen_fd;                /* under shoal_roots_lock: -1 once the thread closes it */
} shoal_root_live_t;

static pthread_mutex_t shoal_roots_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t shoal_roots_cond = PTHREAD_COND_INITIALIZER;
static shoal_root_live_t *shoal_roots;

static void shoal_root_live_free(shoal_root_live_t *l)
{
    close(l->stop_efd);
    free(l);
}

/* A root listed in a process that forked after it started: the list came with the memory, the
 * thread did not (a child of a parent that made the unique id). The child waited forever for
 * it at destroy, or joined a thread of its parent. */
static int shoal_root_inherited(const shoal_root_live_t *l)
{
    return l->pid != getpid();
}

/* Joins and frees every root whose thread is over; drops the entries inherited over a fork. */
static void shoal_roots_reap(void)
{
    shoal_root_live_t *over = NULL, **pp;

    pthread_mutex_lock(&shoal_roots_lock);
    for (pp = &shoal_roots; *pp != NULL;) {
        shoal_root_live_t *l = *pp;
        if (l->over || shoal_root_inherited(l)) {
            *pp = l->next;
            l->next = over;
            over = l;
        } else {
            pp = &l->next;
        }
    }
    pthread_mutex_unlock(&shoal_roots_lock);
    while (over != NULL) {
        shoal_root_live_t *next = over->next;
        if (!shoal_root_inherited(over)) {
            pthread_join(over->tid, NULL);
        } else if (over->listen_fd >= 0) {
            close(over->listen_fd); /* the child's copy: the port closes with the root */
        }
        shoal_root_live_free(over);
        over = next;
    }
}

/* Under shoal_roots_lock: one wait of at most 10 ms for a root's thread to end. The condition
 * variable's clock is CLOCK_REALTIME: callers keep their deadlines on the monotonic clock. */
static void shoal_roots_cond_step(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 10 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&shoal_roots_cond, &shoal_roots_lock, &ts);
}

/* Under shoal_roots_lock: until l's thread is over or the deadline (monotonic) passes. */
static void shoal_roots_wait_over(shoal_root_live_t *l, uint64_t deadline)
{
    while (!l->over && !shoal_deadline_passed(deadline)) {
        shoal_roots_cond_step();
    }
}

void shoal_boot_root_key(const shoal_boot_uid_t *u, shoal_boot_root_key_t *k)
{
    static const char label[] = "shoal-boot-root-tag";
    uint8_t mac[SHOAL_HMAC_BYTES] = {0};

    memset(k, 0, sizeof(*k));
    memcpy(&k->addr, &u->root, SHOAL_MIN((size_t)u->root_len, sizeof(k->addr)));
    k->len = u->root_len;
    /* a failed HMAC leaves the zero tag: at worst a root not waited for, never another's */
    (void)shoal_hmac(u->secret, sizeof(u->secret), label, sizeof(label) - 1, mac);
    memcpy(k->tag, mac, sizeof(k->tag));
    shoal_secret_wipe(mac, sizeof(mac));
}

void shoal_boot_root_wait(const shoal_boot_root_key_t *k, int grace_ms, int stop)
{
    uint64_t deadline = shoal_deadline_ns(grace_ms);
    shoal_root_live_t *l;
    uint64_t one = 1;

    pthread_mutex_lock(&shoal_roots_lock);
    for (l = shoal_roots; l != NULL; l = l->next) {
        if (l->key.len == k->len && memcmp(&l->key.addr, &k->addr, k->len) == 0 &&
            memcmp(l->key.tag, k->tag, sizeof(k->tag)) == 0) {
            break;
        }
    }
    if (l == NULL || shoal_root_inherited(l)) { /* not a root of this process */
        pthread_mutex_unlock(&shoal_roots_lock);
        shoal_roots_reap();
        return;
    }
    shoal_roots_wait_over(l, deadline);
    if (!l->over && !stop) { /* it still has ranks to tell of a failure: left running */
        pthread_mutex_unlock(&shoal_roots_lock);
        return;
    }
    if (!l->over) {
        shoal_info(BOOT, "root: not done after %d ms (a rank did not say bye); stopped",
                    grace_ms);
        __atomic_store_n(&l->stop, 1, __ATOMIC_RELEASE);
        (void)!write(l->stop_efd, &one, sizeof(one));
        /* it sees the stop within one poll; a send it is in ends at its own deadline */
        int bound_ms = SHOAL_MAX(grace_ms, 5000);
        shoal_roots_wait_over(l, shoal_deadline_ns(bound_ms));
        if (!l->over) {
            shoal_warn(BOOT, "root: its thread did not stop within %d ms; left to end by itself",
                       bound_ms);
        }
    }
    pthread_mutex_unlock(&shoal_roots_lock);
    shoal_roots_reap();
}

/* At exit, before libcrypto's cleanup: a root that no communicator of this process waited
 * for (the launcher's, as shoalrun's; one whose rank failed its init; an id never used here)
 * still runs, and a rank's hello it verifies as exit() runs crashed the process in HMAC
 * (1 exit in 300 while 8 ranks joined). Every root of this process is stopped, and the exit
 * waits until their threads are over, SHOAL_ROOT_EXIT_WAIT_MS at most (a root's write to a
 * rank that reads nothing may block up to its deadline; the exit does not). */
#define SHOAL_ROOT_EXIT_WAIT_MS 2000

static void shoal_roots_atexit(void)
{
    uint64_t deadline = shoal_deadline_ns(SHOAL_ROOT_EXIT_WAIT_MS);
    pid_t me = getpid();
    uint64_t one = 1;
    int busy;

    pthread_mutex_lock(&shoal_roots_lock);
    do {
        busy = 0;
        for (shoal_root_live_t *l = shoal_roots; l != NULL; l = l->next) {
            if (l->pid == me && !l->over) {
                if (!__atomic_exchange_n(&l->stop, 1, __ATOMIC_ACQ_REL)) {
                    (void)!write(l->stop_efd, &one, sizeof(one));
                }
                busy = 1;
            }
        }
        if (busy) {
            shoal_roots_cond_step();
        }
    } while (busy && !shoal_deadline_passed(deadline));
    pthread_mutex_unlock(&shoal_roots_lock);
    shoal_roots_reap(); /* joined: a thread over but not joined is a leak (ThreadSanitizer) */
}

/* libcrypto first, so that its atexit cleanup is registered before ours and runs after. */
static void shoal_roots_atexit_register(void)
{
    shoal_crypto_init();
    (void)atexit(shoal_roots_atexit);
}

void shoal_boot_root_extend(const shoal_boot_root_key_t *k, int timeout_ms)
{
    pthread_mutex_lock(&shoal_roots_lock);
    for (shoal_root_live_t *l = shoal_roots; l != NULL; l = l->next) {
        if (l->pid == getpid() && !l->over && l->key.len == k->len &&
            memcmp(&l->key.addr, &k->addr, k->len) == 0 &&
            memcmp(l->key.tag, k->tag, sizeof(k->tag)) == 0) {
            int cur = __atomic_load_n(&l->timeout_ms, __ATOMIC_RELAXED);
            if (cur >= 0 && (timeout_ms < 0 || timeout_ms > cur)) {
                shoal_info(BOOT, "root: idle timeout raised from %d to %d ms by a rank of this "
                            "process", cur, timeout_ms);
                __atomic_store_n(&l->timeout_ms, timeout_ms, __ATOMIC_RELAXED);
            }
            break;
        }
    }
    pthread_mutex_unlock(&shoal_roots_lock);
}

void shoal_boot_root_fail(const shoal_boot_root_key_t *k)
{
    uint64_t one = 1;

    pthread_mutex_lock(&shoal_roots_lock);
    for (shoal_root_live_t *l = shoal_roots; l != NULL; l = l->next) {
        if (l->pid == getpid() && !l->over && l->key.len == k->len &&
            memcmp(&l->key.addr, &k->addr, k->len) == 0 &&
            memcmp(l->key.tag, k->tag, sizeof(k->tag)) == 0) {
            __atomic_store_n(&l->fail, 1, __ATOMIC_RELEASE);
            (void)!write(l->stop_efd, &one, sizeof(one));
            break;
        }
    }
    pthread_mutex_unlock(&shoal_roots_lock);
}

static void *shoal_root_thread(void *arg)
{
    shoal_root_t *r = arg;
    shoal_root_live_t *live = r->live;
    uint64_t idle_deadline = shoal_deadline_ns(r->timeout_ms);
    struct pollfd *pfds = NULL;

    while (!shoal_root_finished(r) && !__atomic_load_n(&live->stop, __ATOMIC_ACQUIRE)) {
        int npfds = 0, ret, told_before = r->told, joined_before = r->joined;
        struct pollfd *np = realloc(pfds, sizeof(*pfds) * (size_t)(r->ncl + 2));
        uint32_t round_before = r->round;
        int timeout_ms = __atomic_load_n(&live->timeout_ms, __ATOMIC_RELAXED);
        shoal_status_t st;
        if (timeout_ms != r->timeout_ms) { /* raised by a rank of this process */
            r->timeout_ms = timeout_ms;
            idle_deadline = shoal_deadline_ns(timeout_ms);
        }
        if (np == NULL) {
            shoal_error(BOOT, "root: out of memory");
            break;
        }
        pfds = np;
        /* No room for a newcomer: the listen socket is left out (poll skips a negative fd)
         * until a slot frees or the oldest pending connection's grace is over. */
        int room_wait = 200, room = shoal_root_room(r, &room_wait);
        if (r->accept_stall.since_ns != 0) { /* accept() failed for want of a resource */
            room = 0;
            room_wait = SHOAL_MIN(room_wait, 50);
        }
        pfds[npfds++] = (struct pollfd){.fd = room ? r->listen_fd : -1, .events = POLLIN};
        pfds[npfds++] = (struct pollfd){.fd = live->stop_efd, .events = POLLIN};
        for (int i = 0; i < r->ncl; i++) {
            if (r->cl[i].fd >= 0 && shoal_root_client_live(&r->cl[i])) {
                pfds[npfds++] = (struct pollfd){.fd = r->cl[i].fd, .events = POLLIN};
            }
        }
        ret = poll(pfds, (nfds_t)npfds,
                   SHOAL_MIN(shoal_deadline_left_ms(idle_deadline, 200), room_wait));
        if (ret < 0 && errno != EINTR) {
            shoal_error(BOOT, "root: poll failed: %s", strerror(errno));
            break;
        }
        if ((ret > 0 && (pfds[0].revents & POLLIN)) || r->accept_stall.since_ns != 0) {
            shoal_root_accept(r);
        }
        if (ret > 0 && (pfds[1].revents & POLLIN)) {
            uint64_t n;
            (void)!read(live->stop_efd, &n, sizeof(n)); /* drained: a fail goes on polling */
        }
        if (__atomic_load_n(&live->fail, __ATOMIC_ACQUIRE) && !r->failed_here) {
            r->failed_here = 1;
            if (r->failed == SHOAL_OK) {
                shoal_root_fail(r, SHOAL_ERR_PEER_FAILED);
            }
            idle_deadline = shoal_deadline_ns(r->timeout_ms);
        }
        st = shoal_root_serve(r);
        if (st != SHOAL_OK) {
            shoal_root_fail(r, st);
            idle_deadline = shoal_deadline_ns(r->timeout_ms);
            continue;
        }
        if (r->round != round_before || r->joined != joined_before || r->told != told_before) {
            idle_deadline = shoal_deadline_ns(r->timeout_ms);
        } else if (shoal_deadline_passed(idle_deadline)) {
            if (r->failed == SHOAL_OK) {
                shoal_error(BOOT, "root: no progress for %d ms (%d of %d ranks joined, round "
                            "%u); giving up", r->timeout_ms, r->joined, r->nranks, r->round);
                /* The joined ranks learn why: a closed connection read as a root whose
                 * process failed ("peer process failed") while it lives on. */
                shoal_root_fail(r, SHOAL_ERR_TIMEOUT);
            }
            break;
        }
    }
    if (r->failed == SHOAL_OK && shoal_root_finished(r)) {
        shoal_info(BOOT, "root: all %d ranks done in %u rounds: %llu bytes in, %llu bytes out "
                   "(%u strangers refused)", r->nranks, r->round,
                   (unsigned long long)r->bytes_in, (unsigned long long)r->bytes_out,
                   r->refused);
    }
    free(pfds);
    pthread_mutex_lock(&shoal_roots_lock);
    live->listen_fd = -1; /* before the close: a child forked later must not close it */
    pthread_mutex_unlock(&shoal_roots_lock);
    shoal_boot_root_free(r);
    pthread_mutex_lock(&shoal_roots_lock);
    live->over = 1;
    pthread_cond_broadcast(&shoal_roots_cond);
    pthread_mutex_unlock(&shoal_roots_lock);
    return NULL;
}

void (*shoal_boot_root_started_hook)(const shoal_boot_uid_t *u);

/* Listens on addr (or every interface at its port when bind_any); fills u's address. */
static shoal_status_t shoal_boot_root_listen(const struct sockaddr_storage *addr, socklen_t len,
                                             int bind_any, shoal_boot_uid_t *u, int *fd_p)
{
    struct sockaddr_storage where, got;
    socklen_t glen = sizeof(got);
    char a[80];
    int one = 1, fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    if (fd < 0) {
        shoal_error(BOOT, "socket() for the bootstrap root failed: %s", strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    memset(&where, 0, sizeof(where));
    memcpy(&where, addr, len);
    if (bind_any && where.ss_family == AF_INET) {
        ((struct sockaddr_in *)&where)->sin_addr.s_addr = htonl(INADDR_ANY);
    } else if (bind_any) {
        ((struct sockaddr_in6 *)&where)->sin6_addr = in6addr_any;
    }
    shoal_sockaddr_str(&where, a, sizeof(a));
    if (bind(fd, (struct sockaddr *)&where, len) != 0 || listen(fd, 1024) != 0 ||
        getsockname(fd, (struct sockaddr *)&got, &glen) != 0) {
        shoal_error(BOOT, "bootstrap root cannot listen on %s: %s", a, strerror(errno));
        close(fd);
        return SHOAL_ERR_SYSTEM;
    }
    memcpy(&u->root, addr, len);
    u->root_len = len;
    if (got.ss_family == AF_INET) {
        ((struct sockaddr_in *)&u->root)->sin_port = ((struct sockaddr_in *)&got)->sin_port;
    } else {
        ((struct sockaddr_in6 *)&u->root)->sin6_port = ((struct sockaddr_in6 *)&got)->sin6_port;
    }
    shoal_sockaddr_str(&got, a, sizeof(a));
    shoal_trace(BOOT, "bootstrap root listening on %s", a);
    *fd_p = fd;
    return SHOAL_OK;
}

shoal_status_t shoal_boot_root_start(const struct sockaddr_storage *addr, socklen_t len,
                                     int bind_any, int timeout_ms, shoal_boot_uid_t *u)
{
    shoal_root_live_t *live;
    shoal_root_t *r = NULL;
    shoal_status_t st;
    int fd = -1, ret;

    static pthread_once_t atexit_once = PTHREAD_ONCE_INIT;

    pthread_once(&atexit_once, shoal_roots_atexit_register);
    shoal_roots_reap();
    live = calloc(1, sizeof(*live));
    if (live == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    live->stop_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (live->stop_efd < 0) {
        shoal_error(BOOT, "eventfd for the bootstrap root failed: %s", strerror(errno));
        free(live);
        return SHOAL_ERR_SYSTEM;
    }
    SHOAL_CHECK_GOTO(shoal_boot_root_listen(addr, len, bind_any, u, &fd), st, err_live);
    if (shoal_boot_root_new(u, fd, timeout_ms, &r) != SHOAL_OK) {
        close(fd);
        st = SHOAL_ERR_NO_MEMORY;
        goto err_live;
    }
    r->live = live;
    live->timeout_ms = timeout_ms;
    live->pid = getpid();
    live->listen_fd = fd;
    shoal_boot_root_key(u, &live->key);
    ret = pthread_create(&live->tid, NULL, shoal_root_thread, r);
    if (ret != 0) {
        shoal_error(BOOT, "pthread_create for the bootstrap root failed: %s", strerror(ret));
        shoal_boot_root_free(r);
        st = SHOAL_ERR_SYSTEM;
        goto err_live;
    }
    pthread_mutex_lock(&shoal_roots_lock);
    live->next = shoal_roots;
    shoal_roots = live;
    pthread_mutex_unlock(&shoal_roots_lock);
    if (shoal_boot_root_started_hook != NULL) {
        shoal_boot_root_started_hook(u);
    }
    return SHOAL_OK;

err_live:
    shoal_root_live_free(live);
    return st;
}
