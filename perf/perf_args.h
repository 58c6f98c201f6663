/* perf/: one reading of the numbers on the benchmarks' command lines. Each tool had its own
 * (atoi, strtoull with or without suffixes), and most stopped at the first character they did
 * not know: "-b 1G" timed 1 byte, "-b 64x" 64 bytes, "-n 1e6" one iteration, "-n abc" none,
 * and the rows still printed. Here a number is all of its text or an error the tool reports.
 * Header only: the tools link different libraries (some none of shoal's). */
#ifndef SHOAL_PERF_ARGS_H
#define SHOAL_PERF_ARGS_H

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* A size in bytes: decimal or 0x hex digits, then an optional K, M or G (powers of 1024), then
 * an optional B after a suffix ("64", "0x40", "4K", "1MB", "2g"). 0 and *out_p set on success;
 * -1 for anything else: no digits, a sign, junk, or more than SIZE_MAX. */
static inline int perf_arg_size(const char *s, size_t *out_p)
{
    unsigned long long v, mult = 1;
    char *end = NULL;

    if (s == NULL || *s < '0' || *s > '9') {
        return -1;
    }
    errno = 0;
    v = strtoull(s, &end, 0);
    if (errno != 0 || end == s) {
        return -1;
    }
    switch (*end) {
    case 'G': case 'g': mult <<= 10; /* fall through */
    case 'M': case 'm': mult <<= 10; /* fall through */
    case 'K': case 'k': mult <<= 10; end++; break;
    default: break;
    }
    if ((*end == 'B' || *end == 'b') && mult > 1) {
        end++;
    }
    if (*end != '\0' || v > SIZE_MAX / mult) {
        return -1;
    }
    *out_p = (size_t)(v * mult);
    return 0;
}

/* A whole decimal number from lo to hi, all of s. 0 and *out_p set on success, else -1. */
static inline int perf_arg_int(const char *s, long lo, long hi, int *out_p)
{
    char *end = NULL;
    long v;

    if (s == NULL || *s == '\0') {
        return -1;
    }
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi || v < INT_MIN ||
        v > INT_MAX) {
        return -1;
    }
    *out_p = (int)v;
    return 0;
}

#endif
