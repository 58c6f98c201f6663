/* Monotonic time and deadlines. */
#include "util/util.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>

#define SHOAL_TICKS_CALIBRATE_NS 2000000ull /* first estimate of the TSC rate */

/* Until shoal_ticks_init: ticks are CLOCK_MONOTONIC ns. */
shoal_tick_clock_t shoal_tick_clock = {.mult = 1ull << 32, .ticks_per_sec = 1000000000ull};
static pthread_once_t shoal_ticks_once = PTHREAD_ONCE_INIT;

uint64_t shoal_time_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t shoal_deadline_ns(int timeout_ms)
{
    if (timeout_ms < 0)
        return UINT64_MAX;
    return shoal_time_ns() + (uint64_t)timeout_ms * 1000000ull;
}

int shoal_deadline_left_ms(uint64_t deadline_ns, int cap_ms)
{
    uint64_t now, left_ms;

    if (deadline_ns == UINT64_MAX)
        return cap_ms;
    now = shoal_time_ns();
    if (now >= deadline_ns)
        return 0;
    /* Round up so that a caller sleeping for the result does not wake just short of it. */
    left_ms = (deadline_ns - now + 999999ull) / 1000000ull;
    if (cap_ms >= 0 && left_ms > (uint64_t)cap_ms)
        return cap_ms;
    if (left_ms > (uint64_t)INT32_MAX)
        return INT32_MAX;
    return (int)left_ms;
}

void shoal_sleep_us(unsigned us)
{
    struct timespec ts = {.tv_sec = us / 1000000u, .tv_nsec = (long)(us % 1000000u) * 1000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int shoal_ticks_tsc_invariant(void)
{
#if defined(__x86_64__)
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000000u), "c"(0));
    if (a < 0x80000007u) {
        return 0;
    }
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000007u), "c"(0));
    return (d >> 8) & 1; /* invariant TSC: constant rate, runs in every C-state */
#else
    return 0;
#endif
}

#if defined(__x86_64__)
#define SHOAL_TICKS_PAIR_TRIES 8

/* One TSC reading and the CLOCK_MONOTONIC time at the same moment: the tightest of a few
 * rdtsc, clock, rdtsc brackets, the TSC taken at its middle. A single clock-then-rdtsc pair is
 * off by whatever runs between the two reads (an interrupt, a VM exit: microseconds), which a
 * 2 ms calibration turns into an error of ~1e-3 on every interval it times. */
static void shoal_ticks_pair(uint64_t *tsc, uint64_t *ns)
{
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < SHOAL_TICKS_PAIR_TRIES; i++) {
        uint64_t a = __builtin_ia32_rdtsc(), n = shoal_time_ns(), b = __builtin_ia32_rdtsc();
        if (b >= a && b - a < best) {
            best = b - a;
            *tsc = a + (b - a) / 2;
            *ns = n;
        }
    }
    if (best == UINT64_MAX) { /* the TSC went back on every try (never on an invariant TSC) */
        *tsc = __builtin_ia32_rdtsc();
        *ns = shoal_time_ns();
    }
}
#endif

static void shoal_ticks_init_once(void)
{
#if defined(__x86_64__)
    shoal_tick_clock_t *c = &shoal_tick_clock;
    if (shoal_ticks_tsc_invariant()) {
        uint64_t ns0, t0, ns1, t1;
        shoal_ticks_pair(&t0, &ns0);
        while (shoal_time_ns() - ns0 < SHOAL_TICKS_CALIBRATE_NS) {
        }
        shoal_ticks_pair(&t1, &ns1);
        if (t1 > t0 && ns1 > ns0) {
            uint64_t mult = (uint64_t)(((unsigned __int128)(ns1 - ns0) << 32) / (t1 - t0));
            if (mult != 0) {
                c->tick0 = t0;
                c->ns0 = ns0;
                c->ticks_per_sec = (t1 - t0) * 1000000000ull / (ns1 - ns0);
                __atomic_store_n(&c->mult, mult, __ATOMIC_RELAXED);
                __atomic_store_n(&c->tsc, 1, __ATOMIC_RELEASE);
            }
        }
    }
#endif
    shoal_info(INIT, "call path clock: %s, %.4f ns per tick",
               shoal_tick_clock.tsc ? "TSC" : "CLOCK_MONOTONIC",
               (double)shoal_tick_clock.mult / 4294967296.0);
}

void shoal_ticks_init(void)
{
    pthread_once(&shoal_ticks_once, shoal_ticks_init_once);
}

/* Refines the TSC rate over everything since the calibration (a 1 s base is already good to
 * ~1e-7), from a fresh bracketed reading (not now_ticks: the caller read it before other work,
 * and a preemption since would count against the rate). Any thread; the rate is one relaxed
 * 64-bit store. */
void shoal_ticks_refine(uint64_t now_ticks)
{
#if defined(__x86_64__)
    shoal_tick_clock_t *c = &shoal_tick_clock;
    if (__atomic_load_n(&c->tsc, __ATOMIC_ACQUIRE) && now_ticks > c->tick0 + c->ticks_per_sec / 2) {
        uint64_t t, ns;
        shoal_ticks_pair(&t, &ns);
        if (t > c->tick0 && ns > c->ns0) {
            uint64_t mult = (uint64_t)(((unsigned __int128)(ns - c->ns0) << 32) / (t - c->tick0));
            if (mult != 0) {
                __atomic_store_n(&c->mult, mult, __ATOMIC_RELAXED);
            }
        }
    }
#else
    (void)now_ticks;
#endif
}
