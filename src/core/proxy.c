/*
 * The proxy thread: runs a communicator's shoal_i* calls in issue order (tickets shared with
 * blocking calls), so the caller's thread returns at once. Started once, on first use, under
 * the communicator's proxy_lock (several threads may make their first call at once).
 * Requests outlive the communicator safely: shoal_test/shoal_wait touch only the request.
 */
#include "core/core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct shoal_request {
    struct shoal_request *next;
    struct shoal_comm *comm;
    uint64_t ticket;
    shoal_proxy_fn_t fn;
    int detached;                 /* no caller waits: the proxy frees it (post_detached) */
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
};

static void shoal_request_free(struct shoal_request *req);

static void shoal_proxy_complete(struct shoal_request *req, shoal_status_t st)
{
    if (req->detached) {
        shoal_request_free(req);
        return;
    }
    pthread_mutex_lock(&req->lock);
    req->status = st;
    req->done = 1;
    pthread_cond_broadcast(&req->cond);
    pthread_mutex_unlock(&req->lock);
}

static void *shoal_proxy_main(void *arg)
{
    struct shoal_proxy *px = arg;
    struct shoal_comm *comm = px->comm;

    pthread_mutex_lock(&px->lock);
    for (;;) {
        struct shoal_request *req;
        shoal_status_t st;
        while (px->head == NULL && !px->stop) {
            pthread_cond_wait(&px->cond, &px->lock);
        }
        if (px->head == NULL) {
            break;
        }
        req = px->head;
        px->head = req->next;
        if (px->head == NULL) {
            px->tail = NULL;
        }
        pthread_mutex_unlock(&px->lock);
        st = shoal_comm_ticket_wait(comm, req->ticket);
        if (st == SHOAL_OK && !__atomic_load_n(&px->stop, __ATOMIC_ACQUIRE)) {
            st = req->fn(comm, req->arg);
        } else if (st == SHOAL_OK) {
            st = SHOAL_ERR_ABORTED; /* communicator destroyed with the request pending */
        }
        shoal_comm_ticket_release(comm);
        shoal_proxy_complete(req, st);
        pthread_mutex_lock(&px->lock);
    }
    pthread_mutex_unlock(&px->lock);
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

static shoal_status_t shoal_proxy_enqueue(struct shoal_comm *comm, shoal_proxy_fn_t fn,
                                          const void *arg, size_t arglen, int detached,
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
    req->fn = fn;
    req->detached = detached;
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
    return shoal_proxy_enqueue(comm, fn, arg, arglen, 0, req_p);
}

shoal_status_t shoal_proxy_post_detached(struct shoal_comm *comm, shoal_proxy_fn_t fn,
                                         const void *arg, size_t arglen)
{
    return shoal_proxy_enqueue(comm, fn, arg, arglen, 1, NULL);
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

/* A request handle is freed by the call that sees it complete, which sets it to NULL (as MPI
 * does): a second test or wait on the same handle finds NULL, a completed request. */
shoal_status_t shoal_test(shoal_request_t *req_p, int *done_p)
{
    struct shoal_request *req;
    int done;
    shoal_status_t st;
    if (req_p == NULL || done_p == NULL) {
        return SHOAL_ERR_INVALID_ARG;
    }
    req = *req_p;
    if (req == NULL) {
        *done_p = 1;
        return SHOAL_OK;
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
        return SHOAL_ERR_INVALID_ARG;
    }
    req = *req_p;
    if (req == NULL) {
        return SHOAL_OK;
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
