/* Shared-memory transport: segments, connection, sleeping, failure, shared areas. */
#include "transports/shm/shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SHOAL_SHM_PAGE 4096
#define SHOAL_SHM_MIN_SLOT 256

void shoal_shm_layout_compute(size_t slot_size, unsigned nslots, size_t area_size,
                              unsigned local_size, shoal_shm_layout_t *l_p)
{
    shoal_shm_layout_t l = {
        .slot_stride = SHOAL_ALIGN_UP(slot_size, SHOAL_CACHELINE),
        .hdrs_bytes = SHOAL_ALIGN_UP(nslots * sizeof(shoal_shm_slot_hdr_t), SHOAL_SHM_PAGE),
        .rings_off = SHOAL_ALIGN_UP(sizeof(shoal_shm_ctrl_t), SHOAL_SHM_PAGE),
        .nrings = local_size > 0 ? local_size - 1 : 0,
    };
    l.ring_bytes = SHOAL_ALIGN_UP(l.hdrs_bytes + (size_t)nslots * l.slot_stride, SHOAL_SHM_PAGE);
    l.area_off = l.rings_off + (size_t)l.nrings * l.ring_bytes;
    l.total = l.area_off + SHOAL_ALIGN_UP(area_size, SHOAL_SHM_PAGE);
    *l_p = l;
}

shoal_shm_ring_t shoal_shm_ring_at(void *base, const shoal_shm_layout_t *l, int owner,
                                   int sender)
{
    int idx = sender < owner ? sender : sender - 1;
    uint8_t *ring = (uint8_t *)base + l->rings_off + (size_t)idx * l->ring_bytes;
    return (shoal_shm_ring_t){
        .hdrs = (shoal_shm_slot_hdr_t *)ring,
        .data = ring + l->hdrs_bytes,
    };
}

static const char *shoal_shm_dir(void)
{
    const char *d = shoal_shm_config.dir;
    return d != NULL && d[0] != '\0' ? d : "/dev/shm";
}

/* The segments live in SHOAL_SHM_DIR: /dev/shm through shm_open, another directory (a larger
 * tmpfs where a container's /dev/shm is small) by path, with shm_open's O_NOFOLLOW and
 * O_CLOEXEC. name starts with '/'. -1 and errno on failure. */
static int shoal_shm_seg_path(const char *name, char *path, size_t len)
{
    if (snprintf(path, len, "%s%s", shoal_shm_dir(), name) >= (int)len) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return 0;
}

static int shoal_shm_seg_open(const char *name, int flags, mode_t mode)
{
    char path[PATH_MAX];
    if (strcmp(shoal_shm_dir(), "/dev/shm") == 0) {
        return shm_open(name, flags, mode);
    }
    if (shoal_shm_seg_path(name, path, sizeof(path)) != 0) {
        return -1;
    }
    return open(path, flags | O_NOFOLLOW | O_CLOEXEC, mode);
}

static int shoal_shm_seg_unlink(const char *name)
{
    char path[PATH_MAX];
    if (strcmp(shoal_shm_dir(), "/dev/shm") == 0) {
        return shm_unlink(name);
    }
    if (shoal_shm_seg_path(name, path, sizeof(path)) != 0) {
        return -1;
    }
    return unlink(path);
}

/* Takes (lock = 1) or tests (lock = 0) the whole-file OFD write lock of a segment: 0 if it
 * was taken / nobody holds it, 1 if another open file description holds a lock, -1 and errno
 * on failure. OFD locks belong to the open file, not the process: they are not lost when
 * another descriptor of the file is closed, and go when the last descriptor goes, which is how
 * a dead owner's segment is told apart (shoal_shm_sweep). A forked child's copy of the
 * descriptor, or of a mapping made from it, would hold the lock too: the owner locks an open
 * file that only lock_fd references, and forked children close it (shoal_shm_fork_child). */
static int shoal_shm_seg_lock(int fd, int lock)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (fcntl(fd, lock ? F_OFD_SETLK : F_OFD_GETLK, &fl) != 0) {
        return lock && (errno == EAGAIN || errno == EACCES) ? 1 : -1;
    }
    return !lock && fl.l_type != F_UNLCK;
}

/* The contexts whose lock_fd is open, for the fork handlers. A process forked from a rank (a
 * data loader's workers, a helper before its exec) inherits the descriptor and with it the
 * segment's OFD lock, which then said "the owner lives" for as long as the child did: a
 * killed rank's segment outlived it (the sweep left it; peers in another pid namespace took
 * the rank for alive until their timeout). The child closes its copies; the parent's locks
 * stay (they go with the open file's last descriptor). The mutex is held across fork(), so
 * the child's list is whole, and from a segment's open to its tracking, so no fork in
 * between copies an untracked descriptor. */
static pthread_mutex_t shoal_shm_fork_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t shoal_shm_fork_once = PTHREAD_ONCE_INIT;
static shoal_tl_ctx_t *shoal_shm_fork_list; /* linked by fork_next */

static void shoal_shm_fork_prepare(void)
{
    pthread_mutex_lock(&shoal_shm_fork_mutex);
}

static void shoal_shm_fork_parent(void)
{
    pthread_mutex_unlock(&shoal_shm_fork_mutex);
}

static void shoal_shm_fork_child(void)
{
    for (shoal_tl_ctx_t *c = shoal_shm_fork_list; c != NULL; c = c->fork_next) {
        close(c->lock_fd);
        c->lock_fd = -1;
    }
    shoal_shm_fork_list = NULL;
    pthread_mutex_unlock(&shoal_shm_fork_mutex);
}

/* A process that leaves by exit() without finalizing its contexts (main returns without
 * shoal_comm_destroy, a script ends on an exception) left the names it still had in the
 * directory: a lazy context's until every local peer mapped it, any context's before ready().
 * Each held its pages (the shared area is reserved at init) until a later init of the same
 * user swept it, a minute old at least. The contexts with a lock_fd are the ones whose name
 * may exist: their names go here (a name already gone answers ENOENT). A forked child's list
 * is empty (shoal_shm_fork_child): its exit removes nothing of its parent's. */
static void shoal_shm_exit(void)
{
    pthread_mutex_lock(&shoal_shm_fork_mutex);
    for (shoal_tl_ctx_t *c = shoal_shm_fork_list; c != NULL; c = c->fork_next) {
        (void)shoal_shm_seg_unlink(c->name);
    }
    pthread_mutex_unlock(&shoal_shm_fork_mutex);
}

static void shoal_shm_fork_init(void)
{
    if (pthread_atfork(shoal_shm_fork_prepare, shoal_shm_fork_parent, shoal_shm_fork_child) !=
        0) {
        shoal_warn(SHM, "pthread_atfork failed: a process forked from this one would keep "
                   "its segments' locks");
    }
    if (atexit(shoal_shm_exit) != 0) {
        shoal_warn(SHM, "atexit failed: an exit without shoal_comm_destroy would leave "
                   "segments in %s", shoal_shm_dir());
    }
}

/* Called with shoal_shm_fork_mutex held: ctx's lock_fd (open) is closed in forked children. */
static void shoal_shm_fork_track(shoal_tl_ctx_t *ctx)
{
    ctx->fork_next = shoal_shm_fork_list;
    shoal_shm_fork_list = ctx;
}

/* Closes ctx's lock_fd (the lock goes with it unless another descriptor of the open file is
 * left) and stops tracking it. */
static void shoal_shm_lock_close(shoal_tl_ctx_t *ctx)
{
    int fd;
    pthread_mutex_lock(&shoal_shm_fork_mutex);
    for (shoal_tl_ctx_t **pp = &shoal_shm_fork_list; *pp != NULL; pp = &(*pp)->fork_next) {
        if (*pp == ctx) {
            *pp = ctx->fork_next;
            break;
        }
    }
    fd = ctx->lock_fd;
    ctx->lock_fd = -1;
    pthread_mutex_unlock(&shoal_shm_fork_mutex);
    if (fd >= 0) {
        close(fd);
    }
}

int shoal_shm_ep_owner_gone(shoal_ep_t *ep)
{
    return ep->seg_fd >= 0 && shoal_shm_seg_lock(ep->seg_fd, 0) == 0;
}

/* Whether a directory entry is shaped like one of our segments' names. */
static int shoal_shm_seg_name_ok(const char *entry)
{
    size_t plen = strlen(SHOAL_SHM_NAME_PREFIX) - 1; /* without the '/' */
    return strncmp(entry, &SHOAL_SHM_NAME_PREFIX[1], plen) == 0 &&
           strlen(entry) == plen + 32 && strspn(entry + plen, "0123456789abcdef") == 32;
}

/* One entry of the sweep: 1 if it was a dead owner's segment and is gone. */
static int shoal_shm_sweep_one(int dfd, const char *entry, time_t now, unsigned min_age_s)
{
    struct stat sb;
    if (fstatat(dfd, entry, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode) ||
        sb.st_uid != geteuid() || sb.st_mtime > now - (time_t)min_age_s) {
        return 0; /* only this user's plain files, old enough, are opened */
    }
    int fd = openat(dfd, entry, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        return 0; /* gone, or not ours to open */
    }
    struct {
        uint64_t magic;
        uint32_t version;
    } hdr = {0, 0};
    int dead = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_uid == geteuid() &&
               sb.st_mtime <= now - (time_t)min_age_s && shoal_shm_seg_lock(fd, 0) == 0;
    /* A segment of another version of shoal may have no lock while its owner lives (version
     * 1 held none): it is left alone. One never formatted (its owner died before writing the
     * header) is ours to judge. */
    if (dead && pread(fd, &hdr, sizeof(hdr), 0) == (ssize_t)sizeof(hdr) &&
        hdr.magic == SHOAL_SHM_MAGIC && hdr.version != SHOAL_SHM_VERSION) {
        dead = 0;
    }
    /* Taking the lock before the unlink closes the race with another sweeper's or the
     * (dead) owner's: nothing else ever takes it. */
    if (dead && shoal_shm_seg_lock(fd, 1) == 0 && unlinkat(dfd, entry, 0) == 0) {
        shoal_info(SHM, "removed segment %s/%s (%lld bytes): its owner died before removing "
                   "it", shoal_shm_dir(), entry, (long long)sb.st_size);
        close(fd);
        return 1;
    }
    close(fd);
    return 0;
}

unsigned shoal_shm_sweep(unsigned min_age_s)
{
    int dfd = open(shoal_shm_dir(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (d == NULL) {
        if (dfd >= 0) {
            close(dfd);
        }
        return 0; /* shoal_shm_query reports an unusable directory */
    }
    unsigned removed = 0;
    time_t now = time(NULL);
    const struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (shoal_shm_seg_name_ok(e->d_name)) {
            removed += (unsigned)shoal_shm_sweep_one(dfd, e->d_name, now, min_age_s);
        }
    }
    closedir(d);
    return removed;
}

static int shoal_shm_query(void)
{
    if (shoal_shm_config.disable) {
        return 0;
    }
    return access(shoal_shm_dir(), W_OK | X_OK) == 0;
}

/* The ring's geometry: the derived sizes (src/tune through core: explicit settings already
 * applied, the same on every rank of the host), else the variables. */
static shoal_status_t shoal_shm_config_check(const shoal_tl_params_t *params, size_t *slot_p,
                                             unsigned *nslots_p)
{
    const shoal_shm_config_t *c = &shoal_shm_config;
    const shoal_tl_sizes_t *z = params->sizes;
    uint64_t slot = z != NULL && z->shm_slot_size != 0 ? z->shm_slot_size : c->slot_size;
    uint64_t nslots = z != NULL && z->shm_nslots != 0 ? z->shm_nslots : c->nslots;
    const char *from = z != NULL && (z->shm_slot_size != 0 || z->shm_nslots != 0)
                           ? " (as derived, see shoal_info -t)" : "";

    if (slot < SHOAL_SHM_MIN_SLOT || slot > (1u << 30)) {
        shoal_error(SHM, "SHOAL_SHM_SLOT_SIZE=%llu%s is out of range [%d, 1g]",
                    (unsigned long long)slot, from, SHOAL_SHM_MIN_SLOT);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (nslots < 2 || nslots > 4096) {
        shoal_error(SHM, "SHOAL_SHM_NSLOTS=%llu%s is out of range [2, 4096]",
                    (unsigned long long)nslots, from);
        return SHOAL_ERR_INVALID_ARG;
    }
    *slot_p = (size_t)slot;
    *nslots_p = (unsigned)nslots;
    if (c->area_size > ((size_t)1 << 40)) {
        shoal_error(SHM, "SHOAL_SHM_AREA_SIZE=%zu is too large", c->area_size);
        return SHOAL_ERR_INVALID_ARG;
    }
    return SHOAL_OK;
}

/* posix_fallocate of [off, off + len): 0, or the error (a file system without it counts as
 * success: its pages are then allocated at first touch). */
static int shoal_shm_reserve(int fd, size_t off, size_t len)
{
    int ret = len > 0 ? posix_fallocate(fd, (off_t)off, (off_t)len) : 0;
    return ret == EOPNOTSUPP || ret == EINVAL ? 0 : ret;
}

shoal_status_t shoal_shm_ep_reserve_tx(shoal_ep_t *ep)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    size_t len = SHOAL_ALIGN_UP((size_t)ctx->nslots * ctx->layout.slot_stride, SHOAL_SHM_PAGE);
    uint8_t *data = ep->tx.data; /* page aligned: rings and their headers are whole pages */

    /* MADV_POPULATE_WRITE allocates the pages and reports a full tmpfs as an error where a
     * store would raise SIGBUS. A kernel without it (before 5.14): touch each page (only we,
     * the producer, write the ring's data, so the store races with nobody). */
    if (madvise(data, len, 23 /* MADV_POPULATE_WRITE */) != 0) {
        if (errno != EINVAL) {
            char why[192];
            snprintf(why, sizeof(why), "cannot reserve the %zu-byte ring to peer %d in %s: %s",
                     len, ep->rank, shoal_shm_dir(), strerror(errno));
            shoal_error(SHM, "%s", why);
            return errno == EFAULT || errno == ENOMEM ? SHOAL_ERR_NO_MEMORY : SHOAL_ERR_SYSTEM;
        }
        for (size_t off = 0; off < len; off += SHOAL_SHM_PAGE) {
            volatile uint8_t *b = data + off;
            *b = *b;
        }
    }
    ep->tx_reserved = 1;
    return SHOAL_OK;
}

/* Creates, sizes, maps and faults in our segment; ctx->name/base/ctrl on success. */
static shoal_status_t shoal_shm_segment_create(shoal_tl_ctx_t *ctx)
{
    size_t total = ctx->layout.total;
    struct statvfs vfs;
    if (statvfs(shoal_shm_dir(), &vfs) == 0 &&
        (unsigned long long)vfs.f_bavail * vfs.f_frsize < total) {
        shoal_error(SHM, "not enough space in %s for a %zu-byte segment (%llu bytes free)",
                    shoal_shm_dir(), total, (unsigned long long)vfs.f_bavail * vfs.f_frsize);
        return SHOAL_ERR_NO_MEMORY;
    }
    int fd = -1, lfd;
    for (int attempt = 0; fd < 0 && attempt < 4; attempt++) {
        uint8_t rnd[16];
        shoal_status_t st = shoal_random_bytes(rnd, sizeof(rnd));
        if (st != SHOAL_OK) {
            return st;
        }
        int off = snprintf(ctx->name, sizeof(ctx->name), "%s", SHOAL_SHM_NAME_PREFIX);
        for (size_t i = 0; i < sizeof(rnd); i++) {
            off += snprintf(ctx->name + off, sizeof(ctx->name) - off, "%02x", rnd[i]);
        }
        fd = shoal_shm_seg_open(ctx->name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0 && errno != EEXIST) {
            break;
        }
    }
    if (fd < 0) {
        shoal_error(SHM, "creating segment %s in %s failed: %s", ctx->name, shoal_shm_dir(),
                    strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    /* The mode first: a umask without the owner's write bit (0277) made the file 0400, which
     * the second open below may not open for writing (but as root). */
    if (fchmod(fd, 0600) != 0) {
        shoal_error(SHM, "setting the mode of %s in %s to 0600 failed: %s", ctx->name,
                    shoal_shm_dir(), strerror(errno));
        shoal_shm_seg_unlink(ctx->name);
        close(fd);
        return SHOAL_ERR_SYSTEM;
    }
    /* The lock is held by an open file of its own, referenced by lock_fd only: the mapping
     * (made from fd) also keeps its open file alive, in a forked child too, so a lock on fd's
     * would last as long as any child of ours (shoal_shm_fork_child closes lock_fd there). */
    (void)pthread_once(&shoal_shm_fork_once, shoal_shm_fork_init);
    pthread_mutex_lock(&shoal_shm_fork_mutex); /* no fork before the descriptor is tracked */
    lfd = shoal_shm_seg_open(ctx->name, O_RDWR, 0);
    if (lfd >= 0) {
        ctx->lock_fd = lfd;
        shoal_shm_fork_track(ctx);
    }
    pthread_mutex_unlock(&shoal_shm_fork_mutex);
    shoal_status_t status = SHOAL_ERR_SYSTEM;
    struct stat sb, lsb;
    if (lfd < 0 || fstat(fd, &sb) != 0 || fstat(lfd, &lsb) != 0 || sb.st_dev != lsb.st_dev ||
        sb.st_ino != lsb.st_ino) {
        shoal_error(SHM, "opening segment %s in %s again failed: %s", ctx->name,
                    shoal_shm_dir(), lfd < 0 ? strerror(errno) : "another file by that name");
        goto err_unlink;
    }
    /* The lock says "my owner lives" for as long as the name exists (shoal_shm_sweep). A file
     * system without OFD locks fails the sweep's test as well, so its segments are never
     * taken for dead. */
    if (shoal_shm_seg_lock(lfd, 1) != 0) {
        shoal_info(SHM, "no lock on segment %s: %s; a crash would leave it behind", ctx->name,
                    strerror(errno));
    }
    if (ftruncate(fd, (off_t)total) != 0) {
        shoal_error(SHM, "sizing %s to %zu bytes failed: %s", ctx->name, total, strerror(errno));
        goto err_unlink;
    }
    /* Reserve the pages used from init on (control block, ring headers, shared area): a full
     * tmpfs must fail here, not SIGBUS us later. Ring data is reserved by its producer on its
     * first send (shoal_shm_ep_reserve_tx): with every rank of a host holding a ring per
     * local peer, reserving them all at init cost n^2 pages of tmpfs (256 ranks: 33 GB) and
     * the time to fault them in, for rings most collectives never touch. */
    int ret = shoal_shm_reserve(fd, 0, ctx->layout.rings_off);
    for (unsigned i = 0; ret == 0 && i < ctx->layout.nrings; i++) {
        ret = shoal_shm_reserve(fd, ctx->layout.rings_off + (size_t)i * ctx->layout.ring_bytes,
                                ctx->layout.hdrs_bytes);
    }
    if (ret == 0) {
        ret = shoal_shm_reserve(fd, ctx->layout.area_off, total - ctx->layout.area_off);
    }
    if (ret != 0) {
        shoal_error(SHM, "posix_fallocate(%s, %zu bytes) in %s failed: %s", ctx->name, total,
                    shoal_shm_dir(), strerror(ret));
        status = ret == ENOSPC ? SHOAL_ERR_NO_MEMORY : SHOAL_ERR_SYSTEM;
        goto err_unlink;
    }
    void *base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        shoal_error(SHM, "mmap(%s, %zu bytes) failed: %s", ctx->name, total, strerror(errno));
        goto err_unlink;
    }
    close(fd);
    /* Fault the reserved pages in now, never on the data path. */
    memset(base, 0, ctx->layout.rings_off);
    for (unsigned i = 0; i < ctx->layout.nrings; i++) {
        memset((uint8_t *)base + ctx->layout.rings_off + (size_t)i * ctx->layout.ring_bytes, 0,
               ctx->layout.hdrs_bytes);
    }
    memset((uint8_t *)base + ctx->layout.area_off, 0, total - ctx->layout.area_off);
    ctx->base = base;
    ctx->ctrl = base;
    shoal_trace(SHM, "segment %s%s: %zu bytes", shoal_shm_dir(), ctx->name, total);
    return SHOAL_OK;

err_unlink:
    shoal_shm_seg_unlink(ctx->name); /* before the close: the lock goes with the name */
    shoal_shm_lock_close(ctx);
    close(fd);
    return status;
}

static void shoal_shm_segment_format(shoal_tl_ctx_t *ctx)
{
    shoal_shm_ctrl_t *c = ctx->ctrl;
    c->version = SHOAL_SHM_VERSION;
    c->pid = (int32_t)getpid();
    c->comm_id = ctx->comm_id;
    c->local_rank = (uint32_t)ctx->local_rank;
    c->local_size = (uint32_t)ctx->local_size;
    c->nslots = ctx->nslots;
    c->slot_size = ctx->slot_size;
    c->area_size = ctx->area_size;
    c->total_size = ctx->layout.total;
    c->self_va = (uint64_t)(uintptr_t)ctx->base;
    c->culprit = -1;
    for (int s = 0; s < ctx->local_size; s++) {
        if (s == ctx->local_rank) {
            continue;
        }
        shoal_shm_ring_t r = shoal_shm_ring_at(ctx->base, &ctx->layout, ctx->local_rank, s);
        for (unsigned i = 0; i < ctx->nslots; i++) {
            r.hdrs[i].seq = i;
        }
    }
    __atomic_store_n(&c->magic, SHOAL_SHM_MAGIC, __ATOMIC_RELEASE);
}

static shoal_status_t shoal_shm_init(const shoal_tl_params_t *params, shoal_tl_ctx_t **ctx_p)
{
    size_t slot_size;
    unsigned nslots;
    shoal_status_t status = shoal_shm_config_check(params, &slot_size, &nslots);
    if (status != SHOAL_OK) {
        return status;
    }
    if (params->local_size < 1 || params->local_rank < 0 ||
        params->local_rank >= params->local_size) {
        shoal_error(SHM, "local rank %d of %d is invalid", params->local_rank,
                    params->local_size);
        return SHOAL_ERR_INVALID_ARG;
    }
    shoal_tl_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) {
        shoal_error(SHM, "out of memory for a context");
        return SHOAL_ERR_NO_MEMORY;
    }
    *ctx = (shoal_tl_ctx_t){
        .rank = params->rank,
        .local_rank = params->local_rank,
        .local_size = params->local_size,
        .comm_id = params->comm_id,
        .abort_flag = params->abort_flag,
        .lazy = params->lazy,
        .slot_size = SHOAL_ALIGN_UP(slot_size, SHOAL_CACHELINE),
        .nslots = nslots,
        .area_size = SHOAL_ALIGN_UP(shoal_shm_config.area_size, SHOAL_SHM_PAGE),
        .lock_fd = -1,
    };
    shoal_shm_layout_compute(ctx->slot_size, ctx->nslots, ctx->area_size,
                             (unsigned)ctx->local_size, &ctx->layout);
    ctx->ep_by_local = calloc((size_t)ctx->local_size, sizeof(*ctx->ep_by_local));
    if (ctx->ep_by_local == NULL) {
        shoal_error(SHM, "out of memory for %d local peers", ctx->local_size);
        status = SHOAL_ERR_NO_MEMORY;
        goto err_free;
    }
    /* Segments of this user's processes that died between making theirs and removing its
     * name (a rank killed in the middle of init) would stay in the directory until reboot:
     * the first context of each process removes them. */
    static int swept;
    if (!__atomic_exchange_n(&swept, 1, __ATOMIC_RELAXED)) {
        shoal_shm_sweep(SHOAL_SHM_SWEEP_AGE_S);
    }
    status = shoal_shm_segment_create(ctx);
    if (status != SHOAL_OK) {
        goto err_free;
    }
    struct stat dsb;
    if (stat(shoal_shm_dir(), &dsb) == 0) {
        ctx->dir_dev = (uint64_t)dsb.st_dev;
        ctx->dir_ino = (uint64_t)dsb.st_ino;
    }
    shoal_shm_segment_format(ctx);
    shoal_info(SHM, "rank %d: segment %zu bytes (%u rings of %u x %zu B, area %zu B)",
               ctx->rank, ctx->layout.total, ctx->layout.nrings, ctx->nslots, ctx->slot_size,
               ctx->area_size);
    *ctx_p = ctx;
    return SHOAL_OK;

err_free:
    free(ctx->ep_by_local);
    free(ctx);
    return status;
}

static shoal_status_t shoal_shm_address(shoal_tl_ctx_t *ctx, void *addr, size_t *len_p)
{
    shoal_shm_addr_t a = {
        .magic = SHOAL_SHM_ADDR_MAGIC,
        .version = SHOAL_SHM_VERSION,
        .pid = (int32_t)getpid(),
        .local_rank = ctx->local_rank,
        .local_size = (uint32_t)ctx->local_size,
        .nslots = ctx->nslots,
        .slot_size = ctx->slot_size,
        .area_size = ctx->area_size,
        .comm_id = ctx->comm_id,
        .pid_ns = shoal_pid_ns(),
        .dir_dev = ctx->dir_dev,
        .dir_ino = ctx->dir_ino,
    };
    memcpy(a.name, ctx->name, sizeof(a.name));
    memcpy(addr, &a, sizeof(a));
    *len_p = sizeof(a);
    return SHOAL_OK;
}

static int shoal_shm_name_valid(const char *name)
{
    size_t plen = strlen(SHOAL_SHM_NAME_PREFIX);
    if (memchr(name, '\0', SHOAL_SHM_NAME_MAX) == NULL ||
        strncmp(name, SHOAL_SHM_NAME_PREFIX, plen) != 0 || strlen(name) != plen + 32) {
        return 0;
    }
    return strspn(name + plen, "0123456789abcdef") == 32;
}

/* Checks a peer's address against our geometry; a sentence in why otherwise. */
static int shoal_shm_addr_valid(shoal_tl_ctx_t *ctx, const shoal_shm_addr_t *a, char *why,
                                size_t len)
{
    if (a->magic != SHOAL_SHM_ADDR_MAGIC || a->version != SHOAL_SHM_VERSION ||
        !shoal_shm_name_valid(a->name)) {
        snprintf(why, len, "not a shm address of this version");
    } else if (a->comm_id != ctx->comm_id) {
        snprintf(why, len, "address of communicator %08x, expected %08x", a->comm_id,
                 ctx->comm_id);
    } else if (a->local_size != (uint32_t)ctx->local_size || a->local_rank < 0 ||
               a->local_rank >= ctx->local_size || a->local_rank == ctx->local_rank ||
               ctx->ep_by_local[a->local_rank] != NULL) {
        snprintf(why, len, "local rank %d of %u is invalid or duplicate", a->local_rank,
                 a->local_size);
    } else if (a->slot_size != ctx->slot_size || a->nslots != ctx->nslots ||
               a->area_size != ctx->area_size) {
        snprintf(why, len, "SHOAL_SHM_SLOT_SIZE/NSLOTS/AREA_SIZE differ (%llu/%u/%llu there, "
                 "%zu/%u/%zu here)", (unsigned long long)a->slot_size, a->nslots,
                 (unsigned long long)a->area_size, ctx->slot_size, ctx->nslots, ctx->area_size);
    } else {
        return 1;
    }
    return 0;
}

/* 1 if the directory has an entry by the segment's name that is not a plain file of ours. */
static int shoal_shm_seg_foreign(const char *name)
{
    char path[PATH_MAX];
    struct stat sb;
    return shoal_shm_seg_path(name, path, sizeof(path)) == 0 && lstat(path, &sb) == 0 &&
           (!S_ISREG(sb.st_mode) || sb.st_uid != geteuid());
}

/* Opens, checks and maps a peer's segment. gone_ok: a name that no longer exists is
 * SHOAL_ERR_PEER_FAILED, logged as information only (shoal_shm_ep_attach_rx). */
static shoal_status_t shoal_shm_ep_map(shoal_tl_ctx_t *ctx, shoal_ep_t *ep,
                                       const shoal_shm_addr_t *a, int gone_ok)
{
    size_t total = ctx->layout.total;
    struct stat sb = {0}; /* printed when fstat fails too */
    int fd = shoal_shm_seg_open(a->name, O_RDWR, 0);
    int err = fd < 0 ? errno : 0;
    /* The peer's segment is always ours. Once the peer removed its name, anyone may make a file
     * by that name in the directory (/dev/shm is everyone's): one we may not open (EACCES) or
     * of another owner is not the peer's, whose segment is gone. Taken for it, it failed the
     * receive of what the peer had left in our ring with ERR_PERMISSION. Nor is a symbolic
     * link or a directory by that name, which anyone may make there as well: their opens
     * (ELOOP, EISDIR, shm_open's EINVAL) failed the receive with ERR_TRANSPORT. */
    int other = fd < 0 ? err == EACCES || (err != ENOENT && shoal_shm_seg_foreign(a->name))
                       : fstat(fd, &sb) == 0 && sb.st_uid != geteuid();
    if (gone_ok && (err == ENOENT || other)) {
        if (fd >= 0) {
            close(fd);
        }
        if (other) {
            shoal_warn(SHM, "peer %d: a file not ours has the name of its segment %s in %s: "
                       "its segment is gone (the peer finalized or died); what it sent is "
                       "received from ours", ep->rank, a->name, shoal_shm_dir());
        } else {
            shoal_info(SHM, "peer %d: its segment %s is gone (the peer finalized or died): "
                       "what it sent is received from ours", ep->rank, a->name);
        }
        return SHOAL_ERR_PEER_FAILED;
    }
    if (fd < 0) {
        shoal_error(SHM, "peer %d: opening its segment %s in %s failed: %s%s", ep->rank, a->name,
                    shoal_shm_dir(), strerror(err),
                    err == ENOENT ? " (the peer finalized or died)" : "");
        /* The name goes only with its owner's context (or once every local peer mapped it,
         * this process included): a lazy endpoint's first send to a peer that finalized or
         * died (and was swept) finds it gone, as tcp finds a closed listener. */
        return err == ENOENT ? SHOAL_ERR_PEER_FAILED : SHOAL_ERR_TRANSPORT;
    }
    if (fstat(fd, &sb) != 0 || sb.st_uid != geteuid() || (sb.st_mode & 07777) != 0600 ||
        !S_ISREG(sb.st_mode) || (size_t)sb.st_size != total) {
        shoal_error(SHM, "peer %d: segment %s refused (uid %d mode %o size %lld; expected uid "
                    "%d mode 600 size %zu)", ep->rank, a->name, (int)sb.st_uid,
                    (unsigned)(sb.st_mode & 07777), (long long)sb.st_size, (int)geteuid(),
                    total);
        close(fd);
        return SHOAL_ERR_PERMISSION;
    }
    /* No MAP_POPULATE: a peer's pages are faulted in where we touch them (its control block
     * and shared area, our ring in it), not all of them at every connect. */
    void *base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base != MAP_FAILED && ep->pid_foreign) {
        ep->seg_fd = fd; /* its lock says whether the peer lives (shoal_shm_ep_owner_gone) */
        fd = -1;
    }
    if (fd >= 0) {
        close(fd);
    }
    if (base == MAP_FAILED) {
        shoal_error(SHM, "peer %d: mmap(%s, %zu) failed: %s", ep->rank, a->name, total,
                    strerror(errno));
        return SHOAL_ERR_SYSTEM;
    }
    const shoal_shm_ctrl_t *c = base;
    if (__atomic_load_n(&c->magic, __ATOMIC_ACQUIRE) != SHOAL_SHM_MAGIC ||
        c->version != SHOAL_SHM_VERSION || c->comm_id != ctx->comm_id ||
        c->pid != a->pid || c->local_rank != (uint32_t)a->local_rank ||
        c->local_size != (uint32_t)ctx->local_size || c->total_size != total) {
        shoal_error(SHM, "peer %d: segment %s does not match its address", ep->rank, a->name);
        munmap(base, total);
        if (ep->seg_fd >= 0) {
            close(ep->seg_fd);
            ep->seg_fd = -1;
        }
        return SHOAL_ERR_PROTOCOL;
    }
    ep->peer_base = base;
    ep->peer_len = total;
    ep->peer_ctrl = base;
    return SHOAL_OK;
}

/* Checks and keeps a peer's address; its segment is mapped by shoal_shm_ep_attach. */
static shoal_status_t shoal_shm_ep_prepare(shoal_tl_ctx_t *ctx, shoal_ep_t *ep, int rank,
                                           const void *addr, size_t addr_len)
{
    shoal_shm_addr_t a;
    char why[160];
    char state;
    *ep = (shoal_ep_t){.ctx = ctx, .rank = rank, .status = SHOAL_OK, .pidfd = -1,
                       .seg_fd = -1};
    uint32_t pid_ns;
    if (addr_len != sizeof(a)) {
        shoal_error(SHM, "peer %d: shm address of %zu bytes, expected %zu", rank, addr_len,
                    sizeof(a));
        return SHOAL_ERR_PROTOCOL;
    }
    memcpy(&a, addr, sizeof(a));
    if (!shoal_shm_addr_valid(ctx, &a, why, sizeof(why))) {
        shoal_error(SHM, "peer %d: %s", rank, why);
        return SHOAL_ERR_PROTOCOL;
    }
    /* Ranks of one host id that cannot see each other's segments (containers with the same
     * host name and boot id and a /dev/shm each, SHOAL_SHM_DIR set differently): the open of
     * the peer's segment failed with ENOENT, taken for a peer that finalized or died. */
    if (a.dir_ino != 0 && ctx->dir_ino != 0 &&
        (a.dir_dev != ctx->dir_dev || a.dir_ino != ctx->dir_ino)) {
        shoal_error(SHM, "peer %d makes its segments in another directory than this rank's %s "
                    "(device %llx inode %llu there, %llx/%llu here): the ranks of a host must "
                    "share SHOAL_SHM_DIR (containers with a /dev/shm each: share one, or set "
                    "SHOAL_HOSTID per container)", rank, shoal_shm_dir(),
                    (unsigned long long)a.dir_dev, (unsigned long long)a.dir_ino,
                    (unsigned long long)ctx->dir_dev, (unsigned long long)ctx->dir_ino);
        return SHOAL_ERR_INVALID_ARG;
    }
    ep->addr = a;
    ep->local_rank = a.local_rank;
    ep->pid = (pid_t)a.pid;
    /* in our own segment: a receive needs nothing of the peer's (shoal_shm_ep_attach_rx) */
    ep->rx = shoal_shm_ring_at(ctx->base, &ctx->layout, ctx->local_rank, a.local_rank);
    /* A peer in another pid namespace (containers sharing /dev/shm): the pid it published
     * is another process here, or none. Judged by it, a live peer was taken for dead at the
     * first check, and a dead one for alive for as long as that other process lived; single
     * copies would have gone to that other process. */
    pid_ns = shoal_pid_ns();
    ep->pid_foreign = a.pid_ns != 0 && pid_ns != 0 && a.pid_ns != pid_ns;
    if (ep->pid_foreign) {
        shoal_info(SHM, "peer %d (pid %d there) is in another pid namespace: no single copies "
                   "with it, its death is seen by its segment's lock", rank, (int)ep->pid);
        ep->starttime = 0;
    } else if (shoal_shm_proc_stat(ep->pid, &state, &ep->starttime) != 0) {
        ep->starttime = 0; /* another pid namespace? liveness falls back to kill() */
    }
    ctx->ep_by_local[a.local_rank] = ep;
    return SHOAL_OK;
}

static shoal_status_t shoal_shm_ep_attach_ext(shoal_ep_t *ep, int gone_ok)
{
    shoal_tl_ctx_t *ctx = ep->ctx;
    if (SHOAL_LIKELY(ep->peer_base != NULL)) {
        return SHOAL_OK;
    }
    shoal_status_t status = shoal_shm_ep_map(ctx, ep, &ep->addr, gone_ok);
    if (status != SHOAL_OK) {
        return status;
    }
    ep->tx = shoal_shm_ring_at(ep->peer_base, &ctx->layout, ep->local_rank, ctx->local_rank);
    /* Lazy: the name lives until every local peer has mapped the segment; the last one to
     * map it unlinks it (then nothing of the job's is left in the file system, as after an
     * eager init). */
    if (ctx->lazy && __atomic_add_fetch(&ep->peer_ctrl->mapped, 1, __ATOMIC_ACQ_REL) ==
                         (uint32_t)ctx->local_size - 1) {
        if (shoal_shm_seg_unlink(ep->addr.name) != 0 && errno != ENOENT) {
            shoal_warn(SHM, "shm_unlink(%s) of peer %d failed: %s", ep->addr.name, ep->rank,
                       strerror(errno));
        }
    }
    return SHOAL_OK;
}

shoal_status_t shoal_shm_ep_attach(shoal_ep_t *ep)
{
    return shoal_shm_ep_attach_ext(ep, 0);
}

shoal_status_t shoal_shm_ep_attach_rx(shoal_ep_t *ep)
{
    shoal_status_t status = shoal_shm_ep_attach_ext(ep, 1);
    if (status == SHOAL_ERR_PEER_FAILED && ep->pid_foreign && ep->peer_gone == 0) {
        /* A peer in another pid namespace is alive while its segment's lock is held, tested
         * on a descriptor of the segment that we never got: its name went with its context,
         * as the lock goes. Judged by no descriptor, it was alive for ever, and a receive for
         * what never comes waited for the timeout. What is in our ring is still delivered
         * first (shoal_shm_ctx_check_peers). */
        snprintf(ep->gone_why, sizeof(ep->gone_why), "peer %d (in another pid namespace) "
                 "died or finalized: its segment is gone", ep->rank);
        ep->gone_culprit = -1;
        ep->peer_gone = 1;
    }
    return status == SHOAL_ERR_PEER_FAILED ? SHOAL_OK : status;
}

static shoal_status_t shoal_shm_ep_connect(shoal_tl_ctx_t *ctx, shoal_ep_t *ep, int rank,
                                           const void *addr, size_t addr_len)
{
    shoal_status_t status = shoal_shm_ep_prepare(ctx, ep, rank, addr, addr_len);
    if (status == SHOAL_OK && !ctx->lazy) {
        status = shoal_shm_ep_attach(ep);
    }
    return status;
}

static void shoal_shm_eps_release(shoal_tl_ctx_t *ctx, int n)
{
    for (int p = 0; p < n; p++) {
        if (ctx->eps[p].peer_base != NULL) {
            munmap(ctx->eps[p].peer_base, ctx->eps[p].peer_len);
        }
        if (ctx->eps[p].pidfd >= 0) {
            close(ctx->eps[p].pidfd);
        }
        if (ctx->eps[p].seg_fd >= 0) {
            close(ctx->eps[p].seg_fd);
        }
    }
    memset(ctx->ep_by_local, 0, (size_t)ctx->local_size * sizeof(*ctx->ep_by_local));
    free(ctx->eps);
    ctx->eps = NULL;
    ctx->npeers = 0;
}

/* Single copies are used only if a real read of every local peer works now. */
void shoal_shm_cma_check(shoal_tl_ctx_t *ctx)
{
    ctx->cma_ok = 0;
    ctx->cma_checked = 1;
    for (int p = 0; p < ctx->npeers; p++) {
        if (shoal_shm_ep_attach(&ctx->eps[p]) != SHOAL_OK) {
            shoal_info(SHM, "rank %d: single copy (process_vm_readv) off: local peer %d cannot "
                       "be mapped", ctx->rank, ctx->eps[p].rank);
            return;
        }
    }
    for (int p = 0; p < ctx->npeers; p++) {
        if (ctx->eps[p].pid_foreign) {
            shoal_info(SHM, "rank %d: single copy (process_vm_readv) off: local peer %d is in "
                       "another pid namespace", ctx->rank, ctx->eps[p].rank);
            return;
        }
    }
    if (!shoal_shm_config.cma || ctx->npeers != ctx->local_size - 1 || ctx->npeers == 0) {
        shoal_info(SHM, "rank %d: single copy (process_vm_readv) %s", ctx->rank,
                   shoal_shm_config.cma ? "not used: not every local rank is a peer here"
                                        : "off (SHOAL_SHM_CMA=0)");
        return;
    }
    for (int p = 0; p < ctx->npeers; p++) {
        int err = shoal_shm_cma_probe(&ctx->eps[p]);
        if (err != 0) {
            shoal_info(SHM, "rank %d: single copy (process_vm_readv) off: a probe read of rank "
                       "%d failed: %s%s", ctx->rank, ctx->eps[p].rank, strerror(err),
                       err == EPERM ? " (ptrace not allowed: another user, a setuid process "
                                      "or kernel.yama.ptrace_scope > 0)" : "");
            return;
        }
    }
    ctx->cma_ok = 1;
    shoal_info(SHM, "rank %d: single copy (process_vm_readv) on with %d local peers", ctx->rank,
               ctx->npeers);
}

static shoal_status_t shoal_shm_connect_all(shoal_tl_ctx_t *ctx, const int *peers, int npeers,
                                            const void *const *addrs, const size_t *addr_lens,
                                            shoal_ep_t **eps_p)
{
    if (ctx->eps != NULL || npeers < 0 || npeers > ctx->local_size - 1) {
        shoal_error(SHM, "connect_all: %d peers for %d local ranks (or called twice)", npeers,
                    ctx->local_size);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (shoal_aborted(ctx->abort_flag)) {
        return SHOAL_ERR_ABORTED;
    }
    if (npeers == 0) {
        return SHOAL_OK;
    }
    ctx->eps = calloc((size_t)npeers, sizeof(*ctx->eps));
    if (ctx->eps == NULL) {
        shoal_error(SHM, "out of memory for %d endpoints", npeers);
        return SHOAL_ERR_NO_MEMORY;
    }
    /* Every segment exists since init: nothing here waits, so no deadline to watch. */
    for (int p = 0; p < npeers; p++) {
        shoal_status_t status =
            shoal_shm_ep_connect(ctx, &ctx->eps[p], peers[p], addrs[p], addr_lens[p]);
        if (status != SHOAL_OK) {
            shoal_shm_eps_release(ctx, p);
            return status;
        }
    }
    ctx->npeers = npeers;
    for (int p = 0; p < npeers; p++) {
        eps_p[p] = &ctx->eps[p];
    }
    if (!ctx->lazy) {
        shoal_shm_cma_check(ctx); /* lazy: at the first peer_copy_ok() */
    }
    return SHOAL_OK;
}

/* Our segment's name goes; a lazy context's may be gone already (its last mapper). */
static void shoal_shm_unlink(shoal_tl_ctx_t *ctx)
{
    if (!ctx->unlinked) {
        ctx->unlinked = 1;
        if (shoal_shm_seg_unlink(ctx->name) != 0 && !(ctx->lazy && errno == ENOENT)) {
            shoal_warn(SHM, "shm_unlink(%s) failed: %s", ctx->name, strerror(errno));
        }
    }
}

static shoal_status_t shoal_shm_ready(shoal_tl_ctx_t *ctx)
{
    if (!ctx->lazy) {
        shoal_shm_unlink(ctx); /* lazy: peers may map it later */
    }
    return SHOAL_OK;
}

static void shoal_shm_fini(shoal_tl_ctx_t *ctx)
{
    if (ctx == NULL) {
        return;
    }
    shoal_shm_unlink(ctx);
    shoal_shm_lock_close(ctx);
    shoal_shm_mem_unmap_all(ctx);
    shoal_shm_eps_release(ctx, ctx->npeers);
    munmap(ctx->base, ctx->layout.total);
    free(ctx->ep_by_local);
    free(ctx);
}

static int shoal_shm_wait_fd(shoal_tl_ctx_t *ctx)
{
    return -1;
}

static void shoal_shm_wait(shoal_tl_ctx_t *ctx, int timeout_us)
{
    shoal_shm_ctrl_t *c = ctx->ctrl;
    uint32_t seen = ctx->bell_seen;
    if (timeout_us < 0 || timeout_us > SHOAL_SHM_MAX_SLEEP_US) {
        timeout_us = SHOAL_SHM_MAX_SLEEP_US; /* the caller loops; never sleep unbounded */
    }
    if (ctx->npending > 0 && timeout_us > SHOAL_SHM_PENDING_SLEEP_US) {
        timeout_us = SHOAL_SHM_PENDING_SLEEP_US;
    }
    if (timeout_us == 0) {
        return;
    }
    __atomic_store_n(&c->sleeping, 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (!shoal_shm_ctx_has_work(ctx)) {
        struct timespec ts = {
            .tv_sec = timeout_us / 1000000,
            .tv_nsec = (long)(timeout_us % 1000000) * 1000,
        };
        syscall(SYS_futex, &c->doorbell, FUTEX_WAIT, seen, &ts, NULL, 0);
    }
    __atomic_store_n(&c->sleeping, 0, __ATOMIC_RELAXED);
    if (ctx->npending > 0) {
        shoal_shm_ctx_check_peers(ctx, shoal_time_ns());
    }
}

static void shoal_shm_fail(shoal_tl_ctx_t *ctx, int culprit, shoal_status_t status)
{
    char why[160];
    if (!ctx->failed) {
        ctx->failed = 1;
        __atomic_store_n(&ctx->ctrl->culprit, culprit, __ATOMIC_RELAXED);
        __atomic_store_n(&ctx->ctrl->failed, 1, __ATOMIC_RELEASE);
        for (int p = 0; p < ctx->npeers; p++) {
            if (ctx->eps[p].peer_ctrl != NULL) { /* lazy: unmapped peers see it when they check */
                shoal_shm_ctrl_ring(ctx->eps[p].peer_ctrl);
            }
        }
    }
    snprintf(why, sizeof(why), "communicator failed because of rank %d: %s", culprit,
             shoal_strerror(status));
    for (int p = 0; p < ctx->npeers; p++) {
        shoal_shm_ep_fail(&ctx->eps[p], status, culprit, why);
    }
}

static void *shoal_shm_shared_area(shoal_tl_ctx_t *ctx, int local_rank, size_t *len_p)
{
    void *base;
    if (local_rank == ctx->local_rank) {
        base = ctx->base;
    } else if (local_rank >= 0 && local_rank < ctx->local_size &&
               ctx->ep_by_local[local_rank] != NULL &&
               shoal_shm_ep_attach(ctx->ep_by_local[local_rank]) == SHOAL_OK) {
        base = ctx->ep_by_local[local_rank]->peer_base;
    } else {
        return NULL;
    }
    *len_p = ctx->area_size;
    return (uint8_t *)base + ctx->layout.area_off;
}

static void shoal_shm_notify(shoal_tl_ctx_t *ctx, int local_rank)
{
    if (local_rank == ctx->local_rank) {
        shoal_shm_ctrl_ring(ctx->ctrl);
    } else if (local_rank >= 0 && local_rank < ctx->local_size &&
               ctx->ep_by_local[local_rank] != NULL &&
               shoal_shm_ep_attach(ctx->ep_by_local[local_rank]) == SHOAL_OK) {
        shoal_shm_ctrl_ring(ctx->ep_by_local[local_rank]->peer_ctrl);
    }
}

static shoal_status_t shoal_shm_peer_check(shoal_tl_ctx_t *ctx, int local_rank, char *why,
                                           size_t len, int *culprit_p)
{
    if (local_rank == ctx->local_rank || local_rank < 0 || local_rank >= ctx->local_size ||
        ctx->ep_by_local[local_rank] == NULL) {
        return SHOAL_OK;
    }
    shoal_ep_t *ep = ctx->ep_by_local[local_rank];
    uint64_t now = shoal_time_ns();
    if (ep->peer_gone == 0 && now - ep->last_check_ns < SHOAL_SHM_CHECK_NS) {
        return SHOAL_OK;
    }
    ep->last_check_ns = now;
    return shoal_shm_ep_check_peer(ep, why, len, culprit_p);
}

const shoal_tl_ops_t shoal_tl_shm_ops = {
    .abi_version = SHOAL_TL_ABI_VERSION,
    .name = "shm",
    .caps = SHOAL_TL_CAP_SHARED_AREA | SHOAL_TL_CAP_PEER_MEM | SHOAL_TL_CAP_LAZY,
    .intra_node_only = 1,
    .query = shoal_shm_query,
    .init = shoal_shm_init,
    .address = shoal_shm_address,
    .connect_all = shoal_shm_connect_all,
    .ready = shoal_shm_ready,
    .isend = shoal_shm_ep_isend,
    .irecv = shoal_shm_ep_irecv,
    .progress = shoal_shm_ctx_progress,
    .wait_fd = shoal_shm_wait_fd,
    .wait = shoal_shm_wait,
    .fail = shoal_shm_fail,
    .shared_area = shoal_shm_shared_area,
    .notify = shoal_shm_notify,
    .peer_check = shoal_shm_peer_check,
    .fini = shoal_shm_fini,
    .mem_query = shoal_shm_mem_query,
    .mem_map = shoal_shm_mem_map,
    .peer_copy_ok = shoal_shm_peer_copy_ok,
    .peer_copy = shoal_shm_peer_copy,
    .mem_reach_ok = shoal_shm_mem_reach_ok,
};
