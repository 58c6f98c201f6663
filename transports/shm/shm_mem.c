/* Shared-memory transport: buffers local peers read in place, and single copies.
 *
 * shoal_mem_alloc (the public API, like ncclMemAlloc): each buffer is its own memfd segment,
 * mode 0600, sized and faulted in at allocation, mapped MAP_SHARED in the owner:
 *
 *   [header page: magic, owner pid, id, size][size bytes, page-aligned: the user's buffer]
 *
 * The owner keeps the descriptor open. A local peer learns (fd, id, base, size) from the
 * owner's control block in the intra-node path (src/coll/shmdirect.c) the first time the
 * buffer is used, fetches the descriptor with pidfd_getfd(2) (or opens /proc/<pid>/fd/<fd>
 * where pidfd_getfd is refused), checks it like a transport segment (a regular file of this
 * user, mode 0600, the expected size) and the header (magic, the peer's pid, the id), maps it
 * and caches the mapping for the life of the context (a buffer its owner freed: until the
 * next new one). Reaching the descriptor needs the kernel's permission to inspect the owner
 * (same user; pidfd_getfd: ptrace attach, /proc: ptrace read): another user's process,
 * another tenant's, cannot map it; the owner hands its coordinates only to its
 * communicator's local ranks, through its own 0600 segment.
 *
 * Single copy (CMA, like Open MPI's vader/smsc): process_vm_readv/writev between this
 * process and a local peer's memory. Allowed when the kernel lets us ptrace the peer (same
 * user; Yama's ptrace_scope 0; not a setuid process): probed at connect by reading the magic
 * of the peer's control block at the address it published, so a refusal is found once, at
 * init, logged with its cause, and the path is simply not used (SHOAL_SHM_CMA=0 turns it off).
 */
#include "transports/shm/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define SHOAL_SHM_MEM_MAGIC 0x4d4d454d4c414f48ull /* "HOALMEMM" */
#define SHOAL_SHM_MEM_HDR 4096
#define SHOAL_SHM_MEM_PAGE 4096
#define SHOAL_SHM_PMAP_MIN 64 /* mappings of peers' buffers kept per context, at least */

typedef struct {
    uint64_t magic;
    int64_t pid;
    uint64_t id;
    uint64_t size;
} shoal_shm_mem_hdr_t;

typedef struct shoal_shm_mem {
    struct shoal_shm_mem *next;
    uint8_t *base;    /* header page */
    size_t total;
    size_t size;      /* user bytes */
    int fd;
    uint64_t id;
    pid_t owner;      /* the process that allocated it (not a forked child's copy) */
} shoal_shm_mem_t;

static pthread_mutex_t shoal_shm_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static shoal_shm_mem_t *shoal_shm_mem_list;

static size_t shoal_shm_mem_total(size_t size)
{
    return SHOAL_SHM_MEM_HDR + SHOAL_ALIGN_UP(size, SHOAL_SHM_MEM_PAGE);
}

/* One number from a small file: the value after key (a whole line's start, or the file's
 * first word where key is NULL), times unit; 0 if the file or the key is not there, or the
 * value is not a number ("max"). */
static uint64_t shoal_shm_mem_read_num(const char *path, const char *key, uint64_t unit)
{
    char line[256];
    unsigned long long v = 0;
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        return 0;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        size_t klen = key != NULL ? strlen(key) : 0;
        if (key == NULL || strncmp(line, key, klen) == 0) {
            if (sscanf(line + klen, " %llu", &v) != 1) {
                v = 0;
            }
            break;
        }
    }
    fclose(f);
    return (uint64_t)v * unit;
}

/* The bytes a new buffer may take: what the kernel says can still be had (MemAvailable +
 * SwapFree), or the least memory limit of our cgroup and its ancestors where that is less
 * (not less the usage, which counts page cache that reclaim would free). A memfd
 * has no size limit of its own: its posix_fallocate takes pages until memory runs out, and
 * the OOM killer then kills this process or, without a cgroup limit, any process of the
 * host. UINT64_MAX where nothing can be read. */
static uint64_t shoal_shm_mem_room(void)
{
    uint64_t avail = shoal_shm_mem_read_num("/proc/meminfo", "MemAvailable:", 1024);
    uint64_t room = avail == 0 ? UINT64_MAX
                               : avail + shoal_shm_mem_read_num("/proc/meminfo", "SwapFree:",
                                                                1024);
    char line[512], path[PATH_MAX];
    FILE *f = fopen("/proc/self/cgroup", "re");
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        const char *c = strchr(line, ':'), *cg;
        const char *lim_f = NULL, *root = NULL;
        line[strcspn(line, "\n")] = '\0';
        if (c == NULL || (cg = strchr(c + 1, ':')) == NULL) {
            continue;
        }
        if (strncmp(line, "0::", 3) == 0) {
            root = "/sys/fs/cgroup", lim_f = "memory.max";
        } else if (strncmp(c, ":memory:", 8) == 0) {
            root = "/sys/fs/cgroup/memory", lim_f = "memory.limit_in_bytes";
        } else {
            continue;
        }
        /* The limit of our cgroup and of each above it: a job's limit is often set on its
         * slice or scope, with "max" below it. */
        char rel[PATH_MAX / 2]; /* with the root and the file name, fits path */
        snprintf(rel, sizeof(rel), "%s", cg + 1);
        for (;;) {
            char *slash = strrchr(rel, '/');
            snprintf(path, sizeof(path), "%s%s/%s", root, rel, lim_f);
            uint64_t lim = shoal_shm_mem_read_num(path, NULL, 1);
            if (lim != 0) { /* 0: no such file, or "max" */
                room = SHOAL_MIN(room, lim);
            }
            if (slash == NULL || (slash == rel && rel[1] == '\0')) {
                break;
            }
            slash[slash == rel] = '\0'; /* the parent; "/" kept whole */
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return room;
}

static shoal_status_t shoal_shm_mem_create(size_t size, shoal_shm_mem_t *m)
{
    shoal_status_t status = SHOAL_ERR_SYSTEM;
    shoal_shm_mem_hdr_t *h;
    int ret;

    m->total = shoal_shm_mem_total(size);
    m->size = size;
    uint64_t room = shoal_shm_mem_room();
    if ((uint64_t)m->total > room) {
        shoal_error(SHM, "shoal_mem_alloc(%zu bytes): more than the %llu bytes of memory "
                    "left (the host's available memory and swap, this process's memory cgroup "
                    "limit)", size, (unsigned long long)room);
        return SHOAL_ERR_NO_MEMORY;
    }
    do {
        SHOAL_CHECK(shoal_random_bytes(&m->id, sizeof(m->id)));
    } while (m->id == 0);
    m->fd = (int)syscall(SYS_memfd_create, "shoal-mem", MFD_CLOEXEC);
    if (m->fd < 0) {
        shoal_error(SHM, "memfd_create for a %zu-byte buffer failed: %s", size, strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    if (fchmod(m->fd, 0600) != 0 || ftruncate(m->fd, (off_t)m->total) != 0) {
        shoal_error(SHM, "sizing a %zu-byte shared buffer failed: %s", m->total, strerror(errno));
        goto err_close;
    }
    /* Reserve the pages now: a full tmpfs must fail here, not SIGBUS the job later. */
    ret = posix_fallocate(m->fd, 0, (off_t)m->total);
    if (ret != 0 && ret != EOPNOTSUPP && ret != EINVAL) {
        shoal_error(SHM, "reserving a %zu-byte shared buffer failed: %s", m->total,
                    strerror(ret));
        status = ret == ENOSPC ? SHOAL_ERR_NO_MEMORY : SHOAL_ERR_SYSTEM;
        goto err_close;
    }
    m->base = mmap(NULL, m->total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, m->fd, 0);
    if (m->base == MAP_FAILED) {
        shoal_error(SHM, "mmap of a %zu-byte shared buffer failed: %s", m->total,
                    strerror(errno));
        status = errno == ENOMEM ? SHOAL_ERR_NO_MEMORY : SHOAL_ERR_SYSTEM;
        goto err_close;
    }
    h = (shoal_shm_mem_hdr_t *)m->base;
    m->owner = getpid();
    *h = (shoal_shm_mem_hdr_t){
        .magic = SHOAL_SHM_MEM_MAGIC, .pid = m->owner, .id = m->id, .size = size,
    };
    return SHOAL_OK;

err_close:
    close(m->fd);
    return status;
}

shoal_status_t shoal_mem_alloc(size_t size, void **ptr_p)
{
    shoal_shm_mem_t *m;
    shoal_status_t status;

    if (ptr_p == NULL || size == 0) {
        shoal_error(SHM, "shoal_mem_alloc(%zu bytes, %p): invalid size or NULL pointer", size,
                    (void *)ptr_p);
        return SHOAL_ERR_INVALID_ARG;
    }
    /* More than any host's memory (and past what the size arithmetic below may round up):
     * what shoal.h promises for a size above the available memory, not a bad argument. */
    if (size > ((size_t)1 << 46)) {
        shoal_error(SHM, "shoal_mem_alloc(%zu bytes): more than this host's memory", size);
        return SHOAL_ERR_NO_MEMORY;
    }
    m = calloc(1, sizeof(*m));
    if (m == NULL) {
        shoal_error(SHM, "out of memory for a buffer record");
        return SHOAL_ERR_NO_MEMORY;
    }
    status = shoal_shm_mem_create(size, m);
    if (status != SHOAL_OK) {
        free(m);
        return status;
    }
    pthread_mutex_lock(&shoal_shm_mem_lock);
    m->next = shoal_shm_mem_list;
    shoal_shm_mem_list = m;
    pthread_mutex_unlock(&shoal_shm_mem_lock);
    shoal_trace(SHM, "shoal_mem_alloc: %zu bytes at %p (fd %d)", size,
                (void *)(m->base + SHOAL_SHM_MEM_HDR), m->fd);
    *ptr_p = m->base + SHOAL_SHM_MEM_HDR;
    return SHOAL_OK;
}

shoal_status_t shoal_mem_free(void *ptr)
{
    shoal_shm_mem_t **pp, *m = NULL;

    if (ptr == NULL) {
        return SHOAL_OK;
    }
    pthread_mutex_lock(&shoal_shm_mem_lock);
    for (pp = &shoal_shm_mem_list; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->base + SHOAL_SHM_MEM_HDR == (uint8_t *)ptr) {
            m = *pp;
            *pp = m->next;
            break;
        }
    }
    pthread_mutex_unlock(&shoal_shm_mem_lock);
    if (m == NULL) {
        shoal_error(SHM, "shoal_mem_free(%p): not a buffer of shoal_mem_alloc", ptr);
        return SHOAL_ERR_INVALID_ARG;
    }
    /* Peers that mapped it see the header's magic go (shoal_shm_mem_map drops their mapping
     * at their next miss): else the pages stayed held by up to SHOAL_SHM_PMAP_MIN mappings
     * per peer, e.g. 1 GiB per process for 16 MiB buffers allocated and freed each step.
     * Only the owner's free: a process forked from it (a data loader's worker) holds a copy of
     * the record, descriptor and mapping, and its free releases those; clearing the shared
     * header made peers refuse the owner's live buffer and fail the communicator. */
    if (m->owner == getpid()) {
        __atomic_store_n(&((shoal_shm_mem_hdr_t *)m->base)->magic, 0, __ATOMIC_RELEASE);
    }
    munmap(m->base, m->total);
    close(m->fd);
    free(m);
    return SHOAL_OK;
}

/* Unmaps the cached mappings of buffers their owners freed (magic cleared by shoal_mem_free). */
static void shoal_shm_mem_drop_freed(shoal_tl_ctx_t *ctx)
{
    for (int i = 0; i < ctx->npmaps;) {
        const shoal_shm_mem_hdr_t *h = ctx->pmaps[i].base;
        if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == SHOAL_SHM_MEM_MAGIC) {
            i++;
            continue;
        }
        munmap(ctx->pmaps[i].base, ctx->pmaps[i].total);
        ctx->pmaps[i] = ctx->pmaps[--ctx->npmaps];
    }
}

int shoal_shm_mem_query(const void *ptr, size_t len, shoal_tl_mem_t *m_p)
{
    const uint8_t *p = ptr;
    int found = 0;

    pthread_mutex_lock(&shoal_shm_mem_lock);
    for (shoal_shm_mem_t *m = shoal_shm_mem_list; m != NULL; m = m->next) {
        const uint8_t *u = m->base + SHOAL_SHM_MEM_HDR;
        if (p >= u && p < u + m->size && len <= (size_t)(u + m->size - p)) {
            *m_p = (shoal_tl_mem_t){
                .id = m->id, .base = (uint64_t)(uintptr_t)u, .size = m->size, .fd = m->fd,
            };
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&shoal_shm_mem_lock);
    return found;
}

/* ---- peers' buffers ---------------------------------------------------------------------- */

/* The owner's descriptor in this process: pidfd_getfd, else /proc/<pid>/fd/<fd>. */
static int shoal_shm_mem_fetch_fd(shoal_ep_t *ep, int fd, char *why, size_t len)
{
    int ret = -1, err = ENOSYS;
    char path[64];

#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
    int pidfd = (int)syscall(SYS_pidfd_open, ep->pid, 0);
    if (pidfd >= 0) {
        ret = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
        err = errno;
        close(pidfd);
        if (ret >= 0) {
            return ret;
        }
    } else {
        err = errno;
    }
#endif
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)ep->pid, fd);
    ret = open(path, O_RDWR | O_CLOEXEC);
    if (ret < 0) {
        snprintf(why, len, "pidfd_getfd: %s; open(%s): %s", strerror(err), path,
                 strerror(errno));
    }
    return ret;
}

/* 0 if the kernel lets us take the peer's descriptors, else the errno. pidfd_getfd checks
 * the permission (ptrace attach) before the descriptor: an fd number the peer cannot have
 * answers EBADF where we may, EPERM where not (a peer that is not dumpable, another user's,
 * Yama's ptrace_scope). Without pidfd_getfd, /proc/<pid>/fd must open (a weaker test: the
 * links in it need ptrace read permission). */
static int shoal_shm_mem_probe(shoal_ep_t *ep)
{
    int err = ENOSYS;
    char path[64];

    if (ep->pid_foreign) {
        return ESRCH; /* its pid is another process here */
    }
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
    int pidfd = (int)syscall(SYS_pidfd_open, ep->pid, 0);
    if (pidfd >= 0) {
        int fd = (int)syscall(SYS_pidfd_getfd, pidfd, INT_MAX, 0);
        err = fd >= 0 || errno == EBADF ? 0 : errno;
        if (fd >= 0) {
            close(fd);
        }
        close(pidfd);
    } else {
        err = errno;
    }
    if (err != ENOSYS) {
        return err;
    }
#endif
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)ep->pid);
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        return errno;
    }
    close(dfd);
    return 0;
}

int shoal_shm_mem_reach_ok(shoal_tl_ctx_t *ctx)
{
    if (SHOAL_LIKELY(ctx->mem_checked)) {
        return ctx->mem_ok;
    }
    ctx->mem_checked = 1;
    ctx->mem_ok = 1;
    for (int p = 0; p < ctx->npeers; p++) {
        int err = shoal_shm_mem_probe(&ctx->eps[p]);
        if (err != 0) {
            shoal_info(SHM, "rank %d: local peer %d's shoal_mem_alloc buffers cannot be mapped "
                       "here (%s): the intra-node AllReduce stages them", ctx->rank,
                       ctx->eps[p].rank, strerror(err));
            ctx->mem_ok = 0;
            break;
        }
    }
    return ctx->mem_ok;
}

static void *shoal_shm_mem_open(shoal_tl_ctx_t *ctx, shoal_ep_t *ep, const shoal_tl_mem_t *m,
                                size_t total)
{
    const shoal_shm_mem_hdr_t *h;
    struct stat sb = {0}; /* printed when fstat fails too */
    char why[256] = "";
    void *base;
    int fd = shoal_shm_mem_fetch_fd(ep, m->fd, why, sizeof(why));

    if (fd < 0) {
        shoal_error(SHM, "peer %d: cannot reach its shared buffer (fd %d): %s", ep->rank, m->fd,
                    why);
        return NULL;
    }
    if (fstat(fd, &sb) != 0 || sb.st_uid != geteuid() || (sb.st_mode & 07777) != 0600 ||
        !S_ISREG(sb.st_mode) || (size_t)sb.st_size != total) {
        shoal_error(SHM, "peer %d: shared buffer refused (uid %d mode %o size %lld; expected "
                    "uid %d mode 600 size %zu)", ep->rank, (int)sb.st_uid,
                    (unsigned)(sb.st_mode & 07777), (long long)sb.st_size, (int)geteuid(), total);
        close(fd);
        return NULL;
    }
    base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        shoal_error(SHM, "peer %d: mmap of its %zu-byte shared buffer failed: %s", ep->rank,
                    total, strerror(errno));
        return NULL;
    }
    h = base;
    if (h->magic != SHOAL_SHM_MEM_MAGIC || h->pid != (int64_t)ep->pid || h->id != m->id ||
        h->size != m->size) {
        shoal_error(SHM, "peer %d: shared buffer fd %d is not the one it described", ep->rank,
                    m->fd);
        munmap(base, total);
        return NULL;
    }
    (void)ctx;
    return base;
}

void *shoal_shm_mem_map(shoal_tl_ctx_t *ctx, int local_rank, const shoal_tl_mem_t *m)
{
    shoal_ep_t *ep;
    shoal_shm_pmap_t *pm, *lru = NULL;
    size_t total, cap;
    void *base;

    if (local_rank < 0 || local_rank >= ctx->local_size || local_rank == ctx->local_rank ||
        (ep = ctx->ep_by_local[local_rank]) == NULL || m->id == 0 || m->size == 0 ||
        m->size > ((uint64_t)1 << 46) || m->fd < 0) {
        shoal_error(SHM, "local rank %d: invalid shared buffer description", local_rank);
        return NULL;
    }
    if (ep->pid_foreign) { /* its pid is another process here: never take that one's fds */
        shoal_error(SHM, "peer %d is in another pid namespace: its shared buffers cannot be "
                    "reached", ep->rank);
        return NULL;
    }
    ctx->pmap_clock++;
    for (int i = 0; i < ctx->npmaps; i++) {
        pm = &ctx->pmaps[i];
        if (pm->local_rank == local_rank && pm->id == m->id) {
            pm->used = ctx->pmap_clock;
            return pm->base + SHOAL_SHM_MEM_HDR;
        }
    }
    shoal_shm_mem_drop_freed(ctx); /* a miss: a buffer is new, others may be gone */
    total = shoal_shm_mem_total(m->size);
    base = shoal_shm_mem_open(ctx, ep, m, total);
    if (base == NULL) {
        return NULL;
    }
    cap = SHOAL_MAX((size_t)SHOAL_SHM_PMAP_MIN, 4 * (size_t)ctx->local_size);
    if ((size_t)ctx->npmaps < cap) {
        if (ctx->npmaps == ctx->pmaps_cap) {
            int ncap = ctx->pmaps_cap == 0 ? 16 : 2 * ctx->pmaps_cap;
            shoal_shm_pmap_t *np = realloc(ctx->pmaps, (size_t)ncap * sizeof(*np));
            if (np == NULL) {
                shoal_error(SHM, "out of memory for the peers' buffer mappings");
                munmap(base, total);
                return NULL;
            }
            ctx->pmaps = np;
            ctx->pmaps_cap = ncap;
        }
        lru = &ctx->pmaps[ctx->npmaps++];
    } else {
        /* full: the least recently used mapping goes (never one of the call in progress,
         * which uses at most two per peer) */
        lru = &ctx->pmaps[0];
        for (int i = 1; i < ctx->npmaps; i++) {
            if (ctx->pmaps[i].used < lru->used) {
                lru = &ctx->pmaps[i];
            }
        }
        munmap(lru->base, lru->total);
    }
    *lru = (shoal_shm_pmap_t){
        .local_rank = local_rank, .id = m->id, .base = base, .total = total,
        .used = ctx->pmap_clock,
    };
    shoal_trace(SHM, "mapped local rank %d's shared buffer of %llu bytes", local_rank,
                (unsigned long long)m->size);
    return (uint8_t *)base + SHOAL_SHM_MEM_HDR;
}

void shoal_shm_mem_unmap_all(shoal_tl_ctx_t *ctx)
{
    for (int i = 0; i < ctx->npmaps; i++) {
        munmap(ctx->pmaps[i].base, ctx->pmaps[i].total);
    }
    free(ctx->pmaps);
    ctx->pmaps = NULL;
    ctx->npmaps = ctx->pmaps_cap = 0;
}

/* ---- single copy -------------------------------------------------------------------------- */

/* Whether the process single copies go to is still the peer. process_vm_readv/writev name
 * it by pid, and a dead peer's pid may go to another process of the same user, which the
 * kernel lets us read and write as well: the copies are tied to a pidfd of the peer, taken
 * when the probe found it (pollable once the process exited, before its pid can be reused),
 * else (a kernel without pidfd_open) to its /proc start time. Left open: a peer that exits,
 * is reaped and whose pid is reused between the check and the copy (microseconds, in which
 * the pid space would have to wrap around to that very pid). */
static int shoal_shm_cma_gone(shoal_ep_t *ep)
{
    if (ep->pidfd >= 0) {
        struct pollfd p = {.fd = ep->pidfd, .events = POLLIN};
        int ret;
        while ((ret = poll(&p, 1, 0)) < 0 && errno == EINTR) {
        }
        return ret != 0;
    }
    return shoal_shm_pid_dead(ep);
}

/* Reads the magic of the peer's control block through the kernel: 0 if it works, else errno.
 * Takes the pidfd the copies are checked against (shoal_shm_cma_gone) first, so the process
 * it names is the one the probe found. */
int shoal_shm_cma_probe(shoal_ep_t *ep)
{
    uint64_t magic = 0;
    uint64_t va = __atomic_load_n(&ep->peer_ctrl->self_va, __ATOMIC_ACQUIRE);
    struct iovec l = {.iov_base = &magic, .iov_len = sizeof(magic)};
    struct iovec r = {.iov_base = (void *)(uintptr_t)va, .iov_len = sizeof(magic)};
    ssize_t n;

#ifdef SYS_pidfd_open
    if (ep->pidfd < 0) {
        ep->pidfd = (int)syscall(SYS_pidfd_open, ep->pid, 0); /* -1: start-time checks */
    }
#endif
    n = process_vm_readv(ep->pid, &l, 1, &r, 1, 0);
    if (n < 0) {
        return errno;
    }
    if (shoal_shm_cma_gone(ep)) {
        return ESRCH;
    }
    return n == (ssize_t)sizeof(magic) && magic == SHOAL_SHM_MAGIC ? 0 : EIO;
}

int shoal_shm_peer_copy_ok(shoal_tl_ctx_t *ctx)
{
    if (SHOAL_UNLIKELY(!ctx->cma_checked)) {
        shoal_shm_cma_check(ctx); /* lazy: maps every local peer once */
    }
    return ctx->cma_ok;
}

shoal_status_t shoal_shm_peer_copy(shoal_tl_ctx_t *ctx, int local_rank, int write, void *local,
                                   uint64_t remote, size_t len)
{
    shoal_ep_t *ep;
    size_t done = 0;

    if (local_rank < 0 || local_rank >= ctx->local_size ||
        (ep = ctx->ep_by_local[local_rank]) == NULL || !ctx->cma_ok) {
        shoal_error(SHM, "single copy with local rank %d is not available", local_rank);
        return SHOAL_ERR_INTERNAL;
    }
    while (done < len) {
        struct iovec l = {.iov_base = (uint8_t *)local + done, .iov_len = len - done};
        struct iovec r = {.iov_base = (void *)(uintptr_t)(remote + done), .iov_len = len - done};
        ssize_t n;
        /* Before each copy (a write must not reach another process) and after a read (what
         * came may be another process's: the caller drops it on this error). */
        if (shoal_shm_cma_gone(ep)) {
            errno = ESRCH;
            n = -1;
        } else {
            n = write ? process_vm_writev(ep->pid, &l, 1, &r, 1, 0)
                      : process_vm_readv(ep->pid, &l, 1, &r, 1, 0);
            if (n > 0 && !write && shoal_shm_cma_gone(ep)) {
                errno = ESRCH;
                n = -1;
            }
        }
        if (n <= 0) {
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n < 0 && errno == ESRCH) { /* the peer's process is gone */
                shoal_info(SHM, "peer %d: process %d is gone (single copy)", ep->rank,
                           (int)ep->pid);
                return SHOAL_ERR_PEER_FAILED;
            }
            shoal_error(SHM, "peer %d: process_vm_%s of %zu bytes at 0x%llx failed: %s",
                        ep->rank, write ? "writev" : "readv", len - done,
                        (unsigned long long)(remote + done), n < 0 ? strerror(errno) : "no bytes");
            return SHOAL_ERR_TRANSPORT;
        }
        done += (size_t)n;
    }
    return SHOAL_OK;
}
