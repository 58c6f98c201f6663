/* shoald: the HTTP endpoint, served by libmicrohttpd in the agent's own epoll loop (MHD's epoll
 * fd is one more fd of the loop; MHD_run never blocks), so a slow or garbage HTTP client costs
 * a connection slot until MHD's timeout, never the registration socket.
 *   GET /metrics                    the provider's view (every tenant, the agent's series);
 *                                   with provider_token_file, needs that bearer token
 *   GET /metrics?tenant=T           tenant T's jobs only; needs "Authorization: Bearer TOKEN"
 *                                   with T's tenant.T.scrape_token_file
 * A tenant= without a name: 400. Anything else: 404 (or 405 for another method), with a
 * sentence.
 *
 * Every local user reaches the endpoint from 127.0.0.1, so a per-address limit is no limit
 * among them: one that kept SHOALD_HTTP_MAX_CONN / 2 connections open without a request (a
 * byte now and then beats MHD's idle timeout) had every scrape from the host, Prometheus's
 * included, refused. Instead, once SHOALD_HTTP_MAX_CONN connections are open, a new one
 * pushes out the connection that has waited longest without a request being answered (a
 * scraper sends its request at once, so it is never the oldest). */
#include "agent/agent.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#define SHOALD_HTTP_TIMEOUT_S 10

typedef struct {
    struct MHD_Connection *c;         /* NULL: a free slot */
    int fd;
    int busy;                         /* a request is being answered */
    int evicted;                      /* shut down, MHD closes it at its next look */
    uint64_t since_ns;                /* waiting for a request since (accept or last answer) */
} shoald_http_conn_t;

struct shoald_http {
    shoald_t *a;
    struct MHD_Daemon *d;
    shoald_http_conn_t conns[SHOALD_HTTP_MAX_CONN + SHOALD_HTTP_SPARE];
    unsigned nopen;                   /* connections not evicted */
};

static shoald_http_conn_t *shoald_http_conn_find(shoald_http_t *h, struct MHD_Connection *c)
{
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(h->conns); i++) {
        if (h->conns[i].c == c)
            return &h->conns[i];
    }
    return NULL;
}

/* At the limit: the connection waiting longest for a request is shut down (MHD sees its end
 * and closes it); none waiting (all being answered): the newcomer waits its turn in MHD. */
static void shoald_http_conn_evict(shoald_http_t *h)
{
    shoald_http_conn_t *old = NULL;

    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(h->conns); i++) {
        shoald_http_conn_t *k = &h->conns[i];

        if (k->c != NULL && !k->evicted && !k->busy &&
            (old == NULL || k->since_ns < old->since_ns))
            old = k;
    }
    if (old == NULL)
        return;
    shutdown(old->fd, SHUT_RDWR);
    old->evicted = 1;
    h->nopen--;
    shoal_trace(METER, "http: %u connections open: the one idle longest is closed for a new one",
               (unsigned)SHOALD_HTTP_MAX_CONN);
}

static void shoald_http_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                               enum MHD_ConnectionNotificationCode toe)
{
    const union MHD_ConnectionInfo *info;
    shoald_http_t *h = cls;
    shoald_http_conn_t *k;

    (void)socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        k = shoald_http_conn_find(h, c);
        if (k != NULL) {
            h->nopen -= !k->evicted;
            memset(k, 0, sizeof(*k));
        }
        return;
    }
    info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    k = shoald_http_conn_find(h, NULL); /* MHD's limit is the table's size: one is free */
    if (info == NULL || k == NULL)
        return;
    if (h->nopen >= SHOALD_HTTP_MAX_CONN)
        shoald_http_conn_evict(h);
    *k = (shoald_http_conn_t){.c = c, .fd = info->connect_fd, .since_ns = shoal_time_ns()};
    h->nopen++;
}

/* A request ended (answered, or its connection failed): waiting for the next one again. */
static void shoald_http_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                                  enum MHD_RequestTerminationCode toe)
{
    shoald_http_conn_t *k = shoald_http_conn_find(cls, c);

    (void)con_cls;
    (void)toe;
    if (k != NULL) {
        k->busy = 0;
        k->since_ns = shoal_time_ns();
    }
}

static enum MHD_Result shoald_http_send(struct MHD_Connection *c, unsigned code,
                                        const char *type, char *body, size_t len, int must_free)
{
    struct MHD_Response *r;
    enum MHD_Result ret;

    r = MHD_create_response_from_buffer(len, body, must_free ? MHD_RESPMEM_MUST_FREE :
                                        MHD_RESPMEM_PERSISTENT);
    if (r == NULL) {
        if (must_free)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (code == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"shoald\"");
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result shoald_http_error(struct MHD_Connection *c, unsigned code,
                                         const char *msg)
{
    return shoald_http_send(c, code, "text/plain; charset=utf-8", (char *)msg, strlen(msg), 0);
}

/* The request's bearer token against token: constant-time compare; no token configured
 * (len 0) never matches. The scheme is case-insensitive and one or more spaces separate it
 * from the token (RFC 7235): Prometheus sends its authorization type as configured, and one
 * written "type: bearer" was refused at every scrape. */
static int shoald_http_bearer_ok(struct MHD_Connection *c, const char *token, size_t token_len)
{
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                   MHD_HTTP_HEADER_AUTHORIZATION);
    size_t len;

    if (token_len == 0 || auth == NULL || strncasecmp(auth, "Bearer", 6) != 0 ||
        (auth[6] != ' ' && auth[6] != '\t'))
        return 0;
    auth += 6;
    while (*auth == ' ' || *auth == '\t')
        auth++;
    len = strlen(auth);
    while (len > 0 && (auth[len - 1] == ' ' || auth[len - 1] == '\t'))
        len--; /* the field's trailing whitespace is not part of it */
    return len == token_len && shoal_memeq_ct(auth, token, len);
}

/* The tenant view's token: an unknown tenant and a wrong token get the same answer (no way to
 * probe tenant names). */
static int shoald_http_tenant_ok(shoald_http_t *h, struct MHD_Connection *c, const char *name)
{
    shoald_tenant_t *t = shoald_config_tenant(h->a->cfg, name);

    return t != NULL && shoald_http_bearer_ok(c, t->token, t->token_len);
}

/* MHD_get_connection_values' iterator: *cls = 1 once the query holds the key "tenant", with a
 * value or without one ("?tenant", which MHD_lookup_connection_value gives as NULL). */
static enum MHD_Result shoald_http_tenant_arg(void *cls, enum MHD_ValueKind kind,
                                              const char *key, const char *value)
{
    (void)kind;
    (void)value;
    if (strcmp(key, "tenant") != 0)
        return MHD_YES;
    *(int *)cls = 1;
    return MHD_NO;
}

static enum MHD_Result shoald_http_handler(void *cls, struct MHD_Connection *c,
                                           const char *url, const char *method,
                                           const char *version, const char *upload,
                                           size_t *upload_size, void **con_cls)
{
    shoald_http_t *h = cls;
    shoald_http_conn_t *k = shoald_http_conn_find(h, c);
    shoald_text_t t = {0};
    const char *tenant;

    if (k != NULL)
        k->busy = 1; /* its request is in: not one to push out while it is answered */
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return shoald_http_error(c, MHD_HTTP_METHOD_NOT_ALLOWED,
                                 "shoald serves GET /metrics only\n");
    if (strcmp(url, "/metrics") != 0)
        return shoald_http_error(c, MHD_HTTP_NOT_FOUND,
                                 "not found: shoald serves /metrics (and /metrics?tenant=NAME "
                                 "with the tenant's bearer token)\n");
    tenant = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "tenant");
    if (tenant == NULL) { /* "?tenant" without a value was taken for no tenant asked */
        int named = 0;

        MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, shoald_http_tenant_arg, &named);
        tenant = named ? "" : NULL;
    }
    if (tenant != NULL && tenant[0] == '\0')
        return shoald_http_error(c, MHD_HTTP_BAD_REQUEST,
                                 "a tenant view names its tenant: /metrics?tenant=NAME\n");
    if (tenant != NULL && !shoald_http_tenant_ok(h, c, tenant))
        return shoald_http_error(c, MHD_HTTP_UNAUTHORIZED,
                                 "the tenant view needs the tenant's bearer token\n");
    /* the provider's view names every tenant's jobs: behind its own token when one is set */
    if (tenant == NULL && h->a->cfg->provider_token_len > 0 &&
        !shoald_http_bearer_ok(c, h->a->cfg->provider_token, h->a->cfg->provider_token_len))
        return shoald_http_error(c, MHD_HTTP_UNAUTHORIZED,
                                 "the provider view needs the provider's bearer token "
                                 "(provider_token_file); a tenant asks for "
                                 "/metrics?tenant=NAME with its own\n");
    shoald_prom_render(h->a, tenant, &t);
    if (t.oom) {
        free(t.buf);
        return shoald_http_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    }
    return shoald_http_send(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", t.buf,
                            t.len, 1);
}

static void shoald_http_log(void *cls, const char *fmt, va_list ap)
{
    char line[256];

    vsnprintf(line, sizeof(line), fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    shoal_info(METER, "http: %s", line);
}

/* "127.0.0.1:9464", "[::1]:9464", "0.0.0.0:0" */
static int shoald_http_addr(const char *text, struct sockaddr_storage *ss, socklen_t *len_p)
{
    struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    char host[64];
    const char *colon;
    char *end;
    unsigned long port;
    size_t n;

    memset(ss, 0, sizeof(*ss));
    if (text[0] == '[') {
        colon = strstr(text, "]:");
        if (colon == NULL)
            return -1;
        n = (size_t)(colon - text - 1);
        colon++;
    } else {
        colon = strrchr(text, ':');
        if (colon == NULL)
            return -1;
        n = (size_t)(colon - text);
    }
    if (n == 0 || n >= sizeof(host))
        return -1;
    memcpy(host, text[0] == '[' ? text + 1 : text, n);
    host[n] = '\0';
    port = strtoul(colon + 1, &end, 10);
    if (*end != '\0' || colon[1] == '\0' || port > 65535)
        return -1;
    if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)port);
        *len_p = sizeof(*in4);
        return 0;
    }
    if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        *len_p = sizeof(*in6);
        return 0;
    }
    return -1;
}

shoal_status_t shoald_http_start(shoald_t *a, const char *addr, shoald_http_t **h_p,
                                 int *port_p)
{
    const union MHD_DaemonInfo *info;
    struct sockaddr_storage ss;
    shoald_http_t *h;
    socklen_t len;
    unsigned flags = MHD_USE_EPOLL | MHD_USE_ERROR_LOG;

    if (shoald_http_addr(addr, &ss, &len) != 0) {
        shoal_error(METER, "http address %s is not IPv4:port or [IPv6]:port", addr);
        return SHOAL_ERR_INVALID_ARG;
    }
    h = calloc(1, sizeof(*h));
    if (h == NULL)
        return SHOAL_ERR_NO_MEMORY;
    h->a = a;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, shoald_http_handler, h,
                            MHD_OPTION_EXTERNAL_LOGGER, shoald_http_log, NULL,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)SHOALD_HTTP_TIMEOUT_S,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)SHOAL_ARRAY_SIZE(h->conns),
                            MHD_OPTION_NOTIFY_CONNECTION, shoald_http_notify, h,
                            MHD_OPTION_NOTIFY_COMPLETED, shoald_http_completed, h,
                            MHD_OPTION_END);
    if (h->d == NULL) {
        shoal_error(METER, "cannot serve http on %s (address in use or not local?)", addr);
        free(h);
        return SHOAL_ERR_SYSTEM;
    }
    info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    *port_p = info != NULL ? (int)info->port : -1;
    *h_p = h;
    return SHOAL_OK;
}

int shoald_http_fd(shoald_http_t *h)
{
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_EPOLL_FD);

    return info != NULL ? info->epoll_fd : -1;
}

void shoald_http_run(shoald_http_t *h)
{
    MHD_run(h->d);
}

int shoald_http_wait_ms(shoald_http_t *h)
{
    MHD_UNSIGNED_LONG_LONG ms;

    if (MHD_get_timeout(h->d, &ms) != MHD_YES)
        return -1;
    return ms > 60000 ? 60000 : (int)ms;
}

void shoald_http_stop(shoald_http_t *h)
{
    if (h == NULL)
        return;
    MHD_stop_daemon(h->d);
    free(h);
}
