/* src/tune: derivation from a machine profile (deterministic), explicit settings winning
 * (environment, SHOAL_CONF_FILE, SHOAL_TUNING_FILE), SHOAL_TUNE_MACHINE, the measurement. */
#include "tune/tune.h"

#include "tests/tap.h"
#include "topo/topo.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const char *what;
    shoal_tune_machine_t m;
    uint64_t want[SHOAL_TUNE_NKNOBS];
} tune_case_t;

static const tune_case_t tune_cases[] = {
    /* the reference machine: the old constants come back */
    {"1 MiB L2, 55 GB/s in L2", {.l2_kb = 1024, .copy_cache_mbs = 55000, .copy_mem_mbs = 12000,
                                 .reduce_mem_mbs = 12500, .tcp_rbuf_kb = 128},
     {512 << 10, 512 << 10, 2048, 16384, 64, 8000, 4000, 64 << 10, 8, 256 << 10, 8192, 64 << 10}},
    /* 2 MiB L2 and half the rates: larger windows, smaller one-shot, slower model */
    {"2 MiB L2, half the rates", {.l2_kb = 2048, .copy_cache_mbs = 27500, .copy_mem_mbs = 6000,
                                  .reduce_mem_mbs = 6250, .tcp_rbuf_kb = 64},
     {1 << 20, 1 << 20, 1024, 8192, 64, 4000, 2000, 32 << 10, 8, 128 << 10, 4096, 128 << 10}},
    /* small L2, fast copies: the chunk clamps at the bottom, larger LL */
    {"256 KiB L2, 4x the rates", {.l2_kb = 256, .copy_cache_mbs = 220000,
                                  .copy_mem_mbs = 48000, .reduce_mem_mbs = 50000,
                                  .tcp_rbuf_kb = 6144},
     {128 << 10, 128 << 10, 8192, 65536, 256, 32000, 16000, 256 << 10, 2, 4 << 20, 32768, 16 << 10}},
    /* nearest power of two on a log scale: 1.5x rounds up, 1.3x down */
    {"1.5x the copy rate", {.l2_kb = 1024, .copy_cache_mbs = 82500, .copy_mem_mbs = 12000,
                            .reduce_mem_mbs = 12500, .tcp_rbuf_kb = 128},
     {512 << 10, 512 << 10, 4096, 32768, 128, 8000, 4000, 64 << 10, 8, 256 << 10, 16384, 64 << 10}},
    {"1.3x the copy rate", {.l2_kb = 1024, .copy_cache_mbs = 71500, .copy_mem_mbs = 12000,
                            .reduce_mem_mbs = 12500, .tcp_rbuf_kb = 128},
     {512 << 10, 512 << 10, 2048, 16384, 64, 8000, 4000, 64 << 10, 8, 256 << 10, 8192, 64 << 10}},
    /* huge caches and rates: clamps at the top */
    {"64 MiB L2, 4 TB/s", {.l2_kb = 65536, .copy_cache_mbs = 4000000, .copy_mem_mbs = 3000,
                           .reduce_mem_mbs = 2500, .tcp_rbuf_kb = 16},
     {1 << 20, 4 << 20, 32768, 131072, 4096, 2000, 800, 1 << 20, 2, 64 << 10, 65536, 1 << 20}},
};

static void test_derive(void)
{
    for (size_t i = 0; i < sizeof(tune_cases) / sizeof(tune_cases[0]); i++) {
        const tune_case_t *c = &tune_cases[i];
        shoal_tune_t a, b;
        int all = 1;
        shoal_tune_derive(&c->m, &a);
        shoal_tune_derive(&c->m, &b);
        for (int k = 0; k < SHOAL_TUNE_IB_SLOT_SIZE; k++) {
            all &= tap_is_int((long long)a.value[k], (long long)c->want[k], "%s: %s", c->what,
                              shoal_tune_knob_names[k]);
            all &= a.src[k] == SHOAL_TUNE_SRC_DERIVED;
        }
        for (int k = SHOAL_TUNE_IB_SLOT_SIZE; k < SHOAL_TUNE_NKNOBS; k++) {
            all &= a.src[k] == SHOAL_TUNE_SRC_DEFAULT; /* no port: the ib sizes as they were */
        }
        tap_ok(all, "%s: every setting derived", c->what);
        tap_ok(memcmp(&a, &b, sizeof(a)) == 0, "%s: deterministic (same bytes twice)", c->what);
    }
}

static void test_derive_unknown(void)
{
    shoal_tune_machine_t none = {0};
    shoal_tune_t t;
    int all = 1;
    static const uint64_t dflt[SHOAL_TUNE_NKNOBS] = {512 << 10, 512 << 10, 2048, 16384, 64,
                                                     8000, 4000, 64 << 10, 8, 256 << 10, 8192, 0,
                                                     64 << 10, 64, 16};
    shoal_tune_derive(&none, &t);
    for (int k = 0; k < SHOAL_TUNE_NKNOBS; k++) {
        all &= t.src[k] == SHOAL_TUNE_SRC_DEFAULT && t.value[k] == dflt[k] && t.why[k][0] != 0;
    }
    tap_ok(all, "nothing known: every setting is its old default, with a reason");
}

static void override_derived(const char *text)
{
    shoal_tune_t t;
    shoal_tune_derive(&tune_cases[0].m, &t);
    (void)shoal_tune_override(&t, text);
}

/* SHOAL_SHM_WINDOW=128k and SHOAL_SHM_ONESHOT_MAX=0 (automatic) in the environment,
 * SHOAL_SHM_LL_MAX=256 in SHOAL_CONF_FILE (set up by main before the config is read). */
static void test_override(void)
{
    shoal_tune_t t;
    const char *text = "# a tuning file\nshm lat 1.5 bw 6 send 0.3 recv 0.3\n"
                       "set CHUNK_SIZE 256k\nset SHOAL_SHM_WINDOW 2m   # loses to env\n"
                       "set SHM_LL_MAX 1k\ncopy lat 0 bw 3.5\nreduce lat 0 bw 2\n";
    shoal_tune_derive(&tune_cases[0].m, &t);
    tap_is_int(shoal_tune_override(&t, text), SHOAL_OK, "a tuning file with 'set' lines");
    tap_is_int((long long)t.value[SHOAL_TUNE_SHM_WINDOW], 128 << 10, "env wins over the file");
    tap_is_int(t.src[SHOAL_TUNE_SHM_WINDOW], SHOAL_TUNE_SRC_ENV, "... and says env");
    tap_ok(strstr(t.why[SHOAL_TUNE_SHM_WINDOW], "SHOAL_SHM_WINDOW") != NULL, "... naming it: %s",
           t.why[SHOAL_TUNE_SHM_WINDOW]);
    tap_is_int((long long)t.value[SHOAL_TUNE_SHM_LL_MAX], 256,
               "SHOAL_CONF_FILE wins over the tuning file");
    tap_is_int(t.src[SHOAL_TUNE_SHM_LL_MAX], SHOAL_TUNE_SRC_FILE, "... and says file");
    tap_ok(strstr(t.why[SHOAL_TUNE_SHM_LL_MAX], "SHOAL_CONF_FILE") != NULL, "... naming it: %s",
           t.why[SHOAL_TUNE_SHM_LL_MAX]);
    tap_is_int((long long)t.value[SHOAL_TUNE_CHUNK], 256 << 10, "tuning file wins over derived");
    tap_is_int(t.src[SHOAL_TUNE_CHUNK], SHOAL_TUNE_SRC_FILE, "... and says file");
    tap_is_int((long long)t.value[SHOAL_TUNE_COPY_MBS], 3500, "the file's copy rate");
    tap_is_int((long long)t.value[SHOAL_TUNE_REDUCE_MBS], 2000, "the file's reduce rate");
    tap_is_int((long long)t.value[SHOAL_TUNE_SHM_ONESHOT_OWN], 2048,
               "SHOAL_SHM_ONESHOT_MAX=0 is automatic: derived");
    tap_is_int(t.src[SHOAL_TUNE_SHM_ONESHOT_OWN], SHOAL_TUNE_SRC_DERIVED, "... and says so");

    /* transport sizes: a count (SHOAL_SHM_NSLOTS, an unsigned variable) and sizes */
    shoal_tune_derive(&tune_cases[0].m, &t);
    tap_is_int(shoal_tune_override(&t, "set SHM_NSLOTS 16\nset SHM_SLOT_SIZE 128k\n"
                                       "set TCP_MIN_SPLIT 64k\n"), SHOAL_OK,
               "'set' lines of the transport sizes");
    tap_ok(t.value[SHOAL_TUNE_SHM_NSLOTS] == 16 && t.src[SHOAL_TUNE_SHM_NSLOTS] ==
           SHOAL_TUNE_SRC_FILE, "SHM_NSLOTS from the tuning file: %llu (%s)",
           (unsigned long long)t.value[SHOAL_TUNE_SHM_NSLOTS],
           shoal_tune_src_name(t.src[SHOAL_TUNE_SHM_NSLOTS]));
    tap_ok(t.value[SHOAL_TUNE_SHM_SLOT_SIZE] == 128 << 10 &&
           t.src[SHOAL_TUNE_SHM_SLOT_SIZE] == SHOAL_TUNE_SRC_FILE, "SHM_SLOT_SIZE from the file");
    /* a slot size set alone: the derived count divides the ring by it ("divided by the slot
     * size"), not by the derived slot: 1m slots x 8 were 8 MiB a direction where the ring is
     * at most L2 / 2 = 512k (then 2 slots, the least) */
    {
        shoal_tune_t u;
        shoal_tune_derive(&tune_cases[0].m, &u);
        (void)shoal_tune_override(&u, "set SHM_SLOT_SIZE 1m\n");
        tap_ok(u.value[SHOAL_TUNE_SHM_SLOT_SIZE] == 1 << 20 &&
                   u.value[SHOAL_TUNE_SHM_NSLOTS] == 2 &&
                   u.src[SHOAL_TUNE_SHM_NSLOTS] == SHOAL_TUNE_SRC_DERIVED,
               "an explicit shm slot size: the derived slot count follows it (%llu, want 2)",
               (unsigned long long)u.value[SHOAL_TUNE_SHM_NSLOTS]);
    }
    tap_ok(t.value[SHOAL_TUNE_TCP_MIN_SPLIT] == 1 << 20 &&
           t.src[SHOAL_TUNE_TCP_MIN_SPLIT] == SHOAL_TUNE_SRC_ENV,
           "SHOAL_TCP_MIN_SPLIT in the environment wins over the file: %llu",
           (unsigned long long)t.value[SHOAL_TUNE_TCP_MIN_SPLIT]);
    tap_ok(t.src[SHOAL_TUNE_UCX_INLINE_MAX] == SHOAL_TUNE_SRC_DERIVED &&
           t.value[SHOAL_TUNE_UCX_INLINE_MAX] == 8192, "ucx inline limit derived");
    tap_ok(t.src[SHOAL_TUNE_UCX_CMA_MIN] == SHOAL_TUNE_SRC_DERIVED &&
           t.value[SHOAL_TUNE_UCX_CMA_MIN] == 64 << 10, "ucx single-copy threshold derived");
    {
        shoal_tl_sizes_t z;
        shoal_tune_tl_sizes_of(&t, &z);
        tap_ok(z.shm_slot_size == 128 << 10 && z.shm_nslots == 16 && z.tcp_min_split == 1 << 20 &&
               z.ucx_inline_max == 8192 && z.ucx_cma_min == 64 << 10,
               "the transports get the resolved sizes");
    }
    tap_is_int(shoal_tune_override(&t, "set SHM_NSLOTS many\n"), SHOAL_ERR_INVALID_ARG,
               "a count that is no number is refused");

    shoal_tune_derive(&tune_cases[0].m, &t);
    tap_is_int(shoal_tune_override(&t, "set NO_SUCH_KNOB 1\nset CHUNK_SIZE 1m\nset CHUNK_SIZE\n"),
               SHOAL_ERR_INVALID_ARG, "unknown or incomplete 'set' lines are refused");
    tap_is_int((long long)t.value[SHOAL_TUNE_CHUNK], 1 << 20, "... the good line still applies");
    shoal_tune_derive(&tune_cases[0].m, &t);
    tap_is_int(shoal_tune_override(&t, "set CHUNK_SIZE lots\n"), SHOAL_ERR_INVALID_ARG,
               "a value that is no size is refused");
    tap_is_int(t.src[SHOAL_TUNE_CHUNK], SHOAL_TUNE_SRC_DERIVED, "... and changes nothing");
    tap_ok(strstr(tap_stderr_of(override_derived, "set CHUNK_SIZE 1m\n\n# x\nset CHUNK_SIZE lots\n"),
                  "SHOAL_TUNING_FILE line 4:") != NULL, "... and the warning names line 4");
    /* One init resolves the settings several times: the same bad line was warned about at
     * each (three times on rank 0); once per process and text now. */
    tap_ok(strstr(tap_stderr_of(override_derived,
                                "set CHUNK_SIZE 1m\n\n# x\nset CHUNK_SIZE lots\n"),
                  "SHOAL_TUNING_FILE") == NULL,
           "... once: the same text again is not warned about");
    /* No ring has 0 slots: 'set SHM_NSLOTS 0' was taken, shown as the setting, and the
     * transport used its default instead. */
    {
        shoal_tune_t before;
        shoal_tune_derive(&tune_cases[0].m, &t);
        (void)shoal_tune_override(&t, NULL);
        before = t;
        tap_is_int(shoal_tune_override(&t, "set SHM_NSLOTS 0\nset IB_SEND_SLOTS 0\n"),
                   SHOAL_ERR_INVALID_ARG, "a slot count of 0 is refused");
        tap_ok(t.src[SHOAL_TUNE_SHM_NSLOTS] == before.src[SHOAL_TUNE_SHM_NSLOTS] &&
                   t.value[SHOAL_TUNE_SHM_NSLOTS] == before.value[SHOAL_TUNE_SHM_NSLOTS] &&
                   t.value[SHOAL_TUNE_SHM_NSLOTS] != 0 &&
                   t.src[SHOAL_TUNE_IB_SEND_SLOTS] == before.src[SHOAL_TUNE_IB_SEND_SLOTS] &&
                   t.value[SHOAL_TUNE_IB_SEND_SLOTS] == before.value[SHOAL_TUNE_IB_SEND_SLOTS],
               "... and changes nothing");
    }
    /* 'copy' and 'reduce' lines by the link profile's rules (src/topo): the lines it refused,
     * saying the profile was ignored, still set the model's rates here ('bw 3.5 GB/s' as 3.5,
     * 'copy bw 2' without its lat), and 'bw 0' was dropped without a word. */
    {
        shoal_tune_t before;
        shoal_tune_derive(&tune_cases[0].m, &t);
        (void)shoal_tune_override(&t, NULL);
        before = t;
        tap_is_int(shoal_tune_override(&t, "copy lat 0 bw 3.5 GB/s\ncopy bw 2\n"
                                           "reduce lat 0 bw 0\nreduce lat 0 bw 0.0004\n"),
                   SHOAL_ERR_INVALID_ARG,
                   "'copy'/'reduce' lines the link profile refuses are refused, and a rate "
                   "under 1 MB/s");
        tap_ok(t.value[SHOAL_TUNE_COPY_MBS] == before.value[SHOAL_TUNE_COPY_MBS] &&
                   t.src[SHOAL_TUNE_COPY_MBS] == before.src[SHOAL_TUNE_COPY_MBS] &&
                   t.value[SHOAL_TUNE_REDUCE_MBS] == before.value[SHOAL_TUNE_REDUCE_MBS],
               "... and change nothing (copy %llu MB/s)",
               (unsigned long long)t.value[SHOAL_TUNE_COPY_MBS]);
    }

    /* A repeated 'set' line: the last one wins, as a repeated link line does (the first one
     * did, silently); a variable still wins over both. */
    shoal_tune_derive(&tune_cases[0].m, &t);
    tap_is_int(shoal_tune_override(&t, "set CHUNK_SIZE 256k\nshm lat 1 bw 5\n"
                                       "set CHUNK_SIZE 128k\nset SHM_WINDOW 1m\n"
                                       "set SHM_WINDOW 2m\n"), SHOAL_OK,
               "a tuning file that sets CHUNK_SIZE and SHM_WINDOW twice");
    tap_is_int((long long)t.value[SHOAL_TUNE_CHUNK], 128 << 10, "... its last CHUNK_SIZE wins");
    tap_is_int((long long)t.value[SHOAL_TUNE_SHM_WINDOW], 128 << 10,
               "... SHOAL_SHM_WINDOW in the environment still wins over both lines");
}

/* SHOAL_TUNING_FILE past 64 KiB: ignored whole, as rank 0's shoal_tuning_load reports it.
 * Read cut at 64 KiB, its 'set' line at the cut applied half: 'set CHUNK_SIZE 262144' as a
 * chunk of 2621 bytes. */
static void test_file_too_large(void)
{
    char path[] = "/tmp/test_tune_file.XXXXXX";
    const char *line = "# padding line of a tuning file ......................................\n";
    const char *saved = shoal_topo_config.tuning_file;
    int fd = mkstemp(path);
    FILE *fp = fd >= 0 ? fdopen(fd, "w") : NULL;
    size_t len = 0;
    shoal_tune_t t;

    while (fp != NULL && len + strlen(line) <= 65536 - 20) {
        len += (size_t)fprintf(fp, "%s", line);
    }
    while (fp != NULL && len < 65536 - 20 - 1) {
        len += (size_t)fprintf(fp, "#");
    }
    if (fp != NULL) {
        fprintf(fp, "\nset CHUNK_SIZE 262144\n"); /* the cut falls in its value */
        fclose(fp);
    }
    shoal_topo_config.tuning_file = path;
    shoal_tune_resolve_local(shoal_topo_config.topo_discovery, &t);
    shoal_topo_config.tuning_file = saved;
    unlink(path);
    tap_ok(fp != NULL && t.src[SHOAL_TUNE_CHUNK] != SHOAL_TUNE_SRC_FILE,
           "a tuning file past 64 KiB is ignored whole: chunk_size %llu (%s)",
           (unsigned long long)t.value[SHOAL_TUNE_CHUNK],
           shoal_tune_src_name(t.src[SHOAL_TUNE_CHUNK]));
}

/* SHOAL_TUNING_FILE in a directory others write to (/tmp), left there by another user: its
 * 'set' lines were this job's sizes (shoal_tuning_read refuses it, as rank 0's load does). */
static void test_file_squatted(void)
{
    char dir[] = "/tmp/test_tune_squat.XXXXXX", path[64];
    const char *saved = shoal_topo_config.tuning_file;
    shoal_tune_t t, u;
    FILE *fp;

    if (geteuid() != 0) {
        tap_skip(1, "not root: cannot make a file of another user");
        return;
    }
    if (mkdtemp(dir) == NULL || chmod(dir, 01777) != 0) {
        tap_bail("mkdtemp: %s", strerror(errno));
    }
    snprintf(path, sizeof(path), "%s/tuning", dir);
    fp = fopen(path, "w");
    if (fp != NULL) {
        fprintf(fp, "set CHUNK_SIZE 256k\n");
        fclose(fp);
    }
    shoal_topo_config.tuning_file = path;
    shoal_tune_resolve_local(shoal_topo_config.topo_discovery, &u); /* root's own: applies */
    (void)!chown(path, 65534, 65534);
    shoal_tune_resolve_local(shoal_topo_config.topo_discovery, &t);
    shoal_topo_config.tuning_file = saved;
    unlink(path);
    rmdir(dir);
    tap_ok(fp != NULL && u.src[SHOAL_TUNE_CHUNK] == SHOAL_TUNE_SRC_FILE &&
               t.src[SHOAL_TUNE_CHUNK] != SHOAL_TUNE_SRC_FILE,
           "another user's tuning file in a directory others write to sets nothing: chunk_size "
           "%llu (%s)", (unsigned long long)t.value[SHOAL_TUNE_CHUNK],
           shoal_tune_src_name(t.src[SHOAL_TUNE_CHUNK]));
}

/* A model rate under 5 MB/s ('copy lat 0 bw 0.001': 1 MB/s) was printed by shoal_info -t as
 * '0.00GB/s', the rate the model takes as no rate at all. */
static void test_print_small_rate(void)
{
    shoal_tune_machine_t none = {0};
    shoal_tune_t t;
    char *txt = NULL;
    size_t len = 0;
    FILE *mf;

    shoal_tune_derive(&none, &t);
    (void)shoal_tune_override(&t, "copy lat 0 bw 0.001\n");
    mf = open_memstream(&txt, &len);
    if (mf != NULL) {
        shoal_tune_print(&t, mf);
        fclose(mf);
    }
    tap_ok(t.value[SHOAL_TUNE_COPY_MBS] == 1 && txt != NULL &&
               strstr(txt, "model_copy_rate           0.001GB/s  file") != NULL,
           "shoal_info -t prints a copy rate of 1 MB/s as 0.001GB/s, not 0.00");
    free(txt);
}

/* The ib sizes from fake ports: MTU, rate (speed x width), round trip, software or not. */
typedef struct {
    const char *what;
    shoal_tl_link_t l;
    uint64_t slot, nslots, nsend;
} tune_link_case_t;

static const tune_link_case_t link_cases[] = {
    /* EDR 4X, 4k MTU: the old slot; 2 x 12.5 GB/s x 60 us = 1.5 MB = 23 slots -> 32;
     * 2 x 12.5 GB/s x 10 us = 250 KB -> 4 */
    {"EDR 4X 100 Gb/s, MTU 4096", {.mtu = 4096, .rate_mbps = 100000}, 64 << 10, 32, 4},
    /* HDR 4X: 25 GB/s x 5 us = 125 KB -> 128k; 3 MB / 128k = 23 -> 32 (= 4 MiB cap) */
    {"HDR 4X 200 Gb/s, MTU 4096", {.mtu = 4096, .rate_mbps = 200000}, 128 << 10, 32, 4},
    /* NDR 4X: 256k slots, the ring capped at 4 MiB = 16 slots; 2 x 50 GB/s x 10 us = 1 MB */
    {"NDR 4X 400 Gb/s, MTU 4096", {.mtu = 4096, .rate_mbps = 400000}, 256 << 10, 16, 4},
    /* 25 GbE RoCE, MTU 1024: 15.6 KB -> 16k = 16 MTUs; 375 KB / 16k = 23 -> 32; 62.5 KB -> 4 */
    {"25 Gb/s RoCE, MTU 1024", {.mtu = 1024, .rate_mbps = 25000}, 16 << 10, 32, 4},
    /* the MTU floor: 16 x 4096 = 64k although 25 Gb/s x 5 us is 16k */
    {"25 Gb/s RoCE, MTU 4096", {.mtu = 4096, .rate_mbps = 25000}, 64 << 10, 8, 4},
    /* a long round trip given: 2 x 12.5 GB/s x 1050 us = 26 MB, capped at 4 MiB = 64 slots;
     * bounces 2 x 12.5 GB/s x 1000 us / 64k = 382 -> 512, within the ring: 64 */
    {"EDR 4X, round trip 1 ms given", {.mtu = 4096, .rate_mbps = 100000, .rtt_us = 1000},
     64 << 10, 64, 64},
    /* Soft-RoCE over a 10 Gb/s veth (the VM): 1.25 GB/s x 50 us = 62.5 KB -> 64k; 100 us
     * assumed: 2 x 1.25 GB/s x 150 us = 375 KB / 64k = 5.7 -> 8; 250 KB / 64k = 3.8 -> 4 */
    {"software 10 Gb/s, MTU 1024", {.mtu = 1024, .rate_mbps = 10000, .soft = 1}, 64 << 10, 8,
     4},
    /* SDR 1X (what rxe reports over a netdev of unknown speed): 12.5 KB -> 16k, the floors */
    {"software SDR 1X 2 Gb/s, MTU 1024", {.mtu = 1024, .rate_mbps = 2000, .soft = 1}, 16 << 10,
     8, 4},
};

static void test_derive_link(void)
{
    shoal_tune_t t, again;
    shoal_tl_link_t none = {.mtu = 4096};

    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(link_cases); i++) {
        const tune_link_case_t *c = &link_cases[i];
        shoal_tune_derive(&tune_cases[0].m, &t);
        shoal_tune_derive_link(&c->l, &t);
        again = t;
        shoal_tune_derive_link(&c->l, &again);
        tap_ok(t.value[SHOAL_TUNE_IB_SLOT_SIZE] == c->slot &&
               t.value[SHOAL_TUNE_IB_NSLOTS] == c->nslots &&
               t.value[SHOAL_TUNE_IB_SEND_SLOTS] == c->nsend &&
               t.src[SHOAL_TUNE_IB_SLOT_SIZE] == SHOAL_TUNE_SRC_DERIVED &&
               t.src[SHOAL_TUNE_IB_NSLOTS] == SHOAL_TUNE_SRC_DERIVED &&
               t.src[SHOAL_TUNE_IB_SEND_SLOTS] == SHOAL_TUNE_SRC_DERIVED,
               "%s: slot %llu x %llu, %llu bounces (want %llu x %llu, %llu): %s; %s", c->what,
               (unsigned long long)t.value[SHOAL_TUNE_IB_SLOT_SIZE],
               (unsigned long long)t.value[SHOAL_TUNE_IB_NSLOTS],
               (unsigned long long)t.value[SHOAL_TUNE_IB_SEND_SLOTS],
               (unsigned long long)c->slot, (unsigned long long)c->nslots,
               (unsigned long long)c->nsend, t.why[SHOAL_TUNE_IB_SLOT_SIZE],
               t.why[SHOAL_TUNE_IB_NSLOTS]);
        tap_ok(memcmp(&t, &again, sizeof(t)) == 0 && t.value[SHOAL_TUNE_CHUNK] == 512 << 10,
               "%s: deterministic, the machine's settings untouched", c->what);
    }
    shoal_tune_derive(&tune_cases[0].m, &t);
    shoal_tune_derive_link(&none, &t);
    tap_ok(t.value[SHOAL_TUNE_IB_SLOT_SIZE] == 64 << 10 && t.value[SHOAL_TUNE_IB_NSLOTS] == 64 &&
           t.value[SHOAL_TUNE_IB_SEND_SLOTS] == 16 &&
           t.src[SHOAL_TUNE_IB_NSLOTS] == SHOAL_TUNE_SRC_DEFAULT &&
           strstr(t.why[SHOAL_TUNE_IB_NSLOTS], "rate unknown") != NULL,
           "a port of unknown rate: the old constants, saying why (%s)",
           t.why[SHOAL_TUNE_IB_NSLOTS]);
}

/* Explicit ib settings win over the port's (SHOAL_IB_RING_SLOTS=48 in the environment, set
 * by main), the tuning file over the derivation; what the transport is handed. */
static void test_link_override(void)
{
    shoal_tune_t t;
    shoal_tl_link_sizes_t z;

    shoal_tune_derive(&tune_cases[0].m, &t);
    shoal_tune_derive_link(&link_cases[0].l, &t);
    tap_is_int(shoal_tune_override(&t, "set IB_SLOT_SIZE 128k\nset IB_RING_SLOTS 8\n"),
               SHOAL_OK, "'set' lines of the ib sizes");
#if SHOAL_HAVE_VERBS
    tap_ok(t.value[SHOAL_TUNE_IB_NSLOTS] == 48 && t.src[SHOAL_TUNE_IB_NSLOTS] ==
           SHOAL_TUNE_SRC_ENV, "SHOAL_IB_RING_SLOTS in the environment wins: %llu (%s)",
           (unsigned long long)t.value[SHOAL_TUNE_IB_NSLOTS],
           shoal_tune_src_name(t.src[SHOAL_TUNE_IB_NSLOTS]));
    tap_ok(t.value[SHOAL_TUNE_IB_SLOT_SIZE] == 128 << 10 &&
           t.src[SHOAL_TUNE_IB_SLOT_SIZE] == SHOAL_TUNE_SRC_FILE,
           "IB_SLOT_SIZE from the tuning file wins over the port's");
    tap_ok(t.value[SHOAL_TUNE_IB_SEND_SLOTS] == 4 &&
           t.src[SHOAL_TUNE_IB_SEND_SLOTS] == SHOAL_TUNE_SRC_DERIVED, "send slots derived");
    /* the derived bounce slots follow the ring and slot in force, not the port's own: with
     * SHOAL_IB_RING_SLOTS=48 and a 1 ms round trip they were 64 (doc: 4..SHOAL_IB_RING_SLOTS),
     * and an explicit slot size left the counts sized for the port's slot */
    shoal_tune_derive(&tune_cases[0].m, &t);
    shoal_tune_derive_link(&link_cases[5].l, &t);
    (void)shoal_tune_override(&t, "set IB_SLOT_SIZE 1m\n");
    tap_ok(t.value[SHOAL_TUNE_IB_NSLOTS] == 48 && t.value[SHOAL_TUNE_IB_SEND_SLOTS] == 32 &&
               t.src[SHOAL_TUNE_IB_SEND_SLOTS] == SHOAL_TUNE_SRC_DERIVED,
           "derived bounce slots within the explicit ring, for the explicit slot: %llu of %llu "
           "(want 32 of 48: 2 x 12.5 GB/s x 1000 us / 1m)",
           (unsigned long long)t.value[SHOAL_TUNE_IB_SEND_SLOTS],
           (unsigned long long)t.value[SHOAL_TUNE_IB_NSLOTS]);
    shoal_tune_link_sizes(&link_cases[3].l, &z);
    tap_ok(z.nslots == 48 && z.send_slots == 4 && strstr(z.why, "ib_ring_slots env") != NULL &&
           strstr(z.why, "ib_send_slots derived") != NULL,
           "the transport gets the env's ring and the derived bounces: %u x %llu, %u (%s)",
           z.nslots, (unsigned long long)z.slot_size, z.send_slots, z.why);
#else
    tap_skip(5, "the ib transport is not built: its variables do not exist");
#endif
}

static void test_topo_parser(void)
{
    shoal_tuning_t tt;
    tap_is_int(shoal_tuning_parse("shm lat 1 bw 5\nset CHUNK_SIZE 256k\ncopy lat 0 bw 3\n", &tt),
               SHOAL_OK, "the link-profile parser skips 'set' lines");
    tap_ok(tt.have[SHOAL_LINK_SHM] && tt.copy_gbs == 3.0, "... and reads the rest");
}

static void test_machine_parse(void)
{
    shoal_tune_machine_t m = {0};
    tap_is_int(shoal_tune_machine_parse("l1d=48k l2=2m l3=105m copy=7.5 copy_cache=30 reduce=6",
                                        &m), 3, "SHOAL_TUNE_MACHINE: caches and rates");
    tap_ok(m.l1d_kb == 48 && m.l2_kb == 2048 && m.l3_kb == 105 * 1024 &&
           m.copy_mem_mbs == 7500 && m.copy_cache_mbs == 30000 && m.reduce_mem_mbs == 6000,
           "... parsed");
    tap_is_int(shoal_tune_machine_parse("l2=512k", &m), 1, "caches only");
    tap_is_int(shoal_tune_machine_parse("tcp_rbuf=256k", &m), 4, "the tcp receive buffer");
    tap_is_int(m.tcp_rbuf_kb, 256, "... parsed");
    tap_is_int(shoal_tune_machine_parse("l2=lots", &m), -1, "a bad size");
    tap_is_int(shoal_tune_machine_parse("copy=-1", &m), -1, "a bad rate");
    /* rounded to 0 (unknown) and taken as given: the measurement skipped, nothing derived */
    tap_is_int(shoal_tune_machine_parse("copy=0.0004", &m), -1, "a rate under 1 MB/s");
    tap_is_int(shoal_tune_machine_parse("l2=1000", &m), -1, "a cache under 1 KiB");
    tap_is_int(shoal_tune_machine_parse("l2", &m), -1, "no value");
    tap_is_int(shoal_tune_machine_parse("l4=1m", &m), -1, "an unknown field");
}

static void test_measure(void)
{
    shoal_tune_machine_t caches = {.l2_kb = 1024, .l3_kb = 4096}, m = {0};
    tap_is_int(shoal_tune_measure(&caches, &m), 0, "the measurement runs");
    tap_ok(m.copy_cache_mbs > 100 && m.copy_mem_mbs > 100 && m.reduce_mem_mbs > 100,
           "... and gives rates above 0.1 GB/s (in L2 %.2f, memory %.2f, reduce %.2f GB/s)",
           m.copy_cache_mbs / 1e3, m.copy_mem_mbs / 1e3, m.reduce_mem_mbs / 1e3);
}

/* Writes a cache record (rates in MB/s) for caches 48k/1m/4m/2 cores; mtime age_s ago. */
static void cache_put(const char *path, const char *magic, unsigned cc, unsigned cm,
                      unsigned rm, long long since, unsigned samples, long age_s)
{
    FILE *fp = fopen(path, "w");
    struct timeval tv[2];

    if (fp == NULL) {
        tap_bail("cannot write %s", path);
    }
    fprintf(fp, "%s l1d 48 l2 1024 l3 4096 cores 2 copy_cache %u copy %u reduce %u since %lld "
            "samples %u\n", magic, cc, cm, rm, since, samples);
    fclose(fp);
    chmod(path, 0600);
    gettimeofday(&tv[0], NULL);
    tv[0].tv_sec -= age_s;
    tv[1] = tv[0];
    utimes(path, tv);
}

/* Reads the record back: 0 and its fields, or -1. */
static int cache_get(const char *path, unsigned *cc, unsigned *cm, unsigned *rm,
                     long long *since, unsigned *samples)
{
    FILE *fp = fopen(path, "r");
    int n;

    if (fp == NULL) {
        return -1;
    }
    n = fscanf(fp, "shoal-tune 2 l1d 48 l2 1024 l3 4096 cores 2 copy_cache %u copy %u reduce %u "
               "since %lld samples %u", cc, cm, rm, since, samples);
    fclose(fp);
    return n == 5 ? 0 : -1;
}

static void test_cache_file(void)
{
    char dir[] = "/tmp/test_tune_cache.XXXXXX", path[4096], lpath[4200], own[4096];
    const shoal_tune_machine_t base = {.l1d_kb = 48, .l2_kb = 1024, .l3_kb = 4096, .ncores = 2};
    shoal_tune_machine_t m;
    unsigned cc, cm, rm, samples;
    long long since, now = (long long)time(NULL);
    const char *tag = SHOAL_TUNE_BUILD_TAG;
    int lfd;
    double t0;

#if defined(__SANITIZE_ADDRESS__)
    tap_is_str(tag, "-asan", "an ASan build's cache file is its own");
#elif defined(__SANITIZE_THREAD__)
    tap_is_str(tag, "-tsan", "a TSan build's cache file is its own");
#endif
    /* a relative SHOAL_TUNE_CACHE_DIR: /tmp, as before, but no longer without a word */
    {
        const char *saved_dir = shoal_tune_config.cache_dir;
        tap_log_t lg;
        int logged = tap_log_begin(&lg) == 0, n;
        shoal_tune_config.cache_dir = "relative/dir";
        n = shoal_tune_cache_file(own, sizeof(own));
        n = n == 0 ? shoal_tune_cache_file(own, sizeof(own)) : n;
        tap_log_end(&lg);
        shoal_tune_config.cache_dir = saved_dir;
        tap_ok(n == 0 && strncmp(own, "/tmp/shoal-tune-", 16) == 0 && logged &&
                   tap_log_count(&lg, "is not an absolute path", "/tmp is used") == 1,
               "a relative SHOAL_TUNE_CACHE_DIR: /tmp, said once (%s)", own);
        tap_log_close(&lg);
    }
    /* $XDG_RUNTIME_DIR set but not there (inherited through su or into a container): the
     * file went there, nothing was cached, every init measured again */
    {
        const char *saved_dir = shoal_tune_config.cache_dir;
        char *saved_xdg = getenv("XDG_RUNTIME_DIR") != NULL
                              ? strdup(getenv("XDG_RUNTIME_DIR")) : NULL;
        int n;
        shoal_tune_config.cache_dir = "";
        setenv("XDG_RUNTIME_DIR", "/nonexistent/run/user/4242", 1);
        n = shoal_tune_cache_file(own, sizeof(own));
        if (saved_xdg != NULL) {
            setenv("XDG_RUNTIME_DIR", saved_xdg, 1);
            free(saved_xdg);
        } else {
            unsetenv("XDG_RUNTIME_DIR");
        }
        shoal_tune_config.cache_dir = saved_dir;
        tap_ok(n == 0 && strncmp(own, "/tmp/shoal-tune-", 16) == 0,
               "an XDG_RUNTIME_DIR that is not there: /tmp (%s)", own);
    }
    tap_is_int(shoal_tune_cache_file(own, sizeof(own)), 0, "cache file: a path");
    tap_ok(strstr(own, "/shoal-tune-") != NULL && strlen(own) >= strlen(tag) &&
           strcmp(own + strlen(own) - strlen(tag), tag) == 0,
           "... per user and host, and this build's kind ('%s'): %s", tag, own);
    if (mkdtemp(dir) == NULL) {
        tap_bail("mkdtemp: %s", strerror(errno));
    }
    snprintf(path, sizeof(path), "%s/rec", dir);
    snprintf(lpath, sizeof(lpath), "%s.lock", path);

    m = base;
    shoal_tune_rates_at(path, &m);
    tap_ok(m.bw_src == SHOAL_TUNE_BW_MEASURED && m.copy_mem_mbs > 100 &&
           cache_get(path, &cc, &cm, &rm, &since, &samples) == 0 && samples == 1 &&
           cc == m.copy_cache_mbs && cm == m.copy_mem_mbs && rm == m.reduce_mem_mbs &&
           since >= now && since <= now + 60,
           "no file: measured and saved as sample 1 (copy %.2f GB/s)", m.copy_mem_mbs / 1e3);

    /* written a minute ago, low rates (under load): used as they are */
    cache_put(path, "shoal-tune 2", 1000, 200, 150, now - 600, 1, 60);
    m = base;
    shoal_tune_rates_at(path, &m);
    tap_ok(m.bw_src == SHOAL_TUNE_BW_CACHED && m.copy_cache_mbs == 1000 &&
           m.copy_mem_mbs == 200 && m.reduce_mem_mbs == 150,
           "a fresh record is used without measuring");

    /* the same, last written two hours ago: measured again, the best of each rate kept */
    cache_put(path, "shoal-tune 2", 1000, 200, 9000000, now - 7200, 3, 7200);
    m = base;
    shoal_tune_rates_at(path, &m);
    tap_ok(m.bw_src == SHOAL_TUNE_BW_REFRESHED && m.copy_cache_mbs > 1000 &&
           m.copy_mem_mbs > 200 && m.reduce_mem_mbs == 9000000 &&
           cache_get(path, &cc, &cm, &rm, &since, &samples) == 0 && samples == 4 &&
           since == now - 7200 && cc == m.copy_cache_mbs && cm == m.copy_mem_mbs &&
           rm == 9000000,
           "an hour-old record is refreshed: the low rates healed (copy %.2f GB/s), the higher "
           "one kept, sample 4, same start", m.copy_mem_mbs / 1e3);
    /* shoal_info -t said 'measured now' of the 9 TB/s reduce rate this process did not
     * measure: a refresh's rates are the best of the file's samples and this one */
    {
        char *txt = NULL;
        size_t tlen = 0;
        FILE *mf = open_memstream(&txt, &tlen);
        shoal_tune_t pt;
        shoal_tune_derive(&m, &pt);
        if (mf != NULL) {
            shoal_tune_print(&pt, mf);
            fclose(mf);
        }
        tap_ok(txt != NULL && strstr(txt, "memory (measured now, each rate the best of this and "
                                          "the per-host cache file's samples)") != NULL,
               "shoal_info -t says a refresh's rates are the best of the samples");
        free(txt);
    }

    /* begun 8 days ago: starts again from one measurement (the machine may have changed) */
    cache_put(path, "shoal-tune 2", 5000000, 5000000, 5000000, now - 8 * 86400, 40, 7200);
    m = base;
    shoal_tune_rates_at(path, &m);
    tap_ok(m.bw_src == SHOAL_TUNE_BW_MEASURED && m.copy_mem_mbs < 5000000 &&
           cache_get(path, &cc, &cm, &rm, &since, &samples) == 0 && samples == 1 &&
           since >= now && cm == m.copy_mem_mbs,
           "an expired record (begun 8 days ago) is replaced by a new measurement");

    /* the same expired record written a minute ago: still expired */
    cache_put(path, "shoal-tune 2", 5000000, 5000000, 5000000, now - 8 * 86400, 40, 60);
    m = base;
    shoal_tune_rates_at(path, &m);
    tap_ok(m.bw_src == SHOAL_TUNE_BW_MEASURED && m.copy_mem_mbs < 5000000,
           "... also when it was last written a minute ago");

    /* written while the clock was a month ahead (before NTP set it back): begun and written
     * in the future, it was used as it was, never refreshed, and expired a month late */
    cache_put(path, "shoal-tune 2", 1000, 200, 150, now + 30 * 86400, 1, -30 * 86400);
    m = base;
    shoal_tune_rates_at(path, &m);
    tap_ok(m.bw_src == SHOAL_TUNE_BW_MEASURED && m.copy_cache_mbs != 1000 &&
           cache_get(path, &cc, &cm, &rm, &since, &samples) == 0 && samples == 1 &&
           since >= now && since <= now + 60,
           "a record from the future (clock set back) is measured again, from one sample");
    /* begun now, last written an hour ahead (a file server's clock): refreshed, not restarted */
    cache_put(path, "shoal-tune 2", 1000, 200, 9000000, now, 2, -3600);
    m = base;
    shoal_tune_rates_at(path, &m);
    tap_ok(m.bw_src == SHOAL_TUNE_BW_REFRESHED && m.reduce_mem_mbs == 9000000 &&
           cache_get(path, &cc, &cm, &rm, &since, &samples) == 0 && samples == 3,
           "... one written an hour ahead is refreshed (sample 3, the best kept)");

    /* records it must not trust or cannot match */
    cache_put(path, "shoal-tune 1", 1000, 200, 150, now, 1, 60);
    m = base;
    shoal_tune_rates_at(path, &m);
    tap_ok(m.bw_src == SHOAL_TUNE_BW_MEASURED && m.copy_cache_mbs != 1000,
           "the old format (shoal-tune 1) is measured again");
    cache_put(path, "shoal-tune 2", 1000, 200, 150, now, 1, 60);
    chmod(path, 0620);
    m = base;
    shoal_tune_rates_at(path, &m);
    tap_ok(m.bw_src == SHOAL_TUNE_BW_MEASURED && m.copy_cache_mbs != 1000,
           "a group-writable file is not trusted");
    cache_put(path, "shoal-tune 2", 1000, 200, 150, now, 1, 60);
    m = base;
    m.l3_kb = 8192;
    shoal_tune_rates_at(path, &m);
    tap_ok(m.bw_src == SHOAL_TUNE_BW_MEASURED && m.copy_cache_mbs != 1000,
           "a record of other caches is measured again");
    cache_put(path, "shoal-tune 2", 0, 200, 150, now, 1, 60);
    m = base;
    shoal_tune_rates_at(path, &m);
    tap_ok(m.bw_src == SHOAL_TUNE_BW_MEASURED, "a zero rate is measured again");

    /* a refresh due while another process holds the lock: the record, at once */
    cache_put(path, "shoal-tune 2", 1000, 200, 150, now - 7200, 2, 7200);
    lfd = open(lpath, O_RDWR | O_CREAT, 0600);
    tap_ok(lfd >= 0 && flock(lfd, LOCK_EX) == 0, "another process holds %s", lpath);
    m = base;
    t0 = (double)shoal_time_ns() / 1e6;
    shoal_tune_rates_at(path, &m);
    t0 = (double)shoal_time_ns() / 1e6 - t0;
    tap_ok(m.bw_src == SHOAL_TUNE_BW_CACHED && m.copy_cache_mbs == 1000 && t0 < 1000,
           "a refresh due while another process measures: the record's rates at once (%.1f ms)",
           t0);
    if (lfd >= 0) {
        close(lfd);
    }
    unlink(lpath);
    unlink(path);

    /* A temporary file a process of the same pid left (killed between its create and its
     * rename; a container's processes have the same pids job after job): the record was never
     * written again, every init measured and warned 'cannot create'. */
    {
        char stale[4200];
        tap_log_t lg;
        int logged, n, sfd;
        snprintf(stale, sizeof(stale), "%s.%d.tmp", path, (int)getpid());
        sfd = open(stale, O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (sfd >= 0) {
            close(sfd);
        }
        logged = tap_log_begin(&lg) == 0;
        m = base;
        shoal_tune_rates_at(path, &m);
        tap_log_end(&lg);
        n = logged ? tap_log_count(&lg, "tune: cannot", NULL) : -1;
        tap_log_close(&lg);
        tap_ok(sfd >= 0 && m.bw_src == SHOAL_TUNE_BW_MEASURED && n == 0 &&
                   cache_get(path, &cc, &cm, &rm, &since, &samples) == 0 && samples == 1,
               "a stale temporary file of this pid: the record is still written (%d warnings)",
               n);
        unlink(stale);
        unlink(path);
        unlink(lpath);
    }

    /* A FIFO where the record goes (the name is known: any user can make one in /tmp before
     * the job): open() for reading waited for a writer, and init with it, for ever. */
    if (mkfifo(path, 0600) != 0) {
        tap_skip(1, "mkfifo failed");
    } else {
        int status = -1, waited = 0;
        pid_t pid = fork();
        if (pid == 0) {
            m = base;
            shoal_tune_rates_at(path, &m);
            _exit(m.bw_src == SHOAL_TUNE_BW_MEASURED && m.copy_mem_mbs > 0 ? 0 : 1);
        }
        while (pid > 0 && waited < 200 && waitpid(pid, &status, WNOHANG) == 0) {
            usleep(50 * 1000);
            waited++;
        }
        if (pid > 0 && waited == 200) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
        }
        tap_ok(pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
               "a FIFO as the cache file is not trusted: measured at once (%s %d after %d ms)",
               WIFEXITED(status) ? "exit" : "signal",
               WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), waited * 50);
        unlink(path);
        unlink(lpath);
    }
    /* another user's lock file at the name: nothing is cached, every init measured again,
     * and nothing said so */
    if (geteuid() != 0) {
        tap_skip(1, "not root: cannot make a file of another user");
    } else {
        tap_log_t lg;
        int logged = tap_log_begin(&lg) == 0, n;
        lfd = open(lpath, O_RDWR | O_CREAT, 0600);
        (void)!fchown(lfd, 65534, 65534);
        m = base;
        shoal_tune_rates_at(path, &m);
        m = base;
        shoal_tune_rates_at(path, &m);
        tap_log_end(&lg);
        n = logged ? tap_log_count(&lg, "is not this user's own file", "remove it") : -1;
        tap_log_close(&lg);
        tap_ok(lfd >= 0 && m.bw_src == SHOAL_TUNE_BW_MEASURED && n == 1,
               "another user's lock file: measured, and said once (%d warnings)", n);
        if (lfd >= 0) {
            close(lfd);
        }
        unlink(path);
        unlink(lpath);
    }
    /* a cache directory that is not there (a typo in SHOAL_TUNE_CACHE_DIR): nothing was
     * cached, every init of every rank measured again, and nothing said so */
    {
        char gone[4200];
        tap_log_t lg;
        int logged = tap_log_begin(&lg) == 0, n;
        snprintf(gone, sizeof(gone), "%s/no-such-dir/rec", dir);
        m = base;
        shoal_tune_rates_at(gone, &m);
        m = base;
        shoal_tune_rates_at(gone, &m);
        tap_log_end(&lg);
        n = logged ? tap_log_count(&lg, "no-such-dir", "not cached") : -1;
        tap_log_close(&lg);
        tap_ok(m.bw_src == SHOAL_TUNE_BW_MEASURED && n == 1,
               "a cache directory that is not there: measured, and said once (%d warnings)", n);
    }
    rmdir(dir);
}

int main(void)
{
    char conf[] = "/tmp/test_tune_conf.XXXXXX";
    int fd = mkstemp(conf);

    if (fd < 0 || write(fd, "SHOAL_SHM_LL_MAX=256\n", 21) != 21) {
        tap_bail("cannot write %s", conf);
    }
    close(fd);
    setenv("SHOAL_CONF_FILE", conf, 1);
    setenv("SHOAL_SHM_WINDOW", "128k", 1);
    setenv("SHOAL_SHM_ONESHOT_MAX", "0", 1);
    setenv("SHOAL_TCP_MIN_SPLIT", "1m", 1);
    unsetenv("SHOAL_CHUNK_SIZE");
    unsetenv("SHOAL_SHM_NSLOTS");
    unsetenv("SHOAL_SHM_SLOT_SIZE");
    unsetenv("SHOAL_SHM_LL_MAX");
    unsetenv("SHOAL_IB_SLOT_SIZE");
    unsetenv("SHOAL_IB_SEND_SLOTS");
    setenv("SHOAL_IB_RING_SLOTS", "48", 1);
    shoal_config_global_init();
    test_derive();
    test_derive_unknown();
    test_override();
    test_file_too_large();
    test_file_squatted();
    test_print_small_rate();
    test_derive_link();
    test_link_override();
    test_topo_parser();
    test_machine_parse();
    test_measure();
    test_cache_file();
    unlink(conf);
    return tap_done();
}
