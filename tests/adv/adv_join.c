/*
 * The adversarial join suite: each case runs a real job (adv_rank processes) against a root
 * in this process while a stranger, a rank of another tenant, job or epoch, or an
 * authenticated rank that misbehaves attacks the join. Every case ends with a clear status on
 * the real ranks (SHOAL_ERR_AUTH, _PERMISSION, _PROTOCOL, _INVALID_ARG, well before their
 * SHOAL_TIMEOUT_MS) or with the job unharmed. TAP on stdout.
 */
#include "core/core.h"
#include "tenant/breaker.h"
#include "tests/adv/adv_lib.h"
#include "tests/tap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define ADV_T "SHOAL_TENANT=acme"
#define ADV_J "SHOAL_JOB=train-7"
#define ADV_E "SHOAL_EPOCH=3"
static const char *const adv_job_env[] = {ADV_T, ADV_J, ADV_E, NULL};

/* Starts n real ranks of the job (ranks first..first+n-1 of nranks) and waits for them. */
static void adv_job(adv_proc_t *p, const char *hex, int first, int n, int nranks)
{
    for (int i = 0; i < n; i++) {
        adv_spawn(&p[i], "init", hex, first + i, nranks, adv_job_env, -1);
    }
    adv_wait(p, n, 3 * ADV_TIMEOUT_MS);
}

static int adv_new_root(shoal_boot_uid_t *u, char *hex)
{
    if (adv_root("acme", "train-7", 3, u, hex) != 0) {
        tap_bail("cannot start a root");
    }
    return 0;
}

static void adv_case_sanity(void)
{
    shoal_boot_uid_t u;
    char hex[2 * SHOAL_UID_BYTES + 1];
    adv_proc_t p[3];
    adv_new_root(&u, hex);
    adv_job(p, hex, 0, 3, 3);
    adv_diag(p, 3, "rank");
    tap_ok(adv_all(p, 3, "SHOAL_OK", 1), "a job of 3 ranks of tenant acme forms and computes");
}

/* A stranger with a wrong secret is refused (AUTH); the job forms regardless. */
static void adv_case_wrong_secret(void)
{
    shoal_boot_uid_t u, bad;
    char hex[2 * SHOAL_UID_BYTES + 1], badhex[2 * SHOAL_UID_BYTES + 1];
    adv_proc_t s, p[2];
    adv_new_root(&u, hex);
    bad = u;
    bad.secret[5] ^= 0x80;
    adv_uid_hex(&bad, badhex);
    adv_spawn(&s, "init", badhex, 1, 2, adv_job_env, -1);
    adv_wait(&s, 1, 2 * ADV_TIMEOUT_MS);
    adv_job(p, hex, 0, 2, 2);
    adv_diag(&s, 1, "stranger");
    tap_ok(adv_all(&s, 1, "SHOAL_ERR_AUTH", 0) && adv_all_quick(&s, 1) &&
               adv_all(p, 2, "SHOAL_OK", 1),
           "wrong secret: the stranger gets SHOAL_ERR_AUTH, the job forms");
}

/* The right id, a rank configured for another tenant (or epoch): PERMISSION before joining. */
static void adv_case_uid_identity(const char *what, const char *env1, const char *env2,
                                  const char *env3)
{
    shoal_boot_uid_t u;
    char hex[2 * SHOAL_UID_BYTES + 1];
    const char *const env[] = {env1, env2, env3, NULL};
    adv_proc_t s, p[2];
    adv_new_root(&u, hex);
    adv_spawn(&s, "init", hex, 1, 2, env, -1);
    adv_wait(&s, 1, 2 * ADV_TIMEOUT_MS);
    adv_job(p, hex, 0, 2, 2);
    adv_diag(&s, 1, "stranger");
    tap_ok(adv_all(&s, 1, "SHOAL_ERR_PERMISSION", 0) && adv_all_quick(&s, 1) &&
               adv_all(p, 2, "SHOAL_OK", 1),
           "right secret, %s: SHOAL_ERR_PERMISSION, the job forms", what);
}

/* The right secret, another identity, proved to the root itself (a forged or stale id). */
static void adv_case_root_identity(const char *what, const char *tenant, const char *job,
                                   uint64_t epoch)
{
    shoal_boot_uid_t u;
    shoal_boot_ident_t other;
    char hex[2 * SHOAL_UID_BYTES + 1];
    adv_fake_t f;
    int32_t why = 0;
    adv_proc_t p[2];
    int r;
    adv_new_root(&u, hex);
    adv_ident(tenant, job, epoch, &other);
    r = adv_fake_join(&u, u.secret, &other, 1, 2, &f, &why);
    adv_fake_close(&f);
    adv_job(p, hex, 0, 2, 2);
    tap_diag("root answered %d (status %d)", r, why);
    tap_ok(r == 1 && why == SHOAL_ERR_PERMISSION && adv_all(p, 2, "SHOAL_OK", 1),
           "right secret, %s, at the root: refused with SHOAL_ERR_PERMISSION, the job forms",
           what);
}

/* SHOAL_ROOT mode: no id carries the identity; the root refuses a rank of another job. */
static void adv_case_env_root_job(void)
{
    uint8_t secret[SHOAL_SECRET_BYTES];
    char sec_env[16 + 2 * SHOAL_SECRET_BYTES], root_env[64];
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    adv_proc_t r0, s, r1;

    /* A free port (the race with another process taking it is harmless here). */
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        tap_bail("no free port");
    }
    close(fd);
    shoal_random_bytes(secret, sizeof(secret));
    strcpy(sec_env, "SHOAL_SECRET=");
    for (size_t i = 0; i < sizeof(secret); i++) {
        sprintf(sec_env + 13 + 2 * i, "%02x", secret[i]);
    }
    snprintf(root_env, sizeof(root_env), "SHOAL_ROOT=127.0.0.1:%u", ntohs(a.sin_port));
    const char *const job[] = {ADV_T, ADV_J, ADV_E, sec_env, root_env, NULL};
    const char *const other[] = {ADV_T, "SHOAL_JOB=other-job", ADV_E, sec_env, root_env, NULL};
    adv_spawn(&r0, "init", NULL, 0, 2, job, -1);
    usleep(200 * 1000);
    adv_spawn(&s, "init", NULL, 1, 2, other, -1);
    adv_wait(&s, 1, 2 * ADV_TIMEOUT_MS);
    adv_spawn(&r1, "init", NULL, 1, 2, job, -1);
    adv_wait(&r0, 1, 2 * ADV_TIMEOUT_MS);
    adv_wait(&r1, 1, 2 * ADV_TIMEOUT_MS);
    adv_diag(&s, 1, "stranger");
    adv_diag(&r0, 1, "rank 0");
    tap_ok(adv_all(&s, 1, "SHOAL_ERR_PERMISSION", 0) && adv_all_quick(&s, 1) &&
               adv_all(&r0, 1, "SHOAL_OK", 1) && adv_all(&r1, 1, "SHOAL_OK", 1),
           "SHOAL_ROOT mode, right secret, another job: SHOAL_ERR_PERMISSION, the job forms");
}

/* A hello with a guessed MAC, or a truncated one. */
static void adv_case_bad_proof(int truncated)
{
    shoal_boot_uid_t u;
    char hex[2 * SHOAL_UID_BYTES + 1];
    uint8_t nonce[SHOAL_BOOT_NONCE];
    struct {
        shoal_boot_frame_t f;
        shoal_boot_hello_t h;
    } msg;
    int32_t why = 0;
    int fd, r = -9;
    adv_proc_t p[2];
    adv_new_root(&u, hex);
    fd = adv_dial(&u);
    if (fd >= 0 && adv_read_challenge(fd, nonce) == 0) {
        memset(&msg, 0, sizeof(msg));
        msg.f = (shoal_boot_frame_t){.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_HELLO,
                                     .len = sizeof(msg.h)};
        msg.h.rank = 1;
        msg.h.nranks = 2;
        msg.h.ident = u.ident;
        shoal_random_bytes(msg.h.nonce, sizeof(msg.h.nonce));
        shoal_random_bytes(msg.h.mac, sizeof(msg.h.mac));
        if (truncated) {
            msg.f.len -= SHOAL_HMAC_BYTES / 2; /* a proof of 16 bytes */
        }
        (void)!send(fd, &msg, sizeof(msg) - (truncated ? SHOAL_HMAC_BYTES / 2 : 0),
                    MSG_NOSIGNAL);
        r = adv_expect_refused(fd, 3000, &why);
    }
    if (fd >= 0) {
        close(fd);
    }
    adv_job(p, hex, 0, 2, 2);
    tap_diag("root answered %d (status %d)", r, why);
    tap_ok(r == 1 && why == (truncated ? SHOAL_ERR_PROTOCOL : SHOAL_ERR_AUTH) &&
               adv_all(p, 2, "SHOAL_OK", 1),
           "%s proof: refused with %s, the job forms", truncated ? "truncated" : "guessed",
           truncated ? "SHOAL_ERR_PROTOCOL" : "SHOAL_ERR_AUTH");
}

/* A hello recorded from a real rank's join, replayed on a new connection. */
static void adv_case_replay(void)
{
    shoal_boot_uid_t u, via;
    char hex[2 * SHOAL_UID_BYTES + 1], viahex[2 * SHOAL_UID_BYTES + 1];
    uint8_t nonce[SHOAL_BOOT_NONCE];
    size_t hello = sizeof(shoal_boot_frame_t) + sizeof(shoal_boot_hello_t);
    adv_proxy_t px;
    adv_proc_t r0, r1;
    int32_t why = 0;
    int fd, r = -9;
    double deadline;

    adv_new_root(&u, hex);
    if (adv_proxy_start(&px, &u, -1, &via) != 0) {
        tap_bail("relay failed");
    }
    adv_uid_hex(&via, viahex);
    adv_spawn(&r0, "init", viahex, 0, 2, adv_job_env, -1);
    /* Rank 0 joined (challenge and welcome went through the relay): replay its hello. */
    deadline = adv_now_ms() + 5000;
    while (__atomic_load_n(&px.down, __ATOMIC_ACQUIRE) < 96 && adv_now_ms() < deadline) {
        usleep(10 * 1000);
    }
    fd = adv_dial(&u);
    if (fd >= 0 && __atomic_load_n(&px.rec_len, __ATOMIC_ACQUIRE) >= hello &&
        adv_read_challenge(fd, nonce) == 0) {
        (void)!send(fd, px.rec, hello, MSG_NOSIGNAL);
        r = adv_expect_refused(fd, 3000, &why);
    }
    if (fd >= 0) {
        close(fd);
    }
    adv_spawn(&r1, "init", hex, 1, 2, adv_job_env, -1);
    adv_wait(&r0, 1, 2 * ADV_TIMEOUT_MS);
    adv_wait(&r1, 1, 2 * ADV_TIMEOUT_MS);
    adv_proxy_stop(&px);
    tap_diag("root answered the replay with %d (status %d)", r, why);
    tap_ok(r == 1 && why == SHOAL_ERR_AUTH && adv_all(&r0, 1, "SHOAL_OK", 1) &&
               adv_all(&r1, 1, "SHOAL_OK", 1),
           "a recorded hello replayed: refused with SHOAL_ERR_AUTH, the job forms");
}

/* Finding 1: two authenticated ranks send allgather frames of different lengths, the longer
 * one's payload still streaming when the shorter arrives. */
static void adv_case_wrong_length(void)
{
    shoal_boot_uid_t u;
    char hex[2 * SHOAL_UID_BYTES + 1];
    static uint8_t big[4096];
    uint8_t small[16] = {0};
    adv_fake_t f0, f1;
    int32_t w0 = 0, w1 = 0, refused = 0;
    int j0, j1, e0 = -9, e1 = -9;
    adv_proc_t p;

    memset(big, 0xab, sizeof(big));
    adv_new_root(&u, hex);
    j0 = adv_fake_join(&u, u.secret, &u.ident, 0, 3, &f0, &refused);
    j1 = adv_fake_join(&u, u.secret, &u.ident, 1, 3, &f1, &refused);
    if (j0 == 0 && j1 == 0) {
        adv_fake_send_ag(&f0, 0, big, sizeof(big), 0, sizeof(shoal_boot_frame_t) + 100);
        usleep(100 * 1000);
        adv_fake_send_ag(&f1, 0, small, sizeof(small), 0, (size_t)-1);
        usleep(100 * 1000);
        adv_fake_send_rest(&f0);
        e0 = adv_fake_expect_failed(&f0, 3000, &w0);
        e1 = adv_fake_expect_failed(&f1, 3000, &w1);
    }
    adv_spawn(&p, "init", hex, 2, 3, adv_job_env, -1);
    adv_wait(&p, 1, 2 * ADV_TIMEOUT_MS);
    adv_fake_close(&f0);
    adv_fake_close(&f1);
    adv_diag(&p, 1, "real rank");
    tap_diag("fake ranks: joined %d %d, failure notices %d %d (status %d %d)", j0, j1, e0, e1,
             w0, w1);
    tap_ok(j0 == 0 && j1 == 0 && e0 == 1 && w0 == SHOAL_ERR_PROTOCOL && e1 == 1 &&
               w1 == SHOAL_ERR_PROTOCOL && adv_all(&p, 1, "SHOAL_ERR_PROTOCOL", 0) &&
               adv_all_quick(&p, 1),
           "allgather frames of two lengths in one round: SHOAL_ERR_PROTOCOL for every rank");
}

/* An authenticated process takes rank 1, then the real rank 1 comes: the job fails at once. */
static void adv_case_join_twice(void)
{
    shoal_boot_uid_t u;
    char hex[2 * SHOAL_UID_BYTES + 1];
    adv_fake_t f;
    int32_t refused = 0;
    adv_proc_t p[3];
    int j;
    adv_new_root(&u, hex);
    j = adv_fake_join(&u, u.secret, &u.ident, 1, 3, &f, &refused);
    adv_job(p, hex, 0, 3, 3);
    adv_fake_close(&f);
    adv_diag(p, 3, "rank");
    tap_ok(j == 0 && adv_all(p, 3, "SHOAL_ERR_INVALID_ARG", 0) && adv_all_quick(p, 3),
           "rank 1 joins twice: every real rank gets SHOAL_ERR_INVALID_ARG at once");
}

/* A rank of the job with another rank count (SHOAL_NRANKS set apart on one host) comes after
 * rank 0 joined: the job cannot form. Rank 0 learns it at once, and so do the ranks still to
 * come; rank 0 waited its whole timeout, told nothing. */
static void adv_case_other_size(void)
{
    shoal_boot_uid_t u;
    char hex[2 * SHOAL_UID_BYTES + 1];
    adv_fake_t f0, f1;
    int32_t w0 = 0, refused = 0, none = 0;
    int j0, j1, e0 = -9;
    adv_proc_t p[2];
    adv_new_root(&u, hex);
    j0 = adv_fake_join(&u, u.secret, &u.ident, 0, 3, &f0, &none);
    j1 = adv_fake_join(&u, u.secret, &u.ident, 1, 2, &f1, &refused);
    if (j0 == 0) {
        e0 = adv_fake_expect_failed(&f0, 3000, &w0);
    }
    adv_job(p, hex, 1, 2, 3);
    adv_fake_close(&f0);
    adv_fake_close(&f1);
    adv_diag(p, 2, "rank");
    tap_diag("rank 0 joined %d, failure notice %d (status %d); rank 1 of 2: %d (status %d)", j0,
             e0, w0, j1, refused);
    tap_ok(j0 == 0 && j1 == 1 && refused == SHOAL_ERR_INVALID_ARG && e0 == 1 &&
               w0 == SHOAL_ERR_INVALID_ARG && adv_all(p, 2, "SHOAL_ERR_INVALID_ARG", 0) &&
               adv_all_quick(p, 2),
           "a rank of the job with another rank count is refused and the job fails at once: "
           "the joined rank is told, and the ranks still to come");
}

/* A stranger holds far more connections than the root keeps pending (slow loris). */
static void adv_case_slow_loris(void)
{
    shoal_boot_uid_t u;
    char hex[2 * SHOAL_UID_BYTES + 1];
    enum { N = 3 * SHOAL_BOOT_MAX_PENDING };
    int fds[N];
    shoal_boot_frame_t f = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_HELLO,
                            .len = sizeof(shoal_boot_hello_t)};
    adv_proc_t p[3];
    double t0;
    adv_new_root(&u, hex);
    for (int i = 0; i < N; i++) {
        fds[i] = adv_dial(&u);
        if (fds[i] >= 0) {
            (void)!send(fds[i], &f, sizeof(f) - 3, MSG_NOSIGNAL); /* never finished */
        }
    }
    t0 = adv_now_ms();
    for (int i = 0; i < 3; i++) {
        adv_spawn(&p[i], "init", hex, i, 3, adv_job_env, -1);
    }
    /* Keep the flood going while the job joins. */
    for (int i = 0; i < N; i += 2) {
        if (fds[i] >= 0) {
            close(fds[i]);
        }
        fds[i] = adv_dial(&u);
    }
    adv_wait(p, 3, 3 * ADV_TIMEOUT_MS);
    for (int i = 0; i < N; i++) {
        if (fds[i] >= 0) {
            close(fds[i]);
        }
    }
    adv_diag(p, 3, "rank");
    tap_ok(adv_all(p, 3, "SHOAL_OK", 1) && adv_all_quick(p, 3),
           "%d idle strangers hold the root's pending slots: the job forms (%.0f ms)", N,
           adv_now_ms() - t0);
}

typedef struct {
    shoal_boot_uid_t u;
    int stop;                  /* atomic */
    int count;                 /* the thread's; read after the join */
} adv_scan_t;

static void *adv_scan_thread(void *arg)
{
    adv_scan_t *s = arg;
    while (!__atomic_load_n(&s->stop, __ATOMIC_RELAXED) && s->count < 5000) {
        int fd = adv_dial(&s->u);
        if (fd >= 0) {
            close(fd);
        }
        s->count++;
    }
    return NULL;
}

/* A port scanner connects and closes again and again while the job joins. */
static void adv_case_port_scan(void)
{
    adv_scan_t s;
    char hex[2 * SHOAL_UID_BYTES + 1];
    pthread_t th;
    adv_proc_t p[3];
    memset(&s, 0, sizeof(s));
    adv_new_root(&s.u, hex);
    pthread_create(&th, NULL, adv_scan_thread, &s);
    usleep(20 * 1000);
    adv_job(p, hex, 0, 3, 3);
    __atomic_store_n(&s.stop, 1, __ATOMIC_RELAXED);
    pthread_join(th, NULL);
    adv_diag(p, 3, "rank");
    tap_ok(adv_all(p, 3, "SHOAL_OK", 1) && s.count > 0,
           "a port scan (%d connect/close) during init: the job forms", s.count);
}

/* A split child's root, tried by a rank of another job and by one that holds only the
 * parent's id: both refused, the child forms. The leader holds the child's join until both
 * tries are over (the pipe go closed), not a fixed 1.5 s: under load the second try came after
 * the hold, to a child already formed (-1, not refused), in 1 of 6 runs. */
static void adv_case_split(void)
{
    shoal_boot_uid_t u, child, other;
    char hex[2 * SHOAL_UID_BYTES + 1], line[64] = "", go_env[32];
    const char *const env[] = {ADV_T, ADV_J, ADV_E, "ADV_HOOK_MS=4000", go_env, NULL};
    unsigned fam = 0, port = 0, addr = 0;
    int hook[2], go[2], ra = -9, rb = -9;
    int32_t wa = 0, wb = 0;
    adv_fake_t f;
    adv_proc_t p[2];
    struct pollfd pfd;

    adv_new_root(&u, hex);
    if (pipe(hook) != 0 || pipe(go) != 0 || fcntl(go[1], F_SETFD, FD_CLOEXEC) != 0) {
        tap_bail("pipe");
    }
    snprintf(go_env, sizeof(go_env), "ADV_HOOK_GO_FD=%d", go[0]);
    for (int i = 0; i < 2; i++) {
        adv_spawn(&p[i], "split", hex, i, 2, env, hook[1]);
    }
    close(hook[1]);
    close(go[0]);
    pfd = (struct pollfd){.fd = hook[0], .events = POLLIN};
    if (poll(&pfd, 1, 10000) > 0 && read(hook[0], line, sizeof(line) - 1) > 0 &&
        sscanf(line, "%u %u %x", &fam, &port, &addr) == 3) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&child.root;
        memset(&child, 0, sizeof(child));
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        s4->sin_addr.s_addr = htonl(addr);
        child.root_len = sizeof(*s4);
        /* Another job: its own secret, the same names. */
        shoal_random_bytes(other.secret, sizeof(other.secret));
        ra = adv_fake_join(&child, other.secret, &u.ident, 1, 2, &f, &wa);
        adv_fake_close(&f);
        /* The parent's id (what split used to send in clear): not the child's secret. */
        rb = adv_fake_join(&child, u.secret, &u.ident, 1, 2, &f, &wb);
        adv_fake_close(&f);
    }
    close(go[1]); /* the leader goes on */
    close(hook[0]);
    adv_wait(p, 2, 3 * ADV_TIMEOUT_MS);
    adv_diag(p, 2, "rank");
    tap_diag("child root at port %u; another job: %d (status %d), the parent's id: %d (%d)",
             port, ra, wa, rb, wb);
    tap_ok(ra == 1 && wa == SHOAL_ERR_AUTH && rb == 1 && wb == SHOAL_ERR_AUTH &&
               adv_all(p, 2, "SHOAL_OK", 1),
           "split: the child's root refuses another job and the parent's secret "
           "(SHOAL_ERR_AUTH); the child forms");
}

/* An authenticated rank sends a frame whose MAC does not match (tampered on the way up). */
static void adv_case_tamper_up(void)
{
    shoal_boot_uid_t u;
    char hex[2 * SHOAL_UID_BYTES + 1];
    /* Round 0 at the root is the ring's (SHOAL_BOOT_EXCHANGE=ring, the default): each rank's
     * peer listener, SHOAL_BOOT_RING_REC bytes. A RING frame of that length passes the root's
     * kind and length checks whether or not a real rank's frame came first, so the MAC
     * decides. */
    uint8_t blob[SHOAL_BOOT_RING_REC];
    adv_fake_t f;
    int32_t refused = 0;
    adv_proc_t p[2];
    int j;
    memset(blob, 0, sizeof(blob));
    adv_new_root(&u, hex);
    for (int i = 0; i < 2; i++) {
        adv_spawn(&p[i], "init", hex, 1 + i, 3, adv_job_env, -1);
    }
    j = adv_fake_join(&u, u.secret, &u.ident, 0, 3, &f, &refused);
    if (j == 0) {
        adv_fake_send_frame(&f, SHOAL_BOOT_RING, 0, blob, sizeof(blob), 1, (size_t)-1);
    }
    adv_wait(p, 2, 3 * ADV_TIMEOUT_MS);
    adv_fake_close(&f);
    adv_diag(p, 2, "rank");
    tap_ok(j == 0 && adv_all(p, 2, "SHOAL_ERR_AUTH", 0) && adv_all_quick(p, 2),
           "a tampered allgather frame to the root: SHOAL_ERR_AUTH on every real rank");
}

/* An on-path relay flips one byte of the address table the root sends to rank 2. */
static void adv_case_tamper_down(void)
{
    shoal_boot_uid_t u, via;
    char hex[2 * SHOAL_UID_BYTES + 1], viahex[2 * SHOAL_UID_BYTES + 1];
    adv_proxy_t px;
    adv_proc_t p[3];
    /* challenge (16 + 32) and welcome (16 + 32), then the round-0 header: a byte of the
     * round's answer (the ring neighbours' listeners; with SHOAL_BOOT_EXCHANGE=root, the
     * table). */
    long at = 96 + (long)sizeof(shoal_boot_frame_t) + 9;

    adv_new_root(&u, hex);
    if (adv_proxy_start(&px, &u, at, &via) != 0) {
        tap_bail("relay failed");
    }
    adv_uid_hex(&via, viahex);
    adv_spawn(&p[0], "init", hex, 0, 3, adv_job_env, -1);
    adv_spawn(&p[1], "init", hex, 1, 3, adv_job_env, -1);
    adv_spawn(&p[2], "init", viahex, 2, 3, adv_job_env, -1);
    adv_wait(p, 3, 3 * ADV_TIMEOUT_MS);
    adv_proxy_stop(&px);
    adv_diag(p, 3, "rank");
    tap_ok(adv_all(&p[2], 1, "SHOAL_ERR_AUTH", 0) && adv_all_quick(p, 3) &&
               !adv_all(&p[0], 1, "SHOAL_OK", 0) && !adv_all(&p[1], 1, "SHOAL_OK", 0) &&
               !adv_all(&p[0], 1, "SHOAL_ERR_TIMEOUT", 0),
           "a table byte flipped on the way to rank 2: it refuses the frame "
           "(SHOAL_ERR_AUTH), the others fail at once");
}

/* Dials the root from another loopback address (a host that runs no rank of the job). */
static int adv_dial_from(const shoal_boot_uid_t *u, const char *src)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -1;
    }
    inet_pton(AF_INET, src, &a.sin_addr);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        connect(fd, (const struct sockaddr *)&u->root, u->root_len) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A source that keeps failing the proof opens the root's circuit breaker: while one of its
 * connections is pending (challenged: a host of the job may be behind it), its next ones are
 * closed at accept, unanswered; the job's ranks (from this host's trusted addresses) still
 * form it. */
static void adv_case_breaker(void)
{
    shoal_boot_uid_t u;
    char hex[2 * SHOAL_UID_BYTES + 1];
    struct {
        shoal_boot_frame_t f;
        shoal_boot_hello_t h;
    } msg;
    uint8_t nonce[SHOAL_BOOT_NONCE];
    int refused = 0, unanswered = 0, held = -1, probation = 0;
    adv_proc_t p[2];
    adv_new_root(&u, hex);
    if (u.root.ss_family != AF_INET) {
        tap_skip(1, "the root is not on IPv4 loopback");
        return;
    }
    for (int i = 0; i < 12; i++) {
        int32_t why = 0;
        int fd;
        if (i == 8) {
            held = adv_dial_from(&u, "127.0.0.2");
            probation = held >= 0 && adv_read_challenge(held, nonce) == 0;
        }
        fd = adv_dial_from(&u, "127.0.0.2");
        if (fd < 0) {
            continue;
        }
        if (adv_read_challenge(fd, nonce) != 0) {
            unanswered++;
        } else {
            memset(&msg, 0, sizeof(msg));
            msg.f = (shoal_boot_frame_t){.magic = SHOAL_BOOT_FRAME_MAGIC,
                                         .type = SHOAL_BOOT_HELLO, .len = sizeof(msg.h)};
            msg.h.rank = 0;
            msg.h.nranks = 2;
            msg.h.ident = u.ident;
            shoal_random_bytes(msg.h.nonce, sizeof(msg.h.nonce));
            shoal_random_bytes(msg.h.mac, sizeof(msg.h.mac));
            (void)!send(fd, &msg, sizeof(msg), MSG_NOSIGNAL);
            refused += adv_expect_refused(fd, 3000, &why) == 1 && why == SHOAL_ERR_AUTH;
        }
        close(fd);
    }
    if (held >= 0) {
        close(held);
    }
    adv_job(p, hex, 0, 2, 2);
    adv_diag(p, 2, "rank");
    tap_diag("stranger: %d refused with AUTH, one held: %d, %d unanswered", refused, probation,
             unanswered);
    tap_ok(refused == 8 && probation && unanswered == 4 && adv_all(p, 2, "SHOAL_OK", 1),
           "a source failing 8 proofs is refused at accept by the breaker while it holds a "
           "pending connection; the job forms");
}

/* Sends a hello from the connection fd, whose challenge nonce was read: rank 0 of 2 of the
 * job, with a proof made with secret (a wrong one: a stranger's guess). */
static void adv_send_hello(int fd, const shoal_boot_uid_t *u, const uint8_t *nonce,
                           const uint8_t *secret)
{
    struct {
        shoal_boot_frame_t f;
        shoal_boot_hello_t h;
    } msg;
    memset(&msg, 0, sizeof(msg));
    msg.f = (shoal_boot_frame_t){.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_HELLO,
                                 .len = sizeof(msg.h)};
    msg.h.rank = 0;
    msg.h.nranks = 2;
    msg.h.ident = u->ident;
    shoal_random_bytes(msg.h.nonce, sizeof(msg.h.nonce));
    shoal_boot_hello_mac(secret, nonce, &msg.h, msg.h.mac);
    (void)!send(fd, &msg, sizeof(msg), MSG_NOSIGNAL);
}

/* A co-tenant on a host that also runs a rank of the job (127.0.0.4: neither loopback's
 * 127.0.0.1 nor the root's published address, so not trusted) fails 8 proofs and opens the
 * breaker against the host. The real rank there must still join: a connection that proves
 * the secret closes the breaker. Yet the breaker still sheds the stranger: while one
 * connection of the host is pending, the next ones are closed at accept, and the pending one
 * is refused after a short hello deadline. The root refused every connection of the host at
 * accept for the whole cool-down (a minute): the real rank could not join. */
static void adv_case_breaker_cotenant(void)
{
    shoal_boot_uid_t u;
    char hex[2 * SHOAL_UID_BYTES + 1];
    uint8_t nonce[SHOAL_BOOT_NONCE], bad[SHOAL_SECRET_BYTES], mac[SHOAL_HMAC_BYTES];
    int refused = 0, held = -1, shed = 0, joined = 0, closed_ok = 0, late = 0;
    int32_t why = 0, why_held = 0;
    double t0;
    adv_new_root(&u, hex);
    if (u.root.ss_family != AF_INET) {
        tap_skip(1, "the root is not on IPv4 loopback");
        return;
    }
    memcpy(bad, u.secret, sizeof(bad));
    bad[0] ^= 0x01;
    for (int i = 0; i < 8; i++) {
        int fd = adv_dial_from(&u, "127.0.0.4");
        if (fd >= 0 && adv_read_challenge(fd, nonce) == 0) {
            adv_send_hello(fd, &u, nonce, bad);
            refused += adv_expect_refused(fd, 3000, &why) == 1 && why == SHOAL_ERR_AUTH;
        }
        if (fd >= 0) {
            close(fd);
        }
    }
    /* The breaker is open: one connection is challenged and held, the next ones are shed. */
    held = adv_dial_from(&u, "127.0.0.4");
    if (held >= 0 && adv_read_challenge(held, nonce) == 0) {
        for (int i = 0; i < 3; i++) {
            int fd = adv_dial_from(&u, "127.0.0.4");
            shed += fd >= 0 && adv_read_challenge(fd, nonce) != 0;
            if (fd >= 0) {
                close(fd);
            }
        }
        t0 = adv_now_ms();
        late = adv_expect_refused(held, 6000, &why_held) == 1 &&
               why_held == SHOAL_ERR_TIMEOUT && adv_now_ms() - t0 < 3000;
    }
    if (held >= 0) {
        close(held);
    }
    /* The real rank of that host: challenged, welcomed; the breaker is closed after it. */
    int fd = adv_dial_from(&u, "127.0.0.4");
    if (fd >= 0 && adv_read_challenge(fd, nonce) == 0) {
        shoal_boot_frame_t w;
        adv_send_hello(fd, &u, nonce, u.secret);
        joined = adv_read_n(fd, &w, sizeof(w), 3000) == 1 && w.type == SHOAL_BOOT_WELCOME &&
                 adv_read_n(fd, mac, sizeof(mac), 3000) == 1;
    }
    struct sockaddr_in src = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.4", &src.sin_addr);
    /* The root closes the breaker just after it sends the welcome: a moment to do so. */
    for (int i = 0; i < 100 && joined && !closed_ok; i++) {
        closed_ok = !shoal_tenant_breaker_is_open((const struct sockaddr *)&src);
        if (!closed_ok) {
            usleep(10 * 1000);
        }
    }
    if (fd >= 0) {
        close(fd);
    }
    tap_diag("co-tenant: %d refused with AUTH; then %d of 3 shed, the held one refused in "
             "time: %d; the real rank welcomed: %d, breaker closed after it: %d", refused, shed,
             late, joined, closed_ok);
    tap_ok(refused == 8 && shed == 3 && late && joined && closed_ok,
           "a co-tenant opens the breaker against a host: the job's rank there still joins "
           "and closes it; the co-tenant's extra connections are shed");
}

/* A stranger that resets each connection after its challenge (a scanner's close with
 * SO_LINGER 0) was never counted: it could churn the root's slots for ever without opening
 * the breaker. Resets count as failed hellos now: 8 of them open it. */
static void adv_case_breaker_rst(void)
{
    shoal_boot_uid_t u;
    char hex[2 * SHOAL_UID_BYTES + 1];
    uint8_t nonce[SHOAL_BOOT_NONCE];
    struct sockaddr_in src = {.sin_family = AF_INET};
    int reset = 0, open_now = 0;
    adv_new_root(&u, hex);
    if (u.root.ss_family != AF_INET) {
        tap_skip(1, "the root is not on IPv4 loopback");
        return;
    }
    inet_pton(AF_INET, "127.0.0.6", &src.sin_addr);
    for (int i = 0; i < 8; i++) {
        int fd = adv_dial_from(&u, "127.0.0.6");
        if (fd >= 0 && adv_read_challenge(fd, nonce) == 0) {
            struct linger l = {.l_onoff = 1, .l_linger = 0};
            reset += setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l)) == 0;
        }
        if (fd >= 0) {
            close(fd);
        }
        usleep(20 * 1000); /* the root reads the reset before the next one comes */
    }
    for (int i = 0; i < 100 && !open_now; i++) {
        open_now = shoal_tenant_breaker_is_open((const struct sockaddr *)&src);
        if (!open_now) {
            usleep(10 * 1000);
        }
    }
    tap_ok(reset == 8 && open_now, "a source that resets 8 connections after their challenge "
           "opens the breaker (%d reset, open: %d)", reset, open_now);
}

/* A free IPv4 loopback port and a listener on it that never accepts, its backlog full: a
 * connect to it stalls in the kernel's SYN retries. Returns the listener (and the fillers in
 * fill[4]), or -1. */
static int adv_full_backlog(uint16_t *port, int fill[4])
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(lfd, 0) != 0 ||
        getsockname(lfd, (struct sockaddr *)&a, &len) != 0) {
        return -1;
    }
    for (int i = 0; i < 4; i++) {
        fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fill[i] >= 0) {
            (void)!connect(fill[i], (struct sockaddr *)&a, sizeof(a));
        }
    }
    usleep(100 * 1000);
    *port = ntohs(a.sin_port);
    return lfd;
}

/* A root address that takes no connection (its backlog full, as under a SYN flood): the rank
 * gives up at its SHOAL_TIMEOUT_MS with SHOAL_ERR_TIMEOUT, not after the kernel's SYN retries
 * (about 2 minutes). */
static void adv_case_root_unreachable(void)
{
    char root_env[64], sec_env[16 + 2 * SHOAL_SECRET_BYTES] = "SHOAL_SECRET=";
    int fill[4], lfd;
    uint16_t port;
    adv_proc_t p;
    lfd = adv_full_backlog(&port, fill);
    if (lfd < 0) {
        tap_skip(1, "no listener on IPv4 loopback");
        return;
    }
    for (int i = 0; i < SHOAL_SECRET_BYTES; i++) {
        sprintf(sec_env + 13 + 2 * i, "%02x", (unsigned)(0x5a ^ i));
    }
    snprintf(root_env, sizeof(root_env), "SHOAL_ROOT=127.0.0.1:%u", port);
    const char *const env[] = {ADV_T, ADV_J, ADV_E, sec_env, root_env, NULL};
    adv_spawn(&p, "init", NULL, 1, 2, env, -1);
    adv_wait(&p, 1, 4 * ADV_TIMEOUT_MS);
    for (int i = 0; i < 4; i++) {
        if (fill[i] >= 0) {
            close(fill[i]);
        }
    }
    close(lfd);
    adv_diag(&p, 1, "rank");
    tap_ok(adv_all(&p, 1, "SHOAL_ERR_TIMEOUT", 0) && p.ms < ADV_TIMEOUT_MS + 2000,
           "a root whose backlog is full: SHOAL_ERR_TIMEOUT after SHOAL_TIMEOUT_MS (%.0f ms)",
           p.ms);
}

/* One stranger keeps ADV_FLOOD idle connections to the root from another address (not the
 * one whose breaker adv_case_breaker opened), and reopens each that the root closes. */
enum { ADV_FLOOD = 400 };
typedef struct {
    shoal_boot_uid_t u;
    int stop;                  /* atomic */
    int opened, refused;       /* the thread's; read after the join: refused = a connection
                                * whose first frame was a refusal (none at accept before the
                                * per-source limit: every connection was challenged) */
    int framed[ADV_FLOOD];     /* the thread's: connection i's first frame was read */
} adv_flood_t;

static int adv_flood_dial(const adv_flood_t *f)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -1;
    }
    inet_pton(AF_INET, "127.0.0.3", &a.sin_addr);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        (connect(fd, (const struct sockaddr *)&f->u.root, f->u.root_len) != 0 &&
         errno != EINPROGRESS)) {
        close(fd);
        return -1;
    }
    return fd;
}

static void *adv_flood_thread(void *arg)
{
    adv_flood_t *f = arg;
    struct pollfd pfd[ADV_FLOOD];
    int *framed = f->framed;
    for (int i = 0; i < ADV_FLOOD; i++) {
        pfd[i] = (struct pollfd){.fd = adv_flood_dial(f), .events = POLLIN};
        f->opened += pfd[i].fd >= 0;
        framed[i] = 0;
    }
    while (!__atomic_load_n(&f->stop, __ATOMIC_RELAXED)) {
        if (poll(pfd, ADV_FLOOD, 20) < 0) {
            break;
        }
        for (int i = 0; i < ADV_FLOOD; i++) {
            uint8_t buf[256];
            shoal_boot_frame_t fr;
            ssize_t n;
            if (pfd[i].fd >= 0 && pfd[i].revents == 0) {
                continue;
            }
            n = pfd[i].fd >= 0 ? recv(pfd[i].fd, buf, sizeof(buf), MSG_DONTWAIT) : 0;
            if (n >= (ssize_t)sizeof(fr) && !framed[i]) {
                memcpy(&fr, buf, sizeof(fr));
                f->refused += fr.type == SHOAL_BOOT_REFUSED;
                framed[i] = 1;
            }
            if (n > 0 || (n < 0 && errno == EAGAIN)) {
                continue; /* a challenge: never answered */
            }
            if (pfd[i].fd >= 0) {
                close(pfd[i].fd);
            }
            pfd[i].fd = adv_flood_dial(f);
            f->opened += pfd[i].fd >= 0;
            framed[i] = 0;
        }
    }
    for (int i = 0; i < ADV_FLOOD; i++) {
        if (pfd[i].fd >= 0) {
            close(pfd[i].fd);
        }
    }
    return NULL;
}

/* The flood above while the job joins: the stranger holds at most its share of the pending
 * slots, its other connections are refused at accept, and the job forms at once. */
static void adv_case_source_flood(void)
{
    adv_flood_t f;
    char hex[2 * SHOAL_UID_BYTES + 1];
    pthread_t th;
    adv_proc_t p[3];
    double t0;
    memset(&f, 0, sizeof(f));
    adv_new_root(&f.u, hex);
    if (f.u.root.ss_family != AF_INET) {
        tap_skip(1, "the root is not on IPv4 loopback");
        return;
    }
    pthread_create(&th, NULL, adv_flood_thread, &f);
    usleep(300 * 1000);
    t0 = adv_now_ms();
    adv_job(p, hex, 0, 3, 3);
    __atomic_store_n(&f.stop, 1, __ATOMIC_RELAXED);
    pthread_join(th, NULL);
    adv_diag(p, 3, "rank");
    tap_diag("stranger: %d connections opened, %d refused at accept", f.opened, f.refused);
    tap_ok(adv_all(p, 3, "SHOAL_OK", 1) && adv_all_quick(p, 3) && f.refused > 0,
           "%d idle connections from one stranger, reopened as they close: the job forms "
           "(%.0f ms)", ADV_FLOOD, adv_now_ms() - t0);
}

/* Reads p's output until its "UID <hex>" line (mkuid); 0 with hex filled, -1 otherwise. */
static int adv_read_uid(adv_proc_t *p, char *hex, int ms)
{
    double deadline = adv_now_ms() + ms;
    while (adv_now_ms() < deadline) {
        char *l = strstr(p->buf, "UID ");
        struct pollfd pfd = {.fd = p->out, .events = POLLIN};
        ssize_t r;
        if (l != NULL && strchr(l, '\n') != NULL) {
            return sscanf(l, "UID %256s", hex) == 1 && strlen(hex) == 2 * SHOAL_UID_BYTES ? 0
                                                                                      : -1;
        }
        if (poll(&pfd, 1, 100) <= 0) {
            continue;
        }
        r = read(p->out, p->buf + p->len, sizeof(p->buf) - 1 - p->len);
        if (r <= 0) {
            return -1;
        }
        p->len += (size_t)r;
        p->buf[p->len] = '\0';
    }
    return -1;
}

/* A job with a credential (SHOAL_CREDENTIAL): its ranks join with the job secret bound to
 * it. A process that holds the unique id but not the credential (the id read from a store
 * that anyone can read, as torch's TCPStore is) is refused with SHOAL_ERR_AUTH even when it
 * claims the job's tenant, job and epoch; the ranks that hold the credential form the job. */
static void adv_case_cred_bound(void)
{
    shoal_tenant_cred_t c;
    uint8_t key[SHOAL_HMAC_BYTES];
    char text[SHOAL_TENANT_CRED_TEXT_MAX], cred_env[SHOAL_TENANT_CRED_TEXT_MAX + 32];
    char hex[2 * SHOAL_UID_BYTES + 1];
    adv_proc_t p[3], s;

    memset(&c, 0, sizeof(c));
    snprintf(c.id.tenant, sizeof(c.id.tenant), "acme");
    snprintf(c.id.job, sizeof(c.id.job), "train-7");
    c.id.epoch = 3;
    c.id.qos_class = SHOAL_QOS_BURSTABLE;
    c.id.qos_weight = 1;
    if (shoal_random_bytes(key, sizeof(key)) != SHOAL_OK ||
        shoal_tenant_cred_sign(&c, key) != SHOAL_OK ||
        shoal_tenant_cred_format(&c, text, sizeof(text)) != SHOAL_OK) {
        tap_bail("cannot make a credential");
    }
    snprintf(cred_env, sizeof(cred_env), "SHOAL_CREDENTIAL=%s", text);
    const char *const with[] = {cred_env, NULL};
    adv_spawn(&p[0], "mkuid", NULL, 0, 3, with, -1);
    if (adv_read_uid(&p[0], hex, 3 * ADV_TIMEOUT_MS) != 0) {
        adv_wait(p, 1, 100);
        tap_ok(0, "a credentialed rank 0 printed no unique id");
        return;
    }
    adv_spawn(&s, "init", hex, 2, 3, adv_job_env, -1);
    adv_wait(&s, 1, 2 * ADV_TIMEOUT_MS);
    adv_spawn(&p[1], "init", hex, 1, 3, with, -1);
    adv_spawn(&p[2], "init", hex, 2, 3, with, -1);
    adv_wait(p, 3, 3 * ADV_TIMEOUT_MS);
    adv_diag(&s, 1, "id without the credential");
    adv_diag(p, 3, "rank");
    tap_ok(adv_all(&s, 1, "SHOAL_ERR_AUTH", 0) && adv_all_quick(&s, 1) &&
               adv_all(p, 3, "SHOAL_OK", 1),
           "a credentialed job: the unique id without the credential is refused "
           "(SHOAL_ERR_AUTH), the ranks holding it form the job");
}

/* Rank 0 makes the id with shoal_get_unique_id (its root waits SHOAL_TIMEOUT_MS = 500 ms
 * without progress) and joins with cfg.timeout_ms = 6 s; rank 1 comes 1.5 s later, within
 * both ranks' timeouts. The root gave up after its 500 ms, and both ranks failed. */
static void adv_case_root_waits_cfg(void)
{
    const char *const r0_env[] = {ADV_T, ADV_J, ADV_E, "SHOAL_TIMEOUT_MS=500",
                                  "ADV_INIT_TIMEOUT_MS=6000", NULL};
    const char *const r1_env[] = {ADV_T, ADV_J, ADV_E, "SHOAL_TIMEOUT_MS=6000", NULL};
    char hex[2 * SHOAL_UID_BYTES + 1];
    adv_proc_t p[2];

    adv_spawn(&p[0], "mkuid", NULL, 0, 2, r0_env, -1);
    if (adv_read_uid(&p[0], hex, 3 * ADV_TIMEOUT_MS) != 0) {
        adv_wait(p, 1, 100);
        tap_ok(0, "rank 0 printed no unique id");
        return;
    }
    usleep(1500 * 1000);
    adv_spawn(&p[1], "init", hex, 1, 2, r1_env, -1);
    adv_wait(p, 2, 3 * ADV_TIMEOUT_MS);
    adv_diag(p, 2, "rank");
    tap_ok(adv_all(p, 2, "SHOAL_OK", 1),
           "shoal_get_unique_id's root (SHOAL_TIMEOUT_MS=500) waits as long as its rank's "
           "cfg.timeout_ms (6 s): a rank 1.5 s late joins");
}

/* Rank 0 runs in the root's process and its init fails before it joins (a bad
 * shoal_config_t): the rank already joined and the one that comes later learn it at once
 * (they waited for their timeout, the root serving nobody). */
static void adv_case_local_init_fails(void)
{
    shoal_boot_uid_t u;
    shoal_uid_t uid;
    shoal_comm_t comm = NULL;
    shoal_config_t cfg = SHOAL_CONFIG_INIT;
    char hex[2 * SHOAL_UID_BYTES + 1];
    adv_proc_t p[2];
    shoal_status_t st;

    adv_new_root(&u, hex);
    shoal_boot_uid_encode(&u, &uid);
    adv_spawn(&p[0], "init", hex, 1, 3, adv_job_env, -1);
    usleep(300 * 1000); /* rank 1 joins first */
    cfg.qos_class = 99;
    st = shoal_comm_init(&comm, 3, 0, &uid, &cfg);
    adv_spawn(&p[1], "init", hex, 2, 3, adv_job_env, -1);
    adv_wait(p, 2, 3 * ADV_TIMEOUT_MS);
    adv_diag(p, 2, "rank");
    tap_ok(st == SHOAL_ERR_INVALID_ARG && adv_all(p, 2, "SHOAL_ERR_PEER_FAILED", 0) &&
               adv_all_quick(p, 2),
           "rank 0's init fails in the root's process: the joined rank and a later one get "
           "SHOAL_ERR_PEER_FAILED at once (%.0f, %.0f ms)", p[0].ms, p[1].ms);
}

int main(int argc, char **argv)
{
    (void)argc;
    adv_init(argv[0]);
    tap_plan(27);
    adv_case_sanity();
    adv_case_wrong_secret();
    adv_case_uid_identity("another tenant", "SHOAL_TENANT=globex", ADV_J, ADV_E);
    adv_case_uid_identity("another job", ADV_T, "SHOAL_JOB=train-8", ADV_E);
    adv_case_uid_identity("a rank of the previous epoch", ADV_T, ADV_J, "SHOAL_EPOCH=2");
    adv_case_root_identity("another tenant", "globex", "train-7", 3);
    adv_case_root_identity("a rank of the previous epoch", "acme", "train-7", 2);
    adv_case_env_root_job();
    adv_case_bad_proof(0);
    adv_case_bad_proof(1);
    adv_case_replay();
    adv_case_wrong_length();
    adv_case_join_twice();
    adv_case_other_size();
    adv_case_slow_loris();
    adv_case_port_scan();
    adv_case_split();
    adv_case_tamper_up();
    adv_case_tamper_down();
    adv_case_breaker();
    adv_case_breaker_cotenant();
    adv_case_breaker_rst();
    adv_case_root_unreachable();
    adv_case_source_flood();
    adv_case_cred_bound();
    adv_case_local_init_fails();
    adv_case_root_waits_cfg();
    return tap_done();
}
