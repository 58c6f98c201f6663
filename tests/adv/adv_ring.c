/*
 * The ring exchange of the bootstrap under attack (SHOAL_BOOT_EXCHANGE=ring, the default):
 * each case runs a real job of adv_rank processes against a root in this process, which tells
 * the test every rank's peer listener (shoal_boot_root_ring_hook) before it answers the RING
 * round. Strangers, ranks of another tenant and garbage then attack a rank's listener, a relay
 * tampers with a ring link, or a rank dies in the middle of the exchange. Every case ends with
 * the job unharmed or with a clear status on every real rank well before SHOAL_TIMEOUT_MS.
 * TAP on stdout.
 */
#include "core/core.h"
#include "tests/adv/adv_lib.h"
#include "tests/tap.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static const char *const ring_env[] = {"SHOAL_TENANT=acme", "SHOAL_JOB=train-7",
                                       "SHOAL_EPOCH=3", NULL};
static const char *const root_env[] = {"SHOAL_TENANT=acme", "SHOAL_JOB=train-7",
                                       "SHOAL_EPOCH=3", "SHOAL_BOOT_EXCHANGE=root", NULL};

#define RING_N 4

enum { RING_WATCH = 0, RING_STRANGERS, RING_TAMPER, RING_KILL, RING_FLOOD };
#define FLOOD_HOLD 256                   /* connections a flood holds open at once */

/* Stranger kinds against rank 1's listener. */
enum { ST_GARBAGE = 0, ST_SECRET, ST_TENANT, ST_RANK, ST_IDLE, ST_N };
static const char *const st_names[ST_N] = {"garbage", "wrong secret", "another tenant",
                                           "wrong rank", "idle"};

/* The hook runs on the root's thread (the library's, detached): it holds ring_lock while it
 * writes, and ring_end takes the lock before the test reads what it wrote. */
static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
    int mode;
    int calls;                           /* RING rounds the root answered */
    int nranks;
    uint8_t recs[RING_N * SHOAL_BOOT_RING_REC];
    shoal_boot_uid_t u;                  /* the job's root, secret and identity */
    int fds[ST_N];
    int got[ST_N];                       /* 1: refused; 0: EOF; -1 no answer; -2 other */
    int32_t why[ST_N];
    pid_t pid[2];                        /* ranks 0 and 1 for the hook and its threads (adv_wait
                                          * zeroes p[i].pid while they may still run) */
    pthread_t th;
    int th_started;
    shoal_boot_uid_t flood_at;           /* rank 1's listener */
    int flood_made;                      /* connections the flood opened */
    adv_proxy_t px;
} ring;

/* Signals rank i (0 or 1) of the job; never pid 0 or -1 (a spawn that failed): those would
 * signal the test's own process group, or every process. */
static void ring_signal(int i, int sig)
{
    if (ring.pid[i] > 0) {
        kill(ring.pid[i], sig);
    }
}

static void ring_rec_addr(const uint8_t *rec, shoal_boot_uid_t *to)
{
    struct sockaddr_in *s4 = (struct sockaddr_in *)&to->root;
    uint16_t family, port;
    memcpy(&family, rec, 2);
    memcpy(&port, rec + 2, 2);
    memset(&to->root, 0, sizeof(to->root));
    s4->sin_family = family;
    s4->sin_port = port;
    memcpy(&s4->sin_addr, rec + 4, 4);
    to->root_len = sizeof(*s4);
}

/* The strangers do their part once the root answered; rank 0 (the real previous rank of rank
 * 1) is stopped until every stranger has been answered, so that no stranger can be cut short
 * by the listener closing when the real rank proves itself. */
static void *ring_strangers(void *arg)
{
    uint8_t nonce[SHOAL_BOOT_NONCE];
    (void)arg;
    for (int k = 0; k < ST_N; k++) {
        int fd = ring.fds[k];
        struct {
            shoal_boot_frame_t f;
            shoal_boot_hello_t h;
        } msg;
        uint8_t secret[SHOAL_SECRET_BYTES];
        ring.got[k] = -1;
        if (fd < 0 || adv_read_challenge(fd, nonce) != 0) {
            ring.got[k] = -2;
            continue;
        }
        if (k == ST_GARBAGE || k == ST_IDLE) {
            continue; /* the garbage went out before the challenge came */
        }
        memset(&msg, 0, sizeof(msg));
        msg.f = (shoal_boot_frame_t){.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_HELLO,
                                     .len = sizeof(msg.h)};
        msg.h.rank = k == ST_RANK ? 2 : 0;
        msg.h.nranks = RING_N;
        msg.h.ident = ring.u.ident;
        if (k == ST_TENANT) {
            adv_ident("globex", "train-7", 3, &msg.h.ident);
        }
        (void)shoal_random_bytes(msg.h.nonce, sizeof(msg.h.nonce));
        memcpy(secret, ring.u.secret, sizeof(secret));
        if (k == ST_SECRET) {
            secret[3] ^= 0x10;
        }
        shoal_boot_peer_hello_mac(secret, nonce, &msg.h, msg.h.mac);
        (void)!send(fd, &msg, sizeof(msg), MSG_NOSIGNAL);
    }
    for (int k = 0; k < ST_N; k++) {
        if (ring.got[k] == -1 && k != ST_IDLE) {
            ring.got[k] = adv_expect_refused(ring.fds[k], 3000, &ring.why[k]);
        }
    }
    ring_signal(0, SIGCONT);
    /* The idle one is closed once the real rank 0 is in. */
    ring.got[ST_IDLE] = adv_expect_refused(ring.fds[ST_IDLE], 4000, &ring.why[ST_IDLE]);
    return NULL;
}

/* Connections to rank 1's listener as fast as they go, FLOOD_HOLD held open (the oldest
 * closed for a new one), none ever sending a byte, for 1.5 s; rank 0, stopped at the root's
 * answer, goes on 200 ms into it and must get through. */
static void *ring_flood(void *arg)
{
    int held[FLOOD_HOLD], next = 0;
    double t0 = adv_now_ms();
    int cont = 0;
    (void)arg;
    for (int i = 0; i < FLOOD_HOLD; i++) {
        held[i] = -1;
    }
    while (adv_now_ms() - t0 < 1500) {
        struct timeval tv = {.tv_sec = 0, .tv_usec = 100000};
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (!cont && adv_now_ms() - t0 > 200) {
            ring_signal(0, SIGCONT);
            cont = 1;
        }
        if (fd < 0) {
            break;
        }
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        if (connect(fd, (const struct sockaddr *)&ring.flood_at.root, ring.flood_at.root_len) !=
            0) {
            close(fd);
            usleep(1000); /* the listener is gone (rank 1 has its neighbour) or full */
            continue;
        }
        if (held[next] >= 0) {
            close(held[next]);
        }
        held[next] = fd;
        next = (next + 1) % FLOOD_HOLD;
        ring.flood_made++;
    }
    if (!cont) {
        ring_signal(0, SIGCONT);
    }
    for (int i = 0; i < FLOOD_HOLD; i++) {
        if (held[i] >= 0) {
            close(held[i]);
        }
    }
    return NULL;
}

static void *ring_killer(void *arg)
{
    (void)arg;
    usleep(300 * 1000);
    ring_signal(1, SIGKILL);
    return NULL;
}

static void ring_hook_locked(int nranks, uint8_t *recs);

static void ring_hook(int nranks, uint8_t *recs)
{
    pthread_mutex_lock(&ring_lock);
    ring_hook_locked(nranks, recs);
    pthread_mutex_unlock(&ring_lock);
}

static void ring_hook_locked(int nranks, uint8_t *recs)
{
    ring.calls++;
    ring.nranks = nranks;
    if (nranks != RING_N) {
        return;
    }
    memcpy(ring.recs, recs, sizeof(ring.recs));
    if (ring.mode == RING_STRANGERS) {
        shoal_boot_uid_t at = ring.u;
        ring_rec_addr(recs + 1 * SHOAL_BOOT_RING_REC, &at);
        ring_signal(0, SIGSTOP);
        for (int k = 0; k < ST_N; k++) {
            ring.fds[k] = adv_dial(&at);
            if (k == ST_GARBAGE && ring.fds[k] >= 0) {
                static const char junk[64] = "GET / HTTP/1.0\r\n\r\n";
                (void)!send(ring.fds[k], junk, sizeof(junk), MSG_NOSIGNAL);
            }
        }
        ring.th_started = pthread_create(&ring.th, NULL, ring_strangers, NULL) == 0;
    } else if (ring.mode == RING_TAMPER) {
        /* Rank 1 dials rank 2 through the relay. Upward: its hello (frame header + hello),
         * then the first ring frame's header: flip a byte of that frame's record. */
        shoal_boot_uid_t up = ring.u, via;
        uint8_t *r2 = recs + 2 * SHOAL_BOOT_RING_REC;
        const struct sockaddr_in *s4;
        ring_rec_addr(r2, &up);
        if (adv_proxy_start(&ring.px, &up, -1, &via) != 0) {
            return;
        }
        __atomic_store_n(&ring.px.flip_up,
                         (long)SHOAL_BOOT_PEER_HELLO_BYTES + (long)sizeof(shoal_boot_frame_t) + 9,
                         __ATOMIC_RELAXED);
        s4 = (const struct sockaddr_in *)&via.root;
        memcpy(r2 + 2, &s4->sin_port, 2);
        memcpy(r2 + 4, &s4->sin_addr, 4);
        ring.th_started = 1;
    } else if (ring.mode == RING_FLOOD) {
        ring.flood_at = ring.u;
        ring_rec_addr(recs + 1 * SHOAL_BOOT_RING_REC, &ring.flood_at);
        ring_signal(0, SIGSTOP);
        ring.th_started = pthread_create(&ring.th, NULL, ring_flood, NULL) == 0;
    } else if (ring.mode == RING_KILL) {
        /* Rank 1 stops before it hears of its neighbours and dies 300 ms later, while ranks 2
         * and 3 are linked and wait in the exchange and rank 0 waits for rank 1's challenge. */
        ring_signal(1, SIGSTOP);
        ring.th_started = pthread_create(&ring.th, NULL, ring_killer, NULL) == 0;
    }
}

/* Starts a root and ranks 0..n-1 of a job of RING_N ranks. */
static void ring_start(int mode, adv_proc_t *p, int n, const char *const *env, char *hex)
{
    pthread_mutex_lock(&ring_lock); /* an earlier case's root thread may still be there */
    memset(&ring, 0, sizeof(ring));
    pthread_mutex_unlock(&ring_lock);
    for (int k = 0; k < ST_N; k++) {
        ring.fds[k] = -1;
    }
    ring.mode = mode;
    if (adv_root("acme", "train-7", 3, &ring.u, hex) != 0) {
        tap_bail("cannot start a root");
    }
    pthread_mutex_lock(&ring_lock); /* the hook and its threads read the pids */
    for (int i = 0; i < n; i++) {
        adv_spawn(&p[i], "init", hex, i, RING_N, env, -1);
        if (i < 2) {
            ring.pid[i] = p[i].pid;
        }
    }
    pthread_mutex_unlock(&ring_lock);
}

static void ring_end(void)
{
    pthread_mutex_lock(&ring_lock); /* what the hook wrote, seen (it is done: the job ended) */
    pthread_mutex_unlock(&ring_lock);
    if (ring.th_started && ring.mode == RING_TAMPER) {
        adv_proxy_stop(&ring.px);
    } else if (ring.th_started) {
        pthread_join(ring.th, NULL);
    }
    for (int k = 0; k < ST_N; k++) {
        if (ring.fds[k] >= 0) {
            close(ring.fds[k]);
        }
    }
}

static void ring_case_sanity(void)
{
    char hex[2 * SHOAL_UID_BYTES + 1];
    adv_proc_t p[RING_N];
    ring_start(RING_WATCH, p, RING_N, ring_env, hex);
    adv_wait(p, RING_N, 3 * ADV_TIMEOUT_MS);
    ring_end();
    adv_diag(p, RING_N, "rank");
    tap_diag("the root answered %d RING round(s) of %d ranks", ring.calls, ring.nranks);
    tap_ok(adv_all(p, RING_N, "SHOAL_OK", 1) && ring.calls == 1 && ring.nranks == RING_N,
           "ring exchange (default): a job of 4 ranks forms through one RING round and computes");
}

static void ring_case_root_mode(void)
{
    char hex[2 * SHOAL_UID_BYTES + 1];
    adv_proc_t p[RING_N];
    ring_start(RING_WATCH, p, RING_N, root_env, hex);
    adv_wait(p, RING_N, 3 * ADV_TIMEOUT_MS);
    ring_end();
    adv_diag(p, RING_N, "rank");
    tap_ok(adv_all(p, RING_N, "SHOAL_OK", 1) && ring.calls == 0,
           "SHOAL_BOOT_EXCHANGE=root: the job forms with no RING round (the root's tables)");
}

/* One rank configured for the root's tables, the others for the ring: the root refuses the
 * mix of round kinds and every rank learns it at once. */
static void ring_case_mixed(void)
{
    char hex[2 * SHOAL_UID_BYTES + 1];
    adv_proc_t p[RING_N];
    int ok = 1;
    ring_start(RING_WATCH, p, RING_N - 1, ring_env, hex);
    adv_spawn(&p[RING_N - 1], "init", hex, RING_N - 1, RING_N, root_env, -1);
    adv_wait(p, RING_N, 3 * ADV_TIMEOUT_MS);
    ring_end();
    adv_diag(p, RING_N, "rank");
    for (int i = 0; i < RING_N; i++) {
        ok = ok && p[i].have_result && strcmp(p[i].status, "SHOAL_OK") != 0 &&
             strcmp(p[i].status, "SHOAL_ERR_TIMEOUT") != 0;
    }
    tap_ok(ok && adv_all_quick(p, RING_N),
           "ranks that disagree on SHOAL_BOOT_EXCHANGE: every rank fails at once, no timeout");
}

static void ring_case_strangers(void)
{
    char hex[2 * SHOAL_UID_BYTES + 1];
    adv_proc_t p[RING_N];
    static const int32_t want[ST_N] = {SHOAL_ERR_PROTOCOL, SHOAL_ERR_AUTH,
                                       SHOAL_ERR_PERMISSION, SHOAL_ERR_INVALID_ARG, 0};
    int refused_ok = 1;
    ring_start(RING_STRANGERS, p, RING_N, ring_env, hex);
    adv_wait(p, RING_N, 3 * ADV_TIMEOUT_MS);
    ring_end();
    adv_diag(p, RING_N, "rank");
    for (int k = 0; k < ST_N; k++) {
        tap_diag("stranger (%s): answer %d, status %d", st_names[k], ring.got[k],
                 (int)ring.why[k]);
        if (k != ST_IDLE) {
            refused_ok = refused_ok && ring.got[k] == 1 && ring.why[k] == want[k];
        }
    }
    tap_ok(refused_ok,
           "rank 1's peer listener refuses garbage (PROTOCOL), a wrong secret (AUTH), another "
           "tenant's credential (PERMISSION) and a hello for the wrong rank (INVALID_ARG)");
    tap_ok(ring.got[ST_IDLE] == 0 && adv_all(p, RING_N, "SHOAL_OK", 1) &&
               adv_all_quick(p, RING_N),
           "with five strangers on rank 1's listener (one idle) the job still forms; the idle "
           "one is closed once the real neighbour is in");
}

static void ring_case_flood(void)
{
    char hex[2 * SHOAL_UID_BYTES + 1];
    adv_proc_t p[RING_N];
    ring_start(RING_FLOOD, p, RING_N, ring_env, hex);
    adv_wait(p, RING_N, 3 * ADV_TIMEOUT_MS);
    ring_end();
    adv_diag(p, RING_N, "rank");
    tap_diag("the flood opened %d connections to rank 1's listener", ring.flood_made);
    tap_ok(ring.flood_made > SHOAL_BOOT_MAX_PENDING && adv_all(p, RING_N, "SHOAL_OK", 1) &&
               adv_all_quick(p, RING_N),
           "a flood of idle connections on rank 1's peer listener (more than its slots): the "
           "real neighbour gets through (redialing if evicted), the job forms");
}

static void ring_case_tamper(void)
{
    char hex[2 * SHOAL_UID_BYTES + 1];
    adv_proc_t p[RING_N];
    int others = 1;
    ring_start(RING_TAMPER, p, RING_N, ring_env, hex);
    adv_wait(p, RING_N, 3 * ADV_TIMEOUT_MS);
    ring_end();
    adv_diag(p, RING_N, "rank");
    tap_diag("relay: %zu bytes up", ring.px.upn);
    for (int i = 0; i < RING_N; i++) {
        others = others && p[i].have_result && strcmp(p[i].status, "SHOAL_OK") != 0 &&
                 strcmp(p[i].status, "SHOAL_ERR_TIMEOUT") != 0;
    }
    tap_ok(adv_all(&p[2], 1, "SHOAL_ERR_AUTH", 0) && others && adv_all_quick(p, RING_N),
           "a record byte flipped on the ring link 1 -> 2: rank 2 refuses the frame "
           "(SHOAL_ERR_AUTH), every other rank fails at once");
}

static void ring_case_kill(void)
{
    char hex[2 * SHOAL_UID_BYTES + 1];
    adv_proc_t p[RING_N];
    adv_proc_t rest[RING_N - 1];
    ring_start(RING_KILL, p, RING_N, ring_env, hex);
    adv_wait(p, RING_N, 3 * ADV_TIMEOUT_MS);
    ring_end();
    adv_diag(p, RING_N, "rank");
    rest[0] = p[0];
    rest[1] = p[2];
    rest[2] = p[3];
    tap_ok(!p[1].have_result && adv_all(rest, RING_N - 1, "SHOAL_ERR_PEER_FAILED", 0) &&
               adv_all_quick(rest, RING_N - 1),
           "rank 1 killed during the ring exchange: ranks 0, 2 and 3 fail init with "
           "SHOAL_ERR_PEER_FAILED at once, no timeout");
}

int main(int argc, char **argv)
{
    (void)argc;
    adv_init(argv[0]);
    shoal_boot_root_ring_hook = ring_hook;
    tap_plan(8);
    ring_case_sanity();
    ring_case_root_mode();
    ring_case_mixed();
    ring_case_strangers();
    ring_case_flood();
    ring_case_tamper();
    ring_case_kill();
    return tap_done();
}
