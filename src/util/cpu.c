/* What the CPU offers beyond the baseline the library is built for, asked once. */
#include "util/util.h"

#include <pthread.h>

static int shoal_cpu_prefetchw_val;
static pthread_once_t shoal_cpu_once = PTHREAD_ONCE_INIT;

static void shoal_cpu_init(void)
{
#if defined(__x86_64__)
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000000u), "c"(0));
    if (a >= 0x80000001u) {
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000001u), "c"(0));
        shoal_cpu_prefetchw_val = (c >> 8) & 1; /* PRFCHW (3DNowPrefetch) */
    }
#elif defined(__aarch64__)
    shoal_cpu_prefetchw_val = 1; /* PRFM PST* is in the base architecture */
#endif
}

int shoal_cpu_prefetchw(void)
{
    pthread_once(&shoal_cpu_once, shoal_cpu_init);
    return shoal_cpu_prefetchw_val;
}
