/* shoald, the node agent (DESIGN.md section 7): keeps the metering page of every registered
 * communicator on this host, notices a rank's exit (pidfd), aggregates per tenant and job,
 * serves /metrics for Prometheus and closes one ledger record per tenant, job and minute.
 *
 * One thread, one epoll loop (shoald.c): the registration socket and its connections
 * (agent_reg.c), the pidfds of the registered processes, libmicrohttpd's epoll fd
 * (agent_http.c) and the minute timer (agent_minute.c). Nothing blocks: every read of a
 * client has a deadline, so no client can stall the agent; the ledger's database calls run on
 * a thread of their own, which the loop waits for 100 ms at most (agent_minute.c).
 *
 * Trust: the page is written by the job, so everything in it is an untrusted claim. The agent
 * copies the identity once at registration (after checking it against SO_PEERCRED and the
 * credential) and never reads it again; counters are read with the seqlock and clamped so a
 * counter never goes backwards; names are checked before they become label values.
 */
#ifndef SHOAL_AGENT_H
#define SHOAL_AGENT_H

#include "util/util.h"
#include "meter/meter_page.h"
#include "agent/ledger.h"

#include <stdio.h>
#include <sys/types.h>

#define SHOALD_NAME_MAX SHOAL_METER_NAME_MAX
#define SHOALD_KEY_BYTES 32                /* raw key files, as shoal-cred writes them */
#define SHOALD_TOKEN_MAX 128               /* a scrape bearer token, bytes */
#define SHOALD_HOSTNAME_MAX 64             /* the host's name, NUL included (HOST_NAME_MAX + 1) */

/* Transports the agent reports: the page's bytes_sent/bytes_recv ones, then cuda_ipc
 * (SHOAL_METER_TL_CUDA_IPC: the page's cuda_ipc_sent/recv, same host only), then nccl
 * (SHOAL_METER_TL_NCCL: the page's nccl_sent/recv, the NCCL delegate's ring-equivalent bytes,
 * same host only). */
#define SHOALD_NTL (SHOAL_METER_NTL + 2)
/* Entries of a ledger cursor written by an agent that reported ntl transports. */
#define SHOALD_CUR_NCOUNTERS_NTL(ntl) (SHOAL_METER_NCOLL + 2 * (ntl) * SHOAL_METER_NLOC + 5)

/* Counters of a page, in page order (the ledger cursor's counters[0..SHOALD_NCTR-1]). */
enum {
    SHOALD_CTR_OPS = 0,                                       /* ops[SHOAL_METER_NCOLL] */
    SHOALD_CTR_SENT = SHOALD_CTR_OPS + SHOAL_METER_NCOLL,     /* bytes_sent[tl][loc] */
    SHOALD_CTR_RECV = SHOALD_CTR_SENT + SHOALD_NTL * SHOAL_METER_NLOC,
    SHOALD_CTR_COLL_NS = SHOALD_CTR_RECV + SHOALD_NTL * SHOAL_METER_NLOC,
    SHOALD_CTR_ERRORS,
    SHOALD_CTR_PEER_FAILURES,
    SHOALD_CTR_ABORTS,
    SHOALD_NCTR,
    /* cursor extras, after the page's counters: unix ns up to which the rank's GPU time is
     * billed, and 1 once the rank's exit (or failure) was billed */
    SHOALD_CUR_BILLED_NS = SHOALD_NCTR,
    SHOALD_CUR_NCOUNTERS,
    /* the cursor of an agent before cuda_ipc (its transports were SHOAL_METER_NTL) and of one
     * before nccl (SHOAL_METER_NTL + 1): read by shoald_page_cursor, which moves the entries
     * to their places; the transports they lacked start at 0 */
    SHOALD_CUR_NCOUNTERS_V1 = SHOALD_CUR_NCOUNTERS_NTL(SHOAL_METER_NTL),
    SHOALD_CUR_NCOUNTERS_V2 = SHOALD_CUR_NCOUNTERS_NTL(SHOAL_METER_NTL + 1)
};
_Static_assert(SHOALD_CUR_NCOUNTERS == SHOALD_CUR_NCOUNTERS_NTL(SHOALD_NTL), "cursor layout");

/* ---- configuration (agent_config.c) ---- */
typedef struct shoald_tenant {
    struct shoald_tenant *next;
    char name[SHOALD_NAME_MAX];
    char class_name[16];                   /* "reserved" | "spot" */
    const char *key_file;                  /* tenant key (32 raw bytes); NULL: derive */
    uint8_t key[SHOALD_KEY_BYTES];
    int have_key;
    uid_t *uids;                           /* allowed SO_PEERCRED uids; NULL: any */
    size_t nuids;
    const char *token_file;                /* bearer token of its /metrics?tenant= view */
    char token[SHOALD_TOKEN_MAX];
    size_t token_len;
    int tc_weight;                         /* its htb class's share of a link (qos_tc), >= 1 */
    int tc_dscp;                           /* tc classifier: the DSCP of its packets, -1 none */
    int tc_mark;                           /* or the fwmark the provider's firewall sets, -1 */
} shoald_tenant_t;

typedef struct {
    const char *listen;                    /* registration socket path */
    unsigned socket_mode;                  /* octal, e.g. 0666 */
    const char *socket_group;              /* group owning the socket ("" keep) */
    const char *http;                      /* "127.0.0.1:9464", "[::1]:9464", "none" */
    int minute_seconds;
    const char *ledger_url;
    const char *ledger_key_file;
    int rejoin_grace_ms;                   /* the first batch waits this for re-registrations */
    int rejoin_wait_ms;                    /* a job with a page still to register again waits
                                            * at most this */
    const char *master_key_file;           /* derive tenant keys from the provider master */
    const char *provider_token_file;       /* bearer token of the provider's /metrics view */
    char provider_token[SHOALD_TOKEN_MAX];
    size_t provider_token_len;             /* 0: that view is open to whoever reaches it */
    int export_ranks;                      /* per-rank series on /metrics */
    int allow_uncredentialed;              /* accept pages with no credential and no tenant */
    unsigned abuse_max_refused;            /* refusals per minute that flag a tenant or uid */
    int reg_timeout_ms;                    /* a registration must arrive within this */
    unsigned max_pages;                    /* registered pages, all processes */
    unsigned max_pages_per_uid;
    unsigned max_pending;                  /* registrations in progress */
    int job_retention_s;                   /* series of a job without ranks stay this long */
    const char *ready_file;                /* written once listening (tests, scripts) */
    const char *hostname;                  /* for the cursor keys ("" = this host's name) */
    const char *state_dir;                 /* the agent's own files: the ledger spool */
    /* QoS (agent_qos.c) */
    int qos_period_ms;                     /* the arbiter runs this often */
    const char *qos_rates_dir;             /* rates pages DIR/TENANT.rate; "none": no arbiter */
    size_t qos_capacity_shm;               /* bytes/s of same-host traffic, 0 = not divided */
    size_t qos_capacity_net;               /* bytes/s of other-host traffic (pacing fallback) */
    const char *qos_tc;                    /* shoal-tc.sh to run, "none" */
    const char *qos_tc_dev;                /* its interfaces, comma-separated */
    const char *qos_tc_link_rate;          /* their line rate (tc units, 1gbit) */
    const char *qos_spot_cpu;              /* spot processes: idle, nice, none */
    const char *gpu_device_prefix;         /* GPU device files: PREFIX<N>; "none": not
                                            * checked (shoald_proc_gpus_open) */
    shoald_tenant_t *tenants;
    uint8_t master[SHOALD_KEY_BYTES];
    int have_master;
    uint8_t ledger_key[SHOALD_KEY_BYTES];
    int have_ledger_key;
} shoald_config_t;

/* Parses path (NULL: defaults only); on error prints the file, line and cause to stderr and
 * returns SHOAL_ERR_INVALID_ARG. Reads the key and token files (modes checked). */
shoal_status_t shoald_config_load(shoald_config_t *cfg, const char *path);
/* Checks the values and reads the key and token files (after the command line's overrides). */
shoal_status_t shoald_config_keys(shoald_config_t *cfg);
void shoald_config_free(shoald_config_t *cfg);
void shoald_config_help(FILE *fp);
shoald_tenant_t *shoald_config_tenant(shoald_config_t *cfg, const char *name);
/* Reads a 32-byte raw key file (regular file, exact size; warns when group/others may read). */
shoal_status_t shoald_key_read(const char *what, const char *path,
                              uint8_t key[SHOALD_KEY_BYTES]);

/* ---- aggregation (agent_page.c) ---- */
typedef struct shoald_job shoald_job_t;

/* What an epoll event's data.ptr points at. */
enum { SHOALD_TAG_LISTEN = 1, SHOALD_TAG_PENDING, SHOALD_TAG_PAGE_CONN, SHOALD_TAG_PAGE_PID,
       SHOALD_TAG_HTTP };
typedef struct {
    int kind;
    void *obj;
} shoald_tag_t;

/* The abuse signals of a process (meter_page.h: auth_failed, auth_refused, breaker_opened):
 * every page of a process carries the same process-wide values, so a job's figure is, per
 * process (pid and start time), the largest value any of its pages showed, summed over the
 * job's processes. Kept with the job (so they never go backwards while it is kept). */
enum { SHOALD_ABUSE_AUTH_FAILED = 0, SHOALD_ABUSE_AUTH_REFUSED, SHOALD_ABUSE_BREAKER_OPENED,
       SHOALD_NABUSE };
typedef struct shoald_proc {
    struct shoald_proc *next;
    pid_t pid;
    uint64_t start_ns;                     /* the process's start (from /proc), 0 unknown */
    uint64_t v[SHOALD_NABUSE];
    unsigned npages;                       /* pages of its job that point to it */
    int32_t rank, nranks;                  /* its rank in the largest communicator it
                                            * registered: its per-rank series' label */
    uint64_t gone[SHOALD_NCTR];            /* final counters of its pages dropped while it
                                            * lived (its per-rank series stay monotonic) */
    int32_t gpus_seen;                     /* GPU device files it held open: the most of the
                                            * samples of the minute being billed */
    int32_t gpus_last;                     /* the last sample that could be read */
    uint64_t gpus_round;                   /* the sampling round that read it last */
} shoald_proc_t;

typedef struct shoald_page {
    struct shoald_page *next;              /* in its job */
    shoald_job_t *job;
    const volatile shoal_meter_page_t *map; /* read-only mapping of the memfd */
    shoald_tag_t tag_conn, tag_pid;
    int conn_fd;                           /* the registration connection, kept open */
    int pidfd;                             /* -1 once the exit was seen */
    pid_t pid;
    uid_t uid;
    gid_t gid;
    int32_t rank, nranks, ngpus;
    uint32_t comm_id;
    uint64_t created_ns;                   /* unix ns, clamped to [process start, now] */
    uint64_t end_ns;                       /* unix ns of exit / close, 0 while live */
    int failed;                            /* 0, 1 platform (peer failure), 2 tenant abort */
    int failure_counted;                   /* its failure is in its job's counts (an earlier
                                            * registration of the key may have put it there) */
    int final;                             /* ended for good (communicator destroyed, process
                                            * gone): the same page cannot register again */
    int cursor_known;                      /* billed[] is what the ledger holds (or no ledger) */
    int superseded;                        /* registered again: the newer page counts */
    char key[96];                          /* ledger cursor key */
    char legacy_key[96];                   /* the cursor it resumed from, keyed before the
                                            * host's long name was hashed: deleted with the
                                            * next batch that writes key; "" if none */
    uint64_t ctr[SHOALD_NCTR];             /* last values read, never decreasing */
    shoald_proc_t *proc;                   /* its process's abuse signals (in its job) */
    int32_t qos_class, qos_weight;         /* effective (the credential's at most) */
    int qos_seen;                          /* qos_prev holds a reading */
    uint64_t qos_prev[2];                  /* bytes sent same host / other host, last tick */
    uint64_t qos_paced_prev;               /* paced_ns, last tick */
    uint64_t qos_fresh_ns;                 /* its tenant's arrival: the tenant counts as
                                            * greedy until the page has sent for a period, at
                                            * most until this time (monotonic); 0 = not */
    uint64_t billed[SHOALD_CUR_NCOUNTERS]; /* cursor: what the ledger has (or will have) */
} shoald_page_t;

struct shoald_job {
    shoald_job_t *next;
    char tenant[SHOALD_NAME_MAX];
    char job[SHOALD_NAME_MAX];
    char class_name[16];
    shoald_page_t *pages;                  /* live and gone, until billed */
    uint64_t gone[SHOALD_NCTR];            /* final counters of dropped pages */
    double gone_gpu_s;                     /* allocated GPU-seconds of dropped pages */
    unsigned failed_platform, failed_tenant; /* rank failures not yet billed */
    uint64_t failures_platform_total, failures_tenant_total;
    shoald_proc_t *procs;                  /* abuse signals per process of the job */
    uint64_t gone_abuse[SHOALD_NABUSE];    /* final abuse signals of dropped processes */
    uint64_t empty_since_ns;               /* monotonic; 0 while it has pages */
    int gpus_warned;                       /* a process was seen holding more GPUs than it
                                            * declared (logged once) */
    int64_t last_minute;                   /* from the ledger, -1 none */
    int last_minute_known;
};

/* Refusal reasons (the label of shoal_registrations_refused_total). */
#define SHOALD_REFUSAL_MAP(X)                                                   \
    X(MALFORMED, "malformed") X(NO_FD, "no_fd") X(BAD_PAGE, "bad_page")          \
    X(UNSEALED, "unsealed") X(NO_CREDENTIAL, "no_credential")                   \
    X(BAD_CREDENTIAL, "bad_credential") X(EXPIRED, "expired")                   \
    X(UNKNOWN_TENANT, "unknown_tenant") X(TENANT_MISMATCH, "tenant_mismatch")     \
    X(UID_NOT_ALLOWED, "uid_not_allowed") X(LIMIT, "limit") X(TIMEOUT, "timeout")
typedef enum {
#define SHOALD_REFUSAL_ENUM_(n, s) SHOALD_REFUSE_##n,
    SHOALD_REFUSAL_MAP(SHOALD_REFUSAL_ENUM_)
#undef SHOALD_REFUSAL_ENUM_
    SHOALD_NREFUSALS
} shoald_refusal_t;
const char *shoald_refusal_name(int r);

/* Refusals per claimed tenant (configured tenants only; others are "_unknown") or per uid. */
typedef struct shoald_abuse {
    struct shoald_abuse *next;
    int is_uid;
    char tenant[SHOALD_NAME_MAX];
    uid_t uid;
    uint64_t refused, auth_failed, flags;
    uint64_t window_ns;                    /* monotonic start of the rule's window */
    unsigned this_minute;                  /* refusals in the window */
    int flagged;                           /* flagged in this window */
} shoald_abuse_t;

typedef struct {
    shoald_config_t *cfg;
    char hostname[SHOALD_HOSTNAME_MAX];
    char host_key[33];                     /* the host in ledger cursor keys (shoald_host_key) */
    shoald_job_t *jobs;
    unsigned npages;
    uint64_t refused[SHOALD_NREFUSALS];
    uint64_t accepted;
    shoald_abuse_t *abuse;
    /* ledger */
    shoal_ledger_t *ledger;                /* open (a mark: only a->lg's thread calls it) */
    struct shoald_lg *lg;                  /* the ledger's thread (agent_minute.c) */
    uint64_t ledger_next_try_ns;           /* monotonic */
    int ledger_backoff_ms;
    uint64_t ledger_commits, ledger_failures, ledger_records;
    uint64_t ledger_dropped;         /* malformed records and cursors dropped (logged) */
    struct shoald_batch *pending;          /* minutes waiting for the ledger, oldest first */
    unsigned npending;
    int64_t next_boundary;                 /* unix seconds of the next minute boundary */
    uint64_t rejoin_until_ns;              /* monotonic: no batch before (rejoin_grace; 0
                                            * without a ledger) */
    struct shoald_rejoin *rejoins;         /* pages open in the ledger, not registered again */
    int rejoins_listed;                    /* the ledger's open pages were read (once) */
    struct shoald_batch *spooled;          /* minutes an earlier agent spooled, oldest first:
                                            * written before the ledger counts as open */
    unsigned nspooled;
    int spool_stuck;                       /* a refused spool could not be put aside */
    uint64_t rejoin_wait_until_ns;         /* monotonic: rejoin_wait from the agent's start */
    struct shoald_qos *qos;                /* the arbiter (agent_qos.c), NULL when off */
    struct shoald_closer *closer;          /* closes what clients handed over (agent_reg.c);
                                            * NULL: close() at once */
    int state_lock_fd;                     /* STATE_DIR/shoald.lock, held; -1: none */
    uint64_t gpus_round;                   /* rounds of shoald_gpus_sample */
    uint64_t gpus_next_ns;                 /* monotonic: the next shoald_gpus_tick sample */
} shoald_t;

/* A rank's page was accepted: the agent takes conn_fd, pidfd and the mapping. */
shoal_status_t shoald_page_add(shoald_t *a, const shoal_meter_page_t *snapshot,
                               const volatile shoal_meter_page_t *map, int conn_fd, int pidfd,
                               pid_t pid, uid_t uid, gid_t gid, const char *class_name,
                               shoald_page_t **page_p);
/* Unix ns when pid started (from /proc), 0 if unknown. */
uint64_t shoald_proc_start_ns(pid_t pid);
/* 1 if a page of tenant/job that the ledger held open when this agent started is awaited
 * from process pid (the same process: its start is the one read then). */
int shoald_rejoin_expected(const shoald_t *a, const char *tenant, const char *job, pid_t pid);
/* a->host_key from a->hostname: the name itself up to 32 characters; a longer one as its
 * first 23, '~' and 8 hex digits of a hash of the whole (names that share their first 32
 * characters, common for cloud nodes, made one key prefix: an agent listing its host's open
 * pages took the other host's for its own). */
void shoald_host_key(shoald_t *a);
/* Reads every live page's counters (seqlock, clamped). */
void shoald_pages_read(shoald_t *a);
void shoald_page_read(shoald_page_t *p);
/* The rank exited or closed its communicator: last read, end time, failure class. */
void shoald_page_end(shoald_t *a, shoald_page_t *p, const char *why);
void shoald_pages_free(shoald_t *a);
/* Frees pages and jobs that are fully billed (and jobs past the retention). */
void shoald_pages_collect(shoald_t *a);
uint64_t shoald_unix_ns(void);
int shoald_name_ok(const char *s, size_t max);
/* GPU-seconds the page lived within [from_ns, to_ns). */
double shoald_page_gpu_seconds(const shoald_page_t *p, uint64_t from_ns, uint64_t to_ns);
/* The part of page q's life a sum counts: 1 and [*s, *e) (unix ns, *e > *s), else 0. */
typedef int (*shoald_span_fn)(const shoald_page_t *q, void *arg, uint64_t *s, uint64_t *e);
/* Allocated GPU-seconds at page p over the spans that span() gives. Every communicator of a
 * process declares the process's GPUs, so they are counted once per process: the union of
 * the spans of its pages in p's job times the most GPUs one declares, at its first page in
 * the job's list with a span, 0 at its other pages (a page without a process entry counts
 * its own span). */
double shoald_proc_gpu_seconds(const shoald_page_t *p, shoald_span_fn span, void *arg);
/* The same as the minute bills it: each process's GPUs are the most of what its pages declare
 * and what the agent saw it hold open over the minute (shoald_gpus_sample), so a job that
 * declares none (SHOAL_METER_GPUS=none, no CUDA_VISIBLE_DEVICES) still pays for its GPUs. */
double shoald_proc_billed_gpu_seconds(const shoald_page_t *p, shoald_span_fn span, void *arg);
/* Distinct GPU device files (prefix followed by a number: /dev/nvidia0, not /dev/nvidiactl)
 * that process pid holds open, among its first SHOALD_GPU_SCAN_FDS descriptors; -1 when its
 * /proc/PID/fd cannot be read (gone, another user's without the right to look). */
#define SHOALD_GPU_SCAN_FDS 1024
int shoald_proc_gpus_open(pid_t pid, const char *prefix);
/* One sample of the GPUs every live page's process holds open (page NULL), or one page's:
 * raises the process's gpus_seen; logs once per job a process that holds more than it
 * declared. */
void shoald_gpus_sample(shoald_t *a, shoald_page_t *page);
/* After a minute was billed: each process starts the next one at its last sample. */
void shoald_gpus_minute_done(shoald_t *a);
/* Samples every live page's process six times a minute (shoald_gpus_sample), so that GPUs
 * held between the registration and the minute's end are seen too. */
void shoald_gpus_tick(shoald_t *a);
/* Milliseconds until the next sample (-1: gpu_device_prefix none). */
int shoald_gpus_wait_ms(shoald_t *a);
/* The same over the pages' lives up to now_ns (unix ns), superseded pages left out: what
 * shoal_allocated_gpu_seconds_total adds for the live and the unbilled pages. */
double shoald_page_life_gpu_seconds(const shoald_page_t *p, uint64_t now_ns);
/* Counts a refusal for the claimed tenant and the uid; applies the abuse rule. */
void shoald_abuse_note(shoald_t *a, const char *claimed_tenant, uid_t uid, int auth_failure);

/* ---- minute loop and ledger (agent_minute.c) ---- */
/* ---- the spool of minutes not written at a stop (agent_spool.c) ---- */
/* A minute's batch for the ledger: its records and the pages' new cursors (one commit). */
typedef struct shoald_batch {
    struct shoald_batch *next;
    int64_t minute;
    shoal_ledger_record_t *recs;
    size_t nrecs;
    shoal_ledger_cursor_t *curs;
    size_t ncurs;
} shoald_batch_t;

void shoald_batch_free(shoald_batch_t *b);
/* Replaces the spool (STATE_DIR/ledger.spool) with the batches of first then second, or
 * removes it when both are NULL; logged on failure. */
shoal_status_t shoald_spool_save(shoald_t *a, const shoald_batch_t *first,
                                 const shoald_batch_t *second);
/* Takes STATE_DIR/shoald.lock for the agent's life (a->state_lock_fd): SHOAL_ERR_SYSTEM
 * (logged) when another agent holds it; a state_dir that cannot be made or written is only
 * a warning (SHOAL_OK, no lock), as the spool's failure then is. */
shoal_status_t shoald_state_lock(shoald_t *a);
/* Reads the spool: SHOAL_OK with the batches (none when there is no spool), or refused
 * (logged, the file renamed aside). */
shoal_status_t shoald_spool_load(shoald_t *a, shoald_batch_t **list_p, unsigned *n_p);
/* An agent without a ledger: a spool left in state_dir is not read, so it says so. */
void shoald_spool_unread(shoald_t *a);

/* Looks up the page's ledger cursor (when the ledger is open). */
void shoald_page_cursor(shoald_t *a, shoald_page_t *p);
void shoald_minute_init(shoald_t *a);
/* Called when the minute boundary has passed: builds the batch and commits what it can. */
void shoald_minute_tick(shoald_t *a);
/* Retries pending batches when their backoff has passed. */
void shoald_ledger_retry(shoald_t *a);
/* Milliseconds until the next boundary or retry (for epoll_wait). */
int shoald_minute_wait_ms(shoald_t *a);
void shoald_minute_fini(shoald_t *a);

/* ---- Prometheus text (agent_prom.c) ---- */
typedef struct {
    char *buf;
    size_t len, cap;
    int oom;
} shoald_text_t;
/* tenant NULL: the provider's view (every tenant, the agent's own series). */
void shoald_prom_render(shoald_t *a, const char *tenant, shoald_text_t *t);
void shoald_text_printf(shoald_text_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Appends s as a Prometheus label value (\\, \", \n escaped). */
void shoald_text_label(shoald_text_t *t, const char *s);

/* ---- QoS arbiter (agent_qos.c) ---- */
/* Sets up tc (qos_tc) and the rates directory; SHOAL_OK also when QoS is off or tc cannot be
 * configured here (then pacing stands in, said once). */
shoal_status_t shoald_qos_start(shoald_t *a);
/* Runs the arbiter when its period has passed: demands from the pages' counters, weighted
 * max-min shares, the rates pages written (and their heartbeat). */
void shoald_qos_tick(shoald_t *a);
/* Milliseconds until the next run (-1: off). */
int shoald_qos_wait_ms(shoald_t *a);
/* Lifts the rates (0 = no limit), removes the pages and the tc tree. */
void shoald_qos_stop(shoald_t *a);
/* The QoS series of /metrics (tenant NULL: every tenant). */
void shoald_qos_prom(shoald_t *a, const char *tenant, shoald_text_t *t);
/* A page was accepted: its effective class and weight (its claim, never above the
 * credential's; cred_class 0: no credential, at most burstable and weight 1), and its tenant's
 * rates page made (before the reply, so the rank's pacer finds it at init). */
void shoald_qos_page_register(shoald_t *a, shoald_page_t *p, const shoal_meter_page_t *snap,
                              int cred_class, int cred_weight);
/* A page ended (shoald_page_end): when it was its tenant's last live one, the others get
 * its part now rather than at the next run. */
void shoald_qos_page_end(shoald_t *a, shoald_page_t *p);

/* ---- HTTP (agent_http.c) ---- */
#define SHOALD_HTTP_MAX_CONN 64
#define SHOALD_HTTP_SPARE 16          /* MHD's limit above ours: room for the newcomers that
                                       * push others out, until those are closed */
typedef struct shoald_http shoald_http_t;
shoal_status_t shoald_http_start(shoald_t *a, const char *addr, shoald_http_t **h_p,
                                 int *port_p);
int shoald_http_fd(shoald_http_t *h);
void shoald_http_run(shoald_http_t *h);
int shoald_http_wait_ms(shoald_http_t *h);
void shoald_http_stop(shoald_http_t *h);

/* ---- registration (agent_reg.c) ---- */
typedef struct shoald_reg shoald_reg_t;
shoal_status_t shoald_reg_start(shoald_t *a, int epfd, shoald_reg_t **r_p);
void shoald_reg_stop(shoald_reg_t *r);
/* An epoll event for a tag that belongs to the registration side. */
void shoald_reg_event(shoald_reg_t *r, void *tag, uint32_t events);
void shoald_reg_timeouts(shoald_reg_t *r);
int shoald_reg_wait_ms(shoald_reg_t *r);
/* Watches a page's connection and pidfd in the loop (after shoald_page_add). */
void shoald_reg_watch(shoald_reg_t *r, shoald_page_t *p);
/* Closes a descriptor that a client had a hand in: one it sent, or a connection whose queue may
 * hold some it sent. Their last close() may wait (a TCP socket with SO_LINGER waits for its
 * unsent data, a FUSE file for its daemon): on the closer's thread, not the loop's; a memfd
 * (sealable: its close never waits) at once. */
void shoald_close_later(shoald_t *a, int fd);

#endif
