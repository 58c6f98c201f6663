/* Helpers of the adversarial join suite: real ranks (adv_rank, exec'd), a root in this
 * process, raw and authenticated fake clients that speak the root protocol themselves, and a
 * TCP relay that records or tampers with a connection. */
#ifndef SHOAL_ADV_LIB_H
#define SHOAL_ADV_LIB_H

#include "core/boot.h"
#include "core/boot_proto.h"

#include <pthread.h>
#include <sys/types.h>

#define ADV_TIMEOUT_MS 5000  /* SHOAL_TIMEOUT_MS of the roots and the ranks */
#define ADV_QUICK_MS 4000    /* a failure must be reported well before a timeout would */

/* A real rank: adv_rank run with SHOAL_* variables. */
typedef struct {
    pid_t pid;
    int out;                 /* its stdout, -1 once read to the end */
    char buf[512];
    size_t len;
    int have_result;
    char status[48];         /* shoal_status_name of its init (or split) */
    double ms;               /* time in shoal_comm_init_env */
    int ok;                  /* its AllReduce(s) were right */
} adv_proc_t;

void adv_init(const char *argv0);
double adv_now_ms(void);
/* Starts adv_rank <mode> with the given SHOAL_UID (or NULL) and "NAME=VALUE" entries
 * (NULL-terminated, may be NULL). hook_fd >= 0: passed as ADV_HOOK_FD. */
int adv_spawn(adv_proc_t *p, const char *mode, const char *uid_hex, int rank, int nranks,
              const char *const *env, int hook_fd);
/* Waits for every process's result line (and exit) until deadline_ms from now; kills the
 * rest. Returns how many gave a result. */
int adv_wait(adv_proc_t *p, int n, int deadline_ms);
/* 1 if every process of p[0..n) says status (and ok when want_ok). */
int adv_all(const adv_proc_t *p, int n, const char *status, int want_ok);
int adv_all_quick(const adv_proc_t *p, int n);
void adv_diag(const adv_proc_t *p, int n, const char *what);

/* A root in this process for a job of the given identity; u and hex (257 bytes) filled. */
int adv_root(const char *tenant, const char *job, uint64_t epoch, shoal_boot_uid_t *u,
             char *hex);
void adv_uid_hex(const shoal_boot_uid_t *u, char *hex);
void adv_ident(const char *tenant, const char *job, uint64_t epoch, shoal_boot_ident_t *id);

/* Raw connections. */
int adv_dial(const shoal_boot_uid_t *u);
int adv_read_n(int fd, void *buf, size_t n, int ms);
int adv_read_challenge(int fd, uint8_t *nonce);
/* Reads until a REFUSED frame (returns 1, *status set), EOF (0) or the deadline (-1). */
int adv_expect_refused(int fd, int ms, int32_t *status);

/* An authenticated fake rank: knows the secret, speaks the protocol with its own hands. */
typedef struct {
    int fd;
    uint8_t key[SHOAL_HMAC_BYTES];
    uint64_t tx;
    uint64_t rx;
    uint8_t *rest;           /* bytes of a frame held back by adv_fake_send_ag */
    size_t rest_len;
} adv_fake_t;
/* 0 joined; 1 refused (*refused set); -1 no answer. */
int adv_fake_join(const shoal_boot_uid_t *u, const uint8_t *secret,
                  const shoal_boot_ident_t *id, int rank, int nranks, adv_fake_t *f,
                  int32_t *refused);
/* Sends an allgather frame of round, with a MAC unless tamper (then one payload byte is
 * flipped after the MAC was computed); only the first send_bytes bytes of header + payload +
 * MAC when send_bytes is not (size_t)-1; the rest with adv_fake_send_rest. */
int adv_fake_send_ag(adv_fake_t *f, uint32_t round, const void *payload, uint32_t len,
                     int tamper, size_t send_bytes);
/* The same with a frame type of the caller's choice (SHOAL_BOOT_RING, ...). */
int adv_fake_send_frame(adv_fake_t *f, uint32_t type, uint32_t round, const void *payload,
                        uint32_t len, int tamper, size_t send_bytes);
void adv_fake_send_rest(adv_fake_t *f);
/* Reads frames until an authenticated FAILED notice (1, *status), EOF (0), deadline (-1). */
int adv_fake_expect_failed(adv_fake_t *f, int ms, int32_t *status);
void adv_fake_close(adv_fake_t *f);

/* A relay for one connection to the root (or to any listener: up.root): records the
 * client's first bytes, or flips the byte at flip_down (offset in the root -> client stream;
 * -1 none) or at flip_up (client -> root; -1 none, set after adv_proxy_start). */
typedef struct {
    int lfd;
    shoal_boot_uid_t up;
    long flip_down;
    long flip_up;
    size_t upn;
    uint8_t rec[256];
    size_t rec_len;            /* written by the relay thread (release), read with acquire */
    size_t down;               /* the same */
    int stop;                  /* atomic: set by adv_proxy_stop */
    pthread_t th;
} adv_proxy_t;
int adv_proxy_start(adv_proxy_t *p, const shoal_boot_uid_t *up, long flip_down,
                    shoal_boot_uid_t *via);
void adv_proxy_stop(adv_proxy_t *p);

#endif
