/*
 * The proxy thread: runs a communicator's shoal_i* calls, so the caller's thread returns at
 * once. Calls start in issue order (tickets shared with blocking calls); each becomes a plan
 * (core.h) that the proxy advances together with the other plans in flight, so several
 * collectives progress at once. While any plan is in flight the proxy holds the
 * communicator's ticket: it hands it on to its own next call (which starts at once), and to a
 * blocking call only once every plan is done (one thread drives the transports at a time).
 * Started once, on first use, under the communicator's proxy_lock (several threads may make
 * their first call at once). Requests outlive the communicator safely: shoal_test/shoal_wait
 * touch only the request.
 */
#include "core/core.h"
#include "meter/meter.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct shoal_request {
    struct shoal_request *next;   /* proxy queue, then the list of plans in flight */
    struct shoal_comm *comm;
    uint64_t ticket;
    shoal_plan_start_t start;
    shoal_proxy_fn_t fn;          /* a call run whole (start == NULL) */
    shoal_plan_t *plan;           /* in flight */
    int detached;                 /* no caller waits: the proxy frees it (post_detached) */
    shoal_proxy_cancel_t cancel;  /* detached: run if fn never does */
    int ran;                      /* fn was called */
    uint32_t fork_gen;            /* the communicator's (core.h): made in this process? */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;
    shoal_status_t status;
    uint8_t arg[];                /* copy of the call's arguments */
};

struct shoal_proxy {
    struct shoal_comm *comm;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct shoal_request *head;
    struct shoal_request *tail;
    int stop;                     /* atomic */
    void *ext;                    /* a layer's per-communicator state (src/cuda) */
    shoal_proxy_ext_fini_t ext_fini;
    /* proxy thread only */
    struct shoal_request *active; /* plans in flight, in issue order */
    struct shoal_request *active_tail;
    int holding;                  /* holds the ticket 'held' (plans in flight) */
    uint64_t held;
};

static void shoal_request_free(struct shoal_request *req);

static void shoal_proxy_complete(struct shoal_request *req, shoal_status_t st)
{
    if (req->detached) {
        if (!req->ran && req->cancel != NULL) {
            req->cancel(req->comm, req->arg); /* refused or failed before fn ran */
        }
        shoal_request_free(req);
        return;
    }
    pthread_mutex_lock(&req->lock);
    req->status = st;
    req->done = 1;
    pthread_cond_broadcast(&req->cond);
    pthread_mutex_unlock(&req->lock);
}

/* ---- plans ------------------------------------------------------------------------------ */

/* A call run whole, as a plan that has the communicator to itself. */
typedef struct {
    shoal_plan_t base;
    shoal_proxy_fn_t fn;
    void *arg;
    int *ran;                     /* the request's */
} shoal_fn_plan_t;

static shoal_status_t shoal_fn_plan_progress(struct shoal_comm *comm, shoal_plan_t *plan)
{
    shoal_fn_plan_t *fp = (shoal_fn_plan_t *)plan;
    *fp->ran = 1;
    return fp->fn(comm, fp->arg);
}

static void shoal_fn_plan_release(struct shoal_comm *comm, shoal_plan_t *plan, shoal_status_t st)
{
    (void)comm;
    (void)st;
    free(plan);
}

static int shoal_plan_overlap(const shoal_plan_t *a, const shoal_plan_t *b)
{
    if (a->npeers < 0 || b->npeers < 0) {
        return 1;
    }
    for (int i = 0; i < a->npeers; i++) {
        for (int j = 0; j < b->npeers; j++) {
            if (a->peers[i] == b->peers[j]) {
                return 1;
            }
        }
    }
    return 0;
}

static void shoal_plan_wait_what(struct shoal_comm *comm, const shoal_plan_t *plan, char *what,
                                 size_t len)
{
    if (plan != NULL && plan->wait_peer >= 0 && plan->wait_peer < comm->nranks) {
        snprintf(what, len, "waiting for peer %d (%s)", plan->wait_peer,
                 shoal_comm_peer_host(comm, plan->wait_peer));
    } else {
        snprintf(what, len, "waiting");
    }
}

shoal_status_t shoal_plan_drive(struct shoal_comm *comm, shoal_plan_t *plan)
{
    uint64_t deadline = UINT64_MAX; /* set after a few idle polls, see below */
    unsigned spins = 0;
    shoal_status_t st;
    int deadline_due = 1;

    for (;;) {
        plan->nwait = 0;
        st = plan->progress(comm, plan);
        if (st != SHOAL_IN_PROGRESS) {
            break;
        }
        /* Until the plan may move: the requests it waits for are done; none listed: after
         * one poll of the transports (and an idle step when nothing moved), as before. An
         * idle poll is then the transports' progress alone: its length is the delay before
         * an arrival is seen. */
        while (plan->nwait == 0 || !shoal_plan_ready(plan)) {
            if (shoal_chan_progress(comm) > 0) {
                spins = 0;
                if (plan->nwait == 0) {
                    break;
                }
                continue;
            }
            /* The deadline counts from the last completion, read a few idle polls after it
             * (no clock read on a call whose answer comes at once; shoal_chan_idle looks at
             * it only every 256th poll, or at every poll past spin_count). */
            if (spins == 0) {
                deadline_due = 1;
            }
            if (deadline_due && (spins >= 32 || spins + 1 >= comm->spin_count)) {
                deadline = shoal_deadline_ns(comm->timeout_ms);
                deadline_due = 0;
            }
            if (!shoal_chan_idle_may_fail(comm, spins, deadline)) {
                st = shoal_chan_idle(comm, &spins, deadline, "waiting");
            } else {
                char what[96];
                shoal_plan_wait_what(comm, plan, what, sizeof(what));
                st = shoal_chan_idle(comm, &spins, deadline, what);
            }
            if (st != SHOAL_OK) {
                goto out;
            }
            if (plan->nwait == 0) {
                break;
            }
        }
    }
out:
    plan->release(comm, plan, st);
    return st;
}

/* ---- the proxy's loop ------------------------------------------------------------------- */

/* The plan of a request whose ticket is served: *plan_p NULL when the call is already over.
 * A call refused here (the communicator failed, was aborted or is being destroyed after it
 * was posted) never reaches its start function, which meters it: it counts in the page's
 * errors here, as a blocking call refused at its ticket does (src/api/api.c). */
static shoal_status_t shoal_proxy_start(struct shoal_proxy *px, struct shoal_request *req)
{
    struct shoal_comm *comm = px->comm;
    shoal_status_t st = __atomic_load_n(&px->stop, __ATOMIC_ACQUIRE)
                            ? SHOAL_ERR_ABORTED : shoal_comm_check_usable(comm);
    req->plan = NULL;
    if (st != SHOAL_OK) {
        shoal_meter_count_refused(comm->meter);
        return st;
    }
    if (req->start != NULL) {
        return req->start(comm, req->arg, &req->plan);
    }
    shoal_fn_plan_t *fp = calloc(1, sizeof(*fp));
    if (fp == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    fp->base = (shoal_plan_t){.progress = shoal_fn_plan_progress,
                              .release = shoal_fn_plan_release, .npeers = -1, .wait_peer = -1};
    fp->fn = req->fn;
    fp->arg = req->arg;
    fp->ran = &req->ran;
    req->plan = &fp->base;
    return SHOAL_OK;
}

static void shoal_proxy_finish(struct shoal_proxy *px, struct shoal_request *req,
                               struct shoal_request *prev, shoal_status_t st)
{
    if (prev != NULL) {
        prev->next = req->next;
    } else {
        px->active = req->next;
    }
    if (px->active_tail == req) {
        px->active_tail = prev;
    }
    req->next = NULL;
    req->plan->release(px->comm, req->plan, st);
    req->plan = NULL;
    shoal_proxy_complete(req, st);
}

/* Starts the queued calls whose turn it is. Called with px->lock held; returns with it held. */
static void shoal_proxy_take(struct shoal_proxy *px)
{
    struct shoal_comm *comm = px->comm;
    while (px->head != NULL) {
        struct shoal_request *req = px->head;
        shoal_status_t st;
        if (px->holding) {
            if (req->ticket != px->held + 1) {
                return; /* a blocking call comes first: it waits for the plans in flight */
            }
            shoal_comm_ticket_release(comm); /* serving = our own next ticket */
        } else {
            pthread_mutex_unlock(&px->lock);
            st = shoal_comm_ticket_wait(comm, req->ticket); /* nothing in flight: may block */
            pthread_mutex_lock(&px->lock);
            (void)st; /* shoal_proxy_start checks the communicator again */
        }
        px->holding = 1;
        px->held = req->ticket;
        px->head = req->next;
        if (px->head == NULL) {
            px->tail = NULL;
        }
        req->next = NULL;
        pthread_mutex_unlock(&px->lock);
        st = shoal_proxy_start(px, req);
        if (req->plan == NULL) {
            shoal_proxy_complete(req, st);
        } else if (px->active_tail != NULL) {
            px->active_tail->next = req;
            px->active_tail = req;
        } else {
            px->active = px->active_tail = req;
        }
        pthread_mutex_lock(&px->lock);
    }
}

/* One pass over the plans in flight; returns how many finished. A plan waits while an
 * earlier one in flight shares a channel with it. */
static int shoal_proxy_advance(struct shoal_proxy *px, shoal_status_t fatal,
                               shoal_plan_t **waiting_p)
{
    struct shoal_request *req = px->active, *prev = NULL;
    int finished = 0;
    *waiting_p = NULL;
    while (req != NULL) {
        struct shoal_request *next = req->next, *e;
        shoal_status_t st = fatal;
        int blocked = 0;
        if (st == SHOAL_OK) {
            for (e = px->active; e != req && !blocked; e = e->next) {
                blocked = shoal_plan_overlap(e->plan, req->plan);
            }
            if (blocked) {
                prev = req;
                req = next;
                continue;
            }
            if (req->plan->nwait > 0 && !shoal_plan_ready(req->plan)) {
                st = SHOAL_IN_PROGRESS; /* what it waits for is not done yet */
            } else {
                req->plan->nwait = 0;
                st = req->plan->progress(px->comm, req->plan);
            }
        }
        if (st == SHOAL_IN_PROGRESS) {
            if (*waiting_p == NULL) {
                *waiting_p = req->plan;
            }
            prev = req;
        } else {
            shoal_proxy_finish(px, req, prev, st);
            finished++;
        }
        req = next;
    }
    return finished;
}

/* The proxy whose thread this is (NULL on every other thread): shoal_proxy_stopping. */
static __thread struct shoal_proxy *shoal_proxy_self;

int shoal_proxy_stopping(const struct shoal_comm *comm)
{
    struct shoal_proxy *px = shoal_proxy_self;
    return px != NULL && px->comm == comm && __atomic_load_n(&px->stop, __ATOMIC_ACQUIRE);
}

static void *shoal_proxy_main(void *arg)
{
    struct shoal_proxy *px = arg;
    struct shoal_comm *comm = px->comm;
    uint64_t deadline = UINT64_MAX;
    unsigned spins = 0;

    shoal_proxy_self = px;

    for (;;) {
        shoal_plan_t *waiting = NULL;
        shoal_status_t fatal;
        int moved;

        pthread_mutex_lock(&px->lock);
        while (px->head == NULL && px->active == NULL && !px->stop) {
            pthread_cond_wait(&px->cond, &px->lock);
        }
        if (px->head == NULL && px->active == NULL) {
            pthread_mutex_unlock(&px->lock);
            break; /* stopped, nothing left */
        }
        shoal_proxy_take(px);
        pthread_mutex_unlock(&px->lock);
        if (px->active == NULL) {
            if (px->holding) {
                px->holding = 0;
                shoal_comm_ticket_release(comm);
            }
            spins = 0; /* the next call's wait is a new one: see below */
            continue;
        }
        fatal = shoal_comm_fatal(comm);
        if (fatal == SHOAL_OK && shoal_comm_aborted(comm)) {
            /* Failing the communicator makes the transports drop every request that points
             * into a plan before the plans are freed. */
            fatal = shoal_comm_set_failed(comm, SHOAL_ERR_ABORTED, comm->rank,
                                          "aborted by the application with collectives in "
                                          "flight");
        } else if (fatal == SHOAL_OK && __atomic_load_n(&px->stop, __ATOMIC_ACQUIRE)) {
            fatal = shoal_comm_set_failed(comm, SHOAL_ERR_ABORTED, comm->rank,
                                          "communicator destroyed with collectives in flight");
        }
        moved = shoal_chan_progress(comm);
        moved += shoal_proxy_advance(px, fatal, &waiting);
        if (px->active == NULL) {
            px->holding = 0;
            shoal_comm_ticket_release(comm);
            /* A new wait starts from 0, which sets its deadline: the idle count of the calls
             * that just ended kept their deadline, and the first call posted after an idle
             * spell longer than SHOAL_TIMEOUT_MS failed the communicator at its first idle
             * pass ("timed out after N ms" at once). */
            spins = 0;
            continue;
        }
        if (moved > 0) {
            spins = 0;
            continue;
        }
        if (spins == 0) {
            deadline = shoal_deadline_ns(comm->timeout_ms); /* from the last completion */
        } else if ((spins & 255) == 255 || spins + 1 >= comm->spin_count) {
            if (shoal_deadline_passed(deadline)) {
                char what[96];
                shoal_plan_wait_what(comm, waiting, what, sizeof(what));
                (void)shoal_comm_set_failed(comm, SHOAL_ERR_TIMEOUT, -1,
                                            "timed out after %d ms %s", comm->timeout_ms, what);
                continue; /* the next pass fails every plan in flight */
            }
        }
        if (waiting != NULL && waiting->sleep != NULL && spins + 1 >= comm->spin_count &&
            px->active == px->active_tail && shoal_comm_dead_peer(comm) < 0 &&
            waiting->sleep(comm, waiting)) {
            spins++; /* its own sleep (an intra-node AllReduce's futex), bounded by 1 ms */
            continue;
        }
        (void)shoal_chan_idle(comm, &spins, UINT64_MAX, "waiting"); /* errors: next pass */
    }
    return NULL;
}

/* Starts the proxy unless it runs; returns it in *px_p. Readers that see comm->proxy set
 * (acquire) see it fully initialised (the release store below). */
static shoal_status_t shoal_proxy_get(struct shoal_comm *comm, struct shoal_proxy **px_p)
{
    struct shoal_proxy *px = __atomic_load_n(&comm->proxy, __ATOMIC_ACQUIRE);
    shoal_status_t st = SHOAL_OK;
    int ret;

    if (SHOAL_LIKELY(px != NULL)) {
        *px_p = px;
        return SHOAL_OK;
    }
    pthread_mutex_lock(&comm->proxy_lock);
    px = __atomic_load_n(&comm->proxy, __ATOMIC_ACQUIRE);
    if (px != NULL) {
        goto out; /* another thread started it meanwhile */
    }
    px = calloc(1, sizeof(*px));
    if (px == NULL) {
        st = SHOAL_ERR_NO_MEMORY;
        goto out;
    }
    px->comm = comm;
    pthread_mutex_init(&px->lock, NULL);
    pthread_cond_init(&px->cond, NULL);
    ret = pthread_create(&px->thread, NULL, shoal_proxy_main, px);
    if (ret != 0) {
        shoal_error(CORE, "pthread_create for the proxy thread failed: %s", strerror(ret));
        pthread_mutex_destroy(&px->lock);
        pthread_cond_destroy(&px->cond);
        free(px);
        px = NULL;
        st = SHOAL_ERR_SYSTEM;
        goto out;
    }
    __atomic_store_n(&comm->proxy, px, __ATOMIC_RELEASE);
out:
    pthread_mutex_unlock(&comm->proxy_lock);
    *px_p = px;
    return st;
}

static shoal_status_t shoal_proxy_enqueue(struct shoal_comm *comm, shoal_plan_start_t start,
                                          shoal_proxy_fn_t fn, const void *arg, size_t arglen,
                                          int detached, shoal_proxy_cancel_t cancel,
                                          shoal_request_t *req_p)
{
    struct shoal_request *req;
    struct shoal_proxy *px;

    SHOAL_CHECK(shoal_proxy_get(comm, &px));
    req = calloc(1, sizeof(*req) + arglen);
    if (req == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    req->comm = comm;
    req->start = start;
    req->fn = fn;
    req->detached = detached;
    req->cancel = cancel;
    req->fork_gen = comm->fork_gen;
    pthread_mutex_init(&req->lock, NULL);
    pthread_cond_init(&req->cond, NULL);
    memcpy(req->arg, arg, arglen);
    pthread_mutex_lock(&px->lock);
    req->ticket = shoal_comm_ticket_take(comm);
    if (px->tail != NULL) {
        px->tail->next = req;
    } else {
        px->head = req;
    }
    px->tail = req;
    pthread_cond_signal(&px->cond);
    pthread_mutex_unlock(&px->lock);
    if (req_p != NULL) {
        *req_p = req;
    }
    return SHOAL_OK;
}

shoal_status_t shoal_proxy_post(struct shoal_comm *comm, shoal_proxy_fn_t fn, void *arg,
                                size_t arglen, shoal_request_t *req_p)
{
    return shoal_proxy_enqueue(comm, NULL, fn, arg, arglen, 0, NULL, req_p);
}

shoal_status_t shoal_proxy_post_plan(struct shoal_comm *comm, shoal_plan_start_t start,
                                     const void *arg, size_t arglen, shoal_request_t *req_p)
{
    return shoal_proxy_enqueue(comm, start, NULL, arg, arglen, 0, NULL, req_p);
}

shoal_status_t shoal_proxy_post_detached(struct shoal_comm *comm, shoal_proxy_fn_t fn,
                                         shoal_proxy_cancel_t cancel, const void *arg,
                                         size_t arglen)
{
    return shoal_proxy_enqueue(comm, NULL, fn, arg, arglen, 1, cancel, NULL);
}

shoal_status_t shoal_proxy_ext_get(struct shoal_comm *comm, void **ext_p)
{
    struct shoal_proxy *px;
    SHOAL_CHECK(shoal_proxy_get(comm, &px));
    *ext_p = px->ext;
    return SHOAL_OK;
}

void shoal_proxy_ext_set(struct shoal_comm *comm, void *ext, shoal_proxy_ext_fini_t fini)
{
    comm->proxy->ext = ext;
    comm->proxy->ext_fini = fini;
}

void shoal_proxy_stop(struct shoal_comm *comm)
{
    struct shoal_proxy *px = comm->proxy;
    if (px == NULL) {
        return;
    }
    pthread_mutex_lock(&px->lock);
    __atomic_store_n(&px->stop, 1, __ATOMIC_RELEASE); /* read without the lock, mid-queue */
    pthread_cond_signal(&px->cond);
    pthread_mutex_unlock(&px->lock);
    pthread_join(px->thread, NULL);
    if (px->ext_fini != NULL) {
        px->ext_fini(comm, px->ext); /* after every request ran or was cancelled */
    }
    pthread_mutex_destroy(&px->lock);
    pthread_cond_destroy(&px->cond);
    free(px);
    comm->proxy = NULL;
}

static void shoal_request_free(struct shoal_request *req)
{
    pthread_mutex_destroy(&req->lock);
    pthread_cond_destroy(&req->cond);
    free(req);
}

/* A request of the process that forked this one: one in flight at the fork never completes
 * here (the proxy thread is the parent's), and the test said not done forever, the wait
 * waited forever. Read without its lock, which a thread of the parent may have held at the
 * fork (nothing else runs on it here). Complete at the fork: its status, and it is freed; in
 * flight: refused, as every call on the parent's communicator is here, and left (its lock
 * may be held). The handle is NULL after either. */
static shoal_status_t shoal_request_forked_end(shoal_request_t *req_p, const char *what)
{
    struct shoal_request *req = *req_p;
    shoal_status_t st = req->status;

    *req_p = NULL;
    if (!req->done) {
        shoal_error(CORE, "%s: the request was made by process %d, which forked this one (%d), "
                    "and was in flight at the fork: it never completes here (it is left to the "
                    "parent)", what, (int)req->comm->pid, (int)getpid());
        return SHOAL_ERR_INVALID_ARG;
    }
    free(req);
    return st;
}

static int shoal_request_forked(const struct shoal_request *req)
{
    return SHOAL_UNLIKELY(req->fork_gen != __atomic_load_n(&shoal_fork_gen, __ATOMIC_RELAXED));
}

/* A request handle is freed by the call that sees it complete, which sets it to NULL (as MPI
 * does): a second test or wait on the same handle finds NULL, a completed request. */
shoal_status_t shoal_test(shoal_request_t *req_p, int *done_p)
{
    struct shoal_request *req;
    int done;
    shoal_status_t st;
    if (req_p == NULL || done_p == NULL) {
        shoal_error(CORE, "shoal_test: NULL %s pointer", req_p == NULL ? "request" : "done");
        return SHOAL_ERR_INVALID_ARG;
    }
    req = *req_p;
    if (req == NULL) {
        *done_p = 1;
        return SHOAL_OK;
    }
    if (shoal_request_forked(req)) {
        *done_p = 1;
        return shoal_request_forked_end(req_p, "shoal_test");
    }
    pthread_mutex_lock(&req->lock);
    done = req->done;
    st = req->status;
    pthread_mutex_unlock(&req->lock);
    *done_p = done;
    if (!done) {
        return SHOAL_OK;
    }
    *req_p = NULL;
    shoal_request_free(req);
    return st;
}

shoal_status_t shoal_wait(shoal_request_t *req_p)
{
    struct shoal_request *req;
    shoal_status_t st;
    if (req_p == NULL) {
        shoal_error(CORE, "shoal_wait: NULL request pointer");
        return SHOAL_ERR_INVALID_ARG;
    }
    req = *req_p;
    if (req == NULL) {
        return SHOAL_OK;
    }
    if (shoal_request_forked(req)) {
        return shoal_request_forked_end(req_p, "shoal_wait");
    }
    /* The operation has its own deadline (SHOAL_TIMEOUT_MS) and always completes. */
    pthread_mutex_lock(&req->lock);
    while (!req->done) {
        pthread_cond_wait(&req->cond, &req->lock);
    }
    st = req->status;
    pthread_mutex_unlock(&req->lock);
    *req_p = NULL;
    shoal_request_free(req);
    return st;
}
