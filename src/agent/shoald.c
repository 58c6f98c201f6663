/* shoald: the shoal node agent (DESIGN.md section 7; agent.h describes the parts).
 *   shoald [-c FILE] [--listen PATH] [--http ADDR|none] [--minute-seconds N]
 *          [--ledger URL|none] [--ready-file PATH]
 *   shoald --help-config        the configuration keys, defaults and meanings
 * Runs in the foreground (systemd Type=notify: READY=1 once it listens), logs to stderr with
 * the library's logger (SHOAL_DEBUG, default INFO here), stops cleanly on SIGTERM or SIGINT.
 * Exit 0 after a clean stop, 1 when it cannot start, 2 on a usage error. */
#include "agent/agent.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define SHOALD_DEFAULT_CONF "/etc/shoal/shoald.conf"

static void shoald_usage(FILE *fp)
{
    fprintf(fp,
            "usage: shoald [-c CONFIG] [--listen SOCKET] [--http ADDR:PORT|none]\n"
            "              [--minute-seconds N] [--ledger URL|none] [--ready-file PATH]\n"
            "       shoald --help-config | --version | --help\n"
            "The shoal node agent: ranks register their metering pages on SOCKET, Prometheus\n"
            "scrapes http://ADDR:PORT/metrics, one ledger record per tenant, job and minute.\n"
            "CONFIG defaults to " SHOALD_DEFAULT_CONF " when it exists; options override it.\n");
}

/* systemd's readiness notification (sd_notify without libsystemd). */
static void shoald_notify(const char *msg)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    socklen_t len;
    int fd;

    if (path == NULL || (path[0] != '/' && path[0] != '@') || strlen(path) >= sizeof(sa.sun_path))
        return;
    memcpy(sa.sun_path, path, strlen(path));
    if (sa.sun_path[0] == '@')
        sa.sun_path[0] = '\0';
    len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path));
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return;
    if (sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sa, len) < 0)
        shoal_warn(METER, "sd_notify: %s", strerror(errno));
    close(fd);
}

static void shoald_ready_file(const shoald_config_t *cfg, const char *http, int port)
{
    char tmp[4096];
    FILE *fp;

    if (cfg->ready_file == NULL)
        return;
    snprintf(tmp, sizeof(tmp), "%s.tmp", cfg->ready_file);
    fp = fopen(tmp, "we");
    if (fp == NULL) {
        shoal_warn(METER, "cannot write %s: %s", tmp, strerror(errno));
        return;
    }
    fprintf(fp, "pid=%d\nsock=%s\n", (int)getpid(), cfg->listen);
    if (http != NULL) {
        const char *colon = strrchr(http, ':');
        fprintf(fp, "http=%.*s:%d\n", (int)(colon - http), http, port);
    }
    fclose(fp);
    if (rename(tmp, cfg->ready_file) != 0)
        shoal_warn(METER, "cannot rename %s: %s", tmp, strerror(errno));
}

typedef struct {
    const char *conf, *listen, *http, *ledger, *ready;
    int minute_seconds;
} shoald_args_t;

static int shoald_args(int argc, char **argv, shoald_args_t *o)
{
    enum { O_LISTEN = 256, O_HTTP, O_MINUTE, O_LEDGER, O_READY, O_HELPCFG, O_VERSION };
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"listen", required_argument, NULL, O_LISTEN},
        {"http", required_argument, NULL, O_HTTP},
        {"minute-seconds", required_argument, NULL, O_MINUTE},
        {"ledger", required_argument, NULL, O_LEDGER},
        {"ready-file", required_argument, NULL, O_READY},
        {"help-config", no_argument, NULL, O_HELPCFG},
        {"version", no_argument, NULL, O_VERSION},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    char *end;
    long v;
    int c;

    while ((c = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': o->conf = optarg; break;
        case O_LISTEN: o->listen = optarg; break;
        case O_HTTP: o->http = optarg; break;
        case O_LEDGER:
            o->ledger = shoal_ledger_url_arg(optarg, "shoald");
            if (o->ledger == NULL) {
                fprintf(stderr, "shoald: out of memory\n");
                return 1;
            }
            break;
        case O_READY: o->ready = optarg; break;
        case O_MINUTE:
            errno = 0;
            v = strtol(optarg, &end, 10);
            if (end == optarg || *end != '\0' || errno != 0 || v < 1 || v > 3600) {
                fprintf(stderr, "shoald: --minute-seconds takes 1..3600 (seconds), not '%s'\n",
                        optarg);
                return 2;
            }
            o->minute_seconds = (int)v;
            break;
        case O_HELPCFG: shoald_config_help(stdout); return 0;
        case O_VERSION: printf("shoald %s\n", PACKAGE_VERSION); return 0;
        case 'h': shoald_usage(stdout); return 0;
        default: shoald_usage(stderr); return 2;
        }
    }
    if (optind != argc) {
        shoald_usage(stderr);
        return 2;
    }
    return -1;
}

static int shoald_config(const shoald_args_t *o, shoald_config_t *cfg)
{
    const char *path = o->conf;

    if (path == NULL && access(SHOALD_DEFAULT_CONF, F_OK) == 0)
        path = SHOALD_DEFAULT_CONF;
    if (shoald_config_load(cfg, path) != SHOAL_OK)
        return -1;
    if (o->listen != NULL)
        cfg->listen = o->listen;
    if (o->http != NULL)
        cfg->http = o->http;
    if (o->ledger != NULL)
        cfg->ledger_url = o->ledger;
    if (o->ready != NULL)
        cfg->ready_file = o->ready;
    if (o->minute_seconds > 0)
        cfg->minute_seconds = o->minute_seconds;
    if (cfg->ledger_url != NULL && strcmp(cfg->ledger_url, "none") == 0)
        cfg->ledger_url = NULL;
    if (cfg->http != NULL && strcmp(cfg->http, "none") == 0)
        cfg->http = NULL;
    return shoald_config_keys(cfg) == SHOAL_OK ? 0 : -1;
}

static int shoald_min_wait(int a, int b)
{
    if (a < 0)
        return b;
    if (b < 0)
        return a;
    return a < b ? a : b;
}

static int shoald_loop(shoald_t *a, int epfd, int sigfd, shoald_reg_t *reg, shoald_http_t *http)
{
    struct epoll_event evs[64];
    shoald_tag_t *tag;
    int n, i, timeout, stop = 0;

    while (!stop) {
        timeout = shoald_min_wait(shoald_reg_wait_ms(reg), shoald_minute_wait_ms(a));
        timeout = shoald_min_wait(timeout, shoald_qos_wait_ms(a));
        timeout = shoald_min_wait(timeout, shoald_gpus_wait_ms(a));
        if (http != NULL)
            timeout = shoald_min_wait(timeout, shoald_http_wait_ms(http));
        n = epoll_wait(epfd, evs, (int)SHOAL_ARRAY_SIZE(evs), timeout);
        if (n < 0 && errno != EINTR) {
            shoal_error(METER, "epoll_wait: %s", strerror(errno));
            return 1;
        }
        for (i = 0; i < n; i++) {
            tag = evs[i].data.ptr;
            if (tag == NULL)
                stop = 1; /* the signalfd */
            else if (tag->kind != SHOALD_TAG_HTTP)
                shoald_reg_event(reg, tag, evs[i].events);
        }
        if (http != NULL)
            shoald_http_run(http); /* its fd, or its timeouts: cheap when idle */
        shoald_reg_timeouts(reg);
        shoald_minute_tick(a);
        shoald_ledger_retry(a);
        shoald_qos_tick(a);
        shoald_gpus_tick(a);
    }
    (void)sigfd;
    shoal_info(METER, "stopping");
    return 0;
}

int main(int argc, char **argv)
{
    static shoald_tag_t http_tag = {.kind = SHOALD_TAG_HTTP};
    struct epoll_event ev = {.events = EPOLLIN};
    shoald_args_t o = {0};
    shoald_config_t cfg;
    shoald_http_t *http = NULL;
    shoald_reg_t *reg = NULL;
    shoald_t a = {0};
    sigset_t mask;
    int ret, epfd, sigfd, port = 0;
    char ledger_url[512];

    ret = shoald_args(argc, argv, &o);
    if (ret >= 0)
        return ret;
    /* The tenant keys and the database password it holds stay out of a core dump. */
    (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    shoal_config_global_init();
    if (shoal_cfg_getenv("DEBUG") == NULL) {
        shoal_log_level_cur = SHOAL_LOG_INFO;
        shoal_log_subsys_mask = ~0u;
    }
    if (shoald_config(&o, &cfg) != 0)
        return 1;
    a.cfg = &cfg;
    a.state_lock_fd = -1;
    if (cfg.hostname != NULL)
        snprintf(a.hostname, sizeof(a.hostname), "%s", cfg.hostname);
    else if (gethostname(a.hostname, sizeof(a.hostname) - 1) != 0)
        snprintf(a.hostname, sizeof(a.hostname), "localhost");
    shoald_host_key(&a);

    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (sigfd < 0 || epfd < 0) {
        shoal_error(METER, "signalfd/epoll: %s", strerror(errno));
        return 1;
    }
    ev.data.ptr = NULL;
    epoll_ctl(epfd, EPOLL_CTL_ADD, sigfd, &ev);
    ret = 1;
    /* first: a second agent on this state_dir leaves the first one's socket alone */
    if (shoald_state_lock(&a) != SHOAL_OK)
        goto out;
    if (shoald_reg_start(&a, epfd, &reg) != SHOAL_OK)
        goto out;
    if (cfg.http != NULL) {
        if (shoald_http_start(&a, cfg.http, &http, &port) != SHOAL_OK)
            goto out;
        if (cfg.provider_token_len == 0)
            shoal_warn(METER, "http: /metrics serves every tenant's job names and counts to "
                       "whoever reaches %s (on loopback, every local user): set "
                       "provider_token_file to ask for a token", cfg.http);
        ev.data.ptr = &http_tag;
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, shoald_http_fd(http), &ev) != 0) {
            shoal_error(METER, "epoll_ctl(http): %s", strerror(errno));
            goto out;
        }
    }
    shoald_minute_init(&a);
    if (shoald_qos_start(&a) != SHOAL_OK)
        goto out;
    shoal_ledger_url_redact(cfg.ledger_url != NULL ? cfg.ledger_url : "none", ledger_url,
                            sizeof(ledger_url));
    shoal_info(METER, "shoald %s: registrations on %s, metrics on %s%s%s (port %d), minute %d s, "
               "ledger %s", PACKAGE_VERSION, cfg.listen, cfg.http != NULL ? "http://" : "",
               cfg.http != NULL ? cfg.http : "none", cfg.http != NULL ? "/metrics" : "", port,
               cfg.minute_seconds, ledger_url);
    shoald_ready_file(&cfg, cfg.http, port);
    shoald_notify("READY=1");
    ret = shoald_loop(&a, epfd, sigfd, reg, http);
    shoald_notify("STOPPING=1");
    shoald_minute_fini(&a);
out:
    shoald_qos_stop(&a);
    shoald_http_stop(http);
    shoald_reg_stop(reg);
    shoald_pages_free(&a);
    if (cfg.ready_file != NULL)
        unlink(cfg.ready_file);
    shoald_config_free(&cfg);
    if (a.state_lock_fd >= 0)
        close(a.state_lock_fd);
    close(epfd);
    close(sigfd);
    return ret;
}
