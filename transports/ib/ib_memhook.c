/* IB transport: memory events for the registration cache (SHOAL_IB_REG_CACHE=1).
 *
 * A registration pins the physical pages behind a virtual range. When the application frees
 * that range (munmap, free() of a large block, a heap trim) and later gets new memory at the
 * same address, a cached registration still points at the old pages: RDMA would send stale
 * bytes. The cache must learn of every such release, including the ones glibc's malloc makes
 * on its own (free() calls its internal munmap, trims non-main arenas with madvise or an
 * inaccessible MAP_FIXED mapping and the main heap with brk), which no symbol interposition
 * sees: those calls never go through a PLT.
 *
 * As Open MPI's memory patcher and UCX's ucm "bistro" mode do, the entries of libc's munmap,
 * mremap, madvise, mmap, brk and shmdt are overwritten with a jump into a replacement here
 * that records the range about to be released and then makes the system call itself (so the
 * original code is never needed again). Recording happens before the system call: memory the
 * application maps next at that address is always preceded by its event.
 *
 * Events go into a global ring of SHOAL_IB_MEMEV_N slots (lock-free, async-signal-safe: the
 * hooks run inside malloc with its locks held and in any thread); every cache keeps the
 * sequence number it has seen and, on each lookup, invalidates the ranges recorded since.
 * A cache that fell more than the ring behind, or that finds a slot whose writer has not
 * finished, flushes itself entirely: slower, never stale.
 *
 * Limits (documented in the config row): x86-64 only (elsewhere the cache keeps nothing
 * past a message); memory released by raw system calls (syscall(SYS_munmap, ...)), by a
 * statically linked second libc, or by ld.so unloading a library is not seen; patching is
 * done once, at the first communicator that enables the cache, and another thread inside
 * one of the patched functions at that instant could run a half-written entry (the same
 * caveat as Open MPI's and UCX's patchers). Hardware that supports on-demand paging would
 * make all of this unnecessary; Soft-RoCE on the kernels we test does not. */
#include "transports/ib/ib.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef MADV_FREE
#define MADV_FREE 8
#endif
#ifndef MADV_DONTNEED_LOCKED
#define MADV_DONTNEED_LOCKED 24
#endif
#ifndef MREMAP_FIXED
#define MREMAP_FIXED 2
#endif

typedef struct {
    uint64_t seq;             /* 2s + 1 while event s is written, 2s + 2 once it is */
    uintptr_t start, end;
} shoal_ib_memev_t;

static shoal_ib_memev_t shoal_ib_memev[SHOAL_IB_MEMEV_N];
static uint64_t shoal_ib_memev_head;   /* events started */
static void **shoal_ib_curbrk;         /* libc's __curbrk, which brk() keeps */
static pthread_once_t shoal_ib_memhook_once = PTHREAD_ONCE_INIT;
static int shoal_ib_memhook_state;     /* 1 installed, -1 failed */
static char shoal_ib_memhook_why[256];

/* Records [start, end) as released; async-signal-safe, no locks, no allocation. */
static void shoal_ib_memev_record(uintptr_t start, uintptr_t end)
{
    uint64_t s;
    shoal_ib_memev_t *e;
    if (end <= start) {
        return;
    }
    s = __atomic_fetch_add(&shoal_ib_memev_head, 1, __ATOMIC_SEQ_CST);
    e = &shoal_ib_memev[s % SHOAL_IB_MEMEV_N];
    __atomic_store_n(&e->seq, 2 * s + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&e->start, start, __ATOMIC_RELAXED);
    __atomic_store_n(&e->end, end, __ATOMIC_RELAXED);
    __atomic_store_n(&e->seq, 2 * s + 2, __ATOMIC_RELEASE);
}

static void shoal_ib_memev_len(const void *addr, size_t len)
{
    uintptr_t a = (uintptr_t)addr;
    shoal_ib_memev_record(a, len > UINTPTR_MAX - a ? UINTPTR_MAX : a + len);
}

uint64_t shoal_ib_memhook_seq(void)
{
    return __atomic_load_n(&shoal_ib_memev_head, __ATOMIC_ACQUIRE);
}

int shoal_ib_memhook_drain(uint64_t *seen_p, void (*fn)(void *arg, uintptr_t start,
                                                        uintptr_t end), void *arg)
{
    uint64_t head = shoal_ib_memhook_seq(), s = *seen_p;
    if (head - s > SHOAL_IB_MEMEV_N) {
        *seen_p = head;
        return 1; /* overrun: some ranges are gone */
    }
    for (; s != head; s++) {
        shoal_ib_memev_t *e = &shoal_ib_memev[s % SHOAL_IB_MEMEV_N];
        uint64_t want = 2 * s + 2, got;
        uintptr_t start, end;
        int spins = 0;
        while ((got = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE)) < want && spins < 100000) {
            spins++; /* its writer is between fetch_add and the last store */
        }
        if (got != want) {
            *seen_p = head;
            return 1; /* still unwritten, or already overwritten */
        }
        start = __atomic_load_n(&e->start, __ATOMIC_RELAXED);
        end = __atomic_load_n(&e->end, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&e->seq, __ATOMIC_RELAXED) != want) {
            *seen_p = head;
            return 1;
        }
        fn(arg, start, end);
    }
    *seen_p = head;
    return 0;
}

void shoal_ib_memhook_record(const void *addr, size_t len)
{
    shoal_ib_memev_len(addr, len);
}

/* ---- the replacements: record, then the system call ------------------------------------ */

static int shoal_ib_hook_munmap(void *addr, size_t len)
{
    shoal_ib_memev_len(addr, len);
    return (int)syscall(SYS_munmap, addr, len);
}

static int shoal_ib_hook_madvise(void *addr, size_t len, int advice)
{
    /* advice that drops the pages: the next touch maps fresh (zero) ones */
    if (advice == MADV_DONTNEED || advice == MADV_FREE || advice == MADV_REMOVE ||
        advice == MADV_DONTNEED_LOCKED) {
        shoal_ib_memev_len(addr, len);
    }
    return (int)syscall(SYS_madvise, addr, len, advice);
}

static void *shoal_ib_hook_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (flags & MAP_FIXED) {
        shoal_ib_memev_len(addr, len); /* replaces whatever was mapped there */
    }
    return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

/* mremap is variadic; the fifth argument is read only with MREMAP_FIXED, as the kernel does. */
static void *shoal_ib_hook_mremap(void *old, size_t old_len, size_t new_len, int flags,
                                  void *new_addr)
{
    shoal_ib_memev_len(old, old_len);
    if (flags & MREMAP_FIXED) {
        shoal_ib_memev_len(new_addr, new_len);
    } else {
        new_addr = NULL; /* whatever the caller's register held: not an argument */
    }
    return (void *)syscall(SYS_mremap, old, old_len, new_len, flags, new_addr);
}

static int shoal_ib_hook_shmdt(const void *addr)
{
    /* the segment's size is not known here: everything from addr up */
    shoal_ib_memev_record((uintptr_t)addr, UINTPTR_MAX);
    return (int)syscall(SYS_shmdt, addr);
}

/* glibc's brk: the system call, then __curbrk (which sbrk reads) */
static int shoal_ib_hook_brk(void *addr)
{
    void *cur = *shoal_ib_curbrk, *r;
    if (addr != NULL && cur != NULL && (uintptr_t)addr < (uintptr_t)cur) {
        shoal_ib_memev_record((uintptr_t)addr, (uintptr_t)cur); /* the heap shrinks */
    }
    r = (void *)syscall(SYS_brk, addr);
    *shoal_ib_curbrk = r;
    if ((uintptr_t)r < (uintptr_t)addr) {
        errno = ENOMEM;
        return -1;
    }
    return 0;
}

/* ---- patching --------------------------------------------------------------------------- */

#if defined(__x86_64__)
#define SHOAL_IB_PATCH_BYTES 13 /* movabs $hook, %r11; jmp *%r11 */

typedef struct {
    const char *name;
    void *hook;
    void *target;
    size_t size;              /* st_size of the target's symbol */
} shoal_ib_patch_t;

/* libc's own definition of name (not an interposer's), with its symbol size. */
static int shoal_ib_memhook_find(void *libc, shoal_ib_patch_t *p)
{
    Dl_info di;
    const ElfW(Sym) *sym = NULL;
    p->target = dlsym(libc, p->name);
    if (p->target == NULL ||
        dladdr1(p->target, &di, (void **)&sym, RTLD_DL_SYMENT) == 0 || sym == NULL) {
        snprintf(shoal_ib_memhook_why, sizeof(shoal_ib_memhook_why), "libc's %s not found",
                 p->name);
        return -1;
    }
    p->size = sym->st_size;
    if (p->size < SHOAL_IB_PATCH_BYTES + 4) {
        snprintf(shoal_ib_memhook_why, sizeof(shoal_ib_memhook_why), "libc's %s is %zu bytes "
                 "long: too short to patch", p->name, p->size);
        return -1;
    }
    return 0;
}

static int shoal_ib_memhook_write(shoal_ib_patch_t *p)
{
    long pg = sysconf(_SC_PAGESIZE);
    uint8_t *at = p->target, code[SHOAL_IB_PATCH_BYTES];
    uintptr_t hook = (uintptr_t)p->hook, lo, hi;
    if (at[0] == 0xf3 && at[1] == 0x0f && at[2] == 0x1e && at[3] == 0xfa) {
        at += 4; /* keep endbr64: indirect callers must still land on one */
    }
    code[0] = 0x49; /* movabs $hook, %r11 (r11: scratch at entry, clobbered by syscall) */
    code[1] = 0xbb;
    memcpy(code + 2, &hook, 8);
    code[10] = 0x41; /* jmp *%r11 */
    code[11] = 0xff;
    code[12] = 0xe3;
    lo = (uintptr_t)at & ~(uintptr_t)(pg - 1);
    hi = ((uintptr_t)at + SHOAL_IB_PATCH_BYTES + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
    if (mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) {
        snprintf(shoal_ib_memhook_why, sizeof(shoal_ib_memhook_why), "mprotect of libc's %s "
                 "failed: %s", p->name, strerror(errno));
        return -1;
    }
    /* A thread entering meanwhile spins on "jmp ." (one aligned 2-byte store) until the rest
     * is written, then the first two bytes complete the sequence. */
    __atomic_store_n((uint16_t *)(void *)at, (uint16_t)0xfeeb, __ATOMIC_SEQ_CST);
    memcpy(at + 2, code + 2, SHOAL_IB_PATCH_BYTES - 2);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    __atomic_store_n((uint16_t *)(void *)at, (uint16_t)(code[0] | code[1] << 8),
                     __ATOMIC_SEQ_CST);
    (void)mprotect((void *)lo, hi - lo, PROT_READ | PROT_EXEC);
    __builtin___clear_cache((char *)at, (char *)at + SHOAL_IB_PATCH_BYTES);
    return 0;
}

static void shoal_ib_memhook_do(void)
{
    shoal_ib_patch_t p[] = {
        {.name = "munmap", .hook = (void *)shoal_ib_hook_munmap},
        {.name = "madvise", .hook = (void *)shoal_ib_hook_madvise},
        {.name = "mmap", .hook = (void *)shoal_ib_hook_mmap},
        {.name = "mremap", .hook = (void *)shoal_ib_hook_mremap},
        {.name = "shmdt", .hook = (void *)shoal_ib_hook_shmdt},
        {.name = "brk", .hook = (void *)shoal_ib_hook_brk},
    };
    Dl_info di;
    void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    shoal_ib_memhook_state = -1;
    if (libc == NULL) {
        snprintf(shoal_ib_memhook_why, sizeof(shoal_ib_memhook_why), "libc.so.6 is not "
                 "loaded (static or non-glibc program)");
        return;
    }
    shoal_ib_curbrk = dlsym(libc, "__curbrk");
    if (shoal_ib_curbrk == NULL) {
        snprintf(shoal_ib_memhook_why, sizeof(shoal_ib_memhook_why), "libc has no __curbrk");
        return;
    }
    /* every target is checked before any is patched: all or nothing */
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(p); i++) {
        if (shoal_ib_memhook_find(libc, &p[i]) != 0) {
            return;
        }
    }
    /* the hooks must outlive any dlclose of the library that holds them */
    if (dladdr((void *)shoal_ib_hook_munmap, &di) != 0 && di.dli_fname != NULL) {
        (void)dlopen(di.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
    }
    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(p); i++) {
        if (shoal_ib_memhook_write(&p[i]) != 0) {
            /* the ones already patched stay (they record and make the same system call) */
            return;
        }
    }
    shoal_ib_memhook_state = 1;
}
#else
static void shoal_ib_memhook_do(void)
{
    (void)shoal_ib_hook_munmap;
    (void)shoal_ib_hook_madvise;
    (void)shoal_ib_hook_mmap;
    (void)shoal_ib_hook_mremap;
    (void)shoal_ib_hook_shmdt;
    (void)shoal_ib_hook_brk;
    shoal_ib_memhook_state = -1;
    snprintf(shoal_ib_memhook_why, sizeof(shoal_ib_memhook_why), "memory hooks are "
             "implemented for x86-64 only");
}
#endif

int shoal_ib_memhook_install(const char **why_p)
{
    (void)pthread_once(&shoal_ib_memhook_once, shoal_ib_memhook_do);
    if (why_p != NULL) {
        *why_p = shoal_ib_memhook_state > 0 ? "" : shoal_ib_memhook_why;
    }
    return shoal_ib_memhook_state > 0 ? 0 : -1;
}
