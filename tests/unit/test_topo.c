/* Topology: ring order, topology and tuning files, discovery, cost-model choice. */
#include "coll/coll.h"
#include "tests/tap.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Checks that order is a permutation, each host's ranks are contiguous on the ring (so it
 * crosses each host boundary once per direction) and returns the share. */
static void test_ring_valid(int n, const int *host_of, const int *order, const char *what)
{
    int *seen = calloc((size_t)n, sizeof(int)), perm = 1, runs = 0, nhosts = 0;
    for (int i = 0; i < n; i++) {
        perm &= order[i] >= 0 && order[i] < n && !seen[order[i]];
        if (order[i] >= 0 && order[i] < n) {
            seen[order[i]] = 1;
        }
        nhosts = SHOAL_MAX(nhosts, host_of[i] + 1);
        runs += host_of[order[i]] != host_of[order[(i + n - 1) % n]];
    }
    tap_ok(perm, "%s: a permutation", what);
    tap_is_int(runs, nhosts > 1 ? nhosts : 0, "%s: one host change per host", what);
    tap_is_int(shoal_topo_ring_share(n, host_of, order), nhosts > 1 ? 1 : 0,
               "%s: one crossing per host and direction", what);
    free(seen);
}

static void test_ring_order(void)
{
    int inter[8] = {0, 1, 0, 1, 0, 1, 0, 1}, order[8];
    int uneven[7] = {0, 1, 1, 2, 1, 0, 1};
    int sock[8] = {1, 0, 0, 1, 1, 0, 0, 1}, one[8] = {0};
    int ident[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    uint64_t ids[5] = {77, 5, 77, 9, 5};
    int hidx[5];

    shoal_topo_ring_order(8, inter, NULL, order);
    test_ring_valid(8, inter, order, "interleaved 2 hosts");
    tap_is_int(order[0], 0, "interleaved: starts at rank 0");
    tap_is_int(order[1], 2, "interleaved: then rank 2 (same host)");
    tap_is_int(order[4], 1, "interleaved: host 1 starts at rank 1");
    tap_is_int(shoal_topo_ring_share(8, inter, ident), 4,
               "rank order over interleaved hosts crosses 4 times per host");
    shoal_topo_ring_order(7, uneven, NULL, order);
    test_ring_valid(7, uneven, order, "uneven 3 hosts (2, 4, 1 ranks)");
    tap_ok(order[0] == 0 && order[1] == 5 && order[2] == 1 && order[6] == 3,
           "uneven: host 0 (0 5), host 1 (1 2 4 6), host 2 (3)");
    shoal_topo_ring_order(8, one, NULL, order);
    test_ring_valid(8, one, order, "single host");
    tap_ok(memcmp(order, ident, sizeof(ident)) == 0, "single host: rank order");
    shoal_topo_ring_order(8, one, sock, order);
    tap_ok(order[0] == 1 && order[1] == 2 && order[2] == 5 && order[3] == 6 && order[4] == 0,
           "single host, two sockets: socket 0 ranks (1 2 5 6) then socket 1 (0 3 4 7)");
    tap_is_int(shoal_topo_host_index(5, ids, hidx), 3, "host index: 3 hosts");
    tap_ok(hidx[0] == 0 && hidx[1] == 1 && hidx[2] == 0 && hidx[3] == 2 && hidx[4] == 1,
           "host index by first appearance");
}

/* Every rank groups the ranks by host at init (host index, ring order): both scanned all
 * lower ranks for each rank's host, n^2 / 2 steps - at 256Ki ranks (32Ki hosts of 8) tens of
 * seconds of every rank's init. Now a sort: well under a second (2 s allowed: a loaded CI). */
static void test_ring_order_scale(void)
{
    const int n = 256 << 10, ppn = 8;
    uint64_t *ids = malloc(sizeof(*ids) * (size_t)n);
    int *host_of = malloc(sizeof(int) * (size_t)n), *order = malloc(sizeof(int) * (size_t)n);
    int nhosts, ok = 1;
    uint64_t t0;
    double ms;

    if (ids == NULL || host_of == NULL || order == NULL) {
        tap_bail("no memory");
    }
    for (int r = 0; r < n; r++) {
        ids[r] = 0x9e3779b97f4a7c15ull * (uint64_t)(r / ppn + 1); /* hashes, as host ids are */
    }
    t0 = shoal_time_ns();
    nhosts = shoal_topo_host_index(n, ids, host_of);
    shoal_topo_ring_order(n, host_of, NULL, order);
    ms = (double)(shoal_time_ns() - t0) / 1e6;
    for (int r = 0; r < n; r++) {
        ok &= host_of[r] == r / ppn && order[r] == r;
    }
    tap_ok(nhosts == n / ppn && ok, "%d ranks, %d per host: host index and ring order right", n,
           ppn);
    tap_ok(ms < 2000, "... in %.0f ms (under 2 s)", ms);
    free(ids);
    free(host_of);
    free(order);
}

static void parse_topo_4(const char *text)
{
    shoal_topo_file_t tf;
    (void)shoal_topo_file_parse(text, 4, &tf);
}

static void parse_tuning(const char *text)
{
    shoal_tuning_t t;
    (void)shoal_tuning_parse(text, &t);
}

static void parse_ring_hosts(const char *text)
{
    shoal_topo_ring_hosts_t rh;
    if (shoal_topo_ring_hosts_parse(text, &rh) == SHOAL_OK) {
        shoal_topo_ring_hosts_free(&rh);
    }
}

static void load_tuning(const char *path)
{
    shoal_tuning_t t;
    (void)shoal_tuning_load(path, &t);
}

static void test_topo_file(void)
{
    const char *msg;
    shoal_topo_file_t tf;
    const char *txt = "# two hosts\nhosts 2\nppn 2\nlayout cyclic\n"
                      "link intra lat 0.5 bw 10\n"
                      "link inter lat 30 bw 0.125 send 2 recv 1 # 1 Gbit/s\n";

    tap_is_int(shoal_topo_file_parse(txt, 4, &tf), SHOAL_OK, "topo file: parses");
    tap_is_int(tf.nhosts, 2, "topo file: 2 hosts");
    tap_ok(tf.host_of[0] == 0 && tf.host_of[1] == 1 && tf.host_of[2] == 0 && tf.host_of[3] == 1,
           "topo file: cyclic layout");
    tap_ok(tf.have_inter && tf.inter.alpha_us == 30 && tf.inter.beta_us > 0.0079 &&
           tf.inter.beta_us < 0.0081, "topo file: inter link 30 us, 0.125 GB/s");
    tap_ok(tf.have_intra && tf.intra.alpha_us == 0.5, "topo file: intra link");
    tap_ok(tf.inter.send_us == 2 && tf.inter.recv_us == 1 && tf.intra.send_us == 0 &&
               shoal_link_send_us(&tf.intra) == 0.5,
           "topo file: send/recv busy times given, or the latency when not");
    shoal_topo_file_free(&tf);

    tap_is_int(shoal_topo_file_parse("hosts 2\nppn 3 1\nsockets 2\n", 8, &tf), SHOAL_OK,
               "topo file: uneven ppn list");
    tap_ok(tf.host_of[0] == 0 && tf.host_of[2] == 0 && tf.host_of[3] == 1 &&
           tf.host_of[4] == 0 && tf.host_of[7] == 1, "topo file: ppn 3 1 wraps (0 0 0 1 ...)");
    tap_ok(tf.socket_of[0] == 0 && tf.socket_of[5] == 1 && tf.socket_of[3] == 0,
           "topo file: sockets split each host's ranks");
    tap_ok(!tf.have_inter && !tf.have_intra, "topo file: no links given");
    shoal_topo_file_free(&tf);

    tap_is_int(shoal_topo_file_parse("hosts 2\nhost 1 ranks 0 3\n", 4, &tf), SHOAL_OK,
               "topo file: explicit host line");
    tap_ok(tf.host_of[0] == 1 && tf.host_of[3] == 1 && tf.host_of[1] == 0,
           "topo file: explicit placement wins over the layout");
    shoal_topo_file_free(&tf);

    /* 'hosts N' alone, N not dividing the ranks: blocks of ceil(ranks / N) left hosts empty
     * ('hosts 4' over 6 ranks was 2 2 2 0: three hosts). Every host gets ranks, the blocks
     * differ by one at most, and the ring still crosses each host boundary once. */
    tap_is_int(shoal_topo_file_parse("hosts 4\n", 6, &tf), SHOAL_OK, "topo file: hosts 4, 6 ranks");
    {
        int cnt[4] = {0}, order[6], ok = tf.host_of != NULL;
        for (int r = 0; ok && r < 6; r++) {
            ok = tf.host_of[r] >= 0 && tf.host_of[r] < 4 && (r == 0 || tf.host_of[r] >=
                                                             tf.host_of[r - 1]);
            cnt[ok ? tf.host_of[r] : 0]++;
        }
        tap_ok(ok && cnt[0] >= 1 && cnt[1] >= 1 && cnt[2] >= 1 && cnt[3] >= 1 &&
                   cnt[0] + cnt[1] + cnt[2] + cnt[3] == 6,
               "topo file: hosts 4 over 6 ranks: blocks %d %d %d %d, none empty", cnt[0],
               cnt[1], cnt[2], cnt[3]);
        if (ok) {
            shoal_topo_ring_order(6, tf.host_of, tf.socket_of, order);
            test_ring_valid(6, tf.host_of, order, "hosts 4 over 6 ranks");
        }
    }
    shoal_topo_file_free(&tf);
    tap_is_int(shoal_topo_file_parse("hosts 3\nsockets 2\n", 4, &tf), SHOAL_OK,
               "topo file: hosts 3, 4 ranks");
    {
        int ids[4] = {0}, hidx[4];
        uint64_t u[4];
        for (int r = 0; r < 4; r++) {
            u[r] = (uint64_t)(tf.host_of != NULL ? tf.host_of[r] : 0);
            ids[r] = (int)u[r];
        }
        tap_is_int(shoal_topo_host_index(4, u, hidx), 3,
                   "topo file: hosts 3 over 4 ranks: three hosts (%d %d %d %d)", ids[0], ids[1],
                   ids[2], ids[3]);
    }
    shoal_topo_file_free(&tf);

    /* Cyclic over a ppn list: one rank per host in turn, a host left out once it has its
     * count; past the list's sum it starts again. It was r mod hosts (0 1 0 1 | 0 1 0 1: two
     * ranks on the host of one). */
    {
        static const struct {
            const char *text;
            int n;
            const char *want;
        } cc[] = {{"layout cyclic\nppn 3 1\n", 8, "01000100"},
                  {"layout cyclic\nppn 1 3 2\n", 7, "0121210"},
                  {"layout cyclic\nppn 2 2\n", 4, "0101"},
                  {"layout cyclic\nppn 2 1\nhost 1 ranks 0\n", 4, "1100"}};
        int bad = 0;
        for (size_t i = 0; i < SHOAL_ARRAY_SIZE(cc); i++) {
            char got[16] = {0};
            if (shoal_topo_file_parse(cc[i].text, cc[i].n, &tf) == SHOAL_OK) {
                for (int r = 0; r < cc[i].n; r++) {
                    got[r] = (char)('0' + tf.host_of[r]);
                }
            }
            if (strcmp(got, cc[i].want) != 0) {
                tap_diag("'%s' over %d ranks: hosts %s, want %s", cc[i].text, cc[i].n, got,
                         cc[i].want);
                bad++;
            }
            shoal_topo_file_free(&tf);
        }
        tap_is_int(bad, 0, "topo file: cyclic over a ppn list gives each host its count");
    }

    /* The ranks a file describes (shoal_info -t's default -n): hosts x ppn, the ppn list's sum,
     * the host lines' highest rank + 1; 0 where it does not say. */
    {
        static const struct {
            const char *text;
            int want;
        } dc[] = {{"hosts 4\nppn 8\n", 32},  {"ppn 3 1\n", 4},
                  {"hosts 2\nppn 3 1\n", 4}, {"layout cyclic\nhosts 3\nppn 2\n", 6},
                  {"host 1 ranks 0 9\n", 10}, {"hosts 3\n", 0},
                  {"ppn 2\n", 0}};
        int bad = 0;
        for (size_t i = 0; i < SHOAL_ARRAY_SIZE(dc); i++) {
            if (shoal_topo_file_parse(dc[i].text, 1, &tf) != SHOAL_OK ||
                tf.described != dc[i].want) {
                tap_diag("'%s': described %d, want %d", dc[i].text, tf.described, dc[i].want);
                bad++;
            }
            shoal_topo_file_free(&tf);
        }
        tap_is_int(bad, 0, "topo file: the ranks it describes");
    }

    tap_is_int(shoal_topo_file_parse("hosts two\n", 4, &tf), SHOAL_ERR_INVALID_ARG,
               "topo file: bad number refused");
    tap_is_int(shoal_topo_file_parse("link middle lat 1 bw 1\n", 4, &tf), SHOAL_ERR_INVALID_ARG,
               "topo file: bad link class refused");
    tap_is_int(shoal_topo_file_parse("frobnicate 3\n", 4, &tf), SHOAL_ERR_INVALID_ARG,
               "topo file: unknown keyword refused");
    tap_is_int(shoal_topo_file_parse("link inter lat 1 bw 1e-320\n", 4, &tf),
               SHOAL_ERR_INVALID_ARG, "topo file: a bandwidth of 1e-320 (a beta of inf) refused");
    /* The error names the line, empty and comment lines counted (there was no number). */
    msg = tap_stderr_of(parse_topo_4, "hosts 2\n\n# comment\n\nppn 2\nlink inter lat 5 bw x\n");
    tap_ok(strstr(msg, "SHOAL_TOPO_FILE line 6:") != NULL, "topo file: the error names line 6");
    /* A file given by mistake (a credential, a token): its first line went to every rank's
     * log. A line of no known keyword is named by its number, not shown. */
    msg = tap_stderr_of(parse_topo_4, "# key\ns3cr3t-t0ken-AbCd 42\n");
    tap_ok(strstr(msg, "line 2") != NULL && strstr(msg, "s3cr3t") == NULL,
           "topo file: a line of no known keyword is not shown: %s", msg);

    /* Larger than what is read (1 MiB): refused, not cut (every rank was on one host). */
    {
        char path[] = "/tmp/test_topo_file.XXXXXX";
        int fd = mkstemp(path);
        FILE *fp = fd >= 0 ? fdopen(fd, "w") : NULL;
        shoal_status_t st;
        for (int i = 0; fp != NULL && i < 20000; i++) {
            fprintf(fp, "# padding line %05d of a generated topology file .............\n", i);
        }
        if (fp != NULL) {
            fprintf(fp, "hosts 2\n");
            fclose(fp);
        }
        st = shoal_topo_file_load(path, 4, &tf);
        tap_ok(fp != NULL && st == SHOAL_ERR_INVALID_ARG, "topo file: a file past 1 MiB is "
               "refused, not cut: %s (%d hosts)", shoal_status_name(st), tf.nhosts);
        if (st == SHOAL_OK) {
            shoal_topo_file_free(&tf);
        }
        unlink(path);
    }
    /* A directory opens and reads nothing: it passed as an empty file (one host). */
    tap_is_int(shoal_topo_file_load("/", 4, &tf), SHOAL_ERR_INVALID_ARG,
               "topo file: a directory is refused");
    /* A NUL byte ended the text: a file of zeros (a write lost in a crash) passed as an empty
     * topology, every rank on one host, and the lines past a NUL were dropped unread. */
    {
        char path[] = "/tmp/test_topo_file.XXXXXX";
        int fd = mkstemp(path);
        static const char zeros[] = "\0\0\0\0hosts 2\nlink inter lat 5 bw x\n";
        shoal_status_t st = SHOAL_ERR_SYSTEM;
        if (fd >= 0 && write(fd, zeros, sizeof(zeros) - 1) == (ssize_t)sizeof(zeros) - 1) {
            st = shoal_topo_file_load(path, 4, &tf);
        }
        tap_is_int(st, SHOAL_ERR_INVALID_ARG, "topo file: a file with a NUL byte is refused");
        if (st == SHOAL_OK) {
            shoal_topo_file_free(&tf);
        }
        if (fd >= 0) {
            close(fd);
        }
        unlink(path);
    }
}

static void test_tuning(void)
{
    shoal_tuning_t t, u;
    char path[] = "/tmp/test_topo_tuning.XXXXXX";
    int fd = mkstemp(path);

    tap_is_int(shoal_tuning_parse("# x\ntcp lat 20 bw 1.5\nreduce lat 0 bw 5\n", &t), SHOAL_OK,
               "tuning: parses");
    tap_ok(t.have[SHOAL_LINK_TCP] && !t.have[SHOAL_LINK_SHM] && t.reduce_gbs == 5,
           "tuning: tcp and reduce given");
    tap_is_int(shoal_tuning_parse("warp lat 1 bw 1\n", &t), SHOAL_ERR_INVALID_ARG,
               "tuning: unknown kind refused");
    tap_is_int(shoal_tuning_parse("tcp lat 1 bw 1 send -2\n", &t), SHOAL_ERR_INVALID_ARG,
               "tuning: negative busy time refused");
    /* Figures the model cannot use (its times were inf or NaN, the choice arbitrary). */
    tap_ok(shoal_tuning_parse("shm lat inf bw 5\n", &t) == SHOAL_ERR_INVALID_ARG &&
               shoal_tuning_parse("shm lat 1e300 bw 5\n", &t) == SHOAL_ERR_INVALID_ARG &&
               shoal_tuning_parse("shm lat 1 bw 1e-320\n", &t) == SHOAL_ERR_INVALID_ARG &&
               shoal_tuning_parse("shm lat 1 bw inf\n", &t) == SHOAL_ERR_INVALID_ARG &&
               shoal_tuning_parse("shm lat 1 bw 5 send inf\n", &t) == SHOAL_ERR_INVALID_ARG &&
               shoal_tuning_parse("shm lat 1e9 bw 1e-9 send 0 recv 1e9\n", &t) == SHOAL_OK,
           "tuning: inf, 1e300 and a bandwidth of 1e-320 refused; 0..1e9 us, 1e-9..1e9 GB/s "
           "taken");
    tap_ok(strstr(tap_stderr_of(parse_tuning, "shm lat 1 bw 5\n\n# x\ntcp lat 1 bw -5\n"),
                  "SHOAL_TUNING_FILE line 4:") != NULL, "tuning: the error names line 4");
    {
        const char *msg = tap_stderr_of(parse_tuning, "password=s3cr3t-t0ken-AbCd\n");
        tap_ok(strstr(msg, "line 1") != NULL && strstr(msg, "s3cr3t") == NULL,
               "tuning: a line of no known kind is not shown (a file given by mistake): %s",
               msg);
    }
    /* Words past the figures were dropped without a word: 'recv 4' without 'send' (the topology
     * file takes them in any order), a misspelt 'sned 3', a unit glued to a number. */
    tap_ok(shoal_tuning_parse("tcp lat 1 bw 2 recv 4\n", &t) == SHOAL_ERR_INVALID_ARG &&
               shoal_tuning_parse("tcp lat 1 bw 2 sned 3\n", &t) == SHOAL_ERR_INVALID_ARG &&
               shoal_tuning_parse("tcp lat 1 bw 2GB/s\n", &t) == SHOAL_ERR_INVALID_ARG &&
               shoal_tuning_parse("tcp lat 1 bw 2 send 3 recv 4 5\n", &t) ==
                   SHOAL_ERR_INVALID_ARG &&
               shoal_tuning_parse("tcp lat 1 bw 2 send 3\n", &t) == SHOAL_OK &&
               shoal_tuning_parse("tcp lat 1 bw 2 send 3 recv 4 \t\r\n", &t) == SHOAL_OK &&
               t.link[SHOAL_LINK_TCP].recv_us == 4,
           "tuning: a line with words past its figures is refused, not taken in part");
    shoal_tuning_parse("shm lat 1.25 bw 8 send 0.5 recv 0.25\n", &t);
    close(fd);
    tap_is_int(shoal_tuning_save(path, &t), SHOAL_OK, "tuning: saved");
    tap_is_int(shoal_tuning_load(path, &u), 1, "tuning: loaded back");
    tap_ok(u.have[SHOAL_LINK_SHM] && u.link[SHOAL_LINK_SHM].alpha_us == 1.25 &&
               u.link[SHOAL_LINK_SHM].send_us == 0.5 && u.link[SHOAL_LINK_SHM].recv_us == 0.25,
           "tuning: round trip (send and recv busy times too)");
    /* a link slower than 50 KB/s: written as "bw 0.0000", which the loader refused */
    shoal_tuning_parse("tcp lat 900 bw 0.00002\n", &t);
    int slow_ok = shoal_tuning_save(path, &t) == SHOAL_OK && shoal_tuning_load(path, &u) == 1;
    double slow_gbs = shoal_beta_to_gbs(u.link[SHOAL_LINK_TCP].beta_us);
    tap_ok(slow_ok && u.have[SHOAL_LINK_TCP] && fabs(slow_gbs - 0.00002) < 1e-9,
           "tuning: a 20 KB/s link is saved as a line that loads back (%.3g GB/s)", slow_gbs);
    /* a file past 4 KiB is read whole (it was cut at 4095 bytes and its last line refused) */
    FILE *fp = fopen(path, "w");
    for (int i = 0; i < 80; i++) {
        fprintf(fp, "# comment line %02d, padding the tuning file past one 4 KiB read ......\n",
                i);
    }
    fprintf(fp, "shm lat 1.25 bw 8 send 0.5 recv 0.25\ntcp lat 20 bw 1.5\n");
    fclose(fp);
    tap_is_int(shoal_tuning_load(path, &u), 1, "tuning: a file of 6 KiB loads");
    tap_ok(u.have[SHOAL_LINK_SHM] && u.have[SHOAL_LINK_TCP] &&
               u.link[SHOAL_LINK_TCP].alpha_us == 20,
           "tuning: ... every line of it");
    /* larger than what is read: refused, not cut */
    fp = fopen(path, "w");
    for (int i = 0; i < 1200; i++) {
        fprintf(fp, "# comment line %04d, padding the tuning file past 64 KiB .............\n",
                i);
    }
    fprintf(fp, "shm lat 1.25 bw 8\n");
    fclose(fp);
    tap_ok(shoal_tuning_load(path, &u) < 0, "tuning: a file past 64 KiB is refused, not cut");
    unlink(path);
    tap_is_int(shoal_tuning_load(path, &u), 0, "tuning: absent file is not an error");
    /* past a NUL byte nothing was read: a file of zeros was an empty profile (and src/tune
     * read none of its 'set' lines), without a word */
    fp = fopen(path, "w");
    fwrite("\0\0shm lat 1 bw fast\n", 1, sizeof("\0\0shm lat 1 bw fast\n") - 1, fp);
    fclose(fp);
    tap_ok(shoal_tuning_load(path, &u) < 0, "tuning: a file with a NUL byte is refused");
    unlink(path);
    tap_ok(shoal_tuning_load("/", &u) < 0, "tuning: a directory is refused, not an empty profile");
    /* A malformed file: its link lines are ignored, not its 'set' lines (src/tune applies
     * those line by line); the message said the whole file was ignored. */
    fp = fopen(path, "w");
    fprintf(fp, "set CHUNK_SIZE 256k\nshm lat 1 bw fast\n");
    fclose(fp);
    tap_ok(strstr(tap_stderr_of(load_tuning, path), "is malformed: its link profile is ignored (its "
                  "'set' lines apply on their own)") != NULL,
           "tuning: a malformed file is said to lose its link profile, not its 'set' lines");
    unlink(path);
}

static void test_model(void)
{
    int inter[4] = {0, 1, 0, 1}, order[4], ident[4] = {0, 1, 2, 3}, one[4] = {0};
    shoal_link_t intra = {.alpha_us = 1, .beta_us = shoal_gbs_to_beta(10)};
    shoal_link_t net = {.alpha_us = 30, .beta_us = shoal_gbs_to_beta(0.125)};
    shoal_coll_shape_t topo, rank, local;
    double c_topo, c_rank;

    shoal_topo_ring_order(4, inter, NULL, order);
    shoal_coll_shape_build(&topo, 4, inter, order, &intra, &net, 0, 4);
    shoal_coll_shape_build(&rank, 4, inter, ident, &intra, &net, 0, 4);
    tap_is_int(topo.ring_share, 1, "model: host-aware ring shares nothing");
    tap_is_int(rank.ring_share, 2, "model: rank-order ring shares the NIC by 2");
    c_topo = shoal_coll_cost(&topo, SHOAL_COLL_ALLREDUCE, SHOAL_ALGO_RING, 64 << 20);
    c_rank = shoal_coll_cost(&rank, SHOAL_COLL_ALLREDUCE, SHOAL_ALGO_RING, 64 << 20);
    tap_ok(c_rank > 1.8 * c_topo, "model: 64 MiB over 1 Gbit/s: topo ring %.0f us vs %.0f us",
           c_topo, c_rank);
    tap_is_int(shoal_coll_select_shape(&topo, SHOAL_COLL_ALLREDUCE, 8, 0, NULL), SHOAL_ALGO_RD,
               "model: 8 B across hosts picks recursive doubling");
    tap_ok(shoal_coll_select_shape(&topo, SHOAL_COLL_ALLREDUCE, 64 << 20, 0, NULL) !=
           SHOAL_ALGO_RD, "model: 64 MiB across hosts picks a bandwidth algorithm");
    tap_ok(shoal_coll_select_shape(&topo, SHOAL_COLL_ALLREDUCE, 64 << 20, SHOAL_ALGO_RD,
                                   NULL) != SHOAL_ALGO_RD,
           "model: forced rd too large for scratch falls back");
    tap_is_int(shoal_coll_select_shape(&topo, SHOAL_COLL_ALLREDUCE, 1024, SHOAL_ALGO_RING,
                                       NULL), SHOAL_ALGO_RING, "model: SHOAL_ALGO=ring forces");
    shoal_coll_shape_build(&local, 4, one, ident, &intra, &net, 1, 2);
    tap_is_int(shoal_coll_select_shape(&local, SHOAL_COLL_ALLREDUCE, 8, 0, NULL),
               SHOAL_ALGO_SHM, "model: one host with shared areas picks shm at 8 B");
    tap_ok(local.oversub == 2.0, "model: 4 ranks on 2 cores: oversubscribed by 2");
}

/* One host with the shared areas: the cost model itself must pick the intra-node AllReduce
 * (no preference overrides it) on 2, 3, 4 and 8 ranks, with a core each or sharing 2 cores,
 * from 8 B to 64 MiB, whatever the machine's rates: the channel algorithms move the same
 * data through the transport's rings (a copy in by the sender, one out by the receiver) plus
 * a message per step, the direct path reads the peers' areas in place. Swept: intra-host
 * links of 0.5-3 us and 2-20 GB/s, copies and reductions at 2-20 GB/s (the measured rates
 * of a VM and of a server). Returns the sizes where it does not. */
static int one_host_choices(int n, int ncores, const shoal_link_t *intra, double copy_gbs,
                            double reduce_gbs, char *why, size_t len)
{
    int host[8] = {0}, order[8] = {0, 1, 2, 3, 4, 5, 6, 7}, bad = 0;
    shoal_link_t net = {.alpha_us = 20, .beta_us = shoal_gbs_to_beta(1.5)};
    shoal_coll_shape_t s;

    shoal_coll_shape_build(&s, n, host, order, intra, &net, 1, ncores);
    s.copy_beta = shoal_gbs_to_beta(copy_gbs);
    s.reduce_beta = shoal_gbs_to_beta(reduce_gbs);
    for (size_t m = 8; m <= ((size_t)64 << 20); m *= 2) {
        double c;
        shoal_algo_t a = shoal_coll_select_shape(&s, SHOAL_COLL_ALLREDUCE, m, 0, &c);
        if (a != SHOAL_ALGO_SHM && getenv("TEST_TOPO_VERBOSE") != NULL) {
            printf("# n=%d cores=%d intra %.1f us %.0f GB/s copy %.0f reduce %.0f: %zu B picks "
                   "%s (%.1f us, shm %.1f us)\n", n, ncores, intra->alpha_us,
                   intra->beta_us > 0 ? 1e-3 / intra->beta_us : 0, copy_gbs, reduce_gbs, m,
                   shoal_algo_names[a], c,
                   shoal_coll_cost(&s, SHOAL_COLL_ALLREDUCE, SHOAL_ALGO_SHM, m));
        }
        if (a != SHOAL_ALGO_SHM && bad++ == 0) {
            snprintf(why, len, "n=%d cores=%d intra %.1f us %.0f GB/s copy %.0f reduce %.0f: "
                     "%zu B picks %s (%.1f us, shm %.1f us)", n, ncores, intra->alpha_us,
                     1e-3 / intra->beta_us, copy_gbs, reduce_gbs, m, shoal_algo_names[a], c,
                     shoal_coll_cost(&s, SHOAL_COLL_ALLREDUCE, SHOAL_ALGO_SHM, m));
        }
    }
    return bad;
}

static void test_one_host_model(void)
{
    static const int ns[] = {2, 3, 4, 8};
    static const double alphas[] = {0.5, 1.5, 3}, gbs[] = {2, 6, 20}, mem[] = {2, 6, 20};
    int cases = 0, bad = 0;
    char why[256] = "";

    for (size_t i = 0; i < SHOAL_ARRAY_SIZE(ns); i++) {
        for (int shared = 0; shared < 2; shared++) {
            int ncores = shared ? 2 : ns[i];
            shoal_link_t def = {0};
            cases++;
            bad += one_host_choices(ns[i], ncores, &def, 8, 4, why, sizeof(why)) > 0;
            for (size_t a = 0; a < SHOAL_ARRAY_SIZE(alphas); a++) {
                for (size_t b = 0; b < SHOAL_ARRAY_SIZE(gbs); b++) {
                    shoal_link_t l = {.alpha_us = alphas[a], .beta_us = shoal_gbs_to_beta(gbs[b]),
                                      .send_us = alphas[a] / 5, .recv_us = alphas[a] / 5};
                    for (size_t c = 0; c < SHOAL_ARRAY_SIZE(mem); c++) {
                        for (size_t r = 0; r < SHOAL_ARRAY_SIZE(mem); r++) {
                            cases++;
                            bad += one_host_choices(ns[i], ncores, &l, mem[c], mem[r], why,
                                                    sizeof(why)) > 0;
                        }
                    }
                }
            }
        }
    }
    tap_ok(bad == 0, "model: one host, 2-8 ranks, 8 B-64 MiB: the cost model picks shm in all "
           "%d rate settings (%d not%s%s)", cases, bad, bad ? ": " : "", why);
}

/* The hierarchical AllReduce's cost is a pipeline of segments (hier.c): the latency of each
 * phase, the slower of the core (intra-host phases) and the link (the ring across hosts) once
 * per further segment, the other one once. Written out here with the shape's numbers. */
static double hier_expected(double m, double seg, double L, double H, double ai, double bi,
                            double oi, double ae, double be, double oe, double rb)
{
    double S = m < seg ? m : seg, k = m / S, red = rb * (m <= 1048576 ? 0.1 : 0.5);
    double lat = 2 * 1.5 * ai + 2 * (H - 1) * 1.5 * ae;
    double core = ((L - 1) / L + (H - 1) / H / L) * S * red + 2 * (L - 1) / L * S * bi;
    double link = 2 * (H - 1) / H * S * be;
    double core_t = core + 2 * (L - 1) * 2 * oi, link_t = link + 2 * (H - 1) * 2 * oe;
    return lat + core + link + (k - 1) * (core_t > link_t ? core_t : link_t);
}

static void test_hier_model(void)
{
    int hosts[4] = {0, 0, 1, 1}, order[4];
    /* shm at 8 GB/s, a 40 Gbit/s network (5 GB/s): both phases weigh about the same */
    shoal_link_t intra = {.alpha_us = 1, .beta_us = shoal_gbs_to_beta(8), .send_us = 0.5,
                          .recv_us = 0.5};
    shoal_link_t net = {.alpha_us = 5, .beta_us = shoal_gbs_to_beta(5), .send_us = 2,
                        .recv_us = 2};
    shoal_coll_shape_t s, one;
    double c, want, ring, add, link, core, bi = intra.beta_us, be = net.beta_us, rb;
    size_t m = (size_t)64 << 20;

    shoal_topo_ring_order(4, hosts, NULL, order);
    shoal_coll_shape_build(&s, 4, hosts, order, &intra, &net, 0, 4);
    s.chunk = 512 * 1024;
    s.scratch = 4 * s.chunk;
    s.hier_segment = 1 << 20;
    rb = s.reduce_beta;
    tap_ok(s.nhosts == 2 && s.max_ppn == 2 && s.oversub == 1.0, "hier model: 2 hosts x 2 ranks");
    c = shoal_coll_cost(&s, SHOAL_COLL_ALLREDUCE, SHOAL_ALGO_HIER, m);
    want = hier_expected((double)m, 1 << 20, 2, 2, 1, bi, 0.5, 5, be, 2, rb);
    tap_ok(fabs(c - want) < 1e-6 * want, "hier model: 64 MiB in 64 segments of 1 MiB: %.1f us "
           "(formula %.1f)", c, want);
    ring = shoal_coll_cost(&s, SHOAL_COLL_ALLREDUCE, SHOAL_ALGO_RING, m);
    /* the same phases one after the other, segment after segment: what the additive model
     * said, and more than the ring */
    add = 2 * 1.5 * 5 + 2 * 1.5 * 1 +
          64 * (0.75 * (1 << 20) * rb * 0.5 + (1 << 20) * bi + (1 << 20) * be);
    tap_ok(c < ring && ring < add, "hier model: pipelined %.0f us < ring %.0f us < the phases "
           "summed %.0f us", c, ring, add);
    tap_is_int(shoal_coll_select_shape(&s, SHOAL_COLL_ALLREDUCE, m, 0, NULL), SHOAL_ALGO_HIER,
               "hier model: 64 MiB over 2x2 at 5 GB/s picks hier");
    c = shoal_coll_cost(&s, SHOAL_COLL_ALLREDUCE, SHOAL_ALGO_HIER, 64 * 1024);
    want = hier_expected(64 * 1024, 64 * 1024, 2, 2, 1, bi, 0.5, 5, be, 2, rb);
    tap_ok(fabs(c - want) < 1e-6 * want, "hier model: 64 KiB is one segment, the phases "
           "summed: %.2f us (formula %.2f)", c, want);
    s.hier_segment = 4 << 20;
    c = shoal_coll_cost(&s, SHOAL_COLL_ALLREDUCE, SHOAL_ALGO_HIER, m);
    want = hier_expected((double)m, 4 << 20, 2, 2, 1, bi, 0.5, 5, be, 2, rb);
    tap_ok(fabs(c - want) < 1e-6 * want, "hier model: SHOAL_HIER_SEGMENT=4m, 16 segments: "
           "%.1f us (formula %.1f)", c, want);
    /* a 1 Gbit/s network: the link is the bottleneck, the core's work hides behind it */
    net = (shoal_link_t){.alpha_us = 30, .beta_us = shoal_gbs_to_beta(0.125)};
    shoal_coll_shape_build(&s, 4, hosts, order, &intra, &net, 0, 4);
    s.hier_segment = 1 << 20;
    c = shoal_coll_cost(&s, SHOAL_COLL_ALLREDUCE, SHOAL_ALGO_HIER, m);
    want = hier_expected((double)m, 1 << 20, 2, 2, 1, bi, 0.5, 30, net.beta_us, 30, rb);
    /* per segment: the link's bytes and its messages (busy time unknown: the latency) */
    link = 64 * ((1 << 20) * net.beta_us + 2 * (30 + 30));
    core = 64 * (0.75 * (1 << 20) * rb * 0.5 + (1 << 20) * bi);
    tap_ok(fabs(c - want) < 1e-6 * want && c > link && c - link < 0.1 * core,
           "hier model: at 1 Gbit/s the link's %.0f us, the core's %.0f us hidden but one "
           "segment: %.0f us (formula %.0f)", link, core, c, want);
    tap_is_int(shoal_coll_select_shape(&s, SHOAL_COLL_ALLREDUCE, m, 0, NULL), SHOAL_ALGO_HIER,
               "hier model: 64 MiB over 2x2 at 1 Gbit/s picks hier");
    shoal_coll_shape_build(&one, 4, (int[4]){0, 0, 0, 0}, order, &intra, &net, 0, 4);
    tap_ok(shoal_coll_cost(&one, SHOAL_COLL_ALLREDUCE, SHOAL_ALGO_HIER, m) < 0,
           "hier model: not applicable on one host");
}

#if !SHOAL_HAVE_HWLOC
static void discover_hwloc(const char *unused)
{
    shoal_topo_summary_t s;
    (void)unused;
    shoal_topo_discover(SHOAL_TOPO_DISC_HWLOC, &s);
}
#endif

static void test_discover(void)
{
    shoal_topo_summary_t s;
    shoal_topo_discover(SHOAL_TOPO_DISC_SYSFS, &s);
    tap_ok(s.source == SHOAL_TOPO_SRC_SYSFS && s.npus >= 1 && s.nsockets >= 1,
           "sysfs discovery: %d PUs, %d sockets", s.npus, s.nsockets);
    tap_ok(s.host_id == shoal_host_id(), "summary carries the host id");
#if SHOAL_HAVE_HWLOC
    shoal_topo_discover(SHOAL_TOPO_DISC_HWLOC, &s);
    tap_ok(s.source == SHOAL_TOPO_SRC_HWLOC && s.npus >= 1 && s.ncores >= 1,
           "hwloc discovery: %d PUs, %d cores, %d NICs", s.npus, s.ncores, s.nnics);
#else
    tap_skip(1, "hwloc not built in");
    /* SHOAL_TOPO_DISCOVERY=hwloc, a mode of its own, fell back to sysfs without a word */
    {
        const char *msg = tap_stderr_of(discover_hwloc, NULL);
        tap_ok(strstr(msg, "SHOAL_TOPO_DISCOVERY=hwloc: this library was built without hwloc") !=
                   NULL,
               "SHOAL_TOPO_DISCOVERY=hwloc without hwloc built in: said (%s)", msg);
    }
#endif
}

/* SHOAL_RING_HOSTS: a list orders the hosts; malformed lists and missing hosts are refused. */
static void test_ring_hosts(void)
{
    shoal_topo_ring_hosts_t rh, rh2;
    const char *names[6] = {"a", "a", "b", "b", "c", "c"};
    int socket_of[6] = {0, 1, 0, 0, 1, 0}, order[6];

    tap_ok(shoal_topo_ring_hosts_parse("c, a\n# comment\nb", &rh) == SHOAL_OK && rh.n == 3,
           "ring host list parses (commas, newlines, comments)");
    tap_is_int(shoal_topo_ring_order_hosts(6, socket_of, names, &rh, order), 0,
               "every host is listed: the order is taken");
    tap_ok(order[0] == 5 && order[1] == 4 && order[2] == 0 && order[3] == 1 && order[4] == 2 &&
           order[5] == 3, "hosts in list order, sockets then ranks within a host");
    tap_ok(shoal_topo_ring_hosts_parse("c a b", &rh2) == SHOAL_OK && rh2.hash == rh.hash,
           "the same list gives the same fingerprint");
    shoal_topo_ring_hosts_free(&rh2);
    tap_ok(shoal_topo_ring_hosts_parse("a c b", &rh2) == SHOAL_OK && rh2.hash != rh.hash,
           "another order, another fingerprint");
    shoal_topo_ring_hosts_free(&rh2);
    shoal_topo_ring_hosts_free(&rh);
    tap_ok(shoal_topo_ring_hosts_parse("a,b", &rh) == SHOAL_OK, "a list without c");
    order[0] = -7;
    tap_is_int(shoal_topo_ring_order_hosts(6, socket_of, names, &rh, order), 5,
               "rank 4's host c is missing: refused, naming the rank");
    tap_is_int(order[0], -7, "the order is left alone");
    shoal_topo_ring_hosts_free(&rh);
    tap_ok(shoal_topo_ring_hosts_parse("a,a", &rh) != SHOAL_OK, "a host twice is refused");
    tap_ok(shoal_topo_ring_hosts_parse("b,a,c,d,c", &rh) != SHOAL_OK,
           "... also apart and out of order");
    tap_ok(shoal_topo_ring_hosts_parse("a,b$c", &rh) != SHOAL_OK, "a bad character is refused");
    /* SHOAL_RING_HOSTS_FILE naming the wrong file (a token): its text went to the log */
    {
        const char *msg = tap_stderr_of(parse_ring_hosts, "a\nb\npassword=s3cr3t\n");
        tap_ok(strstr(msg, "line 3") != NULL && strstr(msg, "s3cr3t") == NULL,
               "ring host list: a bad name is placed by line, not shown: %s", msg);
    }
    /* A list near the limit (65536 hosts, shoal-place's output for a large cluster): each name
     * was compared with every one before it (8 s of CPU here on every rank's init), and each
     * rank's host looked up by a scan of the whole list. */
    {
        const int nh = SHOAL_TOPO_RING_HOSTS_MAX, nr = 8192;
        char *text = malloc((size_t)nh * 24), *p = text;
        const char **rn = malloc(sizeof(*rn) * (size_t)nr);
        char(*rbuf)[24] = malloc(sizeof(*rbuf) * (size_t)nr);
        int *ord = malloc(sizeof(int) * (size_t)nr), ok;
        clock_t c0 = clock();
        double cpu;
        if (text == NULL || rn == NULL || rbuf == NULL || ord == NULL) {
            tap_bail("out of memory");
        }
        for (int i = 0; i < nh; i++) { /* the list in reverse: the ring goes down the hosts */
            p += sprintf(p, "gpu-node-%05d\n", nh - 1 - i);
        }
        for (int r = 0; r < nr; r++) { /* 8 ranks on each of 1024 hosts spread over the list */
            snprintf(rbuf[r], sizeof(rbuf[r]), "gpu-node-%05d", (r / 8) * 64);
            rn[r] = rbuf[r];
        }
        ok = shoal_topo_ring_hosts_parse(text, &rh) == SHOAL_OK && rh.n == nh &&
             shoal_topo_ring_order_hosts(nr, NULL, rn, &rh, ord) == 0;
        cpu = (double)(clock() - c0) / CLOCKS_PER_SEC;
        tap_ok(ok && ord[0] == nr - 8 && ord[7] == nr - 1 && ord[8] == nr - 16 &&
                   ord[nr - 1] == 7 && cpu < 2.0,
               "a list of %d hosts, %d ranks on it: the order taken in %.2f s of CPU", nh, nr,
               cpu);
        shoal_topo_ring_hosts_free(&rh);
        free(text);
        free(rn);
        free(rbuf);
        free(ord);
    }
    /* A directory opens and reads nothing: it passed as an empty list, without a warning. */
    tap_is_int(shoal_topo_ring_hosts_load(NULL, "/", &rh), SHOAL_ERR_INVALID_ARG,
               "SHOAL_RING_HOSTS_FILE naming a directory is refused");
    shoal_topo_ring_hosts_free(&rh);
}

/* A FIFO at a configuration file's path (anyone may leave one in a directory others write
 * to) held shoal_comm_init in open() until a writer came, for ever. Each loader refuses it at
 * once; they run in a child, so that a loader that waits fails the case instead of the run. */
static void test_fifo_files(void)
{
    char path[] = "/tmp/shoal-topo-fifo-XXXXXX";
    char fifo[sizeof(path) + 8];
    int status = -1, waited = 0;
    pid_t pid;

    if (mkdtemp(path) == NULL) {
        tap_skip(1, "mkdtemp failed");
        return;
    }
    snprintf(fifo, sizeof(fifo), "%s/fifo", path);
    if (mkfifo(fifo, 0600) != 0) {
        rmdir(path);
        tap_skip(1, "mkfifo failed");
        return;
    }
    pid = fork();
    if (pid == 0) {
        shoal_topo_file_t tf;
        shoal_tuning_t t;
        shoal_topo_ring_hosts_t rh;
        int bad = 0;
        setenv("SHOAL_DEBUG", "NONE", 1);
        bad |= shoal_topo_file_load(fifo, 4, &tf) != SHOAL_ERR_INVALID_ARG;
        bad |= (shoal_tuning_load(fifo, &t) >= 0) << 1;
        bad |= (shoal_topo_ring_hosts_load(NULL, fifo, &rh) != SHOAL_ERR_INVALID_ARG) << 2;
        _exit(bad);
    }
    while (pid > 0 && waited < 100 && waitpid(pid, &status, WNOHANG) == 0) {
        usleep(50 * 1000);
        waited++;
    }
    if (pid > 0 && waited == 100) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    unlink(fifo);
    rmdir(path);
    tap_ok(pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "a FIFO as SHOAL_TOPO_FILE, SHOAL_TUNING_FILE, SHOAL_RING_HOSTS_FILE: refused at once "
           "(%s %d after %d ms)", WIFEXITED(status) ? "exit" : "signal",
           WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), waited * 50);
}

/* SHOAL_TUNING_FILE is a cache rank 0 writes: at a path in a directory others write to
 * (/tmp), another local user could squat it. A symbolic link at the temporary name the save
 * writes (path.<pid>.tmp) had the save write through it (fopen "w": the target truncated,
 * root's included); a file or a symbolic link another user left at the path was read as the
 * job's profile, its 'set' lines its sizes. Now the temporary file is made new (O_EXCL,
 * O_NOFOLLOW), and in a directory others may write to a file or link of a user other than
 * this one, root or the directory's owner is refused, as is a file anyone may write. */
static void squat_file(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    if (fp != NULL) {
        fputs(text, fp);
        fclose(fp);
    }
}

static void test_tuning_squat(void)
{
    char dir[] = "/tmp/shoal-topo-squat-XXXXXX";
    char path[128], tmp[160], victim[128], real[128], buf[64] = "";
    const char *prof = "shm lat 77 bw 1\n";
    shoal_tuning_t t;
    FILE *fp;
    int root = geteuid() == 0;

    if (mkdtemp(dir) == NULL || chmod(dir, 01777) != 0) {
        tap_skip(6, "mkdtemp failed");
        return;
    }
    snprintf(path, sizeof(path), "%s/tuning", dir);
    snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
    snprintf(victim, sizeof(victim), "%s/victim", dir);
    snprintf(real, sizeof(real), "%s/real", dir);
    squat_file(victim, "precious\n");
    memset(&t, 0, sizeof(t));
    shoal_tuning_parse("tcp lat 20 bw 1.5\n", &t);
    /* path.<pid>.tmp was the only name tried: a link or file there (anyone's, or one a
     * process of the same pid left when killed) made every save fail */
    tap_ok(symlink(victim, tmp) == 0 && shoal_tuning_save(path, &t) == SHOAL_OK &&
               shoal_tuning_load(path, &t) == 1 && t.have[SHOAL_LINK_TCP],
           "tuning save: a symbolic link at path.<pid>.tmp is neither written through nor stops "
           "the save");
    fp = fopen(victim, "r");
    if (fp != NULL) {
        (void)!fgets(buf, sizeof(buf), fp);
        fclose(fp);
    }
    tap_is_str(buf, "precious\n", "tuning save: ... the link's target is left as it was");
    unlink(tmp);
    unlink(path);
    if (!root) {
        tap_skip(4, "not root: cannot make files of another user");
        unlink(victim);
        rmdir(dir);
        return;
    }
    /* another user's file at the path, in a directory anyone may write to */
    squat_file(path, prof);
    tap_ok(chown(path, 65534, 65534) == 0 && shoal_tuning_load(path, &t) < 0 &&
               !t.have[SHOAL_LINK_SHM],
           "tuning load: another user's file in a directory others write to is refused");
    unlink(path);
    /* root's file, reached through another user's symbolic link */
    squat_file(real, prof);
    tap_ok(symlink(real, path) == 0 && lchown(path, 65534, 65534) == 0 &&
               shoal_tuning_load(path, &t) < 0 && !t.have[SHOAL_LINK_SHM],
           "tuning load: another user's symbolic link in such a directory is refused");
    unlink(path);
    /* this user's file that anyone may write */
    squat_file(path, prof);
    tap_ok(chmod(path, 0666) == 0 && shoal_tuning_load(path, &t) < 0,
           "tuning load: a file anyone may write is refused");
    /* this user's own file there, and another user's in a directory only root writes */
    chmod(path, 0644);
    chmod(dir, 0755);
    tap_ok(shoal_tuning_load(path, &t) == 1 && t.have[SHOAL_LINK_SHM] &&
               chown(path, 65534, 65534) == 0 && shoal_tuning_load(path, &t) == 1,
           "tuning load: this user's file loads, and another user's where others cannot write");
    unlink(path);
    unlink(real);
    unlink(victim);
    rmdir(dir);
}

/* The cost model and the runtime agree on where recursive halving can reduce-scatter: a
 * slice of n/2 blocks in a third of scratch, at least 64 bytes (the runtime divided by n, so
 * shoal_info -t showed it where a job of 128 ranks with 4 KiB chunks ran the ring). */
static void test_rh_applicable(void)
{
    shoal_coll_state_t st = {0};
    struct shoal_comm comm = {0};
    shoal_coll_shape_t s;
    shoal_link_t l = {.alpha_us = 1, .beta_us = shoal_gbs_to_beta(8)};
    int hosts[256] = {0}, order[256], differ = 0, both = 0;

    comm.coll = &st;
    for (int n = 2; n <= 256; n *= 2) {
        for (size_t scratch = 64; scratch <= (size_t)1 << 16; scratch += 64) {
            shoal_topo_ring_order(n, hosts, NULL, order);
            shoal_coll_shape_build(&s, n, hosts, order, &l, &l, 0, n);
            s.scratch = scratch;
            st.scratch_size = scratch;
            comm.nranks = n;
            int model = shoal_rh_rs_cost(&s, 1 << 20) >= 0;
            int runtime = shoal_rh_reduce_scatter_applicable(&comm, NULL);
            differ += model != runtime;
            both += model && runtime;
        }
    }
    tap_ok(differ == 0 && both > 0, "recursive halving: the cost model and the runtime agree "
           "on every power of two to 256 ranks and scratch to 64 KiB (%d differ, %d apply)",
           differ, both);
}

/* A link measurement whose large ping-pong is no slower than its small one (a loaded
 * machine) is not used: its floor gave 26 TB/s, saved for every later job. */
static void test_meas_plausible(void)
{
    size_t big = 256 * 1024;
    tap_ok(shoal_link_meas_plausible(5, 5 + 26.2, big), "a link measured at 10 GB/s is used");
    tap_ok(shoal_link_meas_plausible(1, 1.27, big), "one measured at 970 GB/s is used");
    tap_ok(!shoal_link_meas_plausible(30, 30, big) && !shoal_link_meas_plausible(40, 12, big) &&
               !shoal_link_meas_plausible(5, 5.2, big),
           "one whose large ping-pong took no longer (or was faster, or over 1 TB/s) is not");
}

/* The profile rank 0 saves to an absent SHOAL_TUNING_FILE: where every pair's measurement was
 * not believable (a loaded machine), a file with no link line was written; from then on it
 * existed, so no job wrote it again and every one measured again (the same for a kind missing
 * from a partial profile). */
static void test_profile_save(void)
{
    shoal_link_t links[SHOAL_LINK_KINDS];
    shoal_tuning_t t;
    uint32_t shm = 1u << SHOAL_LINK_SHM, tcp = 1u << SHOAL_LINK_TCP;

    for (int k = 0; k < SHOAL_LINK_KINDS; k++) {
        links[k] = (shoal_link_t){.alpha_us = 1 + k, .beta_us = 1e-4, .send_us = 1, .recv_us = 1};
    }
    tap_is_int(shoal_topo_profile(0, shm, links, &t), 0,
               "profile: nothing measured believably (shm timed): not saved");
    tap_is_int(shoal_topo_profile(shm, shm | tcp, links, &t), 0,
               "profile: shm measured, tcp timed but not believable: not saved");
    tap_ok(shoal_topo_profile(shm | tcp, shm | tcp, links, &t) == 1 &&
               t.have[SHOAL_LINK_SHM] && t.have[SHOAL_LINK_TCP] &&
               t.link[SHOAL_LINK_TCP].alpha_us == 1 + SHOAL_LINK_TCP,
           "profile: every kind timed was measured: saved with its figures");
}

static void fake_cpu(const char *root, int cpu, int pkg, int core)
{
    char path[256];
    FILE *fp;

    snprintf(path, sizeof(path), "%s/cpu%d", root, cpu);
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/cpu%d/topology", root, cpu);
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/cpu%d/topology/physical_package_id", root, cpu);
    if ((fp = fopen(path, "w")) != NULL) {
        fprintf(fp, "%d\n", pkg);
        fclose(fp);
    }
    snprintf(path, sizeof(path), "%s/cpu%d/topology/core_id", root, cpu);
    if ((fp = fopen(path, "w")) != NULL) {
        fprintf(fp, "%d\n", core);
        fclose(fp);
    }
}

/* sysfs discovery counted a package only if its id was under 256: one of 256 or more (ids
 * are not small everywhere) was no socket ('sockets 0' where every package was such). */
static void test_discover_pkg_ids(void)
{
    char root[] = "/tmp/shoal-topo-cpus-XXXXXX", cmd[64];
    shoal_topo_summary_t s;

    if (mkdtemp(root) == NULL) {
        tap_skip(2, "mkdtemp failed");
        return;
    }
    fake_cpu(root, 0, 0, 0);
    fake_cpu(root, 1, 300, 0);
    fake_cpu(root, 2, 300, 1);
    memset(&s, 0, sizeof(s));
    shoal_topo_sysfs_cpus_at(root, &s);
    tap_ok(s.npus == 3 && s.nsockets == 2 && s.ncores == 3,
           "sysfs: packages 0 and 300: 2 sockets, 3 cores, 3 PUs (%d, %d, %d)", s.nsockets,
           s.ncores, s.npus);
    fake_cpu(root, 0, 4096, 0);
    fake_cpu(root, 1, 4096, 1);
    fake_cpu(root, 2, 4096, 2);
    memset(&s, 0, sizeof(s));
    shoal_topo_sysfs_cpus_at(root, &s);
    tap_ok(s.npus == 3 && s.nsockets == 1 && s.ncores == 3,
           "sysfs: every CPU in package 4096: 1 socket, 3 cores (%d, %d)", s.nsockets, s.ncores);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    if (system(cmd) != 0) {
        tap_diag("could not remove %s", root);
    }
}

/* Host lines place only the ranks they name: the layout's hosts come from the 'hosts' line or
 * the ppn, not from the host lines' count ('ppn 2' with 'host 0 ranks 7' put all 8 ranks on
 * one host), and a 'hosts' line before or after a host line is the same file. */
static void test_topo_file_host_lines(void)
{
    static const int want[8] = {0, 0, 1, 1, 2, 2, 3, 0};
    shoal_topo_file_t tf, tf2;
    int same = 1, bad = 0;

    tap_is_int(shoal_topo_file_parse("ppn 2\nhost 0 ranks 7\n", 8, &tf), SHOAL_OK,
               "topo file: ppn 2 and a host line");
    for (int r = 0; tf.host_of != NULL && r < 8; r++) {
        bad += tf.host_of[r] != want[r];
    }
    tap_ok(tf.host_of != NULL && bad == 0 && tf.nhosts == 4,
           "... 4 hosts of 2 ranks, rank 7 moved to host 0 (%d %d %d %d %d %d %d %d, %d hosts)",
           tf.host_of ? tf.host_of[0] : -1, tf.host_of ? tf.host_of[1] : -1,
           tf.host_of ? tf.host_of[2] : -1, tf.host_of ? tf.host_of[3] : -1,
           tf.host_of ? tf.host_of[4] : -1, tf.host_of ? tf.host_of[5] : -1,
           tf.host_of ? tf.host_of[6] : -1, tf.host_of ? tf.host_of[7] : -1, tf.nhosts);
    shoal_topo_file_free(&tf);
    tap_ok(shoal_topo_file_parse("hosts 2\nhost 3 ranks 0\n", 6, &tf) == SHOAL_OK &&
               shoal_topo_file_parse("host 3 ranks 0\nhosts 2\n", 6, &tf2) == SHOAL_OK,
           "topo file: 'hosts 2' before and after 'host 3 ranks 0'");
    for (int r = 0; tf.host_of != NULL && tf2.host_of != NULL && r < 6; r++) {
        same &= tf.host_of[r] == tf2.host_of[r];
    }
    tap_ok(tf.host_of != NULL && tf2.host_of != NULL && same && tf.nhosts == tf2.nhosts &&
               tf.described == tf2.described,
           "... place the ranks alike (rank 1: host %d and %d; %d and %d hosts)",
           tf.host_of ? tf.host_of[1] : -1, tf2.host_of ? tf2.host_of[1] : -1, tf.nhosts,
           tf2.nhosts);
    shoal_topo_file_free(&tf);
    shoal_topo_file_free(&tf2);
}

int main(void)
{
    shoal_config_global_init();
    test_ring_order();
    test_ring_order_scale();
    test_topo_file();
    test_tuning();
    test_model();
    test_one_host_model();
    test_hier_model();
    test_discover();
    test_ring_hosts();
    test_fifo_files();
    test_tuning_squat();
    test_rh_applicable();
    test_meas_plausible();
    test_topo_file_host_lines();
    test_profile_save();
    test_discover_pkg_ids();
    return tap_done();
}
