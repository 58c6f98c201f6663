/* Helpers shared by the fuzz targets (tests/fuzz/fuzz_<name>.c). A target defines
 *     int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
 * and may define LLVMFuzzerInitialize; libFuzzer or tests/fuzz/replay.c calls them. A target
 * must not keep state between inputs that changes what it does, must not write to stdout and
 * must not exit: a finding is a sanitizer report or a crash (fuzz_require() below). */
#ifndef SHOAL_FUZZ_H
#define SHOAL_FUZZ_H

#include "util/util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An invariant the parser promises (a round trip, a bound on a decoded value): a crash with
 * the reason, so that libFuzzer records the input. */
#define fuzz_require(cond)                                                              \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                    \
        }                                                                               \
    } while (0)

/* The library logs what it rejects: keep those lines (their formatting is exercised) but
 * send them to /dev/null unless SHOAL_FUZZ_VERBOSE is set. Then parses the config tables. */
static inline void fuzz_quiet_log(void)
{
    if (getenv("SHOAL_FUZZ_VERBOSE") == NULL) {
        setenv("SHOAL_DEBUG_FILE", "/dev/null", 1);
    }
    shoal_config_global_init();
}

/* A NUL-terminated copy of the input (text parsers); free() it. */
static inline char *fuzz_strndup(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (s == NULL) {
        abort();
    }
    memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

/* Fixed-size views of the input: the next n bytes, zero-padded past the end. */
typedef struct {
    const uint8_t *p;
    size_t left;
} fuzz_in_t;

static inline void fuzz_take(fuzz_in_t *in, void *out, size_t n)
{
    size_t k = in->left < n ? in->left : n;
    memcpy(out, in->p, k);
    memset((uint8_t *)out + k, 0, n - k);
    in->p += k;
    in->left -= k;
}

static inline uint32_t fuzz_u32(fuzz_in_t *in)
{
    uint8_t b[4];
    fuzz_take(in, b, 4);
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

#endif
