/* Helpers of the adversarial join suite (see adv_lib.h). */
#include "tests/adv/adv_lib.h"
#include "core/core.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char adv_rank_path[4096];

void adv_init(const char *argv0)
{
    const char *slash = strrchr(argv0, '/');
    char tmo[32];
    snprintf(adv_rank_path, sizeof(adv_rank_path), "%.*sadv_rank",
             slash != NULL ? (int)(slash - argv0 + 1) : 0, argv0);
    snprintf(tmo, sizeof(tmo), "%d", ADV_TIMEOUT_MS);
    /* Before any shoal call: the config is parsed once per process. */
    setenv("SHOAL_TIMEOUT_MS", tmo, 1);
    setenv("SHOAL_TRANSPORT", "shm", 1);
    unsetenv("SHOAL_UID");
    unsetenv("SHOAL_ROOT");
    unsetenv("SHOAL_SECRET");
    unsetenv("SLURM_JOB_ID");
    unsetenv("SLURM_RESTART_COUNT");
    signal(SIGPIPE, SIG_IGN);
    shoal_config_global_init();
}

double adv_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

int adv_spawn(adv_proc_t *p, const char *mode, const char *uid_hex, int rank, int nranks,
              const char *const *env, int hook_fd)
{
    int fds[2];
    memset(p, 0, sizeof(*p));
    p->out = -1;
    if (pipe(fds) != 0) {
        return -1;
    }
    p->pid = fork();
    if (p->pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (p->pid == 0) {
        char v[32];
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        if (uid_hex != NULL) {
            setenv("SHOAL_UID", uid_hex, 1);
        }
        snprintf(v, sizeof(v), "%d", rank);
        setenv("SHOAL_RANK", v, 1);
        snprintf(v, sizeof(v), "%d", nranks);
        setenv("SHOAL_NRANKS", v, 1);
        for (int i = 0; env != NULL && env[i] != NULL; i++) {
            putenv((char *)env[i]);
        }
        if (hook_fd >= 0) {
            snprintf(v, sizeof(v), "%d", hook_fd);
            setenv("ADV_HOOK_FD", v, 1);
        }
        execl(adv_rank_path, adv_rank_path, mode, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    p->out = fds[0];
    return 0;
}

static void adv_parse(adv_proc_t *p)
{
    char *line = strstr(p->buf, "RESULT ");
    if (line != NULL && strchr(line, '\n') != NULL &&
        sscanf(line, "RESULT %47s %lf %d", p->status, &p->ms, &p->ok) == 3) {
        p->have_result = 1;
    }
}

int adv_wait(adv_proc_t *p, int n, int deadline_ms)
{
    double deadline = adv_now_ms() + deadline_ms;
    int open = n, got = 0;
    while (open > 0 && adv_now_ms() < deadline) {
        struct pollfd pfd[16];
        int m = 0, idx[16];
        for (int i = 0; i < n && m < 16; i++) {
            if (p[i].out >= 0) {
                pfd[m] = (struct pollfd){.fd = p[i].out, .events = POLLIN};
                idx[m++] = i;
            }
        }
        if (poll(pfd, (nfds_t)m, 100) <= 0) {
            continue;
        }
        for (int k = 0; k < m; k++) {
            adv_proc_t *q = &p[idx[k]];
            ssize_t r;
            if (pfd[k].revents == 0) {
                continue;
            }
            r = read(q->out, q->buf + q->len, sizeof(q->buf) - 1 - q->len);
            if (r <= 0) {
                close(q->out);
                q->out = -1;
                open--;
                continue;
            }
            q->len += (size_t)r;
            q->buf[q->len] = '\0';
            adv_parse(q);
        }
    }
    for (int i = 0; i < n; i++) {
        if (p[i].out >= 0) {
            close(p[i].out);
            p[i].out = -1;
        }
        if (p[i].pid > 0) {
            if (!p[i].have_result) {
                kill(p[i].pid, SIGKILL);
            }
            waitpid(p[i].pid, NULL, 0);
            p[i].pid = 0;
        }
        got += p[i].have_result;
    }
    return got;
}

int adv_all(const adv_proc_t *p, int n, const char *status, int want_ok)
{
    for (int i = 0; i < n; i++) {
        if (!p[i].have_result || strcmp(p[i].status, status) != 0 || (want_ok && !p[i].ok)) {
            return 0;
        }
    }
    return 1;
}

int adv_all_quick(const adv_proc_t *p, int n)
{
    for (int i = 0; i < n; i++) {
        if (!p[i].have_result || p[i].ms >= ADV_QUICK_MS) {
            return 0;
        }
    }
    return 1;
}

void adv_diag(const adv_proc_t *p, int n, const char *what)
{
    for (int i = 0; i < n; i++) {
        printf("# %s %d: %s in %.0f ms, allreduce %s\n", what, i,
               p[i].have_result ? p[i].status : "(no result)", p[i].ms, p[i].ok ? "ok" : "-");
    }
}

void adv_ident(const char *tenant, const char *job, uint64_t epoch, shoal_boot_ident_t *id)
{
    shoal_tenant_id_t t;
    memset(&t, 0, sizeof(t));
    snprintf(t.tenant, sizeof(t.tenant), "%s", tenant);
    snprintf(t.job, sizeof(t.job), "%s", job);
    t.epoch = epoch;
    shoal_boot_ident_make(&t, id);
}

void adv_uid_hex(const shoal_boot_uid_t *u, char *hex)
{
    shoal_uid_t uid;
    shoal_boot_uid_encode(u, &uid);
    for (int i = 0; i < SHOAL_UID_BYTES; i++) {
        sprintf(hex + 2 * i, "%02x", (unsigned char)uid.internal[i]);
    }
}

int adv_root(const char *tenant, const char *job, uint64_t epoch, shoal_boot_uid_t *u,
             char *hex)
{
    struct sockaddr_in *s4;
    struct sockaddr_storage ss;
    memset(u, 0, sizeof(*u));
    memset(&ss, 0, sizeof(ss));
    s4 = (struct sockaddr_in *)&ss;
    s4->sin_family = AF_INET;
    s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (shoal_random_bytes(u->secret, sizeof(u->secret)) != SHOAL_OK) {
        return -1;
    }
    adv_ident(tenant, job, epoch, &u->ident);
    if (shoal_boot_root_start(&ss, sizeof(*s4), 0, shoal_core_config.timeout_ms, u) != SHOAL_OK) {
        return -1;
    }
    adv_uid_hex(u, hex);
    return 0;
}

int adv_dial(const shoal_boot_uid_t *u)
{
    int fd = socket(u->root.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -1;
    }
    if (connect(fd, (const struct sockaddr *)&u->root, u->root_len) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int adv_read_n(int fd, void *buf, size_t n, int ms)
{
    double deadline = adv_now_ms() + ms;
    size_t have = 0;
    while (have < n) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ssize_t r;
        if (adv_now_ms() >= deadline) {
            return -1;
        }
        if (poll(&p, 1, 50) <= 0) {
            continue;
        }
        r = recv(fd, (char *)buf + have, n - have, 0);
        if (r <= 0) {
            return r == 0 ? 0 : -1;
        }
        have += (size_t)r;
    }
    return 1;
}

int adv_read_challenge(int fd, uint8_t *nonce)
{
    shoal_boot_frame_t f;
    if (adv_read_n(fd, &f, sizeof(f), 3000) != 1 || f.magic != SHOAL_BOOT_FRAME_MAGIC ||
        f.type != SHOAL_BOOT_CHALLENGE || f.len != SHOAL_BOOT_NONCE) {
        return -1;
    }
    return adv_read_n(fd, nonce, SHOAL_BOOT_NONCE, 3000) == 1 ? 0 : -1;
}

int adv_expect_refused(int fd, int ms, int32_t *status)
{
    shoal_boot_frame_t f;
    int r = adv_read_n(fd, &f, sizeof(f), ms);
    if (r != 1) {
        return r;
    }
    if (f.magic == SHOAL_BOOT_FRAME_MAGIC && f.type == SHOAL_BOOT_REFUSED) {
        *status = (int32_t)f.round;
        return 1;
    }
    return -2;
}

int adv_fake_join(const shoal_boot_uid_t *u, const uint8_t *secret,
                  const shoal_boot_ident_t *id, int rank, int nranks, adv_fake_t *f,
                  int32_t *refused)
{
    uint8_t nonce[SHOAL_BOOT_NONCE], mac[SHOAL_HMAC_BYTES], want[SHOAL_HMAC_BYTES];
    struct {
        shoal_boot_frame_t f;
        shoal_boot_hello_t h;
    } msg;
    shoal_boot_frame_t w;

    memset(f, 0, sizeof(*f));
    f->fd = adv_dial(u);
    if (f->fd < 0 || adv_read_challenge(f->fd, nonce) != 0) {
        return -1;
    }
    memset(&msg, 0, sizeof(msg));
    msg.f = (shoal_boot_frame_t){.magic = SHOAL_BOOT_FRAME_MAGIC, .type = SHOAL_BOOT_HELLO,
                                 .len = sizeof(msg.h)};
    msg.h.rank = rank;
    msg.h.nranks = nranks;
    msg.h.ident = *id;
    shoal_random_bytes(msg.h.nonce, sizeof(msg.h.nonce));
    shoal_boot_hello_mac(secret, nonce, &msg.h, msg.h.mac);
    if (send(f->fd, &msg, sizeof(msg), MSG_NOSIGNAL) != (ssize_t)sizeof(msg) ||
        adv_read_n(f->fd, &w, sizeof(w), 3000) != 1) {
        return -1;
    }
    if (w.type == SHOAL_BOOT_REFUSED) {
        *refused = (int32_t)w.round;
        return 1;
    }
    if (w.type != SHOAL_BOOT_WELCOME || adv_read_n(f->fd, mac, sizeof(mac), 3000) != 1) {
        return -1;
    }
    shoal_boot_welcome_mac(secret, nonce, &msg.h, want);
    if (memcmp(mac, want, sizeof(mac)) != 0) {
        return -1;
    }
    shoal_boot_session_key(secret, nonce, &msg.h, f->key);
    return 0;
}

int adv_fake_send_ag(adv_fake_t *f, uint32_t round, const void *payload, uint32_t len,
                     int tamper, size_t send_bytes)
{
    return adv_fake_send_frame(f, SHOAL_BOOT_AG, round, payload, len, tamper, send_bytes);
}

int adv_fake_send_frame(adv_fake_t *f, uint32_t type, uint32_t round, const void *payload,
                        uint32_t len, int tamper, size_t send_bytes)
{
    shoal_boot_frame_t h = {.magic = SHOAL_BOOT_FRAME_MAGIC, .type = type, .len = len,
                            .round = round};
    uint8_t digest[SHOAL_HMAC_BYTES];
    size_t total = sizeof(h) + len + SHOAL_BOOT_MAC;
    uint8_t *buf = malloc(total);
    if (buf == NULL) {
        return -1;
    }
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), payload, len);
    shoal_boot_payload_digest(payload, len, digest);
    shoal_boot_frame_mac(f->key, SHOAL_BOOT_DIR_UP, f->tx++, &h, digest, buf + sizeof(h) + len);
    if (tamper && len > 0) {
        buf[sizeof(h)] ^= 0x01;
    }
    if (send_bytes > total) {
        send_bytes = total;
    }
    (void)!send(f->fd, buf, send_bytes, MSG_NOSIGNAL);
    free(f->rest);
    f->rest = NULL;
    f->rest_len = total - send_bytes;
    if (f->rest_len > 0) {
        f->rest = malloc(f->rest_len);
        if (f->rest != NULL) {
            memcpy(f->rest, buf + send_bytes, f->rest_len);
        }
    }
    free(buf);
    return 0;
}

void adv_fake_send_rest(adv_fake_t *f)
{
    if (f->rest != NULL) {
        (void)!send(f->fd, f->rest, f->rest_len, MSG_NOSIGNAL);
        free(f->rest);
        f->rest = NULL;
    }
}

int adv_fake_expect_failed(adv_fake_t *f, int ms, int32_t *status)
{
    double deadline = adv_now_ms() + ms;
    for (;;) {
        shoal_boot_frame_t h;
        uint8_t mac[SHOAL_BOOT_MAC], want[SHOAL_BOOT_MAC], digest[SHOAL_HMAC_BYTES];
        int left = (int)(deadline - adv_now_ms()), r;
        if (left <= 0) {
            return -1;
        }
        r = adv_read_n(f->fd, &h, sizeof(h), left);
        if (r != 1) {
            return r;
        }
        if (h.type != SHOAL_BOOT_FAILED || h.len != 0) {
            /* Skip anything else (a table): payload and MAC. */
            uint8_t skip[4096];
            size_t n = (size_t)h.len + SHOAL_BOOT_MAC;
            while (n > 0) {
                size_t k = n < sizeof(skip) ? n : sizeof(skip);
                if (adv_read_n(f->fd, skip, k, left) != 1) {
                    return 0;
                }
                n -= k;
            }
            f->rx++;
            continue;
        }
        if (adv_read_n(f->fd, mac, sizeof(mac), left) != 1) {
            return 0;
        }
        shoal_boot_payload_digest(NULL, 0, digest);
        shoal_boot_frame_mac(f->key, SHOAL_BOOT_DIR_DOWN, f->rx++, &h, digest, want);
        if (memcmp(mac, want, sizeof(mac)) != 0) {
            return -3;
        }
        *status = (int32_t)h.round;
        return 1;
    }
}

void adv_fake_close(adv_fake_t *f)
{
    if (f->fd >= 0) {
        close(f->fd);
    }
    free(f->rest);
    f->rest = NULL;
    f->fd = -1;
}

/* ---- relay ---------------------------------------------------------------------------- */

static int adv_proxy_pump(int from, int to, uint8_t *buf, size_t cap, adv_proxy_t *p, int down)
{
    ssize_t n = recv(from, buf, cap, MSG_DONTWAIT);
    if (n <= 0) {
        return n == 0 || (errno != EAGAIN && errno != EINTR) ? -1 : 0;
    }
    if (down) {
        size_t at = __atomic_load_n(&p->down, __ATOMIC_RELAXED);
        if (p->flip_down >= 0 && (size_t)p->flip_down >= at &&
            (size_t)p->flip_down < at + (size_t)n) {
            buf[(size_t)p->flip_down - at] ^= 0x40;
        }
        __atomic_store_n(&p->down, at + (size_t)n, __ATOMIC_RELEASE);
    } else {
        size_t at = p->upn;
        long flip = __atomic_load_n(&p->flip_up, __ATOMIC_RELAXED); /* set after the start */
        if (flip >= 0 && (size_t)flip >= at && (size_t)flip < at + (size_t)n) {
            buf[(size_t)flip - at] ^= 0x40;
        }
        p->upn = at + (size_t)n;
    }
    if (!down && p->rec_len < sizeof(p->rec)) {
        size_t k = sizeof(p->rec) - p->rec_len < (size_t)n ? sizeof(p->rec) - p->rec_len
                                                           : (size_t)n;
        memcpy(p->rec + p->rec_len, buf, k);
        __atomic_store_n(&p->rec_len, p->rec_len + k, __ATOMIC_RELEASE);
    }
    return send(to, buf, (size_t)n, MSG_NOSIGNAL) == n ? 0 : -1;
}

static void *adv_proxy_thread(void *arg)
{
    adv_proxy_t *p = arg;
    uint8_t buf[65536];
    double deadline = adv_now_ms() + 20000;
    int c = -1, u = -1;
    while (c < 0 && !__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE) && adv_now_ms() < deadline) {
        struct pollfd pfd = {.fd = p->lfd, .events = POLLIN};
        if (poll(&pfd, 1, 50) > 0) {
            c = accept(p->lfd, NULL, NULL);
        }
    }
    if (c >= 0) {
        u = adv_dial(&p->up);
    }
    while (c >= 0 && u >= 0 && !__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE) &&
           adv_now_ms() < deadline) {
        struct pollfd pfd[2] = {{.fd = c, .events = POLLIN}, {.fd = u, .events = POLLIN}};
        if (poll(pfd, 2, 50) <= 0) {
            continue;
        }
        if ((pfd[0].revents && adv_proxy_pump(c, u, buf, sizeof(buf), p, 0) != 0) ||
            (pfd[1].revents && adv_proxy_pump(u, c, buf, sizeof(buf), p, 1) != 0)) {
            break;
        }
    }
    if (c >= 0) {
        close(c);
    }
    if (u >= 0) {
        close(u);
    }
    return NULL;
}

int adv_proxy_start(adv_proxy_t *p, const shoal_boot_uid_t *up, long flip_down,
                    shoal_boot_uid_t *via)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    memset(p, 0, sizeof(*p));
    p->up = *up;
    p->flip_down = flip_down;
    p->flip_up = -1;
    p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(p->lfd, 4) != 0 || getsockname(p->lfd, (struct sockaddr *)&a, &len) != 0) {
        return -1;
    }
    *via = *up;
    memcpy(&via->root, &a, sizeof(a));
    via->root_len = sizeof(a);
    return pthread_create(&p->th, NULL, adv_proxy_thread, p) == 0 ? 0 : -1;
}

void adv_proxy_stop(adv_proxy_t *p)
{
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
    pthread_join(p->th, NULL);
    close(p->lfd);
}
