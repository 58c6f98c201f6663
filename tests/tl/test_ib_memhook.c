/* The registration cache follows memory released through libc (transports/ib/ib_memhook.c):
 * after munmap, free() of a large block, madvise(MADV_DONTNEED), mremap, a MAP_FIXED mapping
 * or a shrinking brk, and new memory at the same address, the next lookup misses (registers
 * the new pages) instead of returning the registration of the old ones. A cache that does not
 * follow the events still hits there: that is the stale-pages bug (tests/vm/ib_remap shows
 * what it sends on Soft-RoCE). No RDMA device needed: registrations are counted by a fake
 * registrar. */
#include "transports/ib/ib.h"
#include "tests/tap.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

typedef struct {
    int regs, deregs;
} fake_t;

static int fake_reg(void *arg, void *addr, size_t len, void **h, uint32_t *lkey)
{
    fake_t *f = arg;
    (void)len;
    f->regs++;
    *h = addr;
    *lkey = (uint32_t)f->regs;
    return 0;
}

static void fake_dereg(void *arg, void *h)
{
    fake_t *f = arg;
    (void)h;
    f->deregs++;
}

static fake_t f;
static shoal_ib_regcache_t rc;   /* follows memory events */
static shoal_ib_regcache_t blind; /* does not: the old behaviour */
static size_t pg;

/* One lookup and release; 1 if it registered (a miss). */
static int touch(shoal_ib_regcache_t *c, const void *p, size_t len)
{
    uintptr_t key;
    uint32_t lkey;
    int before = f.regs;
    if (shoal_ib_regcache_get(c, p, len, &key, &lkey) != SHOAL_OK) {
        return -1;
    }
    shoal_ib_regcache_put(c, key, lkey);
    return f.regs != before;
}

static void *map_at(void *hint, size_t len)
{
    void *p = mmap(hint, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (hint != NULL ? MAP_FIXED_NOREPLACE : 0), -1,
                   0);
    return p == MAP_FAILED ? NULL : p;
}

static void test_munmap(void)
{
    size_t len = 64 * pg;
    uint8_t *p = map_at(NULL, len), *q;
    tap_ok(touch(&rc, p, len) == 1 && touch(&blind, p, len) == 1,
           "munmap: the first lookup registers");
    tap_ok(touch(&rc, p + pg, 8 * pg) == 0, "munmap: a lookup inside it hits while mapped");
    munmap(p, len);
    q = map_at(p, len);
    if (q != p) {
        tap_skip(2, "could not map again at the same address");
        return;
    }
    tap_ok(touch(&rc, q, len) == 1, "munmap + mmap at the same address: the next lookup "
           "registers the new pages");
    tap_ok(touch(&blind, q, len) == 0, "a cache that does not follow the events hits there "
           "(the stale registration the hooks exist for)");
    munmap(q, len);
}

static void test_free(void)
{
    size_t len = 8u << 20; /* above the mmap threshold: free() unmaps it */
    uint8_t *p, *q;
    mallopt(M_MMAP_THRESHOLD, 1 << 20); /* fixed: a free() would raise the dynamic one */
    p = malloc(len);
    memset(p, 1, len);
    tap_ok(touch(&rc, p, len) == 1, "free: a malloc'ed 8 MiB buffer registers");
    free(p);
    q = malloc(len);
    if (q != p) {
        tap_skip(1, "the allocator did not hand out the same address again");
    } else {
        tap_ok(touch(&rc, q, len) == 1, "free + malloc at the same address (libc's internal "
               "munmap): the next lookup registers the new pages");
    }
    free(q);
}

static void test_madvise(void)
{
    size_t len = 16 * pg;
    uint8_t *p = map_at(NULL, len);
    memset(p, 2, len);
    touch(&rc, p, len);
    madvise(p, len, MADV_WILLNEED);
    tap_ok(touch(&rc, p, len) == 0, "madvise(MADV_WILLNEED) keeps the registration");
    madvise(p + 4 * pg, pg, MADV_DONTNEED);
    tap_ok(touch(&rc, p, len) == 1, "madvise(MADV_DONTNEED) on one page drops the "
           "registration covering it");
    tap_ok(p[0] == 2 && p[4 * pg] == 0, "madvise still does what it did (the page reads 0)");
    munmap(p, len);
}

static void test_mremap(void)
{
    size_t len = 16 * pg;
    uint8_t *p = map_at(NULL, len), *dst = map_at(NULL, len), *q;
    touch(&rc, p, len);
    touch(&rc, dst, len);
    q = mremap(p, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, dst);
    tap_ok(q == dst, "mremap moved the mapping (%p)", (void *)q);
    tap_ok(touch(&rc, dst, len) == 1, "mremap onto a registered range drops its registration");
    munmap(dst, len);
}

static void test_mmap_fixed(void)
{
    size_t len = 16 * pg;
    uint8_t *p = map_at(NULL, len), *q;
    touch(&rc, p, len);
    q = mmap(p, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    tap_ok(q == p && touch(&rc, p, len) == 1, "mmap(MAP_FIXED) over a registered range drops "
           "its registration");
    munmap(p, len);
}

static void test_brk(void)
{
    size_t len = 16 * pg;
    uint8_t *p = sbrk(0), *g;
    g = sbrk((intptr_t)len);
    if (g == (void *)-1 || g != p) {
        tap_skip(2, "sbrk cannot grow the heap here");
        return;
    }
    memset(g, 3, len);
    touch(&rc, g, len);
    sbrk(-(intptr_t)len);
    tap_ok(sbrk(0) == p, "brk shrinks as before (the break is back at %p)", (void *)p);
    g = sbrk((intptr_t)len);
    tap_ok(g == p && touch(&rc, g, len) == 1 && g[0] == 0, "sbrk down and up again: the next "
           "lookup registers the new (zeroed) pages");
    sbrk(-(intptr_t)len);
}

static void test_errors(void)
{
    void *p;
    errno = 0;
    tap_ok(munmap((void *)1, pg) == -1 && errno == EINVAL, "munmap still fails with EINVAL "
           "on a misaligned address");
    errno = 0;
    p = mmap(NULL, 0, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    tap_ok(p == MAP_FAILED && errno == EINVAL, "mmap of 0 bytes still fails with EINVAL");
    errno = 0;
    tap_ok(madvise((void *)1, pg, MADV_DONTNEED) == -1 && errno == EINVAL,
           "madvise still fails with EINVAL");
}

static void test_overrun(void)
{
    size_t len = 4 * pg;
    uint8_t *p = map_at(NULL, len);
    uint64_t fl = rc.flushes;
    int miss;
    touch(&rc, p, len);
    for (int i = 0; i < 2 * SHOAL_IB_MEMEV_N; i++) {
        munmap(map_at(NULL, pg), pg); /* elsewhere */
    }
    miss = touch(&rc, p, len);
    tap_ok(miss == 1 && rc.flushes == fl + 1, "more events than the ring holds: the cache "
           "drops everything (flushes %llu)", (unsigned long long)rc.flushes);
    tap_ok(touch(&rc, p, len) == 0, "and then caches again");
    munmap(p, len);
}

static void *churn(void *arg)
{
    (void)arg;
    for (int i = 0; i < 3000; i++) {
        void *q = malloc(256u << 10);
        memset(q, 4, 4096);
        free(q);
        munmap(map_at(NULL, pg), pg);
    }
    return NULL;
}

static void test_threads(void)
{
    pthread_t t[4];
    size_t len = 16 * pg;
    uint8_t *p = map_at(NULL, len);
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        pthread_create(&t[i], NULL, churn, NULL);
    }
    for (int i = 0; i < 2000; i++) {
        bad += touch(&rc, p, len) < 0;
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
    }
    munmap(p, len);
    p = map_at(p, len);
    tap_ok(bad == 0 && p != NULL && touch(&rc, p, len) == 1, "four threads mapping and freeing "
           "while the cache is used: no failure, and a remap is still seen");
    munmap(p, len);
}

int main(void)
{
    shoal_ib_reg_ops_t ops = {.reg = fake_reg, .dereg = fake_dereg, .arg = &f};
    const char *why;
    pg = (size_t)sysconf(_SC_PAGESIZE);
    if (shoal_ib_memhook_install(&why) != 0) {
        tap_skip_all(why);
        return 0;
    }
    tap_ok(shoal_ib_memhook_install(&why) == 0, "hooks installed (twice is fine)");
    shoal_ib_regcache_init(&rc, &ops, 64, 1u << 30);
    shoal_ib_regcache_init(&blind, &ops, 64, 1u << 30);
    shoal_ib_regcache_follow(&rc);
    test_munmap();
    test_free();
    test_madvise();
    test_mremap();
    test_mmap_fixed();
    test_brk();
    test_errors();
    test_overrun();
    test_threads();
    shoal_ib_regcache_fini(&rc);
    shoal_ib_regcache_fini(&blind);
    tap_ok(f.regs == f.deregs, "every registration was deregistered (%d)", f.regs);
    return tap_done();
}
