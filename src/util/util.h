/* Internal services: status helpers, logging, env-var config tables, time, hashing, random. */
#ifndef SHOAL_UTIL_H
#define SHOAL_UTIL_H

#include "shoal.h"

#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SHOAL_HIDDEN __attribute__((visibility("hidden")))
#define SHOAL_LIKELY(x) __builtin_expect(!!(x), 1)
#define SHOAL_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define SHOAL_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define SHOAL_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SHOAL_MAX(a, b) ((a) > (b) ? (a) : (b))
#define SHOAL_ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))
#define SHOAL_CACHELINE 64

/* ---- logging ---------------------------------------------------------------------------- */

typedef enum {
    SHOAL_LOG_NONE = 0,
    SHOAL_LOG_VERSION,
    SHOAL_LOG_WARN,
    SHOAL_LOG_INFO,
    SHOAL_LOG_TRACE
} shoal_log_level_t;

/* Subsystems: a bit each. SHOAL_DEBUG_SUBSYS=INIT,COLL or ALL or ^TCP. */
#define SHOAL_SUBSYS_MAP(X)                                                     \
    X(INIT) X(BOOT) X(CORE) X(COLL) X(SHM) X(TCP) X(UCX) X(IB) X(CUDA) X(TOPO)  \
    X(QOS) X(METER) X(TENANT) X(SCHED) X(REDUCE) X(TOOLS) X(CONFIG)

typedef enum {
#define SHOAL_SUBSYS_ENUM_(n) SHOAL_SUBSYS_BIT_##n,
    SHOAL_SUBSYS_MAP(SHOAL_SUBSYS_ENUM_)
#undef SHOAL_SUBSYS_ENUM_
    SHOAL_SUBSYS_COUNT
} shoal_subsys_bit_t;

#define SHOAL_SUBSYS(n) (1u << SHOAL_SUBSYS_BIT_##n)

/* Current level and subsystem mask; set by shoal_log_init() from the config table. */
extern SHOAL_HIDDEN int shoal_log_level_cur;
extern SHOAL_HIDDEN unsigned shoal_log_subsys_mask;

/* Compile-time ceiling: --enable-logging=info makes TRACE free. */
#ifndef SHOAL_LOG_MAX_LEVEL
#define SHOAL_LOG_MAX_LEVEL SHOAL_LOG_TRACE
#endif

SHOAL_HIDDEN void shoal_log_init(void);
/* Emits one line "host:pid:tid shoal LEVEL [SUBSYS] msg" to stderr or SHOAL_DEBUG_FILE.
 * Saves and restores errno. tag is "WARN", "INFO", "TRACE", "ERROR". */
SHOAL_HIDDEN void shoal_log_emit(int level, const char *tag, unsigned subsys_bit,
                                 const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* Parse "INIT,COLL", "ALL", "^TCP,SHM" into a mask; returns 0 on a bad name. */
SHOAL_HIDDEN int shoal_log_parse_subsys(const char *spec, unsigned *mask_p);
SHOAL_HIDDEN const char *shoal_log_subsys_name(unsigned subsys_bit);

#define shoal_log_enabled(level, SUB)                                           \
    ((level) <= SHOAL_LOG_MAX_LEVEL && (level) <= shoal_log_level_cur &&        \
     (shoal_log_subsys_mask & SHOAL_SUBSYS(SUB)) != 0)

#define shoal_log(level, tag, SUB, ...)                                         \
    do {                                                                        \
        if (shoal_log_enabled(level, SUB)) {                                    \
            shoal_log_emit(level, tag, SHOAL_SUBSYS_BIT_##SUB, __FILE__,        \
                           __LINE__, __VA_ARGS__);                              \
        }                                                                       \
    } while (0)

/* Errors are shown from SHOAL_DEBUG=WARN up (the default). */
#define shoal_error(SUB, ...) shoal_log(SHOAL_LOG_WARN, "ERROR", SUB, __VA_ARGS__)
#define shoal_warn(SUB, ...) shoal_log(SHOAL_LOG_WARN, "WARN", SUB, __VA_ARGS__)
#define shoal_info(SUB, ...) shoal_log(SHOAL_LOG_INFO, "INFO", SUB, __VA_ARGS__)
#define shoal_trace(SUB, ...) shoal_log(SHOAL_LOG_TRACE, "TRACE", SUB, __VA_ARGS__)
/* Once per call site. */
#define shoal_warn_once(SUB, ...)                                               \
    do {                                                                        \
        static int shoal_warned_once_;                                          \
        if (__atomic_exchange_n(&shoal_warned_once_, 1, __ATOMIC_RELAXED) == 0) \
            shoal_warn(SUB, __VA_ARGS__);                                       \
    } while (0)

/* Only macros with CHECK in the name may jump. */
#define SHOAL_CHECK_GOTO(expr, status_var, label)                               \
    do {                                                                        \
        (status_var) = (expr);                                                  \
        if ((status_var) != SHOAL_OK)                                           \
            goto label;                                                         \
    } while (0)
#define SHOAL_CHECK(expr)                                                       \
    do {                                                                        \
        shoal_status_t shoal_check_st_ = (expr);                                \
        if (shoal_check_st_ != SHOAL_OK)                                        \
            return shoal_check_st_;                                             \
    } while (0)

/* ---- env-var config tables ------------------------------------------------------------- */

typedef enum {
    SHOAL_CFG_BOOL,   /* int: y/yes/1/true/on, n/no/0/false/off */
    SHOAL_CFG_INT,    /* int */
    SHOAL_CFG_UINT,   /* unsigned */
    SHOAL_CFG_SIZE,   /* size_t, suffixes k m g (powers of 1024) */
    SHOAL_CFG_TIME,   /* int milliseconds; suffixes ms s m; "inf" or negative = -1 */
    SHOAL_CFG_STRING, /* const char * (owned by the table; NULL when default is "") */
    SHOAL_CFG_ENUM    /* int index into enum_names (case-insensitive) */
} shoal_cfg_type_t;

typedef struct {
    const char *name;               /* without the SHOAL_ prefix */
    const char *dflt;               /* default, as text */
    const char *doc;                /* one-line meaning */
    size_t offset;                  /* offsetof(field) in the module's struct */
    shoal_cfg_type_t type;
    const char *const *enum_names;  /* NULL-terminated, for SHOAL_CFG_ENUM */
    unsigned flags;                 /* SHOAL_CFG_F_* */
} shoal_cfg_field_t;

/* The value is a secret (a job secret, a unique id, a credential): redacted in every dump and
 * log, removed from the environment once read, wiped when no longer needed. */
#define SHOAL_CFG_F_SECRET (1u << 0)
/* Unset, the value is derived from the machine (src/tune, shown by shoal_info -t); dflt is
 * the value where nothing can be derived (SHOAL_TUNE=0, nothing known) and the variable's own
 * value for code that bypasses the derivation. */
#define SHOAL_CFG_F_DERIVED (1u << 1)

typedef struct {
    const char *module;             /* "log", "core", "coll", "shm", "tcp", ... */
    const shoal_cfg_field_t *fields;
    size_t nfields;
    void *dst;                      /* the module's parsed struct */
} shoal_cfg_table_t;

/* All tables, listed in src/util/config_tables.c; each module defines its own table object
 * (shoal_<module>_cfg_table) in its <module>_config.c. */
extern SHOAL_HIDDEN const shoal_cfg_table_t *const shoal_cfg_tables[];
extern SHOAL_HIDDEN const size_t shoal_cfg_ntables;

/* Parses every table once (thread-safe; precedence env > SHOAL_CONF_FILE > default), then
 * initialises the logger. Warns once about each unknown SHOAL_* variable. Cheap after the
 * first call. */
SHOAL_HIDDEN void shoal_config_global_init(void);
/* Parse one value into dst, the field itself ((char *)table->dst + f->offset), written only
 * on success; 0 on success, -1 if the text is not valid for the type. */
/* A count in decimal, digits only: no sign, no white space, no base prefix (strtoull takes
 * " -1" as 2^64 - 1 and skips leading blanks). 0 with *out when s is at most max; with end_p,
 * s may go on after the digits and *end_p points there, else s must end with them. */
SHOAL_HIDDEN int shoal_parse_u64(const char *s, uint64_t max, uint64_t *out, const char **end_p);
SHOAL_HIDDEN int shoal_cfg_parse_value(const shoal_cfg_field_t *f, const char *text, void *dst);
/* One line of SHOAL_CONF_FILE, "SHOAL_NAME=value" (blanks around both trimmed, the value's
 * trailing ones in place): 1 with the name (without the prefix, name_len bytes, not
 * terminated) and the value (terminated), both pointing into line; 0 for a blank or comment
 * line; -1 if malformed. */
SHOAL_HIDDEN int shoal_cfg_line_parse(char *line, const char **name_p, size_t *name_len_p,
                                      const char **value_p);
/* Text of the current value of field f in table t (for shoal_info -c); src is the field
 * itself, (char *)t->dst + f->offset. */
SHOAL_HIDDEN void shoal_cfg_format_value(const shoal_cfg_field_t *f, const void *src,
                                         char *buf, size_t len);
/* The raw text that set the field ("env", "file" or "default") and that text. */
SHOAL_HIDDEN const char *shoal_cfg_source(const shoal_cfg_field_t *f);
/* Look up a variable by name without the prefix, from the environment or the conf file;
 * returns NULL if unset. Only the config module calls getenv. */
SHOAL_HIDDEN const char *shoal_cfg_getenv(const char *name);
/* Other programs' variables, by full name (OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID):
 * plain environment lookup, no prefix, no conf file. */
SHOAL_HIDDEN const char *shoal_cfg_getenv_raw(const char *full_name);

/* Module config structs, parsed once. Their tables are in <module>_config.c. */
typedef struct {
    int level;                /* shoal_log_level_t, SHOAL_DEBUG */
    const char *subsys;       /* SHOAL_DEBUG_SUBSYS */
    const char *file;         /* SHOAL_DEBUG_FILE, %h host %p pid */
    const char *hostid;       /* SHOAL_HOSTID: overrides the host identity (tests, netns) */
} shoal_util_config_t;
extern SHOAL_HIDDEN shoal_util_config_t shoal_util_config;

/* ---- status ------------------------------------------------------------------------------ */

static inline int shoal_status_is_fatal(shoal_status_t s)
{
    return s <= SHOAL_ERR_TRANSPORT && s > SHOAL_ERR_AUTH;
}

/* Element sizes (status.c); shoal_dtype_esize is shoal_dtype_size without the call, for the
 * call paths: 0 for a dtype out of range. */
extern SHOAL_HIDDEN const uint8_t shoal_dtype_sizes[SHOAL_DTYPE_COUNT];

static inline size_t shoal_dtype_esize(shoal_dtype_t dtype)
{
    return (unsigned)dtype < SHOAL_DTYPE_COUNT ? shoal_dtype_sizes[dtype] : 0;
}

/* ---- time -------------------------------------------------------------------------------- */

SHOAL_HIDDEN uint64_t shoal_time_ns(void); /* CLOCK_MONOTONIC */
static inline uint64_t shoal_time_us(void) { return shoal_time_ns() / 1000; }
/* Deadline helpers: timeout_ms < 0 is infinite (UINT64_MAX). */
SHOAL_HIDDEN uint64_t shoal_deadline_ns(int timeout_ms);
static inline int shoal_deadline_passed(uint64_t deadline_ns)
{
    return deadline_ns != UINT64_MAX && shoal_time_ns() >= deadline_ns;
}
/* A warning about a failure that repeats at every pass (accept() out of descriptors while a
 * connection waits in the backlog): logged at most once per interval, with the count of those
 * not logged. 1 when it may be logged now (*missed_p: the ones left out since); else 0, and
 * it is counted. */
typedef struct {
    uint64_t last_ns; /* when it was last logged, 0: never */
    unsigned missed;  /* not logged since */
} shoal_log_limit_t;
static inline int shoal_log_limit_pass(shoal_log_limit_t *l, uint64_t interval_ns,
                                       unsigned *missed_p)
{
    uint64_t now = shoal_time_ns();
    if (l->last_ns != 0 && now - l->last_ns < interval_ns) {
        l->missed++;
        return 0;
    }
    *missed_p = l->missed;
    l->last_ns = now;
    l->missed = 0;
    return 1;
}
/* Milliseconds left until deadline, capped at cap_ms; 0 if passed. */
SHOAL_HIDDEN int shoal_deadline_left_ms(uint64_t deadline_ns, int cap_ms);
SHOAL_HIDDEN void shoal_sleep_us(unsigned us);

/* The call path's clock (time.c): the TSC where it is invariant (one rdtsc: no system call, no
 * vDSO page, no fence; a clock_gettime costs about twice as much), else CLOCK_MONOTONIC ns.
 * One read at a collective call's entry serves the CUDA layer's check for a loaded driver and
 * the meter's entry time (src/coll/api.c). Ticks become ns by mult (ns per tick << 32),
 * measured over 2 ms by shoal_ticks_init (once per process, at the first communicator; until
 * then ticks are ns) and refined by shoal_ticks_refine over the whole time since then; each
 * end of a measurement is the tightest of a few rdtsc-clock-rdtsc brackets.
 * rdtsc without a fence may run a few instructions early or late: an error of a few cycles
 * on an interval, not cumulative in a sum of intervals; no serialising read is needed. */
typedef struct {
    int tsc;                   /* 1: ticks are TSC cycles (atomic) */
    uint64_t mult;             /* ns per tick << 32 (atomic: refined by any thread) */
    uint64_t ticks_per_sec;
    uint64_t tick0, ns0;       /* the calibration's start */
} shoal_tick_clock_t;
extern SHOAL_HIDDEN shoal_tick_clock_t shoal_tick_clock;
SHOAL_HIDDEN void shoal_ticks_init(void);
SHOAL_HIDDEN void shoal_ticks_refine(uint64_t now_ticks);

static inline uint64_t shoal_ticks(void)
{
#if defined(__x86_64__)
    if (SHOAL_LIKELY(__atomic_load_n(&shoal_tick_clock.tsc, __ATOMIC_RELAXED))) {
        return __builtin_ia32_rdtsc();
    }
#endif
    return shoal_time_ns();
}

/* ticks as CLOCK_MONOTONIC ns: ns0 + (ticks - tick0) * mult. Anchored at the calibration's
 * start, so that a refinement of mult moves the value at time T by (T - tick0) * the change
 * (the drift the old rate had accumulated: microseconds), not by ticks since boot * the change:
 * the unanchored product stepped by seconds on a machine up for hours (ticks ~1e14, a 2 ms
 * calibration good to ~1e-5), and a pacer timing the agent's heartbeat on it never saw the
 * agent die. Before the calibration tick0 = ns0 = 0 and mult = 1 << 32 (ticks are ns). */
static inline uint64_t shoal_ticks_ns(uint64_t ticks)
{
    __int128 d = (__int128)ticks - (__int128)shoal_tick_clock.tick0;
    return shoal_tick_clock.ns0 +
           (uint64_t)((d * (__int128)__atomic_load_n(&shoal_tick_clock.mult, __ATOMIC_RELAXED)) >>
                      32);
}

/* Whether an abort flag (a communicator's, as transports and the bootstrap get it; may be
 * NULL) is set. Another thread sets it (shoal_comm_abort: an atomic store with release), so
 * it is read with an atomic load: a plain volatile read of it is a data race
 * (ThreadSanitizer reports one). */
static inline int shoal_aborted(const volatile int *flag)
{
    return flag != NULL && __atomic_load_n(flag, __ATOMIC_ACQUIRE) != 0;
}

/* A pause between polls of a shared flag (spin-wait hint to the CPU). */
static inline void shoal_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Whether this CPU has a prefetch for writing (cpu.c: x86-64's PREFETCHW, CPUID
 * 0x80000001 ECX bit 8, asked once; aarch64 always; elsewhere 0): where it is 0,
 * shoal_prefetch_write must not run (an x86 CPU without it may fault on the instruction). */
SHOAL_HIDDEN int shoal_cpu_prefetchw(void);

/* Asks for the cache line of p in the exclusive state, so that a later store to it does not
 * wait for the other cores' copies to be invalidated (a hint: no effect on what any core
 * reads). Only where shoal_cpu_prefetchw() said 1. */
static inline void shoal_prefetch_write(const void *p)
{
#if defined(__x86_64__)
    __asm__ __volatile__("prefetchw %0" : : "m"(*(const char *)p));
#elif defined(__aarch64__)
    __asm__ __volatile__("prfm pstl1keep, [%0]" : : "r"(p));
#else
    (void)p;
#endif
}

/* ---- little-endian codecs for wire and address formats --------------------------------- */

static inline void shoal_put_le(uint8_t *p, uint64_t v, int n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (n == 4) { /* the wire header's fields: one store (a loop of bytes is not merged) */
        uint32_t v32 = (uint32_t)v;
        memcpy(p, &v32, 4);
        return;
    }
    if (n == 8) {
        memcpy(p, &v, 8);
        return;
    }
#endif
    for (int i = 0; i < n; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static inline uint64_t shoal_get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (n == 4) {
        uint32_t v32;
        memcpy(&v32, p, 4);
        return v32;
    }
    if (n == 8) {
        memcpy(&v, p, 8);
        return v;
    }
#endif
    for (int i = 0; i < n; i++) {
        v |= (uint64_t)p[i] << (8 * i);
    }
    return v;
}

/* 1 if the interface name matches an NCCL-style list: "eth,ib" prefixes, "^eth" excludes,
 * "=eth0" exact names (src/util/net.c). */
SHOAL_HIDDEN int shoal_ifname_match(const char *spec, const char *ifname);
/* Moves buf[*off..len) over a non-blocking socket (send when sending, else recv), advancing
 * *off: 1 all moved, 0 it would block, -1 closed or failed (errno; 0 = EOF). */
SHOAL_HIDDEN int shoal_sock_step(int fd, uint8_t *buf, size_t *off, size_t len, int sending);
/* A listener whose accept() fails for want of a resource (EMFILE, ENFILE, ENOBUFS, ENOMEM)
 * fails again at every pass while a connection waits in the backlog, and stays readable: a
 * wait for it returns at once. shoal_accept_stall_note records each accept()'s outcome (err 0:
 * it took one, or the backlog is empty); 1 while the listener is stalled (the caller sleeps
 * rather than polls it). shoal_accept_stall_over: 1 once it has stalled for limit_ns without
 * a break, with the sentence (the cause and, for EMFILE, the process's limit) in why. */
typedef struct {
    uint64_t since_ns; /* first failure of the current stall, 0: none */
    int err;
} shoal_accept_stall_t;
#define SHOAL_ACCEPT_STALL_NS 1000000000ull /* a stall this long fails the wait */
SHOAL_HIDDEN int shoal_accept_stall_note(shoal_accept_stall_t *st, int err);
SHOAL_HIDDEN int shoal_accept_stall_over(const shoal_accept_stall_t *st, uint64_t limit_ns,
                                         char *why, size_t size);

/* ---- hashing and random ---------------------------------------------------------------- */

SHOAL_HIDDEN uint64_t shoal_hash64(const void *data, size_t len, uint64_t seed); /* FNV-1a */
/* Cryptographically strong random bytes (getrandom). */
SHOAL_HIDDEN shoal_status_t shoal_random_bytes(void *buf, size_t len);
/* Initialises libcrypto now (it registers its atexit cleanup here): exit handlers
 * registered after this call run before that cleanup. */
SHOAL_HIDDEN void shoal_crypto_init(void);
/* HMAC-SHA256 through OpenSSL libcrypto; out has 32 bytes. */
#define SHOAL_HMAC_BYTES 32
SHOAL_HIDDEN shoal_status_t shoal_hmac(const uint8_t *key, size_t keylen, const void *msg,
                                       size_t msglen, uint8_t out[SHOAL_HMAC_BYTES]);
/* Constant-time compare; 1 if equal. */
SHOAL_HIDDEN int shoal_memeq_ct(const void *a, const void *b, size_t len);
/* Reads a key file of the provider's tools: a regular file of min..max bytes. SHOAL_OK with
 * *len_p its size and *loose_p = 1 when group or others may read it (the caller warns); one
 * they may write, or one owned by neither root nor the effective uid, is SHOAL_ERR_PERMISSION
 * (anyone could replace it); else a sentence in why (never the content) and buf wiped. */
SHOAL_HIDDEN shoal_status_t shoal_secret_file_read(const char *path, uint8_t *buf, size_t min,
                                                   size_t max, size_t *len_p, int *loose_p,
                                                   char *why, size_t whylen);
/* Reads a configuration file whole: a regular file of at most max bytes (a FIFO, a
 * directory, a device are refused, a FIFO without waiting for a writer). 0 with *text_p
 * (malloc'ed, NUL-terminated) and *len_p (when not NULL); else an errno (ENOENT when absent,
 * EFBIG when larger) and a sentence in why to follow the path ("is larger than 65536 bytes"). */
SHOAL_HIDDEN int shoal_text_file_read(const char *path, size_t max, char **text_p, size_t *len_p,
                                      char *why, size_t whylen);
/* The same, with the status of the file read in *st_p (owner, mode: whether to trust it). */
struct stat;
SHOAL_HIDDEN int shoal_text_file_read_st(const char *path, size_t max, char **text_p,
                                         size_t *len_p, struct stat *st_p, char *why,
                                         size_t whylen);
/* Whether a file the provider's side leaves for jobs to obey (a rates page, a stop file) at
 * path, of status sb, could have been made or changed by another local user, i.e. another
 * tenant's job: NULL if not, else why (for a warning). Suspect: a file writable by group or
 * others, or one in a directory others may write to (such as /tmp) that belongs to neither
 * root nor the directory's owner. */
struct stat;
SHOAL_HIDDEN const char *shoal_provider_file_untrusted(const char *path, const struct stat *sb);
/* The path of such a file from its pattern (SHOAL_STOP_FILE, SHOAL_QOS_RATES): %t the tenant
 * ("uid=N", the effective uid, for an empty name), %j the job ("default" for an empty name),
 * %% a percent sign, into buf; SHOAL_ERR_INVALID_ARG, with a sentence in why, when it does not
 * fit or when a name it inserts is not one file name (it holds a '/', or is "." or ".."). */
SHOAL_HIDDEN shoal_status_t shoal_provider_path_expand(const char *pattern, const char *tenant,
                                                       const char *job, char *buf, size_t len,
                                                       char *why, size_t whylen);
/* 1 if name is one file name as shoal_provider_path_expand inserts it (no '/', not "." nor
 * ".."; empty names are the caller's: they expand to a default), 0 otherwise. The node agent
 * names its rates pages by the same rule. */
SHOAL_HIDDEN int shoal_provider_name_ok(const char *name);
/* Runs argv (argv[0] found in PATH) by fork and exec, never through a shell, in dir (NULL: here),
 * its stdout (and stderr when quiet) on /dev/null, and waits for it at most timeout_ms (then it
 * is killed). *pid_p, when not NULL, holds the child's pid while it runs (for the caller's
 * signal handler) and 0 after. 0 when it exited 0; else -1 with a sentence in why. For tools,
 * not the library (it forks). */
SHOAL_HIDDEN int shoal_child_run(char *const argv[], const char *dir, int quiet, int timeout_ms,
                                 volatile sig_atomic_t *pid_p, char *why, size_t whylen);
/* Wipes len bytes of secret material so the compiler cannot drop it (OPENSSL_cleanse). */
SHOAL_HIDDEN void shoal_secret_wipe(void *p, size_t len);
/* Derives a key for one purpose from a secret: HMAC-SHA256(secret, label | context), the
 * expand step of HKDF with one block. Keys for different labels or contexts are unrelated. */
SHOAL_HIDDEN shoal_status_t shoal_kdf(const uint8_t *secret, size_t secret_len, const char *label,
                                      const void *context, size_t context_len,
                                      uint8_t out[SHOAL_HMAC_BYTES]);

/* ---- host identity --------------------------------------------------------------------- */

/* Hostname (short), and a 64-bit host id: SHOAL_HOSTID if set, else hash(hostname, boot_id). */
SHOAL_HIDDEN const char *shoal_hostname(void);
SHOAL_HIDDEN uint64_t shoal_host_id(void);
/* This process's pid namespace, as the inode number of /proc/self/ns/pid (which fits 32
 * bits); 0 if unknown. Ranks of one host id in different pid namespaces (containers sharing
 * a host id) must not judge each other by the pids they publish. */
SHOAL_HIDDEN uint32_t shoal_pid_ns(void);

#endif /* SHOAL_UTIL_H */
