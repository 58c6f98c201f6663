/*
 * shoal_comm_init_env under a PMIx launcher (Open MPI's mpirun, srun --mpi=pmix, prterun)
 * without linking MPI: rank 0 creates the unique id and publishes it through the PMIx server
 * that launched the job; the other ranks fetch it. Nothing here runs unless the launcher put
 * PMIX_NAMESPACE in the environment, and a failing PMIx_Init only means "no PMIx here".
 */
#include "core/pmix.h"

#include <pmix.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SHOAL_PMIX_KEY_PREFIX "shoal.uid."

/* How many exchanges this process has done: part of the key, so that a second
 * shoal_comm_init_env (collective, so every rank counts alike) never reads a cached old id. */
static unsigned shoal_pmix_seq;

static void shoal_pmix_proc_set(pmix_proc_t *p, const pmix_proc_t *me, pmix_rank_t rank)
{
    PMIX_PROC_CONSTRUCT(p);
    memcpy(p->nspace, me->nspace, sizeof(p->nspace));
    p->rank = rank;
}

/* PMIX_TIMEOUT is in whole seconds, 0 = infinite; ms < 0 is infinite. Rounded up in 64 bits:
 * ms + 999 overflowed int for a timeout within a second of INT_MAX ("for ever" to some). */
static int shoal_pmix_timeout_s(int ms)
{
    long long s = ((long long)ms + 999) / 1000;
    return ms < 0 ? 0 : s > 0 ? (int)s : 1;
}

/* A PMIx launcher puts the job's namespace and its server's address in the environment;
 * without both there is no one to ask (and PMIx_Init would only fail, leaking as it does). */
static int shoal_pmix_launched(void)
{
    if (shoal_cfg_getenv_raw("PMIX_NAMESPACE") == NULL) {
        return 0;
    }
    for (char **e = environ; *e != NULL; e++) {
        if (strncmp(*e, "PMIX_SERVER_URI", strlen("PMIX_SERVER_URI")) == 0) {
            return 1;
        }
    }
    return 0;
}

/* PMIx's knob for how long PMIx_Init waits for the server's answer to its handshake. */
#define SHOAL_PMIX_HANDSHAKE_VAR "PMIX_MCA_ptl_base_handshake_wait_time"

/* PMIx_Init waits for the server's answer to its handshake with no deadline (PMIX_TIMEOUT in
 * its info does not bound it): a server that accepts and never answers (a stopped or hung
 * launcher, or a stale PMIX_SERVER_URI whose port another process now holds) held
 * shoal_comm_init_env forever. PMIx's own knob bounds it at our timeout, set for the call
 * only and unless the user set it; returns whether it was set. The environment is changed
 * as the config module changes it (not safe against another thread's setenv at that time). */
static int shoal_pmix_handshake_bound(int timeout_ms)
{
    char v[16];
    int timeout_s = shoal_pmix_timeout_s(timeout_ms);

    if (timeout_s == 0 || shoal_cfg_getenv_raw(SHOAL_PMIX_HANDSHAKE_VAR) != NULL) {
        return 0;
    }
    snprintf(v, sizeof(v), "%d", timeout_s);
    return setenv(SHOAL_PMIX_HANDSHAKE_VAR, v, 0) == 0;
}

static shoal_status_t shoal_pmix_init(pmix_proc_t *me, int rank, int nranks, int timeout_ms)
{
    pmix_status_t rc;
    pmix_value_t *val = NULL;
    pmix_proc_t wild;
    uint32_t size = 0;
    int bound;

    if (!shoal_pmix_launched()) {
        return SHOAL_ERR_UNSUPPORTED;
    }
    bound = shoal_pmix_handshake_bound(timeout_ms);
    rc = PMIx_Init(me, NULL, 0);
    if (bound) {
        unsetenv(SHOAL_PMIX_HANDSHAKE_VAR);
    }
    if (rc != PMIX_SUCCESS) {
        shoal_info(INIT, "PMIx_Init failed (%s): no PMIx server to exchange the unique id",
                   PMIx_Error_string(rc));
        /* No PMIx_Finalize: after this failure (server unreachable) PMIx 4.2's crashes. */
        return SHOAL_ERR_UNSUPPORTED;
    }
    shoal_pmix_proc_set(&wild, me, PMIX_RANK_WILDCARD);
    /* Job data the server gave at init: looked for here only (PMIX_OPTIONAL), and bounded
     * (PMIX_TIMEOUT) where a server is asked all the same; not found, the check below is
     * skipped. Without either, a PMIx that asks its server waited on a hung one for ever. */
    {
        pmix_info_t info[2];
        bool local = true;
        int timeout_s = shoal_pmix_timeout_s(timeout_ms);

        PMIX_INFO_LOAD(&info[0], PMIX_TIMEOUT, &timeout_s, PMIX_INT);
        PMIX_INFO_LOAD(&info[1], PMIX_OPTIONAL, &local, PMIX_BOOL);
        rc = PMIx_Get(&wild, PMIX_JOB_SIZE, info, 2, &val);
        PMIX_INFO_DESTRUCT(&info[0]);
        PMIX_INFO_DESTRUCT(&info[1]);
    }
    if (rc == PMIX_SUCCESS && val != NULL && val->type == PMIX_UINT32) {
        size = val->data.uint32;
    }
    if (val != NULL) {
        PMIX_VALUE_RELEASE(val);
    }
    if ((int)me->rank != rank || (size != 0 && (int)size != nranks)) {
        shoal_error(INIT, "rank %d of %d, but PMIx says rank %u of %u (namespace %s): set "
                    "SHOAL_UID or SHOAL_ROOT when shoal's ranks are not the PMIx job's",
                    rank, nranks, (unsigned)me->rank, (unsigned)size, me->nspace);
        PMIx_Finalize(NULL, 0);
        return SHOAL_ERR_INVALID_ARG;
    }
    return SHOAL_OK;
}

/* Rank 0: puts the id (size 0 when creating it failed, so that the others fail fast). */
static shoal_status_t shoal_pmix_publish(const char *key, const shoal_uid_t *uid)
{
    pmix_value_t v;
    pmix_status_t rc;

    PMIX_VALUE_CONSTRUCT(&v);
    v.type = PMIX_BYTE_OBJECT;
    v.data.bo.bytes = uid != NULL ? (char *)uid->internal : NULL;
    v.data.bo.size = uid != NULL ? sizeof(uid->internal) : 0;
    rc = PMIx_Put(PMIX_GLOBAL, key, &v);
    if (rc == PMIX_SUCCESS) {
        rc = PMIx_Commit();
    }
    if (rc != PMIX_SUCCESS) {
        shoal_error(INIT, "PMIx_Put/PMIx_Commit(%s) failed: %s", key, PMIx_Error_string(rc));
        return SHOAL_ERR_SYSTEM;
    }
    return SHOAL_OK;
}

/* A PMIx_Fence_nb in flight, shared by the caller and PMIx's callback and freed by whichever
 * lets go last: after the caller gave up, PMIx may still call back (or, the server being
 * hung, never: then it stays, a few hundred bytes on a failed init). PMIx reads wild and info
 * until it calls back. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int refs;
    int done;
    pmix_status_t rc;
    pmix_proc_t wild;
    pmix_info_t info[2];
} shoal_pmix_fence_op_t;

static void shoal_pmix_fence_op_put(shoal_pmix_fence_op_t *op, int n)
{
    int last;

    pthread_mutex_lock(&op->lock);
    op->refs -= n;
    last = op->refs == 0;
    pthread_mutex_unlock(&op->lock);
    if (last) {
        PMIX_INFO_DESTRUCT(&op->info[0]);
        PMIX_INFO_DESTRUCT(&op->info[1]);
        pthread_cond_destroy(&op->cond);
        pthread_mutex_destroy(&op->lock);
        free(op);
    }
}

static void shoal_pmix_fence_cb(pmix_status_t status, void *cbdata)
{
    shoal_pmix_fence_op_t *op = cbdata;

    pthread_mutex_lock(&op->lock);
    op->rc = status;
    op->done = 1;
    pthread_cond_signal(&op->cond);
    pthread_mutex_unlock(&op->lock);
    shoal_pmix_fence_op_put(op, 1);
}

/* Waits for the fence's callback, for PMIX_TIMEOUT and 2 s more (the server enforces
 * PMIX_TIMEOUT and answers TIMEOUT itself; a stopped or hung server answers nothing, and
 * PMIx_Fence waited for it forever). timeout_s 0: no deadline. */
static pmix_status_t shoal_pmix_fence_wait(shoal_pmix_fence_op_t *op, int timeout_s)
{
    struct timespec at;
    pmix_status_t rc;
    int ret = 0;

    clock_gettime(CLOCK_MONOTONIC, &at);
    at.tv_sec += timeout_s + 2;
    pthread_mutex_lock(&op->lock);
    while (!op->done && ret != ETIMEDOUT) {
        ret = timeout_s == 0 ? pthread_cond_wait(&op->cond, &op->lock)
                             : pthread_cond_timedwait(&op->cond, &op->lock, &at);
    }
    rc = op->done ? op->rc : PMIX_ERR_UNREACH; /* UNREACH: the server did not answer */
    pthread_mutex_unlock(&op->lock);
    return rc;
}

static shoal_status_t shoal_pmix_fence(const pmix_proc_t *me, int timeout_ms)
{
    shoal_pmix_fence_op_t *op = calloc(1, sizeof(*op));
    pthread_condattr_t attr;
    pmix_status_t rc;
    bool collect = true;
    int timeout_s = shoal_pmix_timeout_s(timeout_ms);

    if (op == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&op->lock, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&op->cond, &attr);
    pthread_condattr_destroy(&attr);
    op->refs = 2; /* the caller's and the callback's */
    shoal_pmix_proc_set(&op->wild, me, PMIX_RANK_WILDCARD);
    PMIX_INFO_LOAD(&op->info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    PMIX_INFO_LOAD(&op->info[1], PMIX_TIMEOUT, &timeout_s, PMIX_INT);
    rc = PMIx_Fence_nb(&op->wild, 1, op->info, 2, shoal_pmix_fence_cb, op);
    if (rc == PMIX_SUCCESS) {
        rc = shoal_pmix_fence_wait(op, timeout_s);
        shoal_pmix_fence_op_put(op, 1);
    } else {
        shoal_pmix_fence_op_put(op, 2); /* no callback will come */
        if (rc == PMIX_OPERATION_SUCCEEDED) {
            rc = PMIX_SUCCESS;
        }
    }
    if (rc == PMIX_ERR_UNREACH) {
        shoal_error(INIT, "PMIx_Fence over namespace %s: no answer from the PMIx server within "
                    "%d s (is the launcher stopped or hung?)", me->nspace, timeout_s + 2);
        return SHOAL_ERR_TIMEOUT;
    }
    if (rc != PMIX_SUCCESS) {
        shoal_error(INIT, "PMIx_Fence over namespace %s failed: %s", me->nspace,
                    PMIx_Error_string(rc));
        return rc == PMIX_ERR_TIMEOUT ? SHOAL_ERR_TIMEOUT : SHOAL_ERR_SYSTEM;
    }
    return SHOAL_OK;
}

static shoal_status_t shoal_pmix_fetch(const pmix_proc_t *me, const char *key, int timeout_ms,
                                       shoal_uid_t *uid)
{
    pmix_value_t *val = NULL;
    pmix_proc_t root;
    pmix_info_t info[2];
    pmix_status_t rc;
    int timeout_s = shoal_pmix_timeout_s(timeout_ms);
    bool local = true;
    shoal_status_t status = SHOAL_OK;

    shoal_pmix_proc_set(&root, me, 0);
    /* The fence collected every rank's data (PMIX_COLLECT_DATA) into this process: the key is
     * looked for here only (PMIX_OPTIONAL). Asked of the server, a key rank 0 never put was
     * waited for until the timeout. */
    PMIX_INFO_LOAD(&info[0], PMIX_TIMEOUT, &timeout_s, PMIX_INT);
    PMIX_INFO_LOAD(&info[1], PMIX_OPTIONAL, &local, PMIX_BOOL);
    rc = PMIx_Get(&root, key, info, 2, &val);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    if (rc == PMIX_ERR_NOT_FOUND) {
        /* After the fence: rank 0 put nothing, its PMIx_Put or PMIx_Commit failed. */
        shoal_error(INIT, "rank 0 published no unique id under PMIx key %s (its PMIx_Put or "
                    "PMIx_Commit failed: see its log)", key);
        status = SHOAL_ERR_PEER_FAILED;
    } else if (rc != PMIX_SUCCESS || val == NULL) {
        shoal_error(INIT, "PMIx_Get(rank 0, %s) failed: %s", key, PMIx_Error_string(rc));
        status = SHOAL_ERR_SYSTEM;
    } else if (val->type != PMIX_BYTE_OBJECT || val->data.bo.size != sizeof(uid->internal)) {
        shoal_error(INIT, "PMIx key %s from rank 0 holds no unique id (rank 0 could not create "
                    "one: see its log)", key);
        status = SHOAL_ERR_PEER_FAILED;
    } else {
        memcpy(uid->internal, val->data.bo.bytes, sizeof(uid->internal));
    }
    if (val != NULL) {
        if (val->type == PMIX_BYTE_OBJECT && val->data.bo.bytes != NULL) {
            shoal_secret_wipe(val->data.bo.bytes, val->data.bo.size); /* the job secret */
        }
        PMIX_VALUE_RELEASE(val);
    }
    return status;
}

shoal_status_t shoal_pmix_exchange_uid(int rank, int nranks, const shoal_config_t *cfg,
                                       int timeout_ms, shoal_uid_t *uid)
{
    char key[64];
    pmix_proc_t me;
    shoal_uid_t mine;
    shoal_status_t status, fenced, created = SHOAL_OK;

    status = shoal_pmix_init(&me, rank, nranks, timeout_ms);
    if (status != SHOAL_OK) {
        return status;
    }
    snprintf(key, sizeof(key), SHOAL_PMIX_KEY_PREFIX "%u", shoal_pmix_seq++);
    if (rank == 0) {
        created = shoal__get_unique_id_cfg(&mine, cfg);
        status = shoal_pmix_publish(key, created == SHOAL_OK ? &mine : NULL);
    }
    /* Every rank fences, rank 0 also when its put failed: it returned before the fence, and
     * the others (its process living on) waited in theirs for the whole timeout. Past the
     * fence they find no key and fail at once, naming rank 0. */
    fenced = shoal_pmix_fence(&me, timeout_ms);
    if (status == SHOAL_OK) {
        status = fenced;
    }
    if (status == SHOAL_OK && rank != 0) {
        status = shoal_pmix_fetch(&me, key, timeout_ms, &mine);
    }
    PMIx_Finalize(NULL, 0);
    if (status == SHOAL_OK && created != SHOAL_OK) {
        status = created;
    }
    if (status == SHOAL_OK) {
        *uid = mine;
        shoal_info(INIT, "rank %d: unique id exchanged through PMIx (namespace %s)", rank,
                   me.nspace);
    }
    shoal_secret_wipe(&mine, sizeof(mine));
    return status;
}
