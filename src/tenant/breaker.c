/* Circuit breaker on the join listeners: failed authentications per source address in a
 * sliding window, refusal during a cool-down, never against a trusted (expected peer) address.
 * See breaker.h for why it cannot refuse a real rank of the job. */
#include "tenant/breaker.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHOAL_BREAKER_SOURCES 256      /* sources tracked; the least recently seen goes */
#define SHOAL_BREAKER_SOURCES_MAX 65536 /* the table's bound when trusted sources fill it */
#define SHOAL_BREAKER_RING 64          /* failure times kept per source (caps FAILS) */
#define SHOAL_BREAKER_LOG_NS (60ull * 1000000000ull) /* one line per source per minute */

shoal_tenant_breaker_config_t shoal_tenant_breaker_config = {
    .fails = 8,
    .window_ms = 10000,
    .cooldown_ms = 60000,
};

static const shoal_cfg_field_t shoal_tenant_breaker_cfg_fields[] = {
    {
        .name = "TENANT_BREAKER_FAILS",
        .dflt = "8",
        .doc = "a source address (IP) with this many failed authentications at a join "
               "listener (bootstrap root, tcp transport, ib out-of-band) within "
               "SHOAL_TENANT_BREAKER_WINDOW is refused for SHOAL_TENANT_BREAKER_COOLDOWN (at "
               "most 64); never applied to the addresses of the job's peers or the root's own "
               "host; 0 disables",
        .offset = offsetof(shoal_tenant_breaker_config_t, fails),
        .type = SHOAL_CFG_UINT,
    },
    {
        .name = "TENANT_BREAKER_WINDOW",
        .dflt = "10s",
        .doc = "sliding window in which failed authentications of one source are counted; "
               "inf = all of them (the last 64)",
        .offset = offsetof(shoal_tenant_breaker_config_t, window_ms),
        .type = SHOAL_CFG_TIME,
    },
    {
        .name = "TENANT_BREAKER_COOLDOWN",
        .dflt = "60s",
        .doc = "how long a source that kept failing is refused; refusals are logged once per "
               "source per minute",
        .offset = offsetof(shoal_tenant_breaker_config_t, cooldown_ms),
        .type = SHOAL_CFG_TIME,
    },
};

const shoal_cfg_table_t shoal_tenant_breaker_cfg_table = {
    .module = "tenant",
    .fields = shoal_tenant_breaker_cfg_fields,
    .nfields = SHOAL_ARRAY_SIZE(shoal_tenant_breaker_cfg_fields),
    .dst = &shoal_tenant_breaker_config,
};

typedef struct {
    int used;
    int family;                        /* AF_INET or AF_INET6 */
    uint8_t ip[16];
    uint64_t times[SHOAL_BREAKER_RING]; /* failure times, a ring */
    unsigned head, n;
    uint64_t open_until;               /* 0: closed */
    uint64_t failed, refused;
    uint64_t refused_unlogged;         /* refused since the last refusal line */
    uint64_t refuse_log_ns, fail_log_ns; /* last lines, 0 = never */
    uint64_t seen_ns;
    int trust;
} shoal_breaker_src_t;

static pthread_mutex_t shoal_breaker_lock = PTHREAD_MUTEX_INITIALIZER;
/* SHOAL_BREAKER_SOURCES entries, grown (doubled) only when every entry is trusted: the
 * peers of a job over more hosts than that filled it, and then a stranger was not tracked
 * (the breaker was off) and a trust that did not fit was dropped, so that its release later
 * lowered the count of another communicator's peer at that address. */
static shoal_breaker_src_t shoal_breaker_fixed[SHOAL_BREAKER_SOURCES];
static shoal_breaker_src_t *shoal_breaker_tab = shoal_breaker_fixed;
static int shoal_breaker_cap = SHOAL_BREAKER_SOURCES;
static uint64_t shoal_breaker_failed, shoal_breaker_refused, shoal_breaker_opened;
static uint64_t shoal_breaker_untracked_log_ns; /* last full line for a source with no entry */

/* The source key: the IP (IPv4-mapped IPv6 as IPv4), no port. 0 if not an IP address. */
static int shoal_breaker_key(const struct sockaddr *sa, int *family_p, uint8_t ip[16])
{
    memset(ip, 0, 16);
    if (sa == NULL) {
        return 0;
    }
    if (sa->sa_family == AF_INET) {
        memcpy(ip, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        *family_p = AF_INET;
        return 1;
    }
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a)) {
            memcpy(ip, a->s6_addr + 12, 4);
            *family_p = AF_INET;
        } else {
            memcpy(ip, a->s6_addr, 16);
            *family_p = AF_INET6;
        }
        return 1;
    }
    return 0;
}

int shoal_tenant_breaker_same_source(const struct sockaddr *a, const struct sockaddr *b)
{
    int fa, fb;
    uint8_t ia[16], ib[16];
    return shoal_breaker_key(a, &fa, ia) && shoal_breaker_key(b, &fb, ib) && fa == fb &&
           memcmp(ia, ib, sizeof(ia)) == 0;
}

static void shoal_breaker_str(const shoal_breaker_src_t *s, char *buf, size_t len)
{
    if (inet_ntop(s->family, s->ip, buf, (socklen_t)len) == NULL) {
        snprintf(buf, len, "?");
    }
}

/* The entry of sa; created when create is set. Room for it: a free entry, else the least
 * recently seen one that is neither trusted nor open, else the least recently seen open one
 * (a table full of open breakers must not let every newcomer through unrefused: evicted,
 * that source is counted again from zero, as a newcomer is), else a new one of the table
 * grown. NULL only when every entry is trusted and the table cannot grow. Under the lock. */
static shoal_breaker_src_t *shoal_breaker_find(const struct sockaddr *sa, int create,
                                               uint64_t now)
{
    int family, vclass = 3; /* the victim's class: 0 free, 1 closed, 2 open, 3 none */
    uint8_t ip[16];
    shoal_breaker_src_t *victim = NULL;

    if (!shoal_breaker_key(sa, &family, ip)) {
        return NULL;
    }
    for (int i = 0; i < shoal_breaker_cap; i++) {
        shoal_breaker_src_t *s = &shoal_breaker_tab[i];
        int cls;
        if (s->used && s->family == family && memcmp(s->ip, ip, 16) == 0) {
            s->seen_ns = now;
            return s;
        }
        cls = !s->used ? 0 : s->trust != 0 ? 3 : s->open_until <= now ? 1 : 2;
        if (cls < vclass || (cls == vclass && cls != 0 && cls != 3 &&
                             s->seen_ns < victim->seen_ns)) {
            victim = s;
            vclass = cls;
        }
    }
    if (create && victim == NULL && shoal_breaker_cap < SHOAL_BREAKER_SOURCES_MAX) {
        shoal_breaker_src_t *grown = calloc((size_t)shoal_breaker_cap * 2, sizeof(*grown));
        if (grown != NULL) {
            memcpy(grown, shoal_breaker_tab, (size_t)shoal_breaker_cap * sizeof(*grown));
            if (shoal_breaker_tab != shoal_breaker_fixed) {
                free(shoal_breaker_tab);
            }
            shoal_breaker_tab = grown;
            victim = &grown[shoal_breaker_cap];
            shoal_breaker_cap *= 2;
        }
    }
    if (!create || victim == NULL) {
        return NULL;
    }
    if (vclass == 2) {
        char old[INET6_ADDRSTRLEN];
        shoal_breaker_str(victim, old, sizeof(old));
        shoal_trace(TENANT, "breaker table full of open sources: %s is forgotten for a new one",
                    old);
    }
    memset(victim, 0, sizeof(*victim));
    victim->used = 1;
    victim->family = family;
    memcpy(victim->ip, ip, 16);
    victim->seen_ns = now;
    return victim;
}

static unsigned shoal_breaker_recent(const shoal_breaker_src_t *s, uint64_t now)
{
    /* inf (-1, as the TIME parser gives it) counts every failure the ring holds; taken as a
     * window of 0 it counted none, so SHOAL_TENANT_BREAKER_WINDOW=inf turned the breaker off */
    uint64_t window = shoal_tenant_breaker_config.window_ms < 0
                          ? UINT64_MAX
                          : (uint64_t)shoal_tenant_breaker_config.window_ms * 1000000ull;
    unsigned k = 0;
    for (unsigned i = 0; i < s->n; i++) {
        k += now - s->times[i] < window;
    }
    return k;
}

int shoal_tenant_breaker_admit(const struct sockaddr *src)
{
    uint64_t now = shoal_time_ns();
    int admit = 1;
    char ip[INET6_ADDRSTRLEN];

    pthread_mutex_lock(&shoal_breaker_lock);
    shoal_breaker_src_t *s = shoal_breaker_find(src, 0, now);
    if (s != NULL && s->trust == 0 && s->open_until > now) {
        admit = 0;
        s->refused++;
        s->refused_unlogged++;
        shoal_breaker_refused++;
        if (s->refuse_log_ns == 0 || now - s->refuse_log_ns >= SHOAL_BREAKER_LOG_NS) {
            char left[48];
            shoal_breaker_str(s, ip, sizeof(ip));
            if (s->open_until == UINT64_MAX) { /* SHOAL_TENANT_BREAKER_COOLDOWN=inf */
                snprintf(left, sizeof(left), "for good (cooldown inf)");
            } else {
                snprintf(left, sizeof(left), "for %llu s more",
                         (unsigned long long)((s->open_until - now) / 1000000000ull + 1));
            }
            shoal_warn(TENANT, "refusing connections from %s %s: %llu failed "
                       "authentications; %llu connections refused since the last message",
                       ip, left, (unsigned long long)s->failed,
                       (unsigned long long)s->refused_unlogged);
            s->refuse_log_ns = now;
            s->refused_unlogged = 0;
        }
    }
    pthread_mutex_unlock(&shoal_breaker_lock);
    return admit;
}

int shoal_tenant_breaker_note_fail(const struct sockaddr *src)
{
    const shoal_tenant_breaker_config_t *cfg = &shoal_tenant_breaker_config;
    uint64_t now = shoal_time_ns();
    unsigned thr = SHOAL_MIN(cfg->fails, (unsigned)SHOAL_BREAKER_RING);
    int log;
    char ip[INET6_ADDRSTRLEN], window[32], cooldown[32];

    pthread_mutex_lock(&shoal_breaker_lock);
    shoal_breaker_failed++;
    shoal_breaker_src_t *s = shoal_breaker_find(src, 1, now);
    if (s == NULL) {
        /* Not an IP address, or every entry trusted: one full line a minute for all such. */
        log = shoal_breaker_untracked_log_ns == 0 ||
              now - shoal_breaker_untracked_log_ns >= SHOAL_BREAKER_LOG_NS;
        if (log) {
            shoal_breaker_untracked_log_ns = now;
        }
    } else {
        s->failed++;
        s->times[s->head] = now;
        s->head = (s->head + 1) % SHOAL_BREAKER_RING;
        s->n = SHOAL_MIN(s->n + 1, (unsigned)SHOAL_BREAKER_RING);
        log = s->fail_log_ns == 0 || now - s->fail_log_ns >= SHOAL_BREAKER_LOG_NS;
        if (log) {
            s->fail_log_ns = now;
        }
        if (thr > 0 && s->trust == 0 && s->open_until <= now && cfg->cooldown_ms != 0 &&
            shoal_breaker_recent(s, now) >= thr) {
            s->open_until = cfg->cooldown_ms < 0 ? UINT64_MAX
                                                 : now + (uint64_t)cfg->cooldown_ms * 1000000ull;
            shoal_breaker_opened++;
            shoal_breaker_str(s, ip, sizeof(ip));
            /* inf is -1 to the TIME parser: printed as a number, it read 'within -1 ms' and
             * 'for -1 ms', and the refusals 'for 18446744074 s more' */
            if (cfg->window_ms < 0) {
                snprintf(window, sizeof(window), "(window inf)");
            } else {
                snprintf(window, sizeof(window), "within %d ms", cfg->window_ms);
            }
            if (cfg->cooldown_ms < 0) {
                snprintf(cooldown, sizeof(cooldown), "for good (cooldown inf)");
            } else {
                snprintf(cooldown, sizeof(cooldown), "for %d ms", cfg->cooldown_ms);
            }
            shoal_warn(TENANT, "%s failed to authenticate %u times %s: refusing its "
                       "connections %s", ip, shoal_breaker_recent(s, now), window, cooldown);
            s->refuse_log_ns = now; /* this line counts as the minute's refusal line */
        }
    }
    pthread_mutex_unlock(&shoal_breaker_lock);
    return log;
}

void shoal_tenant_breaker_note_ok(const struct sockaddr *src)
{
    pthread_mutex_lock(&shoal_breaker_lock);
    shoal_breaker_src_t *s = shoal_breaker_find(src, 0, shoal_time_ns());
    if (s != NULL) {
        s->n = 0;
        s->head = 0;
        s->open_until = 0;
    }
    pthread_mutex_unlock(&shoal_breaker_lock);
}

int shoal_tenant_breaker_is_open(const struct sockaddr *src)
{
    uint64_t now = shoal_time_ns();
    int open;
    pthread_mutex_lock(&shoal_breaker_lock);
    shoal_breaker_src_t *s = shoal_breaker_find(src, 0, now);
    open = s != NULL && s->trust == 0 && s->open_until > now;
    pthread_mutex_unlock(&shoal_breaker_lock);
    return open;
}

void shoal_tenant_breaker_trust(const struct sockaddr *addr, int delta)
{
    pthread_mutex_lock(&shoal_breaker_lock);
    shoal_breaker_src_t *s = shoal_breaker_find(addr, delta > 0, shoal_time_ns());
    if (s != NULL) {
        s->trust = SHOAL_MAX(s->trust + delta, 0);
    }
    pthread_mutex_unlock(&shoal_breaker_lock);
}

void shoal_tenant_breaker_stats(shoal_tenant_breaker_stats_t *stats,
                                shoal_tenant_breaker_source_t *sources, size_t max, size_t *n_p)
{
    uint64_t now = shoal_time_ns();
    size_t n = 0;
    shoal_tenant_breaker_stats_t st = {0};

    pthread_mutex_lock(&shoal_breaker_lock);
    st.failed = shoal_breaker_failed;
    st.refused = shoal_breaker_refused;
    st.opened = shoal_breaker_opened;
    for (int i = 0; i < shoal_breaker_cap; i++) {
        const shoal_breaker_src_t *s = &shoal_breaker_tab[i];
        int open = s->trust == 0 && s->open_until > now;
        if (!s->used) {
            continue;
        }
        st.sources++;
        st.open_now += (unsigned)open;
        if (sources != NULL && n < max) {
            shoal_tenant_breaker_source_t *o = &sources[n];
            shoal_breaker_str(s, o->addr, sizeof(o->addr));
            o->failed = s->failed;
            o->refused = s->refused;
            o->recent = shoal_breaker_recent(s, now);
            o->open = open;
            o->trusted = s->trust > 0;
            n++;
        }
    }
    pthread_mutex_unlock(&shoal_breaker_lock);
    if (stats != NULL) {
        *stats = st;
    }
    if (n_p != NULL) {
        *n_p = n;
    }
}

void shoal_tenant_breaker_reset(void)
{
    pthread_mutex_lock(&shoal_breaker_lock);
    if (shoal_breaker_tab != shoal_breaker_fixed) {
        free(shoal_breaker_tab);
        shoal_breaker_tab = shoal_breaker_fixed;
        shoal_breaker_cap = SHOAL_BREAKER_SOURCES;
    }
    memset(shoal_breaker_fixed, 0, sizeof(shoal_breaker_fixed));
    shoal_breaker_failed = shoal_breaker_refused = shoal_breaker_opened = 0;
    shoal_breaker_untracked_log_ns = 0;
    pthread_mutex_unlock(&shoal_breaker_lock);
}
