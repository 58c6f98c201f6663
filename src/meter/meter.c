/*
 * The metering page of a communicator: created in a memfd (so the node agent can map it),
 * sealed against resizing, mapped shared and faulted in at init; identity written once before
 * the page is shared; shoal_comm_stats reads it. Registration with the agent: meter_agent.c.
 */
#include "meter/meter.h"
#include "tenant/tenant.h"
#include "tenant/breaker.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

_Static_assert(SHOAL_METER_NCOLL <= SHOAL_STATS_NCOLL, "shoal_stats_t.ops too small");
_Static_assert(SHOAL_METER_NTL + 2 <= SHOAL_STATS_NTL, "shoal_stats_t transports too few");
_Static_assert((int)SHOAL_METER_TL_CUDA_IPC == (int)SHOAL_STATS_TL_CUDA_IPC, "cuda_ipc index");
_Static_assert((int)SHOAL_METER_TL_NCCL == (int)SHOAL_STATS_TL_NCCL, "nccl index");
_Static_assert((int)SHOAL_METER_ALLREDUCE == (int)SHOAL_STATS_ALLREDUCE &&
               (int)SHOAL_METER_ALLTOALL == (int)SHOAL_STATS_ALLTOALL &&
               (int)SHOAL_METER_TL_IB == (int)SHOAL_STATS_TL_IB &&
               (int)SHOAL_METER_OTHER_HOST == (int)SHOAL_STATS_OTHER_HOST,
               "public and page indices agree");
_Static_assert(SHOAL_METER_CRED_MAX == SHOAL_TENANT_CRED_TEXT_MAX, "credential text size");
_Static_assert(SHOAL_METER_NAME_MAX == SHOAL_TENANT_NAME_MAX, "tenant name size");

/* The process's circuit-breaker counters into the page (meter_page.h: abuse signals). The
 * breaker's table takes its lock: called once a second at most, never per call. */
static void shoal_meter_abuse_update(struct shoal_meter *m)
{
    shoal_tenant_breaker_stats_t b;
    size_t n = 0;
    shoal_tenant_breaker_stats(&b, NULL, 0, &n);
    __atomic_store_n(&m->page->auth_failed, b.failed, __ATOMIC_RELAXED);
    __atomic_store_n(&m->page->auth_refused, b.refused, __ATOMIC_RELAXED);
    __atomic_store_n(&m->page->breaker_opened, b.opened, __ATOMIC_RELAXED);
}

void shoal_meter_tick_rebase(shoal_meter_page_t *p, uint64_t nmult)
{
    uint64_t g = __atomic_load_n(&p->tick_slot, __ATOMIC_RELAXED), i = g & 1, j = i ^ 1;
    uint64_t t = __atomic_load_n(&p->coll_ticks, __ATOMIC_RELAXED);
    uint64_t t0 = p->tick_conv[i].ticks0, mult = p->tick_conv[i].mult;
    uint64_t ns = p->tick_conv[i].ns0;
    if (nmult == mult) {
        return;
    }
    if (t > t0) {
        ns += (uint64_t)(((unsigned __int128)(t - t0) * mult) >> 32); /* = the readers' value */
    }
    /* Slot j may be under a reader that took it at the rebase before: the fence orders that
     * rebase's tick_slot before the stores below, so a reader that sees any of them sees
     * tick_slot moved when it checks again, and rereads (shoal_meter_page_coll_ns). */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&p->tick_conv[j].ticks0, t, __ATOMIC_RELAXED);
    __atomic_store_n(&p->tick_conv[j].ns0, ns, __ATOMIC_RELAXED);
    __atomic_store_n(&p->tick_conv[j].mult, nmult, __ATOMIC_RELAXED);
    __atomic_store_n(&p->tick_slot, g + 1, __ATOMIC_RELEASE); /* a count: slot j in force */
}

void shoal_meter_check(struct shoal_meter *m, uint64_t now_ticks)
{
    m->next_check = now_ticks + shoal_meter_clock.ticks_per_sec;
    shoal_ticks_refine(now_ticks);
    shoal_meter_tick_rebase(m->page, __atomic_load_n(&shoal_meter_clock.mult, __ATOMIC_RELAXED));
    shoal_meter_abuse_update(m);
    shoal_meter_agent_check(m);
}

/* The page in a sealed memfd; an anonymous shared mapping if memfds are unavailable (then no
 * agent can be given the page, shoal_comm_stats still works). */
static shoal_status_t shoal_meter_page_create(struct shoal_meter *m)
{
    void *p;
    m->memfd = memfd_create("shoal-meter", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (m->memfd < 0) {
        shoal_warn(METER, "memfd_create(shoal-meter) failed: %s; the counters stay private "
                   "(no node agent)", strerror(errno));
    } else if (ftruncate(m->memfd, SHOAL_METER_PAGE_BYTES) != 0 ||
               fcntl(m->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        shoal_warn(METER, "sizing or sealing the meter memfd (fd %d) failed: %s; the counters "
                   "stay private (no node agent)", m->memfd, strerror(errno));
        close(m->memfd);
        m->memfd = -1;
    }
    p = mmap(NULL, SHOAL_METER_PAGE_BYTES, PROT_READ | PROT_WRITE,
             m->memfd >= 0 ? MAP_SHARED | MAP_POPULATE : MAP_SHARED | MAP_ANONYMOUS, m->memfd, 0);
    if (p == MAP_FAILED) {
        shoal_error(METER, "mmap of the meter page (%d bytes, fd %d) failed: %s",
                    SHOAL_METER_PAGE_BYTES, m->memfd, strerror(errno));
        if (m->memfd >= 0) {
            close(m->memfd); /* the caller frees m only: each failed init leaked the memfd */
            m->memfd = -1;
        }
        return SHOAL_ERR_NO_MEMORY;
    }
    memset(p, 0, SHOAL_METER_PAGE_BYTES); /* faults the page in */
    m->page = p;
    return SHOAL_OK;
}

int shoal_meter_gpus_parse(const char *text, int32_t *gpus, int max)
{
    int n = 0;
    const char *s = text;
    for (int i = 0; i < max; i++) {
        gpus[i] = -1;
    }
    if (text == NULL || text[0] == '\0' || strcmp(text, "none") == 0 ||
        strcmp(text, "NoDevFiles") == 0) {
        return 0;
    }
    if (strncmp(text, "count:", 6) == 0) {
        /* digits only: count:two was 0 GPUs and count:2x 2, without a word */
        char *e;
        long c;
        if (text[6] < '0' || text[6] > '9') {
            return -1;
        }
        errno = 0;
        c = strtol(text + 6, &e, 10);
        if (*e != '\0') {
            return -1;
        }
        return errno == ERANGE || c > SHOAL_METER_NGPUS_MAX ? SHOAL_METER_NGPUS_MAX : (int)c;
    }
    /* A list: ordinals, or CUDA_VISIBLE_DEVICES UUIDs (GPU-..., MIG-...): counted, no
     * ordinal. CUDA stops at the first invalid entry (-1, "foo", "2x"); so do we. Anything
     * that was not a number counted as a UUID: "0,foo,1" billed 3 GPUs where CUDA sees 1. */
    while (*s != '\0') {
        const char *end = strchr(s, ',');
        size_t len = end != NULL ? (size_t)(end - s) : strlen(s);
        int uuid = len > 4 && (strncmp(s, "GPU-", 4) == 0 || strncmp(s, "MIG-", 4) == 0);
        char *e;
        long v = strtol(s, &e, 10);
        if (len == 0 || (!uuid && (s[0] < '0' || s[0] > '9' || e != s + len || v > INT32_MAX))) {
            break;
        }
        if (n < max) {
            gpus[n] = uuid ? -1 : (int32_t)v;
        }
        n++;
        if (end == NULL) {
            break;
        }
        s = end + 1;
    }
    return SHOAL_MIN(n, SHOAL_METER_NGPUS_MAX);
}

/* Identity of the page: the communicator's resolved identity (src/tenant: the credential when
 * the job has one, else the configured names), and the credential's text for the agent, which
 * checks the claim; the library only reports it. */
static void shoal_meter_identity(struct shoal_comm *comm, struct shoal_meter *m)
{
    shoal_meter_page_t *p = m->page;
    shoal_tenant_id_t id = comm->ident;
    const char *gpus = shoal_meter_config.gpus;

    if (id.qos_weight <= 0) {
        id.qos_weight = 1;
    }
    /* the credential the init read once (its identity is comm->ident's) */
    if (comm->init_cred != NULL &&
        shoal_tenant_cred_format(comm->init_cred, m->cred, sizeof(m->cred)) == SHOAL_OK) {
        m->cred_len = strlen(m->cred);
    }
    p->magic = SHOAL_METER_MAGIC;
    p->version = SHOAL_METER_VERSION;
    p->size = sizeof(*p);
    memcpy(p->tenant, id.tenant, sizeof(p->tenant));
    memcpy(p->job, id.job, sizeof(p->job));
    p->tenant[sizeof(p->tenant) - 1] = '\0';
    p->job[sizeof(p->job) - 1] = '\0';
    p->epoch = id.epoch;
    p->comm_id = comm->comm_id;
    p->rank = comm->rank;
    p->nranks = comm->nranks;
    p->qos_class = id.qos_class;
    p->qos_weight = id.qos_weight;
    if (gpus == NULL || gpus[0] == '\0') {
        gpus = shoal_cfg_getenv_raw("CUDA_VISIBLE_DEVICES");
    }
    p->ngpus = shoal_meter_gpus_parse(gpus, p->gpus, SHOAL_METER_MAX_GPUS);
    if (p->ngpus < 0) {
        shoal_warn_once(METER, "SHOAL_METER_GPUS=%s: count:N takes a number of GPUs; this "
                        "rank declares none", gpus);
        p->ngpus = 0;
    }
    p->pid = (int32_t)getpid();
    {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        p->created_unix_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    }
    /* coll_ticks from 0 at the call path clock's rate now (measured before the first
     * communicator, shoal_ticks_init); shoal_meter_check follows its refinements. */
    p->tick_conv[0].mult = __atomic_load_n(&shoal_meter_clock.mult, __ATOMIC_RELAXED);
    p->tick_slot = 0;
    __atomic_store_n(&p->state, SHOAL_METER_LIVE, __ATOMIC_RELEASE);
}

static int shoal_meter_tl_index(const char *name)
{
    static const char *const names[SHOAL_METER_NTL] = {
        [SHOAL_METER_TL_SHM] = "shm", [SHOAL_METER_TL_TCP] = "tcp",
        [SHOAL_METER_TL_UCX] = "ucx", [SHOAL_METER_TL_IB] = "ib"};
    for (int i = 0; i < SHOAL_METER_NTL; i++) {
        if (strcmp(names[i], name) == 0) {
            return i;
        }
    }
    return -1;
}

/* Every channel's counter pair: its transport, and whether the peer shares our host. */
static void shoal_meter_chans_attach(struct shoal_comm *comm, shoal_meter_page_t *p)
{
    uint64_t me = comm->peers[comm->rank].host_id;
    for (int q = 0; q < comm->nranks; q++) {
        shoal_chan_t *ch = &comm->chans[q];
        int tl, loc;
        if (q == comm->rank || ch->tl == NULL) {
            continue;
        }
        tl = shoal_meter_tl_index(ch->tl->ops->name);
        if (tl < 0) {
            shoal_warn(METER, "transport %s is not metered", ch->tl->ops->name);
            continue;
        }
        loc = comm->peers[q].host_id == me ? SHOAL_METER_SAME_HOST : SHOAL_METER_OTHER_HOST;
        ch->meter_sent = &p->bytes_sent[tl][loc];
        ch->meter_recv = &p->bytes_recv[tl][loc];
    }
}

/* The meter holds the credential text (a bearer token) for the communicator's life while an
 * agent may ask for the page again (meter_agent.c). On the heap it went into every core dump
 * of a rank; like the configuration's secrets (src/util/config.c) it lives in a mapping of its
 * own, zero-filled, left out of core dumps. Not mlock'ed: one page per communicator would
 * take from the RLIMIT_MEMLOCK that ib's memory registrations need. */
static struct shoal_meter *shoal_meter_alloc(void)
{
    struct shoal_meter *m;

    m = mmap(NULL, sizeof(*m), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        return NULL;
    }
#ifdef MADV_DONTDUMP
    (void)madvise(m, sizeof(*m), MADV_DONTDUMP);
#endif
    return m;
}

static void shoal_meter_free(struct shoal_meter *m)
{
    shoal_secret_wipe(m->cred, sizeof(m->cred));
    munmap(m, sizeof(*m));
}

shoal_status_t shoal_meter_comm_init(struct shoal_comm *comm)
{
    struct shoal_meter *m;
    shoal_status_t st;

    if (!shoal_meter_config.enabled) {
        if (shoal_meter_config.agent_required) {
            shoal_error(METER, "SHOAL_METER=0 with SHOAL_AGENT_REQUIRED=1: this node meters "
                        "every communicator");
            return SHOAL_ERR_PERMISSION;
        }
        return SHOAL_OK;
    }
    m = shoal_meter_alloc();
    if (m == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    m->memfd = -1;
    m->sock = -1;
    m->next_check = shoal_meter_ticks() + shoal_meter_clock.ticks_per_sec;
    st = shoal_meter_page_create(m);
    if (st != SHOAL_OK) {
        shoal_meter_free(m);
        return st;
    }
    shoal_meter_identity(comm, m);
    shoal_meter_abuse_update(m);
    comm->meter = m;
    shoal_meter_chans_attach(comm, m->page);
    st = shoal_meter_agent_register_init(m);
    if (st != SHOAL_OK) {
        shoal_meter_comm_fini(comm);
        return st;
    }
    return SHOAL_OK;
}

void shoal_meter_comm_fini(struct shoal_comm *comm)
{
    struct shoal_meter *m = comm->meter;
    if (m == NULL) {
        return;
    }
    for (int q = 0; q < comm->nranks && comm->chans != NULL; q++) {
        comm->chans[q].meter_sent = NULL;
        comm->chans[q].meter_recv = NULL;
    }
    shoal_meter_abuse_update(m);
    __atomic_store_n(&m->page->state, SHOAL_METER_CLOSED, __ATOMIC_SEQ_CST);
    if (m->sock >= 0) {
        /* The end of the connection is the agent's sign that the communicator ended. Shut
         * down, not only closed: a child forked meanwhile (a data loader's workers) holds a
         * copy of the descriptor, which kept the connection, and the agent's page, open until
         * the child exited. */
        (void)shutdown(m->sock, SHUT_RDWR);
        close(m->sock);
    }
    munmap(m->page, SHOAL_METER_PAGE_BYTES);
    if (m->memfd >= 0) {
        close(m->memfd);
    }
    shoal_meter_free(m);
    comm->meter = NULL;
}

/* ---- shoal_comm_stats ---------------------------------------------------------------- */

static void shoal_meter_stats_read(const shoal_meter_page_t *p, shoal_stats_t *s)
{
    memset(s, 0, sizeof(*s));
    s->size = sizeof(*s);
    for (int c = 0; c < SHOAL_METER_NCOLL; c++) {
        s->ops[c] = __atomic_load_n(&p->ops[c], __ATOMIC_RELAXED);
        s->ops_total += s->ops[c];
    }
    for (int t = 0; t < SHOAL_METER_NTL; t++) {
        for (int l = 0; l < SHOAL_METER_NLOC; l++) {
            uint64_t sent = __atomic_load_n(&p->bytes_sent[t][l], __ATOMIC_RELAXED);
            uint64_t recv = __atomic_load_n(&p->bytes_recv[t][l], __ATOMIC_RELAXED);
            s->bytes_sent_by[t][l] = sent;
            s->bytes_recv_by[t][l] = recv;
            s->bytes_sent += sent;
            s->bytes_recv += recv;
            if (l == SHOAL_METER_SAME_HOST) {
                s->bytes_sent_same_host += sent;
                s->bytes_recv_same_host += recv;
            } else {
                s->bytes_sent_other_host += sent;
                s->bytes_recv_other_host += recv;
            }
        }
    }
    /* the same-host pairs of their own: cuda_ipc, nccl */
    for (int t = SHOAL_METER_TL_CUDA_IPC; t <= SHOAL_METER_TL_NCCL; t++) {
        const uint64_t *ps = t == SHOAL_METER_TL_NCCL ? &p->nccl_sent : &p->cuda_ipc_sent;
        const uint64_t *pr = t == SHOAL_METER_TL_NCCL ? &p->nccl_recv : &p->cuda_ipc_recv;
        uint64_t sent = __atomic_load_n(ps, __ATOMIC_RELAXED);
        uint64_t recv = __atomic_load_n(pr, __ATOMIC_RELAXED);
        s->bytes_sent_by[t][SHOAL_METER_SAME_HOST] = sent;
        s->bytes_recv_by[t][SHOAL_METER_SAME_HOST] = recv;
        s->bytes_sent += sent;
        s->bytes_recv += recv;
        s->bytes_sent_same_host += sent;
        s->bytes_recv_same_host += recv;
    }
    s->coll_ns = shoal_meter_page_coll_ns(p);
    s->errors = __atomic_load_n(&p->errors, __ATOMIC_RELAXED);
    s->peer_failures = __atomic_load_n(&p->peer_failures, __ATOMIC_RELAXED);
    s->aborts = __atomic_load_n(&p->aborts, __ATOMIC_RELAXED);
    s->paced_ns = __atomic_load_n(&p->paced_ns, __ATOMIC_RELAXED);
    s->pace_rate = __atomic_load_n(&p->pace_rate, __ATOMIC_RELAXED);
}

shoal_status_t shoal_comm_stats(shoal_comm_t comm, shoal_stats_t *stats)
{
    shoal_stats_t s;
    size_t n;

    if (comm == NULL || stats == NULL || stats->size < sizeof(size_t)) {
        return SHOAL_ERR_INVALID_ARG;
    }
    if (comm->meter == NULL) {
        return SHOAL_ERR_UNSUPPORTED; /* SHOAL_METER=0 */
    }
    /* One consistent snapshot when no call is between its updates (seq even and unchanged);
     * while a long call runs on another thread, each counter as it is (each one exact). */
    for (int tries = 0; tries < 1000; tries++) {
        const shoal_meter_page_t *p = comm->meter->page;
        uint64_t s0 = __atomic_load_n(&p->seq, __ATOMIC_ACQUIRE);
        shoal_meter_stats_read(p, &s);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if ((s0 & 1) == 0 && __atomic_load_n(&p->seq, __ATOMIC_RELAXED) == s0) {
            break;
        }
        shoal_cpu_relax();
    }
    s.qos_class = comm->qos.qos_class;
    s.qos_weight = comm->qos.weight;
    s.qos_dscp = comm->qos.marks.dscp;
    s.qos_priority = comm->qos.marks.priority;
    s.qos_ib_tc = comm->qos.marks.ib_tc;
    s.qos_ib_sl = comm->qos.marks.ib_sl;
    s.qos_rate_max = comm->qos.rate_max;
    n = SHOAL_MIN(stats->size, sizeof(s));
    memcpy((char *)stats + sizeof(size_t), (char *)&s + sizeof(size_t), n - sizeof(size_t));
    return SHOAL_OK;
}
