/* shoald: the billing minute. At each boundary (a multiple of minute_seconds in unix time) the
 * agent reads every page and builds one record per (tenant, job) with the exact counter deltas
 * since each page's cursor, the allocated GPU-seconds (GPUs x the seconds each rank lived
 * since its cursor, up to the boundary or its end) and the ranks that ended failed; the batch
 * carries the pages' new cursors and goes to shoal_ledger_commit() in one call (ledger.h: one
 * transaction). A batch the ledger refuses (database down) stays in memory, in order, and is
 * retried with backoff; none is dropped (at a stop, those left go to the spool, which the
 * next agent writes first: agent_spool.c). After a restart the cursors come back from the
 * ledger when a page re-registers, so nothing is billed twice; a page whose cursor is not
 * known yet (ledger unreachable) is left out of the batches until it is, its counters keep
 * growing in the page meanwhile, so nothing is lost either.
 *
 * The deltas of a minute are what the counters moved between two reads at boundaries. When
 * the agent was not running for some minutes of a job (a restart, a kill -9), its first batch
 * after that holds one record per minute the job's ranks lived, each with that minute's
 * GPU-seconds, and the counters' deltas over the whole gap in the last one: no minute of a
 * job's life is missing from the ledger, and the totals stay exact.
 *
 * A commit that failed is retried with the same batch: when the database had stored it but
 * its answer was lost, the ledger takes the exact replay as done (ledger.h), so nothing is
 * written twice. A page that ended for good and is billed to its end has its cursor deleted
 * in the batch of its last record. */
#include "agent/agent.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SHOALD_LEDGER_BACKOFF_MIN_MS 500
#define SHOALD_LEDGER_BACKOFF_MAX_MS 30000
/* The longest the loop waits for one ledger call: a rank's registration (which reads its
 * cursor) has SHOAL_METER_AGENT_MS (200 ms) in all. */
#define SHOALD_LEDGER_WAIT_MS 100
/* The open at the start, before anything is served, may take a connection's time. */
#define SHOALD_LEDGER_OPEN_WAIT_MS 10000
/* At a stop, nothing else is served: the minutes held in memory and a call still running get
 * this long in all. What is still not written then goes to the spool (agent_spool.c): the
 * last minutes of ranks that ended (and their failures) are in no cursor, so only the spool
 * lets the next agent bill them. */
#define SHOALD_LEDGER_STOP_WAIT_MS 5000

/* A rank whose page the ledger holds open (its cursor was not deleted: not billed to its
 * end) and whose process still runs when the agent starts: it was counting while no agent
 * ran, and registers again at the end of its next call. Until it does (or exits, or
 * rejoin_wait passes), its job is not billed: the minutes since its cursor then get a record
 * each with its time in them, instead of being billed without it and its time folded into
 * the job's first open minute (shoald_minute_fold). */
typedef struct shoald_rejoin {
    struct shoald_rejoin *next;
    char key[96];
    char tenant[SHOALD_NAME_MAX];
    char job[SHOALD_NAME_MAX];
    pid_t pid;
    uint64_t start_ns;                     /* the process's start: a reused pid is not it */
    int gone;                              /* its process ended: the cursor goes, in the next
                                            * batch (nothing would ever delete it) */
} shoald_rejoin_t;

/* ---- The ledger's own thread ----
 * The ledger's calls block on the database (libpq waits for the server's answer; a server
 * that hangs, stopped or stuck on its disk, keeps the TCP connection up, so no timeout of the
 * connection ends the wait, and statement_timeout is the server's own). On the loop's thread
 * they stalled everything else: registrations timed out, scrapes hung, pidfd exits waited.
 * So one thread runs them, one at a time, and the loop waits for the answer at most
 * SHOALD_LEDGER_WAIT_MS: a call that takes longer is left to the thread, and it and every
 * call while the thread is still busy fail as SHOAL_ERR_TRANSPORT (the database is not
 * answering), which each caller already handles: minutes stay pending, a cursor stays
 * unknown. A commit that ends after the loop gave up on it is not lost either: its result is
 * kept for the batch's retry (a stored batch would also be taken as its exact replay). */
typedef enum {
    SHOALD_LG_OPEN,
    SHOALD_LG_CURSOR,
    SHOALD_LG_LIST,
    SHOALD_LG_LAST_MINUTE,
    SHOALD_LG_COMMIT,
    SHOALD_LG_STORED
} shoald_lg_op_t;

typedef struct {
    char key[96];
    char tenant[SHOALD_NAME_MAX];
    char job[SHOALD_NAME_MAX];
} shoald_lg_item_t;

typedef struct {
    shoald_lg_op_t op;
    int done, abandoned;
    shoal_status_t status;
    const void *tag;                       /* the batch of a commit */
    char key[96], tenant[SHOALD_NAME_MAX], job[SHOALD_NAME_MAX], host[SHOALD_NAME_MAX];
    shoal_ledger_record_t *recs;           /* copies: the loop may free the batch */
    size_t nrecs;
    shoal_ledger_cursor_t *curs;
    size_t ncurs;
    shoal_ledger_cursor_t cursor;          /* out: SHOALD_LG_CURSOR */
    int64_t minute;                        /* out: SHOALD_LG_LAST_MINUTE */
    uint64_t head;                         /* out: SHOALD_LG_OPEN */
    shoald_lg_item_t *items;               /* out: SHOALD_LG_LIST */
    size_t nitems, cap;
    size_t nsame;                          /* out: SHOALD_LG_STORED */
    uint8_t *taken;                        /* out: SHOALD_LG_STORED, per record (nrecs) */
} shoald_lg_req_t;

typedef struct shoald_lg {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;                     /* CLOCK_MONOTONIC */
    shoald_lg_req_t *req;                  /* the call the thread runs; NULL: idle */
    int stop;
    shoal_ledger_t *ledger;                /* the thread's: the loop never calls it */
    char *url;                             /* copies: a thread left waiting at the agent's
                                            * end outlives its configuration */
    uint8_t key[SHOALD_KEY_BYTES];
    const void *late_tag;                  /* a commit that ended after the loop gave up */
    shoal_status_t late_status;
} shoald_lg_t;

static void shoald_lg_req_free(shoald_lg_req_t *r)
{
    free(r->recs);
    free(r->curs);
    free(r->items);
    free(r->taken);
    free(r);
}

static int shoald_lg_listed(const char *key, const char *tenant, const char *job, void *arg)
{
    shoald_lg_req_t *r = arg;
    shoald_lg_item_t *items;

    if (r->nitems == r->cap) {
        size_t cap = r->cap == 0 ? 16 : 2 * r->cap;

        items = realloc(r->items, cap * sizeof(*items));
        if (items == NULL) {
            r->status = SHOAL_ERR_NO_MEMORY;
            return 1;
        }
        r->items = items;
        r->cap = cap;
    }
    items = &r->items[r->nitems++];
    snprintf(items->key, sizeof(items->key), "%s", key);
    snprintf(items->tenant, sizeof(items->tenant), "%s", tenant);
    snprintf(items->job, sizeof(items->job), "%s", job);
    return 0;
}

/* SHOALD_LG_STORED: whether the record of *want's (tenant, job, host, minute) is stored, and
 * whether it is identical. */
typedef struct {
    const shoal_ledger_record_t *want;
    int found, same;
} shoald_lg_same_t;

static int shoald_lg_same_cb(const shoal_ledger_record_t *rec, void *arg)
{
    shoald_lg_same_t *s = arg;
    const shoal_ledger_record_t *w = s->want;

    if (strcmp(rec->host, w->host) != 0 || rec->minute != w->minute)
        return 0;
    s->found = 1;
    s->same = strcmp(rec->qos_class, w->qos_class) == 0 &&
              memcmp(&rec->gpu_seconds, &w->gpu_seconds, sizeof(double)) == 0 &&
              rec->bytes_same_host == w->bytes_same_host &&
              rec->bytes_cross_host == w->bytes_cross_host && rec->ops == w->ops &&
              memcmp(&rec->coll_seconds, &w->coll_seconds, sizeof(double)) == 0 &&
              rec->failed_platform == w->failed_platform &&
              rec->failed_tenant == w->failed_tenant;
    return 1;
}

static shoal_status_t shoald_lg_stored(shoal_ledger_t *ledger, shoald_lg_req_t *r)
{
    shoal_status_t st = SHOAL_OK;

    r->nsame = 0;
    for (size_t i = 0; i < r->nrecs && st == SHOAL_OK; i++) {
        shoald_lg_same_t s = {.want = &r->recs[i], .found = 0, .same = 0};

        st = shoal_ledger_each(ledger, r->recs[i].minute, r->recs[i].minute + 1,
                               r->recs[i].tenant, r->recs[i].job, shoald_lg_same_cb, &s);
        r->nsame += s.same;
        r->taken[i] = (uint8_t)s.found;
    }
    return st;
}

static void shoald_lg_run(shoald_lg_t *lg, shoald_lg_req_t *r)
{
    if (lg->ledger == NULL && r->op == SHOALD_LG_OPEN) {
        r->status = shoal_ledger_open(lg->url, lg->key, sizeof(lg->key), &lg->ledger);
        if (r->status != SHOAL_OK)
            lg->ledger = NULL;
    }
    if (lg->ledger == NULL) {
        if (r->op != SHOALD_LG_OPEN)
            r->status = SHOAL_ERR_TRANSPORT;
        return;
    }
    switch (r->op) {
    case SHOALD_LG_OPEN:
        if (shoal_ledger_head(lg->ledger, &r->head, NULL) != SHOAL_OK)
            r->head = UINT64_MAX;
        r->status = SHOAL_OK;
        break;
    case SHOALD_LG_CURSOR:
        r->status = shoal_ledger_cursor(lg->ledger, r->key, &r->cursor);
        break;
    case SHOALD_LG_LIST:
        r->status = SHOAL_OK;
        {
            shoal_status_t st = shoal_ledger_cursor_list(lg->ledger, r->key, shoald_lg_listed,
                                                         r);
            if (r->status == SHOAL_OK)
                r->status = st;
        }
        break;
    case SHOALD_LG_LAST_MINUTE:
        /* a failed read is a failure, not "none": the agent would bill a minute the ledger
         * may hold, the commit refuse it as a duplicate and move it to a later minute */
        r->status = shoal_ledger_last_minute_get(lg->ledger, r->tenant, r->job,
                                                 r->host[0] != '\0' ? r->host : NULL,
                                                 &r->minute);
        break;
    case SHOALD_LG_COMMIT:
        r->status = shoal_ledger_commit(lg->ledger, r->recs, r->nrecs, r->curs, r->ncurs);
        break;
    case SHOALD_LG_STORED:
        r->status = shoald_lg_stored(lg->ledger, r);
        break;
    }
}

static void *shoald_lg_main(void *arg)
{
    shoald_lg_t *lg = arg;
    shoald_lg_req_t *r;

    pthread_mutex_lock(&lg->mu);
    for (;;) {
        while (!lg->stop && (lg->req == NULL || lg->req->done))
            pthread_cond_wait(&lg->cv, &lg->mu);
        if (lg->req == NULL || lg->req->done)
            break; /* stop, nothing left to run */
        r = lg->req;
        pthread_mutex_unlock(&lg->mu);
        shoald_lg_run(lg, r);
        pthread_mutex_lock(&lg->mu);
        r->done = 1;
        if (r->abandoned) {
            if (r->op == SHOALD_LG_COMMIT) {
                lg->late_tag = r->tag;
                lg->late_status = r->status;
            }
            lg->req = NULL;
            shoald_lg_req_free(r);
        }
        pthread_cond_broadcast(&lg->cv);
    }
    pthread_mutex_unlock(&lg->mu);
    return NULL;
}

static void shoald_lg_free(shoald_lg_t *lg)
{
    shoal_secret_wipe(lg->url, strlen(lg->url)); /* it may hold the database's password */
    free(lg->url);
    shoal_secret_wipe(lg->key, sizeof(lg->key));
    free(lg);
}

static shoal_status_t shoald_lg_start(shoald_t *a)
{
    shoald_lg_t *lg = calloc(1, sizeof(*lg));
    pthread_condattr_t ca;
    int err;

    if (lg == NULL)
        return SHOAL_ERR_NO_MEMORY;
    lg->url = strdup(a->cfg->ledger_url);
    if (lg->url == NULL) {
        free(lg);
        return SHOAL_ERR_NO_MEMORY;
    }
    memcpy(lg->key, a->cfg->ledger_key, sizeof(lg->key));
    pthread_mutex_init(&lg->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&lg->cv, &ca);
    pthread_condattr_destroy(&ca);
    err = pthread_create(&lg->thread, NULL, shoald_lg_main, lg);
    if (err != 0) {
        shoal_error(METER, "ledger: cannot start its thread: %s", strerror(err));
        pthread_cond_destroy(&lg->cv);
        pthread_mutex_destroy(&lg->mu);
        shoald_lg_free(lg);
        return SHOAL_ERR_NO_MEMORY;
    }
    a->lg = lg;
    return SHOAL_OK;
}

/* Runs *r_p on the ledger's thread and waits for it wait_ms at most. SHOAL_ERR_TRANSPORT when
 * the thread is still busy with an earlier call or the call takes longer (the thread finishes
 * it and frees it: *r_p is set to NULL); otherwise its status. The caller frees *r_p. */
static shoal_status_t shoald_lg_call(shoald_t *a, shoald_lg_req_t **r_p, int wait_ms)
{
    shoald_lg_t *lg = a->lg;
    shoald_lg_req_t *r = *r_p;
    uint64_t deadline = shoal_deadline_ns(wait_ms);
    struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000ull),
                          .tv_nsec = (long)(deadline % 1000000000ull)};
    int err = 0;

    if (lg == NULL)
        return SHOAL_ERR_TRANSPORT;
    pthread_mutex_lock(&lg->mu);
    if (lg->req != NULL) {
        pthread_mutex_unlock(&lg->mu);
        return SHOAL_ERR_TRANSPORT; /* an earlier call still waits for the database */
    }
    lg->req = r;
    pthread_cond_broadcast(&lg->cv);
    while (!r->done && err != ETIMEDOUT)
        err = pthread_cond_timedwait(&lg->cv, &lg->mu, &ts);
    if (!r->done) {
        r->abandoned = 1;
        *r_p = NULL;
        pthread_mutex_unlock(&lg->mu);
        shoal_warn(METER, "ledger: the database did not answer within %d ms: the call goes on "
                   "in the background, the agent does not wait for it", wait_ms);
        return SHOAL_ERR_TRANSPORT;
    }
    lg->req = NULL;
    pthread_mutex_unlock(&lg->mu);
    return r->status;
}

static shoald_lg_req_t *shoald_lg_req(shoald_lg_op_t op)
{
    shoald_lg_req_t *r = calloc(1, sizeof(*r));

    if (r != NULL)
        r->op = op;
    return r;
}

/* shoal_ledger_cursor, on the ledger's thread. */
static shoal_status_t shoald_lg_cursor(shoald_t *a, const char *key, shoal_ledger_cursor_t *cur)
{
    shoald_lg_req_t *r = shoald_lg_req(SHOALD_LG_CURSOR);
    shoal_status_t st;

    if (r == NULL)
        return SHOAL_ERR_NO_MEMORY;
    snprintf(r->key, sizeof(r->key), "%s", key);
    st = shoald_lg_call(a, &r, SHOALD_LEDGER_WAIT_MS);
    if (r == NULL)
        return st; /* the thread's now */
    *cur = r->cursor;
    shoald_lg_req_free(r);
    return st;
}

/* shoal_ledger_last_minute, on the ledger's thread: SHOAL_OK and *minute_p (-1: none), or the
 * database did not answer. */
static shoal_status_t shoald_lg_last_minute(shoald_t *a, const char *tenant, const char *job,
                                            const char *host, int64_t *minute_p)
{
    shoald_lg_req_t *r = shoald_lg_req(SHOALD_LG_LAST_MINUTE);
    shoal_status_t st;

    if (r == NULL)
        return SHOAL_ERR_NO_MEMORY;
    snprintf(r->tenant, sizeof(r->tenant), "%s", tenant);
    snprintf(r->job, sizeof(r->job), "%s", job);
    snprintf(r->host, sizeof(r->host), "%s", host != NULL ? host : "");
    st = shoald_lg_call(a, &r, SHOALD_LEDGER_WAIT_MS);
    if (r == NULL)
        return st;
    *minute_p = r->minute;
    shoald_lg_req_free(r);
    return st;
}

/* shoal_ledger_commit of batch tag, on the ledger's thread. */
static shoal_status_t shoald_lg_commit(shoald_t *a, const void *tag,
                                       const shoal_ledger_record_t *recs, size_t nrecs,
                                       const shoal_ledger_cursor_t *curs, size_t ncurs,
                                       int wait_ms)
{
    shoald_lg_t *lg = a->lg;
    shoald_lg_req_t *r;
    shoal_status_t st;

    if (lg != NULL) {
        /* the same batch's last commit ended after the loop gave up on it: that is its
         * answer (a batch stays first in line until it is written) */
        pthread_mutex_lock(&lg->mu);
        int late = lg->req == NULL && lg->late_tag == tag;
        shoal_status_t late_st = lg->late_status;
        lg->late_tag = NULL;
        pthread_mutex_unlock(&lg->mu);
        if (late && late_st == SHOAL_OK)
            return SHOAL_OK;
        if (late)
            a->ledger_failures++; /* it failed in the end: not counted when it was left */
    }
    r = shoald_lg_req(SHOALD_LG_COMMIT);
    if (r == NULL)
        return SHOAL_ERR_NO_MEMORY;
    r->tag = tag;
    r->recs = malloc((nrecs + 1) * sizeof(*recs));
    r->curs = malloc((ncurs + 1) * sizeof(*curs));
    if (r->recs == NULL || r->curs == NULL) {
        shoald_lg_req_free(r);
        return SHOAL_ERR_NO_MEMORY;
    }
    if (nrecs > 0)
        memcpy(r->recs, recs, nrecs * sizeof(*recs));
    if (ncurs > 0)
        memcpy(r->curs, curs, ncurs * sizeof(*curs));
    r->nrecs = nrecs;
    r->ncurs = ncurs;
    st = shoald_lg_call(a, &r, wait_ms);
    if (r != NULL)
        shoald_lg_req_free(r);
    return st;
}

/* Which records of b the ledger holds (the same host's record of their minute): taken[i]
 * (b->nrecs entries, may be NULL) and how many of them are identical to b's in *nsame_p.
 * SHOAL_OK, or the database did not answer. */
static shoal_status_t shoald_lg_batch_lookup(shoald_t *a, const shoald_batch_t *b,
                                             int wait_ms, uint8_t *taken, size_t *nsame_p)
{
    shoald_lg_req_t *r = shoald_lg_req(SHOALD_LG_STORED);
    shoal_status_t st;

    if (r == NULL)
        return SHOAL_ERR_NO_MEMORY;
    r->recs = malloc((b->nrecs + 1) * sizeof(*r->recs));
    r->taken = calloc(b->nrecs + 1, 1);
    if (r->recs == NULL || r->taken == NULL) {
        shoald_lg_req_free(r);
        return SHOAL_ERR_NO_MEMORY;
    }
    if (b->nrecs > 0)
        memcpy(r->recs, b->recs, b->nrecs * sizeof(*r->recs));
    r->nrecs = b->nrecs;
    st = shoald_lg_call(a, &r, wait_ms);
    if (r == NULL)
        return st;
    if (st == SHOAL_OK && taken != NULL && b->nrecs > 0)
        memcpy(taken, r->taken, b->nrecs);
    if (st == SHOAL_OK)
        *nsame_p = r->nsame;
    shoald_lg_req_free(r);
    return st;
}

/* 1 when every record of b is in the ledger as b has it (the same host's), 0 when not or
 * the database did not answer. */
static int shoald_lg_batch_stored(shoald_t *a, const shoald_batch_t *b, int wait_ms)
{
    size_t nsame = 0;

    return shoald_lg_batch_lookup(a, b, wait_ms, NULL, &nsame) == SHOAL_OK && b->nrecs > 0 &&
           nsame == b->nrecs;
}

/* 1 while the database's answer to commit tag is still to come: the thread runs a call the
 * loop stopped waiting for (that commit, or an earlier call that holds the thread), or that
 * commit ended after the loop gave up and its result waits for the retry. Such a commit is
 * slow, not failed: shoald_lg_commit counts it once its answer is a failure. */
static int shoald_lg_answer_due(shoald_t *a, const void *tag)
{
    shoald_lg_t *lg = a->lg;
    int due;

    if (lg == NULL)
        return 0;
    pthread_mutex_lock(&lg->mu);
    due = lg->req != NULL || lg->late_tag == tag;
    pthread_mutex_unlock(&lg->mu);
    return due;
}

/* Waits until the thread has ended a call the loop gave up on, or the deadline passes. */
static void shoald_lg_idle_wait(shoald_t *a, uint64_t deadline_ns)
{
    shoald_lg_t *lg = a->lg;
    struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000ull),
                          .tv_nsec = (long)(deadline_ns % 1000000000ull)};
    int err = 0;

    if (lg == NULL)
        return;
    pthread_mutex_lock(&lg->mu);
    while (lg->req != NULL && err != ETIMEDOUT)
        err = pthread_cond_timedwait(&lg->cv, &lg->mu, &ts);
    pthread_mutex_unlock(&lg->mu);
}

/* Stops the thread and closes the ledger, once a call still running has ended (deadline_ns
 * at most); a thread that still waits for the database then is left to the process's exit
 * (its transaction is not committed: the database rolls it back). */
static void shoald_lg_stop(shoald_t *a, uint64_t deadline_ns)
{
    shoald_lg_t *lg = a->lg;
    int busy;

    if (lg == NULL)
        return;
    shoald_lg_idle_wait(a, deadline_ns);
    a->lg = NULL;
    pthread_mutex_lock(&lg->mu);
    lg->stop = 1;
    busy = lg->req != NULL;
    pthread_cond_broadcast(&lg->cv);
    pthread_mutex_unlock(&lg->mu);
    if (busy) {
        shoal_warn(METER, "ledger: the database still does not answer; not waiting for it");
        pthread_detach(lg->thread);
        return;
    }
    pthread_join(lg->thread, NULL);
    if (lg->ledger != NULL)
        shoal_ledger_close(lg->ledger);
    pthread_cond_destroy(&lg->cv);
    pthread_mutex_destroy(&lg->mu);
    shoald_lg_free(lg);
}

static int64_t shoald_minute_now_s(void)
{
    return (int64_t)(shoald_unix_ns() / 1000000000ull);
}

static int shoald_page_registered(const shoald_t *a, const char *key)
{
    for (const shoald_job_t *j = a->jobs; j != NULL; j = j->next) {
        for (const shoald_page_t *p = j->pages; p != NULL; p = p->next) {
            if (!p->superseded && strcmp(p->key, key) == 0)
                return 1;
        }
    }
    return 0;
}

static void shoald_rejoin_gone(shoald_rejoin_t *r)
{
    r->gone = 1;
    shoal_info(METER, "%s/%s: the process of page %s ended while no agent ran: its time after "
               "its ledger cursor is not known, and not billed; the cursor is deleted",
               r->tenant, r->job, r->key);
}

/* The ledger's open pages of this host (keys "host:pid:comm:rank:created"). */
static int shoald_rejoin_listed(const char *key, const char *tenant, const char *job, void *arg)
{
    shoald_t *a = arg;
    const char *s = strchr(key, ':'), *last = strrchr(key, ':');
    unsigned long long created;
    shoald_rejoin_t *r;
    uint64_t start;
    char *end;
    long pid;

    if (s == NULL || last == s)
        return 0;
    pid = strtol(s + 1, &end, 10);
    created = strtoull(last + 1, NULL, 10);
    if (end == s + 1 || *end != ':' || pid <= 0 || pid > INT32_MAX)
        return 0;
    if (shoald_page_registered(a, key))
        return 0;
    start = shoald_proc_start_ns((pid_t)pid);
    /* The pid runs a process that started after the page was made: another one, it seems.
     * The creation time is the job's word (the key keeps what it sent), so that process is
     * not waited for, but its cursor is kept: deleting the cursor of a rank that runs would
     * bill all its counters again when it registers. (The start is read to the clock tick,
     * the boot time to the second: 2 s of slack.) */
    if (start != 0 && created != 0 && start > created + 2000000000ull)
        return 0;
    if (start != 0 && shoal_deadline_passed(a->rejoin_wait_until_ns))
        return 0; /* running, and nothing to wait for (rejoin_wait=0) */
    r = calloc(1, sizeof(*r));
    if (r == NULL)
        return 1; /* nothing to wait for is safe: the rejoin grace and the fold log remain */
    snprintf(r->key, sizeof(r->key), "%s", key);
    snprintf(r->tenant, sizeof(r->tenant), "%s", tenant);
    snprintf(r->job, sizeof(r->job), "%s", job);
    r->pid = (pid_t)pid;
    r->start_ns = start;
    r->gone = start == 0; /* no such process: its cursor goes */
    r->next = a->rejoins;
    a->rejoins = r;
    if (r->gone)
        shoald_rejoin_gone(r);
    else
        shoal_info(METER, "%s/%s: page %s was open when the last agent stopped and its "
                   "process runs: the job is billed once it registers again (or exits; %d s "
                   "at most)", r->tenant, r->job, r->key, a->cfg->rejoin_wait_ms / 1000);
    return 0;
}

/* Once per agent, when the ledger first answers: the pages to wait for, and those whose
 * process is gone (their cursors go). */
static void shoald_rejoins_list(shoald_t *a, int wait_ms)
{
    shoald_lg_req_t *r;
    shoal_status_t st;

    if (a->rejoins_listed || a->ledger == NULL)
        return;
    r = shoald_lg_req(SHOALD_LG_LIST);
    if (r == NULL)
        return;
    snprintf(r->key, sizeof(r->key), "%s:", a->host_key); /* as shoald_page_add keys */
    st = shoald_lg_call(a, &r, wait_ms);
    for (size_t i = 0; st == SHOAL_OK && i < r->nitems; i++) {
        if (shoald_rejoin_listed(r->items[i].key, r->items[i].tenant, r->items[i].job, a) != 0)
            break;
    }
    if (r != NULL)
        shoald_lg_req_free(r);
    if (st == SHOAL_OK)
        a->rejoins_listed = 1;
    else
        shoal_warn(METER, "the ledger's open pages cannot be read (%s): retrying",
                   shoal_strerror(st));
}

/* Drops the pages that registered again, or all once rejoin_wait has passed; marks those
 * whose process ended gone. */
static void shoald_rejoins_check(shoald_t *a)
{
    int waited = shoal_deadline_passed(a->rejoin_wait_until_ns);
    shoald_rejoin_t **link = &a->rejoins, *r;

    shoald_rejoins_list(a, SHOALD_LEDGER_WAIT_MS);
    while ((r = *link) != NULL) {
        int drop = 0;

        if (r->gone) {
            /* left for the next batch (shoald_rejoins_gone_to) */
        } else if (shoald_page_registered(a, r->key)) {
            shoal_info(METER, "%s/%s: page %s registered again", r->tenant, r->job, r->key);
            drop = 1;
        } else if (shoald_proc_start_ns(r->pid) != r->start_ns) {
            shoald_rejoin_gone(r); /* the start this agent read itself: the same process */
        } else if (waited) {
            shoal_warn(METER, "%s/%s: page %s did not register again within rejoin_wait "
                       "(%d s): its job is billed without it", r->tenant, r->job, r->key,
                       a->cfg->rejoin_wait_ms / 1000);
            drop = 1;
        }
        if (!drop) {
            link = &r->next;
            continue;
        }
        *link = r->next;
        free(r);
    }
}

/* 1 while a page of job j is awaited. */
static int shoald_rejoin_awaited(const shoald_t *a, const shoald_job_t *j)
{
    for (const shoald_rejoin_t *r = a->rejoins; r != NULL; r = r->next) {
        if (!r->gone && strcmp(r->tenant, j->tenant) == 0 && strcmp(r->job, j->job) == 0)
            return 1;
    }
    return 0;
}

int shoald_rejoin_expected(const shoald_t *a, const char *tenant, const char *job, pid_t pid)
{
    for (const shoald_rejoin_t *r = a->rejoins; r != NULL; r = r->next) {
        if (!r->gone && r->pid == pid && strcmp(r->tenant, tenant) == 0 &&
            strcmp(r->job, job) == 0 && r->start_ns != 0 &&
            shoald_proc_start_ns(pid) == r->start_ns)
            return 1;
    }
    return 0;
}

/* The cursors of the gone pages join batch b (deleted with its commit; a batch that fails is
 * retried as it is), and leave the list. */
static void shoald_rejoins_gone_to(shoald_t *a, shoald_batch_t *b)
{
    shoald_rejoin_t **link = &a->rejoins, *r;
    shoal_ledger_cursor_t *c;

    while ((r = *link) != NULL) {
        if (!r->gone) {
            link = &r->next;
            continue;
        }
        c = &b->curs[b->ncurs++];
        memset(c, 0, sizeof(*c));
        snprintf(c->key, sizeof(c->key), "%s", r->key);
        c->ncounters = -1;
        *link = r->next;
        free(r);
    }
}

/* A record's minute of batch b exists already for this host (another agent with our host
 * name wrote it: each host has its own records): that record moves after the stored ones of
 * its job and after the batch's other minutes of its job, so its counters still reach the
 * ledger once. The batch's other records keep their minutes: every record of a job at or
 * before the stored last minute was moved, one minute per record, the minutes nobody held
 * included (a job's time a minute or more away from when it ran). Which records are taken is
 * asked of the ledger; when it does not answer, nothing moves (the commit is retried). */
static void shoald_batch_shift(shoald_t *a, shoald_batch_t *b, int wait_ms)
{
    uint8_t *taken = calloc(b->nrecs + 1, 1);
    size_t nsame;

    if (taken == NULL || shoald_lg_batch_lookup(a, b, wait_ms, taken, &nsame) != SHOAL_OK) {
        free(taken);
        return;
    }
    for (size_t i = 0; i < b->nrecs; i++) {
        shoal_ledger_record_t *r = &b->recs[i];
        int64_t floor = -1;

        if (!taken[i])
            continue;
        if (shoald_lg_last_minute(a, r->tenant, r->job, r->host, &floor) != SHOAL_OK)
            floor = -1;

        if (floor >= 0)
            floor += a->cfg->minute_seconds;
        for (size_t k = 0; k < b->nrecs; k++) {
            if (k != i && strcmp(b->recs[k].tenant, r->tenant) == 0 &&
                strcmp(b->recs[k].job, r->job) == 0)
                floor = SHOAL_MAX(floor, b->recs[k].minute + a->cfg->minute_seconds);
        }
        if (r->minute < floor)
            r->minute = floor;
    }
    free(taken);
}

/* Writes the batches an earlier agent spooled, in order; 0 once none is left. Until then the
 * ledger does not count as open: a cursor or a job's last minute read before them would bill
 * their minutes again. After each batch the spool is rewritten without it (a replay of a
 * stored batch after later ones moved its cursors would not be taken as exact). */
static int shoald_spool_replay(shoald_t *a, int wait_ms)
{
    shoald_batch_t *b;
    shoal_status_t st;

    while ((b = a->spooled) != NULL) {
        int stored = 0;

        st = shoald_lg_commit(a, b, b->recs, b->nrecs, b->curs, b->ncurs, wait_ms);
        if (st == SHOAL_ERR_INVALID_ARG && shoald_lg_batch_stored(a, b, wait_ms)) {
            /* stored, and its cursors moved on since: the spool was replayed before and not
             * rewritten after (or put back); not a replay the ledger can tell as exact */
            shoal_warn(METER, "ledger: the spooled minute %lld (%zu records) is in the "
                       "ledger already, as spooled: not written again", (long long)b->minute,
                       b->nrecs);
            stored = 1;
            st = SHOAL_OK;
        } else if (st == SHOAL_ERR_INVALID_ARG) {
            shoald_batch_shift(a, b, wait_ms);
            st = shoald_lg_commit(a, b, b->recs, b->nrecs, b->curs, b->ncurs, wait_ms);
        }
        if (st != SHOAL_OK) {
            a->ledger_failures++;
            shoal_warn(METER, "ledger: the spooled minute %lld (%zu records) cannot be "
                       "written (%s); %u spooled minutes wait, nothing else is read from the "
                       "ledger until they are written", (long long)b->minute, b->nrecs,
                       shoal_strerror(st), a->nspooled);
            return -1;
        }
        if (!stored) {
            a->ledger_commits++;
            a->ledger_records += b->nrecs;
            shoal_info(METER, "ledger: the spooled minute %lld (%zu records) is written",
                       (long long)b->minute, b->nrecs);
        }
        a->spooled = b->next;
        a->nspooled--;
        shoald_batch_free(b);
        if (shoald_spool_save(a, a->spooled, NULL) != SHOAL_OK)
            (void)shoald_spool_save(a, NULL, NULL); /* the rest are spooled again at the stop */
    }
    return 0;
}

static void shoald_ledger_open(shoald_t *a, int wait_ms)
{
    shoald_lg_req_t *r;
    shoal_status_t st;
    shoald_job_t *j;
    shoald_page_t *p;
    uint64_t head = UINT64_MAX;
    char url[512];

    if (a->ledger != NULL || a->cfg->ledger_url == NULL)
        return;
    r = shoald_lg_req(SHOALD_LG_OPEN);
    if (r == NULL)
        return;
    st = shoald_lg_call(a, &r, wait_ms);
    if (st == SHOAL_OK)
        head = r->head;
    if (r != NULL)
        shoald_lg_req_free(r);
    if (st != SHOAL_OK) {
        a->ledger = NULL;
        a->ledger_failures++;
        shoal_ledger_url_redact(a->cfg->ledger_url, url, sizeof(url));
        shoal_warn(METER, "ledger %s cannot be opened (%s): holding minutes in memory, "
                   "retrying", url, shoal_strerror(st));
        return;
    }
    if (shoald_spool_replay(a, wait_ms) != 0)
        return; /* not open for the agent yet: retried as a closed ledger is */
    a->ledger = a->lg->ledger; /* a mark that it is open: only the thread calls it */
    if (head != UINT64_MAX)
        shoal_info(METER, "ledger open, its chain at seq %llu", (unsigned long long)head);
    for (j = a->jobs; j != NULL; j = j->next) {
        j->last_minute_known = 0;
        for (p = j->pages; p != NULL; p = p->next)
            shoald_page_cursor(a, p);
    }
}

void shoald_page_cursor(shoald_t *a, shoald_page_t *p)
{
    shoal_ledger_cursor_t cur;
    shoal_status_t st;
    int i;

    if (p->cursor_known)
        return;
    if (a->cfg->ledger_url == NULL) {
        p->cursor_known = 1;
        return;
    }
    if (a->ledger == NULL)
        return;
    memset(&cur, 0, sizeof(cur));
    st = shoald_lg_cursor(a, p->key, &cur);
    if (st == SHOAL_ERR_INVALID_ARG && strcmp(a->host_key, a->hostname) != 0) {
        /* none: an agent before the long host name was hashed may have keyed it with the
         * name's first 32 characters; resume from that one, deleted once the new is written */
        snprintf(p->legacy_key, sizeof(p->legacy_key), "%.32s%s", a->hostname,
                 p->key + strlen(a->host_key));
        st = shoald_lg_cursor(a, p->legacy_key, &cur);
        if (st != SHOAL_OK)
            p->legacy_key[0] = '\0';
        else
            shoal_info(METER, "page %s resumes from the cursor of its older key %s", p->key,
                       p->legacy_key);
    }
    if (st == SHOAL_OK && (cur.ncounters == SHOALD_CUR_NCOUNTERS_V1 ||
                           cur.ncounters == SHOALD_CUR_NCOUNTERS_V2)) {
        /* written before cuda_ipc (V1) or before nccl (V2): every entry after the old
         * transports moves up; the new transports' entries start at 0 (that agent billed none
         * of them) */
        int nold = (cur.ncounters == SHOALD_CUR_NCOUNTERS_V1 ? SHOAL_METER_NTL
                                                             : SHOAL_METER_NTL + 1) *
                   SHOAL_METER_NLOC;
        for (i = 0; i < SHOALD_CTR_SENT + nold; i++)
            p->billed[i] = cur.counters[i];
        for (i = 0; i < nold; i++)
            p->billed[SHOALD_CTR_RECV + i] = cur.counters[SHOALD_CTR_SENT + nold + i];
        for (i = SHOALD_CTR_COLL_NS; i < SHOALD_CUR_NCOUNTERS; i++)
            p->billed[i] = cur.counters[SHOALD_CTR_SENT + 2 * nold + (i - SHOALD_CTR_COLL_NS)];
        shoal_info(METER, "page %s resumes from its ledger cursor (written before %s)", p->key,
                   cur.ncounters == SHOALD_CUR_NCOUNTERS_V1 ? "cuda_ipc" : "nccl");
    } else if (st == SHOAL_OK) {
        for (i = 0; i < cur.ncounters && i < SHOALD_CUR_NCOUNTERS; i++)
            p->billed[i] = cur.counters[i];
        shoal_info(METER, "page %s resumes from its ledger cursor", p->key);
    } else if (st != SHOAL_ERR_INVALID_ARG) {
        /* the database did not answer: "no cursor" is not known, so the page stays out of
         * the batches (its counters keep growing in the page) until it does */
        shoal_warn(METER, "the ledger cursor of page %s cannot be read (%s): billing it once "
                   "the database answers", p->key, shoal_strerror(st));
        return;
    }
    if (p->billed[SHOALD_CUR_BILLED_NS] < p->created_ns)
        p->billed[SHOALD_CUR_BILLED_NS] = p->created_ns;
    for (i = 0; i < SHOALD_NCTR; i++) {
        if (p->ctr[i] < p->billed[i])
            p->ctr[i] = p->billed[i];
    }
    p->cursor_known = 1;
}

void shoald_batch_free(shoald_batch_t *b)
{
    free(b->recs);
    free(b->curs);
    free(b);
}

/* Adds page p's counter deltas to rec, and its new cursor (billed up to to_ns) to the batch.
 * A page that ended for good (its communicator destroyed or its process gone: it cannot
 * register again) and is billed to its end is done: its cursor is deleted. A page whose
 * connection closed while it was live keeps its cursor: the library registers it again. */
static void shoald_minute_page(shoald_page_t *p, uint64_t to_ns, shoal_ledger_record_t *rec,
                               shoal_ledger_cursor_t *cur)
{
    uint64_t d[SHOALD_NCTR], upto;
    int i, l;

    for (i = 0; i < SHOALD_NCTR; i++)
        d[i] = p->ctr[i] - p->billed[i];
    for (i = 0; i < SHOAL_METER_NCOLL; i++)
        rec->ops += d[SHOALD_CTR_OPS + i];
    for (i = 0; i < SHOALD_NTL; i++) {
        for (l = 0; l < SHOAL_METER_NLOC; l++) {
            if (l == SHOAL_METER_SAME_HOST)
                rec->bytes_same_host += d[SHOALD_CTR_SENT + i * SHOAL_METER_NLOC + l];
            else
                rec->bytes_cross_host += d[SHOALD_CTR_SENT + i * SHOAL_METER_NLOC + l];
        }
    }
    rec->coll_seconds += (double)d[SHOALD_CTR_COLL_NS] / 1e9;
    upto = p->end_ns != 0 ? SHOAL_MIN(p->end_ns, to_ns) : to_ns;
    if (upto < p->billed[SHOALD_CUR_BILLED_NS])
        upto = p->billed[SHOALD_CUR_BILLED_NS];
    memcpy(p->billed, p->ctr, sizeof(p->ctr));
    p->billed[SHOALD_CUR_BILLED_NS] = upto;
    memset(cur, 0, sizeof(*cur));
    snprintf(cur->key, sizeof(cur->key), "%s", p->key);
    snprintf(cur->tenant, sizeof(cur->tenant), "%s", p->job->tenant);
    snprintf(cur->job, sizeof(cur->job), "%s", p->job->job);
    memcpy(cur->counters, p->billed, sizeof(p->billed));
    cur->ncounters = p->final && upto >= p->end_ns ? -1 : SHOALD_CUR_NCOUNTERS;
}

/* A page the batch bills: its cursor is known, it is the newest registration of its key, and
 * it is not billed to its end yet. */
static int shoald_minute_billable(const shoald_page_t *p)
{
    return p->cursor_known && !p->superseded && !(p->end_ns != 0 &&
           p->billed[SHOALD_CUR_BILLED_NS] >= p->end_ns &&
           memcmp(p->billed, p->ctr, sizeof(p->ctr)) == 0);
}

/* A billable page's unbilled time before minute t (arg: its start, unix ns). */
static int shoald_minute_before(const shoald_page_t *q, void *arg, uint64_t *s, uint64_t *e)
{
    uint64_t t_ns = *(const uint64_t *)arg;

    if (!shoald_minute_billable(q))
        return 0;
    *s = SHOAL_MAX(q->billed[SHOALD_CUR_BILLED_NS], q->created_ns);
    *e = q->end_ns != 0 ? SHOAL_MIN(q->end_ns, t_ns) : t_ns;
    return *e > *s;
}

/* Minutes of one job in one batch, at most (the oldest unbilled time folds into the first). */
#define SHOALD_MINUTE_FILL_MAX 1440

static shoal_ledger_record_t *shoald_batch_rec(shoald_batch_t *b, size_t *cap)
{
    shoal_ledger_record_t *r;

    if (b->nrecs == *cap) {
        r = realloc(b->recs, (*cap * 2 + 8) * sizeof(*r));
        if (r == NULL)
            return NULL;
        b->recs = r;
        *cap = *cap * 2 + 8;
    }
    r = &b->recs[b->nrecs];
    memset(r, 0, sizeof(*r));
    return r;
}

/* The records of job j for the minutes up to `minute`. Normally one: the minute that just
 * ended. When the job's time since its last billed minute spans several minutes (the agent
 * was down, or killed, in between), one record per minute in which a rank of the job lived,
 * so that the ledger has no gap over the job's life: each carries the GPU-seconds of its own
 * minute (exact: the ranks' creation and end are known), the counters' deltas go to the last
 * one (where they were read; when within the gap they moved is not known).
 * A page whose unbilled time starts in a minute the ledger already holds for the job (a
 * rank that registered again after an agent restart once the job's next minutes were billed
 * without it, a registration that straddled a minute's end, a cursor the database did not
 * answer for) cannot go back into those records (one per tenant, job and minute, chained):
 * that time goes into the first open minute, which then holds more than its ranks could
 * live in it. The sum stays exact; the agent says so (shoald_minute_fold), with the seconds,
 * so that a provider can tell such a minute from an error. After a restart the first batch
 * waits rejoin_grace for the running ranks to come back, so that an agent restart alone
 * does not fold the time of ranks that make calls. The seconds are the process's, as the
 * minute bills them (its GPUs once however many of its communicators folded,
 * shoald_proc_gpu_seconds), logged once, at its first page that folds: each page's seconds,
 * logged per page, said twice what was folded for a rank with two communicators. */
static void shoald_minute_fold(const shoald_job_t *j, const shoald_page_t *p, int64_t t,
                               uint64_t from)
{
    uint64_t t_ns = (uint64_t)t * 1000000000ull;
    double s = shoald_proc_billed_gpu_seconds(p, shoald_minute_before, &t_ns);

    if (s > 0.0) {
        shoal_warn(METER, "%s/%s: rank %d (page %s) was not billed from %.3f s; the job's "
                   "minutes before %lld are in the ledger: its %.6f GPU-seconds before then "
                   "folded into minute %lld", j->tenant, j->job, (int)p->rank, p->key,
                   (double)from / 1e9, (long long)t, s, (long long)t);
    }
}

/* Minute t of a batch that bills minutes first..minute (to_ns the batch's end): a billable
 * page's unbilled time in it (the first takes all before it), as shoald_minute_job bills it. */
typedef struct {
    int64_t t, first, minute, m;
    uint64_t to_ns;
} shoald_minute_win_t;

static int shoald_minute_span(const shoald_page_t *p, void *arg, uint64_t *s, uint64_t *e)
{
    const shoald_minute_win_t *w = arg;
    uint64_t from = p->billed[SHOALD_CUR_BILLED_NS], lo, hi;

    if (!shoald_minute_billable(p))
        return 0;
    lo = w->t == w->first ? from : SHOAL_MAX(from, (uint64_t)w->t * 1000000000ull);
    hi = w->t == w->minute ? w->to_ns : (uint64_t)(w->t + w->m) * 1000000000ull;
    *s = SHOAL_MAX(lo, p->created_ns);
    *e = p->end_ns != 0 ? SHOAL_MIN(p->end_ns, hi) : hi;
    return *e > *s;
}

static shoal_status_t shoald_minute_job(shoald_t *a, shoald_job_t *j, int64_t minute,
                                        uint64_t to_ns, shoald_batch_t *b, size_t *cap)
{
    int64_t m = a->cfg->minute_seconds, first = minute, t, s;
    shoal_ledger_record_t *rec = NULL;
    int64_t last0 = j->last_minute;
    size_t nrecs0 = b->nrecs;
    shoald_page_t *p;
    uint64_t from, lo, hi, end;
    int used = 0, alive;
    shoald_minute_win_t win;

    for (p = j->pages; p != NULL; p = p->next) {
        if (!shoald_minute_billable(p))
            continue;
        s = (int64_t)(p->billed[SHOALD_CUR_BILLED_NS] / 1000000000ull) / m * m;
        first = SHOAL_MIN(first, s);
    }
    if (j->last_minute >= 0)
        first = SHOAL_MAX(first, j->last_minute + m);
    first = SHOAL_MAX(first, minute - (SHOALD_MINUTE_FILL_MAX - 1) * m);
    win = (shoald_minute_win_t){.first = first, .minute = minute, .m = m, .to_ns = to_ns};
    for (t = first; t <= minute; t += m) {
        alive = 0;
        for (p = j->pages; p != NULL; p = p->next) {
            if (!shoald_minute_billable(p))
                continue;
            /* the page's unbilled time within this minute (the first takes all before it) */
            from = p->billed[SHOALD_CUR_BILLED_NS];
            lo = t == first ? from : SHOAL_MAX(from, (uint64_t)t * 1000000000ull);
            if (t == first && from < (uint64_t)t * 1000000000ull)
                shoald_minute_fold(j, p, t, from);
            hi = t == minute ? to_ns : (uint64_t)(t + m) * 1000000000ull;
            end = p->end_ns != 0 ? SHOAL_MIN(p->end_ns, hi) : hi;
            if (end <= SHOAL_MAX(lo, p->created_ns))
                continue;
            if (!alive) {
                rec = shoald_batch_rec(b, cap);
                if (rec == NULL)
                    goto err_oom;
                alive = 1;
            }
            /* a process's GPUs once, however many of its communicators lived in t */
            win.t = t;
            rec->gpu_seconds += shoald_proc_billed_gpu_seconds(p, shoald_minute_span, &win);
        }
        if (t < minute && alive)
            rec->minute = t;
        else if (t < minute)
            continue;
        if (t == minute) {
            if (!alive) {
                rec = shoald_batch_rec(b, cap);
                if (rec == NULL)
                    goto err_oom;
            }
            for (p = j->pages; p != NULL; p = p->next) {
                if (!shoald_minute_billable(p))
                    continue;
                if (p->end_ns == 0)
                    shoald_page_read(p);
                shoald_minute_page(p, to_ns, rec, &b->curs[b->ncurs++]);
                if (p->legacy_key[0] != '\0') {
                    /* in the same commit as the cursor under its key */
                    shoal_ledger_cursor_t *c = &b->curs[b->ncurs++];
                    memset(c, 0, sizeof(*c));
                    snprintf(c->key, sizeof(c->key), "%s", p->legacy_key);
                    c->ncounters = -1;
                    p->legacy_key[0] = '\0';
                }
                used = 1;
            }
            if (!used && !alive && j->failed_platform == 0 && j->failed_tenant == 0)
                return SHOAL_OK; /* nothing to bill: the record is not kept */
            rec->minute = minute;
            rec->failed_platform = j->failed_platform;
            rec->failed_tenant = j->failed_tenant;
            j->failed_platform = 0;
            j->failed_tenant = 0;
        }
        snprintf(rec->tenant, sizeof(rec->tenant), "%s", j->tenant);
        snprintf(rec->job, sizeof(rec->job), "%s", j->job);
        snprintf(rec->qos_class, sizeof(rec->qos_class), "%s", j->class_name);
        snprintf(rec->host, sizeof(rec->host), "%s", a->host_key);
        b->nrecs++;
        j->last_minute = rec->minute;
    }
    j->last_minute_known = a->ledger != NULL;
    return SHOAL_OK;

err_oom:
    /* before the last minute's record: no page's cursor moved yet, the job is left out */
    b->nrecs = nrecs0;
    j->last_minute = last0;
    return SHOAL_ERR_NO_MEMORY;
}

static shoald_batch_t *shoald_minute_build(shoald_t *a, int64_t boundary)
{
    int64_t minute = boundary - a->cfg->minute_seconds;
    uint64_t to_ns = (uint64_t)boundary * 1000000000ull;
    shoald_batch_t *b;
    shoald_job_t *j;
    shoald_page_t *p;
    size_t npages = 0, cap = 0;
    int64_t stored;

    for (j = a->jobs; j != NULL; j = j->next) {
        for (p = j->pages; p != NULL; p = p->next)
            npages += 1 + (p->legacy_key[0] != '\0');
    }
    for (const shoald_rejoin_t *r = a->rejoins; r != NULL; r = r->next)
        npages += r->gone;
    b = calloc(1, sizeof(*b));
    if (b == NULL || (b->curs = calloc(npages + 1, sizeof(*b->curs))) == NULL)
        goto err_oom;
    b->minute = minute;
    shoald_rejoins_gone_to(a, b);
    for (j = a->jobs; j != NULL; j = j->next) {
        for (p = j->pages; p != NULL && a->ledger != NULL; p = p->next) {
            if (!p->cursor_known && !p->superseded)
                shoald_page_cursor(a, p); /* the database did not answer before */
        }
        /* The ledger's last minute of the job, or the job's own when that is later: a
         * minute billed while the ledger was not open is held in memory, not in the ledger
         * yet. Read as it was (and as 0 when the read failed), the job was billed again over
         * the held minute, that commit refused as a duplicate and each of its records moved
         * after the held one, into the future. */
        if (a->ledger != NULL && !j->last_minute_known &&
            shoald_lg_last_minute(a, j->tenant, j->job, a->host_key, &stored) == SHOAL_OK) {
            j->last_minute = SHOAL_MAX(j->last_minute, stored);
            j->last_minute_known = 1;
        }
        if (j->last_minute_known && j->last_minute >= minute)
            continue; /* that minute is in the ledger (an agent before us): next one */
        if (shoald_rejoin_awaited(a, j))
            continue; /* billed at a boundary after its page is back (or given up) */
        if (shoald_minute_job(a, j, minute, to_ns, b, &cap) != SHOAL_OK)
            goto err_oom;
    }
    return b;

err_oom:
    /* the pages' billed[] of the jobs done so far moved on: rebuilding would lose them, so
     * what was built goes to the ledger; nothing of the failed or unbuilt jobs was touched */
    if (b != NULL && b->curs != NULL && (b->nrecs > 0 || b->ncurs > 0))
        return b;
    if (b != NULL)
        shoald_batch_free(b);
    shoal_error(METER, "out of memory building the minute %lld: retrying next minute",
                (long long)minute);
    return NULL;
}

/* Writes pending batches in order while the ledger takes them. */
/* Removes the records and cursors of b that no commit would take (logged in full, so that
 * a provider can bill them by hand); returns how many. Such a record means a defect of the
 * agent; kept, it would hold every later minute of every job in memory for ever. */
static size_t shoald_batch_drop_malformed(shoald_t *a, shoald_batch_t *b)
{
    size_t i, k = 0, dropped = 0;

    for (i = 0; i < b->nrecs; i++) {
        const shoal_ledger_record_t *r = &b->recs[i];

        if (shoal_ledger_record_ok(r)) {
            b->recs[k++] = *r;
            continue;
        }
        dropped++;
        shoal_error(METER, "ledger: dropping a malformed record that no commit takes: tenant "
                    "'%.*s' job '%.*s' class '%.*s' minute %lld: %.3f GPU-seconds, %llu bytes "
                    "same host, %llu cross host, %llu operations, %.3f s in collectives",
                    (int)sizeof(r->tenant), r->tenant, (int)sizeof(r->job), r->job,
                    (int)sizeof(r->qos_class), r->qos_class, (long long)r->minute,
                    r->gpu_seconds, (unsigned long long)r->bytes_same_host,
                    (unsigned long long)r->bytes_cross_host, (unsigned long long)r->ops,
                    r->coll_seconds);
    }
    b->nrecs = k;
    for (i = 0, k = 0; i < b->ncurs; i++) {
        if (shoal_ledger_cursor_ok(&b->curs[i])) {
            b->curs[k++] = b->curs[i];
            continue;
        }
        dropped++;
        shoal_error(METER, "ledger: dropping a malformed cursor (key '%.*s')",
                    (int)sizeof(b->curs[i].key), b->curs[i].key);
    }
    b->ncurs = k;
    a->ledger_dropped += dropped;
    return dropped;
}

/* stop_ns: 0, or the stop's deadline (the commits wait for the database until then). */
static void shoald_ledger_flush(shoald_t *a, uint64_t stop_ns)
{
    shoald_batch_t *b;
    shoal_status_t st;

    if (a->pending == NULL)
        return;
    shoald_ledger_open(a, SHOALD_LEDGER_WAIT_MS);
    while ((b = a->pending) != NULL && a->ledger != NULL) {
        if (stop_ns != 0)
            shoald_lg_idle_wait(a, stop_ns); /* a commit of b the loop gave up on: its end */
        st = shoald_lg_commit(a, b, b->recs, b->nrecs, b->curs, b->ncurs,
                              stop_ns != 0 ? shoal_deadline_left_ms(stop_ns,
                                                                    SHOALD_LEDGER_STOP_WAIT_MS)
                                           : SHOALD_LEDGER_WAIT_MS);
        if (st != SHOAL_OK) {
            /* a commit that outlasted the loop's wait was counted as a failed one, at each
             * retry while it ran: a database that answers in 150 ms raised
             * shoal_ledger_commit_failures_total every minute without failing once */
            int slow = st == SHOAL_ERR_TRANSPORT && shoald_lg_answer_due(a, b);

            if (!slow)
                a->ledger_failures++;
            a->ledger_backoff_ms = a->ledger_backoff_ms == 0 ? SHOALD_LEDGER_BACKOFF_MIN_MS :
                SHOAL_MIN(2 * a->ledger_backoff_ms, SHOALD_LEDGER_BACKOFF_MAX_MS);
            a->ledger_next_try_ns = shoal_deadline_ns(a->ledger_backoff_ms);
            size_t nrecs = b->nrecs, dropped = st == SHOAL_ERR_INVALID_ARG ?
                shoald_batch_drop_malformed(a, b) : 0;
            if (slow) {
                shoal_info(METER, "ledger commit of minute %lld (%zu records) still waits for "
                           "the database; %u minutes held in memory, looking again in %d ms",
                           (long long)b->minute, nrecs, a->npending, a->ledger_backoff_ms);
            } else if (dropped > 0) {
                shoal_warn(METER, "ledger commit of minute %lld (%zu records) failed: %s; %zu "
                           "malformed entries dropped, retrying at once", (long long)b->minute,
                           nrecs, shoal_strerror(st), dropped);
            } else {
                shoal_warn(METER, "ledger commit of minute %lld (%zu records) failed: %s; %u "
                           "minutes held in memory, retrying in %d ms", (long long)b->minute,
                           nrecs, shoal_strerror(st), a->npending, a->ledger_backoff_ms);
            }
            if (dropped > 0) {
                /* a batch that can never be written would hold every later minute back */
                a->ledger_next_try_ns = shoal_deadline_ns(0);
            } else if (st == SHOAL_ERR_INVALID_ARG) {
                shoald_batch_shift(a, b, stop_ns != 0 ?
                                   shoal_deadline_left_ms(stop_ns, SHOALD_LEDGER_STOP_WAIT_MS) :
                                   SHOALD_LEDGER_WAIT_MS);
            }
            return;
        }
        if (a->ledger_backoff_ms != 0)
            shoal_info(METER, "ledger writes again (minute %lld)", (long long)b->minute);
        a->ledger_backoff_ms = 0;
        a->ledger_commits++;
        a->ledger_records += b->nrecs;
        a->pending = b->next;
        a->npending--;
        shoald_batch_free(b);
    }
    if (a->ledger == NULL) {
        a->ledger_backoff_ms = a->ledger_backoff_ms == 0 ? SHOALD_LEDGER_BACKOFF_MIN_MS :
            SHOAL_MIN(2 * a->ledger_backoff_ms, SHOALD_LEDGER_BACKOFF_MAX_MS);
        a->ledger_next_try_ns = shoal_deadline_ns(a->ledger_backoff_ms);
    }
}

void shoald_minute_init(shoald_t *a)
{
    int64_t now = shoald_minute_now_s(), m = a->cfg->minute_seconds;

    a->next_boundary = (now / m + 1) * m;
    /* without a ledger there is nothing to wait for: a deadline of 0 has passed */
    a->rejoin_until_ns = a->cfg->ledger_url != NULL ? shoal_deadline_ns(a->cfg->rejoin_grace_ms)
                                                    : 0;
    a->rejoin_wait_until_ns = a->cfg->ledger_url != NULL ?
                                  shoal_deadline_ns(a->cfg->rejoin_wait_ms) : 0;
    if (a->cfg->ledger_url != NULL)
        (void)shoald_spool_load(a, &a->spooled, &a->nspooled); /* a refusal is logged */
    else
        shoald_spool_unread(a);
    if (a->cfg->ledger_url != NULL && shoald_lg_start(a) == SHOAL_OK) {
        /* nothing is served yet: the first open may take a connection's time */
        shoald_ledger_open(a, SHOALD_LEDGER_OPEN_WAIT_MS);
        shoald_rejoins_list(a, SHOALD_LEDGER_OPEN_WAIT_MS);
    }
    if (a->cfg->ledger_url != NULL && a->ledger == NULL)
        a->ledger_next_try_ns = shoal_deadline_ns(SHOALD_LEDGER_BACKOFF_MIN_MS);
}

void shoald_minute_tick(shoald_t *a)
{
    int64_t now = shoald_minute_now_s(), m = a->cfg->minute_seconds, boundary;
    shoald_batch_t *b, **tail;

    if (now < a->next_boundary)
        return;
    /* Ranks that ran while no agent did register again within the grace: their time since
     * their cursors then gets a record per minute (shoald_minute_job), not a fold into the
     * first open one. The boundaries passed meanwhile are billed by the tick at its end. */
    if (!shoal_deadline_passed(a->rejoin_until_ns))
        return;
    /* One batch for the minute that just ended (a late tick bills the missed time there). */
    boundary = now / m * m;
    a->next_boundary = boundary + m;
    if (a->cfg->ledger_url == NULL) {
        shoald_pages_collect(a);
        return;
    }
    shoald_ledger_open(a, SHOALD_LEDGER_WAIT_MS);
    shoald_rejoins_check(a);
    shoald_gpus_sample(a, NULL); /* the minute's last sample (its GPUs, agent_page.c) */
    b = shoald_minute_build(a, boundary);
    shoald_gpus_minute_done(a);
    if (b != NULL && b->nrecs == 0 && b->ncurs == 0) {
        shoald_batch_free(b);
        b = NULL;
    }
    if (b != NULL) {
        for (tail = &a->pending; *tail != NULL; tail = &(*tail)->next)
            ;
        *tail = b;
        a->npending++;
    }
    if (a->ledger_backoff_ms == 0 || shoal_deadline_passed(a->ledger_next_try_ns))
        shoald_ledger_flush(a, 0);
    shoald_pages_collect(a);
}

void shoald_ledger_retry(shoald_t *a)
{
    if (a->cfg->ledger_url == NULL || a->ledger_next_try_ns == 0 ||
        !shoal_deadline_passed(a->ledger_next_try_ns))
        return;
    a->ledger_next_try_ns = 0;
    if (a->pending != NULL)
        shoald_ledger_flush(a, 0);
    else
        shoald_ledger_open(a, SHOALD_LEDGER_WAIT_MS);
    if (a->ledger == NULL && a->ledger_next_try_ns == 0)
        a->ledger_next_try_ns = shoal_deadline_ns(SHOALD_LEDGER_BACKOFF_MAX_MS);
    shoald_pages_collect(a);
}

int shoald_minute_wait_ms(shoald_t *a)
{
    int64_t left_ms = (a->next_boundary * 1000) - (int64_t)(shoald_unix_ns() / 1000000ull);
    int ms = left_ms < 0 ? 0 : (int)SHOAL_MIN(left_ms + 1, 60000);

    if (!shoal_deadline_passed(a->rejoin_until_ns))
        ms = SHOAL_MAX(ms, shoal_deadline_left_ms(a->rejoin_until_ns, 60000) + 1);

    if (a->ledger_next_try_ns != 0)
        ms = SHOAL_MIN(ms, shoal_deadline_left_ms(a->ledger_next_try_ns, 60000));
    return ms;
}

/* At a clean stop: one last batch up to now is not written (the minute is not over); the
 * cursors stay where the ledger has them, so the next agent bills the rest. Pending batches
 * get one last try, which waits for a slow database (SHOALD_LEDGER_STOP_WAIT_MS in all);
 * those still not written (and those spooled by an agent before that were not either) go to
 * the spool, which the next agent writes at its start. */
void shoald_minute_fini(shoald_t *a)
{
    uint64_t stop_ns = shoal_deadline_ns(SHOALD_LEDGER_STOP_WAIT_MS);
    shoald_batch_t *b;

    if (a->pending != NULL) {
        a->ledger_backoff_ms = 0;
        shoald_ledger_flush(a, stop_ns);
    } else if (a->spooled != NULL) {
        shoald_ledger_open(a, shoal_deadline_left_ms(stop_ns, SHOALD_LEDGER_STOP_WAIT_MS));
    }
    if (a->pending != NULL || a->spooled != NULL) {
        if (shoald_spool_save(a, a->spooled, a->pending) == SHOAL_OK)
            shoal_warn(METER, "%u minutes could not be written to the ledger; saved in "
                       "%s/ledger.spool, the next agent writes them at its start",
                       a->nspooled + a->npending, a->cfg->state_dir);
        else
            shoal_error(METER, "%u minutes could not be written to the ledger nor to the "
                        "spool (said above): they are lost", a->nspooled + a->npending);
    }
    while ((b = a->pending) != NULL) {
        a->pending = b->next;
        shoald_batch_free(b);
    }
    while ((b = a->spooled) != NULL) {
        a->spooled = b->next;
        shoald_batch_free(b);
    }
    while (a->rejoins != NULL) {
        shoald_rejoin_t *r = a->rejoins;

        a->rejoins = r->next;
        free(r);
    }
    shoald_lg_stop(a, stop_ns);
    a->ledger = NULL;
}
