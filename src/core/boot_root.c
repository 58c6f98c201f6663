/*
 * The rendezvous root: one thread per communicator being created. It serves joins and
 * allgather rounds from a single poll loop; every socket is non-blocking, every frame is
 * validated before it is believed, and the whole thing gives up after SHOAL_TIMEOUT_MS
 * without progress.
 */
#include "core/core.h"
#include "core/boot_proto.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    uint64_t deadline_ns;               /* handshake deadline while pending */
    uint8_t nonce[SHOAL_BOOT_NONCE];    /* our challenge */
    shoal_boot_frame_t hdr;             /* frame being read */
    size_t hdr_have;
    uint8_t *payload;                   /* frame payload being read (hello or blob) */
    size_t payload_have;
    uint32_t round_sent;                /* rounds this rank has contributed */
} shoal_root_client_t;

typedef struct {
    int listen_fd;
    uint8_t secret[SHOAL_SECRET_BYTES];
    int timeout_ms;
    int nranks;                         /* 0 until the first valid hello */
    int joined;
    int done;
    shoal_root_client_t *cl;            /* [ncl] */
    int ncl;
    int *rank_cl;                       /* [nranks]: client index of each rank */
    uint32_t round;                     /* current allgather round */
    uint32_t blob_len;                  /* this round's per-rank length */
    int have;                           /* contributions to this round */
    uint8_t *table;                     /* nranks * blob_len */
    unsigned refused;
} shoal_root_t;

static void shoal_root_client_close(shoal_root_t *r, int i)
{
    shoal_root_client_t *c = &r->cl[i];
    if (c->fd >= 0) {
        close(c->fd);
    }
    if (c->state != SHOAL_ROOT_CL_JOINED) {
        free(c->payload);
    }
    memset(c, 0, sizeof(*c));
    c->fd = -1;
}

static void shoal_root_refuse(shoal_root_t *r, int i, shoal_status_t why, const char *what)
{
    shoal_root_client_t *c = &r->cl[i];
    shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_REFUSED,
                            .len = 0, .round = (uint32_t)(int32_t)why};
    r->refused++;
    shoal_error(BOOT, "root refused connection from %s: %s (%u refused so far)", c->peer, what,
                r->refused);
    /* Best effort; never wait on a stranger. */
    (void)!send(c->fd, &f, sizeof(f), MSG_NOSIGNAL | MSG_DONTWAIT);
    shoal_root_client_close(r, i);
}

static int shoal_root_add_client(shoal_root_t *r, int fd, const struct sockaddr_storage *ss)
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
         * redials if it is evicted anyway). */
        int oldest = -1;
        for (i = 0; i < r->ncl; i++) {
            if (r->cl[i].state == SHOAL_ROOT_CL_PENDING &&
                (oldest < 0 || r->cl[i].deadline_ns < r->cl[oldest].deadline_ns)) {
                oldest = i;
            }
        }
        shoal_root_refuse(r, oldest, SHOAL_ERR_PROTOCOL,
                          "evicted: too many unauthenticated connections");
        if (slot < 0) {
            slot = oldest;
        }
    }
    if (slot < 0) {
        shoal_root_client_t *ncl = realloc(r->cl, sizeof(*ncl) * (size_t)(r->ncl + 16));
        if (ncl == NULL) {
            close(fd);
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
    shoal_root_client_t *c = &r->cl[slot];
    c->fd = fd;
    c->state = SHOAL_ROOT_CL_PENDING;
    c->rank = -1;
    c->deadline_ns = shoal_deadline_ns(r->timeout_ms < 0 ? 60000 : SHOAL_MIN(r->timeout_ms, 60000));
    shoal_sockaddr_str(ss, c->peer, sizeof(c->peer));
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
    if (send(fd, msg, sizeof(msg), MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof(msg)) {
        shoal_root_client_close(r, slot);
        return -1;
    }
    return slot;
}

static void shoal_root_accept(shoal_root_t *r)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        int fd = accept4(r->listen_fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                errno != ECONNABORTED) {
                shoal_warn(BOOT, "root accept failed: %s", strerror(errno));
            }
            return;
        }
        shoal_root_add_client(r, fd, &ss);
    }
}

/* Mutual authentication: verify the client's proof, answer with ours. */
static shoal_status_t shoal_root_on_hello(shoal_root_t *r, int i)
{
    shoal_root_client_t *c = &r->cl[i];
    shoal_boot_hello_t h;
    uint8_t mac[SHOAL_HMAC_BYTES];

    memcpy(&h, c->payload, sizeof(h));
    shoal_boot_hello_mac(r->secret, c->nonce, &h, mac);
    if (!shoal_memeq_ct(mac, h.mac, sizeof(mac))) {
        shoal_root_refuse(r, i, SHOAL_ERR_AUTH, "wrong job secret (bad HMAC proof)");
        return SHOAL_ERR_AUTH;
    }
    if (h.nranks <= 0 || h.nranks > SHOAL_BOOT_MAX_RANKS || h.rank < 0 || h.rank >= h.nranks ||
        (r->nranks != 0 && h.nranks != r->nranks)) {
        char what[128];
        snprintf(what, sizeof(what), "rank %d of %d does not fit a job of %d ranks", h.rank,
                 h.nranks, r->nranks);
        shoal_root_refuse(r, i, SHOAL_ERR_INVALID_ARG, what);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (r->nranks == 0) {
        r->rank_cl = malloc(sizeof(int) * (size_t)h.nranks);
        if (r->rank_cl == NULL) {
            return SHOAL_ERR_NO_MEMORY;
        }
        for (int k = 0; k < h.nranks; k++) {
            r->rank_cl[k] = -1;
        }
        r->nranks = h.nranks;
    }
    if (r->rank_cl[h.rank] >= 0) {
        shoal_root_refuse(r, i, SHOAL_ERR_INVALID_ARG, "rank joined twice");
        return SHOAL_ERR_INVALID_ARG;
    }
    shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_WELCOME,
                            .len = SHOAL_HMAC_BYTES, .round = 0};
    uint8_t msg[sizeof(f) + SHOAL_HMAC_BYTES];
    shoal_boot_welcome_mac(r->secret, h.nonce, h.rank, mac);
    memcpy(msg, &f, sizeof(f));
    memcpy(msg + sizeof(f), mac, sizeof(mac));
    if (shoal_sock_write_all(c->fd, msg, sizeof(msg), shoal_deadline_ns(r->timeout_ms), NULL) !=
        SHOAL_OK) {
        shoal_root_client_close(r, i);
        return SHOAL_ERR_TRANSPORT;
    }
    free(c->payload);
    c->payload = NULL;
    c->state = SHOAL_ROOT_CL_JOINED;
    c->rank = h.rank;
    r->rank_cl[h.rank] = i;
    r->joined++;
    shoal_trace(BOOT, "root: rank %d of %d joined from %s", h.rank, h.nranks, c->peer);
    return SHOAL_OK;
}

static shoal_status_t shoal_root_round_begin(shoal_root_t *r, uint32_t len)
{
    size_t total = (size_t)r->nranks * len;
    uint8_t *t = realloc(r->table, total > 0 ? total : 1);
    if (t == NULL) {
        shoal_error(BOOT, "root: cannot allocate %zu bytes for round %u", total, r->round);
        return SHOAL_ERR_NO_MEMORY;
    }
    r->table = t;
    r->blob_len = len;
    return SHOAL_OK;
}

/* Every rank contributed: send the table to all, start the next round. */
static shoal_status_t shoal_root_round_finish(shoal_root_t *r)
{
    shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_AG,
                            .len = (uint32_t)((size_t)r->nranks * r->blob_len),
                            .round = r->round};
    uint64_t deadline = shoal_deadline_ns(r->timeout_ms);
    for (int k = 0; k < r->nranks; k++) {
        int fd = r->cl[r->rank_cl[k]].fd;
        shoal_status_t st = shoal_sock_write_all(fd, &f, sizeof(f), deadline, NULL);
        if (st == SHOAL_OK) {
            st = shoal_sock_write_all(fd, r->table, f.len, deadline, NULL);
        }
        if (st != SHOAL_OK) {
            shoal_error(BOOT, "root: sending round %u to rank %d failed: %s", r->round, k,
                        shoal_strerror(st));
            return st;
        }
    }
    r->round++;
    r->have = 0;
    r->blob_len = 0;
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
    if (h->type != SHOAL_BOOT_AG || h->round != r->round || c->round_sent != r->round ||
        h->len > SHOAL_BOOT_MAX_BLOB || (r->have > 0 && h->len != r->blob_len)) {
        *why = "allgather frame out of order or of the wrong size";
        return SHOAL_ERR_PROTOCOL;
    }
    return SHOAL_OK;
}

/* Reads what is available from client i. Returns SHOAL_OK, or a fatal bootstrap error (a
 * joined rank misbehaved or left): then every rank must be told. */
static shoal_status_t shoal_root_read(shoal_root_t *r, int i)
{
    shoal_root_client_t *c = &r->cl[i];
    const char *why = NULL;
    for (;;) {
        uint8_t *dst;
        size_t want;
        ssize_t n;
        int in_hdr = c->hdr_have < sizeof(c->hdr);

        if (in_hdr) {
            dst = (uint8_t *)&c->hdr + c->hdr_have;
            want = sizeof(c->hdr) - c->hdr_have;
        } else if (c->state == SHOAL_ROOT_CL_PENDING) {
            dst = c->payload + c->payload_have;
            want = c->hdr.len - c->payload_have;
        } else {
            dst = r->table + (size_t)c->rank * r->blob_len + c->payload_have;
            want = c->hdr.len - c->payload_have;
        }
        n = want == 0 ? 0 : recv(c->fd, dst, want, MSG_DONTWAIT);
        if (want != 0 && n == 0) {
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
                shoal_root_client_close(r, i);
                return SHOAL_OK;
            }
            shoal_error(BOOT, "root: read from rank %d (%s) failed: %s", c->rank, c->peer,
                        strerror(errno));
            return SHOAL_ERR_PEER_FAILED;
        }
        if (in_hdr) {
            c->hdr_have += (size_t)n;
            if (c->hdr_have < sizeof(c->hdr)) {
                continue;
            }
            if (shoal_root_check_hdr(r, c, &why) != SHOAL_OK) {
                if (c->state == SHOAL_ROOT_CL_PENDING) {
                    shoal_root_refuse(r, i, SHOAL_ERR_PROTOCOL, why);
                    return SHOAL_OK;
                }
                shoal_error(BOOT, "root: rank %d (%s) sent a bad frame: %s", c->rank, c->peer,
                            why);
                return SHOAL_ERR_PROTOCOL;
            }
            if (c->state == SHOAL_ROOT_CL_PENDING) {
                c->payload = malloc(sizeof(shoal_boot_hello_t));
                if (c->payload == NULL) {
                    return SHOAL_ERR_NO_MEMORY;
                }
            } else if (c->hdr.type == SHOAL_BOOT_AG && r->have == 0) {
                shoal_status_t st = shoal_root_round_begin(r, c->hdr.len);
                if (st != SHOAL_OK) {
                    return st;
                }
            }
            c->payload_have = 0;
        } else {
            c->payload_have += (size_t)n;
        }
        if (c->hdr_have < sizeof(c->hdr) || c->payload_have < c->hdr.len) {
            continue;
        }
        /* A whole frame. */
        c->hdr_have = 0;
        c->payload_have = 0;
        if (c->state == SHOAL_ROOT_CL_PENDING) {
            shoal_status_t st = shoal_root_on_hello(r, i);
            if (st == SHOAL_ERR_NO_MEMORY) {
                return st;
            }
            return SHOAL_OK; /* refused clients are already closed */
        }
        if (c->hdr.type == SHOAL_BOOT_BYE) {
            c->state = SHOAL_ROOT_CL_DONE;
            r->done++;
            return SHOAL_OK;
        }
        c->round_sent++;
        if (++r->have == r->nranks && r->joined == r->nranks) {
            return shoal_root_round_finish(r);
        }
    }
}

static void shoal_root_fini(shoal_root_t *r)
{
    for (int i = 0; i < r->ncl; i++) {
        if (r->cl[i].fd >= 0) {
            shoal_root_client_close(r, i);
        }
    }
    free(r->cl);
    free(r->rank_cl);
    free(r->table);
    close(r->listen_fd);
    shoal_secret_wipe(r->secret, sizeof(r->secret));
    free(r);
}

static void *shoal_root_thread(void *arg)
{
    shoal_root_t *r = arg;
    uint64_t idle_deadline = shoal_deadline_ns(r->timeout_ms);
    struct pollfd *pfds = NULL;
    int npfds = 0;
    shoal_status_t st = SHOAL_OK;

    while (r->nranks == 0 || r->done < r->nranks) {
        int n = 0, ret;
        struct pollfd *np = realloc(pfds, sizeof(*pfds) * (size_t)(r->ncl + 1));
        uint32_t round_before = r->round;
        int joined_before = r->joined;
        if (np == NULL) {
            st = SHOAL_ERR_NO_MEMORY;
            break;
        }
        pfds = np;
        npfds = 0;
        pfds[npfds++] = (struct pollfd){.fd = r->listen_fd, .events = POLLIN};
        for (int i = 0; i < r->ncl; i++) {
            if (r->cl[i].fd >= 0 && r->cl[i].state != SHOAL_ROOT_CL_DONE) {
                pfds[npfds++] = (struct pollfd){.fd = r->cl[i].fd, .events = POLLIN};
            }
        }
        ret = poll(pfds, (nfds_t)npfds, shoal_deadline_left_ms(idle_deadline, 200));
        if (ret < 0 && errno != EINTR) {
            shoal_error(BOOT, "root: poll failed: %s", strerror(errno));
            st = SHOAL_ERR_SYSTEM;
            break;
        }
        if (ret > 0 && (pfds[0].revents & POLLIN)) {
            shoal_root_accept(r);
        }
        for (int i = 0; i < r->ncl && st == SHOAL_OK; i++) {
            shoal_root_client_t *c = &r->cl[i];
            if (c->fd < 0 || c->state == SHOAL_ROOT_CL_DONE) {
                continue;
            }
            if (c->state == SHOAL_ROOT_CL_PENDING && shoal_deadline_passed(c->deadline_ns)) {
                shoal_root_refuse(r, i, SHOAL_ERR_TIMEOUT, "no hello in time");
                continue;
            }
            st = shoal_root_read(r, i);
            n++;
        }
        if (st != SHOAL_OK) {
            break;
        }
        if (r->round != round_before || r->joined != joined_before) {
            idle_deadline = shoal_deadline_ns(r->timeout_ms);
        } else if (shoal_deadline_passed(idle_deadline)) {
            shoal_error(BOOT, "root: no progress for %d ms (%d of %d ranks joined, round %u); "
                        "giving up", r->timeout_ms, r->joined, r->nranks, r->round);
            st = SHOAL_ERR_TIMEOUT;
            break;
        }
    }
    if (st != SHOAL_OK) {
        shoal_warn(BOOT, "root: bootstrap failed (%s); closing every rank's connection",
                   shoal_strerror(st));
    } else {
        shoal_trace(BOOT, "root: all %d ranks done (%u strangers refused)", r->nranks, r->refused);
    }
    free(pfds);
    shoal_root_fini(r);
    return NULL;
}

shoal_status_t shoal_boot_root_start(const struct sockaddr_storage *bind_addr, socklen_t len,
                                     int keep_secret, shoal_boot_uid_t *u)
{
    shoal_root_t *r = calloc(1, sizeof(*r));
    struct sockaddr_storage any;
    socklen_t alen = sizeof(any);
    pthread_attr_t attr;
    pthread_t tid;
    int one = 1, ret;

    if (r == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    r->timeout_ms = shoal_core_config.timeout_ms;
    r->listen_fd = socket(bind_addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (r->listen_fd < 0) {
        shoal_error(BOOT, "socket() for the bootstrap root failed: %s", strerror(errno));
        free(r);
        return SHOAL_ERR_SYSTEM;
    }
    setsockopt(r->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    /* Listen on every interface at the published port: reachable from other namespaces. */
    memset(&any, 0, sizeof(any));
    any.ss_family = bind_addr->ss_family;
    memcpy(&any, bind_addr, len);
    if (any.ss_family == AF_INET) {
        ((struct sockaddr_in *)&any)->sin_addr.s_addr = htonl(INADDR_ANY);
    } else {
        ((struct sockaddr_in6 *)&any)->sin6_addr = in6addr_any;
    }
    if (bind(r->listen_fd, (struct sockaddr *)&any, len) != 0 || listen(r->listen_fd, 1024) != 0 ||
        getsockname(r->listen_fd, (struct sockaddr *)&any, &alen) != 0) {
        char a[80];
        shoal_sockaddr_str(bind_addr, a, sizeof(a));
        shoal_error(BOOT, "bootstrap root cannot listen on %s: %s", a, strerror(errno));
        close(r->listen_fd);
        free(r);
        return SHOAL_ERR_SYSTEM;
    }
    memcpy(&u->root, bind_addr, len);
    u->root_len = len;
    if (any.ss_family == AF_INET) {
        ((struct sockaddr_in *)&u->root)->sin_port = ((struct sockaddr_in *)&any)->sin_port;
    } else {
        ((struct sockaddr_in6 *)&u->root)->sin6_port = ((struct sockaddr_in6 *)&any)->sin6_port;
    }
    if (!keep_secret && shoal_random_bytes(u->secret, sizeof(u->secret)) != SHOAL_OK) {
        close(r->listen_fd);
        free(r);
        return SHOAL_ERR_SYSTEM;
    }
    memcpy(r->secret, u->secret, sizeof(r->secret));
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    ret = pthread_create(&tid, &attr, shoal_root_thread, r);
    pthread_attr_destroy(&attr);
    if (ret != 0) {
        shoal_error(BOOT, "pthread_create for the bootstrap root failed: %s", strerror(ret));
        close(r->listen_fd);
        free(r);
        return SHOAL_ERR_SYSTEM;
    }
    return SHOAL_OK;
}
