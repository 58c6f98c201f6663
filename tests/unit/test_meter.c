/* Metering (src/meter): the SHOAL_METER_GPUS / CUDA_VISIBLE_DEVICES parser, the page layout
 * the agent relies on, the public stats struct's size rule, and a failed page mapping. */
#include "meter/meter.h"
#include "tests/tap.h"

#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* This program's mmap (the library is linked in statically): while fail_page_map is set, the
 * shared mapping of a memfd (the meter page) fails with ENOMEM; all else goes to the kernel. */
static int fail_page_map;

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (fail_page_map && fd >= 0 && (flags & MAP_SHARED) != 0) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

/* Descriptors of this process open on a shoal-meter memfd. */
static int meter_memfds(void)
{
    char path[300], target[256];
    struct dirent *e;
    int n = 0;
    DIR *d = opendir("/proc/self/fd");

    while (d != NULL && (e = readdir(d)) != NULL) {
        ssize_t k;
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        k = readlink(path, target, sizeof(target) - 1);
        if (k > 0) {
            target[k] = '\0';
            n += strstr(target, "shoal-meter") != NULL;
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    return n;
}

/* The page's mapping fails: init fails, and the memfd made for it is closed (it leaked). */
static void test_page_map_fails(void)
{
    struct shoal_comm comm;
    int before = meter_memfds();

    memset(&comm, 0, sizeof(comm));
    shoal_config_global_init();
    fail_page_map = 1;
    tap_is_int(shoal_meter_comm_init(&comm), SHOAL_ERR_NO_MEMORY,
               "the page cannot be mapped: SHOAL_ERR_NO_MEMORY");
    fail_page_map = 0;
    tap_ok(comm.meter == NULL && meter_memfds() == before,
           "no meter and no memfd left behind (%d open, %d before)", meter_memfds(), before);
}

static void test_gpus(const char *text, int want_n, int g0, int g1)
{
    int32_t g[SHOAL_METER_MAX_GPUS];
    int n = shoal_meter_gpus_parse(text, g, SHOAL_METER_MAX_GPUS);
    tap_is_int(n, want_n, "gpus \"%s\": count", text != NULL ? text : "(null)");
    tap_is_int(g[0], g0, "gpus \"%s\": first ordinal", text != NULL ? text : "(null)");
    tap_is_int(g[1], g1, "gpus \"%s\": second ordinal", text != NULL ? text : "(null)");
}

int main(void)
{
    int32_t g[SHOAL_METER_MAX_GPUS];

    test_gpus(NULL, 0, -1, -1);
    test_gpus("", 0, -1, -1);
    test_gpus("none", 0, -1, -1);
    test_gpus("NoDevFiles", 0, -1, -1);
    test_gpus("0,2", 2, 0, 2);
    test_gpus("3", 1, 3, -1);
    test_gpus("count:4", 4, -1, -1);
    test_gpus("GPU-8e1f3c2a,MIG-1", 2, -1, -1);   /* UUIDs: counted, ordinal unknown */
    test_gpus("1,-1,3", 1, 1, -1);                  /* CUDA stops at an invalid entry */
    test_gpus("5,,6", 1, 5, -1);
    tap_is_int(shoal_meter_gpus_parse("0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", g,
                                  SHOAL_METER_MAX_GPUS),
           18, "more GPUs than the page lists: all counted");
    tap_is_int(g[15], 15, "... the first 16 listed");
    /* The agent takes a count up to SHOAL_METER_NGPUS_MAX: a longer list is that many. */
    {
        static char many[2 * (SHOAL_METER_NGPUS_MAX + 4)];
        for (int i = 0; i < SHOAL_METER_NGPUS_MAX + 4; i++) {
            many[2 * i] = '1';
            many[2 * i + 1] = i + 1 < SHOAL_METER_NGPUS_MAX + 4 ? ',' : '\0';
        }
        tap_is_int(shoal_meter_gpus_parse(many, g, SHOAL_METER_MAX_GPUS), SHOAL_METER_NGPUS_MAX,
                   "a list of %d GPUs counts %d", SHOAL_METER_NGPUS_MAX + 4,
                   SHOAL_METER_NGPUS_MAX);
        tap_is_int(shoal_meter_gpus_parse("count:5000", g, SHOAL_METER_MAX_GPUS),
                   SHOAL_METER_NGPUS_MAX, "count:5000 counts %d", SHOAL_METER_NGPUS_MAX);
    }
    /* The layout is the agent's contract: offsets it may hard-code must not move. */
    tap_ok(sizeof(shoal_meter_page_t) <= SHOAL_METER_PAGE_BYTES, "page fits %d bytes",
       SHOAL_METER_PAGE_BYTES);
    tap_is_int((long long)offsetof(shoal_meter_page_t, seq) % 8, 0, "counters 8-byte aligned");
    tap_is_int((long long)offsetof(shoal_meter_page_t, bytes_sent) % 8, 0, "bytes 8-byte aligned");
    /* shoal_comm_stats: a NULL communicator or a struct without room for its size field is an
     * invalid argument. */
    {
        shoal_stats_t s = SHOAL_STATS_INIT;
        tap_is_int(s.size, sizeof(shoal_stats_t), "SHOAL_STATS_INIT sets the size");
        tap_is_int(shoal_comm_stats(NULL, &s), SHOAL_ERR_INVALID_ARG, "stats of NULL");
    }
    test_page_map_fails();
    return tap_done();
}
