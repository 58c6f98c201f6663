/* Monotonic time and deadlines. */
#include "util/util.h"

#include <errno.h>
#include <time.h>

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
