/* Metering (src/meter): the SHOAL_METER_GPUS / CUDA_VISIBLE_DEVICES parser, the page layout
 * the agent relies on, the public stats struct's size rule, and a failed page mapping. */
#include "meter/meter.h"
#include "tests/tap.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
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

/* The tick conversion of a page read while its writer refines the rate (meter_page.h,
 * coll_ticks). A reader that stalls inside the read (preempted, as the agent's reader is at
 * any instruction) while the writer rebases twice took one rebase's ticks0 and another's ns0
 * or mult (the slot rewritten under it): a value off the writer's curve, too high by up to the
 * time between the rebases (an overcharge that the agent, clamping to the largest value it
 * saw, kept). Here the stall is a signal: its handler is the writer (two rebases, ticks added
 * as calls add them), landing anywhere in the reader's loop. The value the reader converts
 * must only grow and never pass the curve's end. */
#define TEAR_SIGNALS 5000
#define TEAR_STEP 1000 /* ticks per "call" */

static shoal_meter_page_t tear_page;
static int tear_handled; /* signals handled (atomic: lock-free, so signal safe) */
static int tear_sent; /* the kicker sent them all (atomic) */

static void tear_writer(int sig)
{
    (void)sig;
    /* 3 then 1 ns per tick: a pairing of two rebases' fields is far off the curve */
    shoal_meter_add(&tear_page.coll_ticks, TEAR_STEP);
    shoal_meter_tick_rebase(&tear_page, 3ull << 32);
    shoal_meter_add(&tear_page.coll_ticks, TEAR_STEP);
    shoal_meter_tick_rebase(&tear_page, 1ull << 32);
    __atomic_store_n(&tear_handled, __atomic_load_n(&tear_handled, __ATOMIC_RELAXED) + 1,
                     __ATOMIC_RELEASE);
}

static void *tear_kicker(void *arg)
{
    pthread_t reader = *(pthread_t *)arg;
    for (int k = 0; k < TEAR_SIGNALS; k++) {
        int seen = __atomic_load_n(&tear_handled, __ATOMIC_ACQUIRE);
        pthread_kill(reader, SIGUSR1);
        for (int spin = 0; __atomic_load_n(&tear_handled, __ATOMIC_ACQUIRE) == seen &&
                           spin < 1000000; spin++) {
            shoal_cpu_relax(); /* one at a time: the handler is the single writer */
        }
    }
    __atomic_store_n(&tear_sent, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void test_tick_conv_torn(void)
{
    struct sigaction sa, old;
    pthread_t self = pthread_self(), k;
    uint64_t prev = 0, last = 0, bad = 0, reads = 0, worst = 0, max_ns = 0;

    memset(&tear_page, 0, sizeof(tear_page));
    tear_page.tick_conv[0].mult = 1ull << 32;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = tear_writer;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, &old);
    __atomic_store_n(&tear_sent, 0, __ATOMIC_RELAXED);
    if (pthread_create(&k, NULL, tear_kicker, &self) != 0) {
        sigaction(SIGUSR1, &old, NULL);
        tap_skip(1, "pthread_create failed");
        return;
    }
    while (!__atomic_load_n(&tear_sent, __ATOMIC_ACQUIRE)) {
        /* mostly reads: the signal lands inside one */
        for (int r = 0; r < 64; r++) {
            uint64_t v = shoal_meter_page_coll_ns(&tear_page);
            /* each value only grows, and never past the curve's end (4 ns per tick pair) */
            if (SHOAL_UNLIKELY(v < prev)) {
                bad += last == prev; /* the reads after one too high stay below it a while */
                worst = SHOAL_MAX(worst, prev - v);
            }
            last = v;
            prev = SHOAL_MAX(prev, v);
        }
        reads += 64;
        max_ns = ((uint64_t)__atomic_load_n(&tear_handled, __ATOMIC_RELAXED) + 1) * TEAR_STEP * 4;
        if (prev > max_ns) {
            bad++;
            worst = SHOAL_MAX(worst, prev - max_ns);
        }
    }
    pthread_join(k, NULL);
    sigaction(SIGUSR1, &old, NULL);
    tap_ok(bad == 0 && worst == 0, "coll_ns read across %d pairs of rate rebases (%d handled): "
           "never torn (%llu of %llu reads off the curve, by up to %llu ns)", TEAR_SIGNALS,
           __atomic_load_n(&tear_handled, __ATOMIC_RELAXED), (unsigned long long)bad,
           (unsigned long long)reads, (unsigned long long)worst);
}

/* A socket at SHOAL_AGENT that this job may not connect to (the agent's socket_mode 0660 with
 * a socket_group the job is not in): under SHOAL_AGENT_REQUIRED=1 init failed with "no node
 * agent answered" and SHOAL_ERR_TIMEOUT, as for a stuck agent; it is a refusal, said so, and
 * SHOAL_ERR_PERMISSION. Root only: the job runs as nobody. */
static void test_agent_denied(void)
{
    char dir[] = "/tmp/test_meter.XXXXXX", path[64];
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int lfd, status = -1;
    pid_t pid;

    if (geteuid() != 0 || mkdtemp(dir) == NULL) {
        tap_skip(1, "not root: the job cannot run as another user");
        return;
    }
    snprintf(path, sizeof(path), "%s/shoald.sock", dir);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (chmod(dir, 0755) != 0 || lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        chmod(path, 0600) != 0 || listen(lfd, 4) != 0) {
        tap_skip(1, "cannot make a listener");
    } else if ((pid = fork()) == 0) {
        struct shoal_meter *m = calloc(1, sizeof(*m));
        shoal_status_t st;
        alarm(10);
        if (m == NULL || setgid(65534) != 0 || setuid(65534) != 0) {
            _exit(9);
        }
        m->sock = -1;
        m->memfd = memfd_create("shoal-meter", MFD_CLOEXEC);
        m->page = calloc(1, SHOAL_METER_PAGE_BYTES);
        shoal_meter_config.agent = path;
        shoal_meter_config.agent_required = 1;
        st = shoal_meter_agent_register_init(m);
        _exit(st == SHOAL_ERR_PERMISSION ? 0 : st == SHOAL_ERR_TIMEOUT ? 2 : 3);
    } else if (pid > 0) {
        waitpid(pid, &status, 0);
        tap_is_int(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0,
                   "an agent socket this job may not connect to: SHOAL_ERR_PERMISSION (exit 0; "
                   "2: SHOAL_ERR_TIMEOUT)");
    }
    if (lfd >= 0) {
        close(lfd);
    }
    unlink(path);
    rmdir(dir);
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
    /* neither an ordinal nor a UUID: CUDA stops there, and billed 3 GPUs where it sees 1 */
    test_gpus("0,foo,1", 1, 0, -1);
    test_gpus("2x,3", 0, -1, -1);
    test_gpus("1,GPU-8e1f3c2a,gpu,4", 2, 1, -1);
    /* count:N takes a number and nothing else: count:two billed 0 GPUs and count:2x 2, with
     * no word; now -1 (malformed), which the init reports and bills as none declared */
    test_gpus("count:two", -1, -1, -1);
    test_gpus("count:2x", -1, -1, -1);
    test_gpus("count:", -1, -1, -1);
    test_gpus("count:-3", -1, -1, -1);
    test_gpus("count: 4", -1, -1, -1);
    test_gpus("count:0", 0, -1, -1);
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
    test_tick_conv_torn();
    test_agent_denied();
    return tap_done();
}
