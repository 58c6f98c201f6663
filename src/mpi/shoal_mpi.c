/*
 * libshoal_mpi: a shoal communicator over an MPI communicator. MPI is only the rendezvous:
 * one broadcast of the unique id (MPI_Ibcast, under the timeout); after that shoal moves all
 * data on its own transports. This library sees only libshoal's public API (and
 * shoal__comm_timeout_ms), so it reports through status codes.
 */
#include <shoal_mpi.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* In libshoal, not in shoal.h: the deadline shoal_comm_init gives a communicator made with cfg
 * (cfg's timeout, else SHOAL_TIMEOUT_MS); -1 = none. */
int shoal__comm_timeout_ms(const shoal_config_t *cfg);
/* shoal_get_unique_id for cfg: the id carries cfg's tenant and job name (the ranks' join
 * checks them against their cfg: made for the environment's, a cfg with a tenant was refused
 * on every rank), and its root waits cfg's timeout without progress, not SHOAL_TIMEOUT_MS
 * (the id's root must wait as long as cfg lets the ranks come). */
shoal_status_t shoal__get_unique_id_cfg(shoal_uid_t *uid, const shoal_config_t *cfg);

/* What rank 0 broadcasts: its shoal_get_unique_id status, then the id. */
typedef struct {
    int32_t status;
    shoal_uid_t uid;
} shoal_mpi_uid_msg_t;

/* A broadcast still posted when its deadline passed. MPI can neither cancel nor free a
 * nonblocking collective, and its buffer must live until it completes: it is kept here, and
 * a later call wipes and frees it once MPI has completed it. */
typedef struct shoal_mpi_pending {
    struct shoal_mpi_pending *next;
    MPI_Request req;
    shoal_mpi_uid_msg_t msg;
} shoal_mpi_pending_t;

static shoal_mpi_pending_t *shoal_mpi_pending_list;
static pthread_mutex_t shoal_mpi_pending_lock = PTHREAD_MUTEX_INITIALIZER;

static void shoal_mpi_pending_free(shoal_mpi_pending_t *p)
{
    explicit_bzero(&p->msg, sizeof(p->msg)); /* the id holds the job secret */
    free(p);
}

/* Frees the timed-out broadcasts that have completed since. */
static void shoal_mpi_pending_reap(void)
{
    pthread_mutex_lock(&shoal_mpi_pending_lock);
    for (shoal_mpi_pending_t **pp = &shoal_mpi_pending_list; *pp != NULL;) {
        shoal_mpi_pending_t *p = *pp;
        int done = 0;

        if (MPI_Test(&p->req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) {
            *pp = p->next;
            shoal_mpi_pending_free(p);
        } else {
            pp = &p->next;
        }
    }
    pthread_mutex_unlock(&shoal_mpi_pending_lock);
}

static double shoal_mpi_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* MPI_Bcast of p->msg from rank 0 with a deadline: a rank that never calls (stuck, or failed
 * before its init) left the others in MPI_Bcast forever. Polls MPI_Test, sleeping up to 1 ms
 * between tests (the id is broadcast once per communicator). On SHOAL_ERR_TIMEOUT p stays
 * posted: it belongs to shoal_mpi_pending_list from then on. */
static shoal_status_t shoal_mpi_bcast(shoal_mpi_pending_t *p, MPI_Comm mpi_comm, int timeout_ms)
{
    double deadline = shoal_mpi_now_ms() + timeout_ms;
    long sleep_ns = 1000;
    int done = 0;

    if (MPI_Ibcast(&p->msg, (int)sizeof(p->msg), MPI_BYTE, 0, mpi_comm, &p->req) != MPI_SUCCESS) {
        return SHOAL_ERR_SYSTEM;
    }
    for (;;) {
        if (MPI_Test(&p->req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            return SHOAL_ERR_SYSTEM; /* an error handler that returns: the request is freed */
        }
        if (done) {
            return SHOAL_OK;
        }
        if (timeout_ms >= 0 && shoal_mpi_now_ms() >= deadline) {
            pthread_mutex_lock(&shoal_mpi_pending_lock);
            p->next = shoal_mpi_pending_list;
            shoal_mpi_pending_list = p;
            pthread_mutex_unlock(&shoal_mpi_pending_lock);
            return SHOAL_ERR_TIMEOUT;
        }
        nanosleep(&(struct timespec){.tv_nsec = sleep_ns}, NULL);
        sleep_ns = sleep_ns < 1000000 ? 2 * sleep_ns : 1000000;
    }
}

static shoal_status_t shoal_mpi_check(int rc)
{
    return rc == MPI_SUCCESS ? SHOAL_OK : SHOAL_ERR_SYSTEM;
}

shoal_status_t shoal_mpi_comm_init(shoal_comm_t *comm_p, MPI_Comm mpi_comm,
                                   const shoal_config_t *cfg)
{
    shoal_config_t dflt = SHOAL_CONFIG_INIT;
    shoal_mpi_pending_t *p;
    shoal_status_t status;
    int initialized = 0, finalized = 0, inter = 0, rank = -1, nranks = 0, timeout_ms;

    if (comm_p == NULL || mpi_comm == MPI_COMM_NULL) {
        return SHOAL_ERR_INVALID_ARG;
    }
    if (MPI_Initialized(&initialized) != MPI_SUCCESS || !initialized ||
        MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) {
        return SHOAL_ERR_INVALID_ARG;
    }
    /* An intercommunicator's MPI_Bcast with root 0 makes every process a receiver from the
     * other group's rank 0: all of them would wait forever. Refused before any call. */
    if (MPI_Comm_test_inter(mpi_comm, &inter) != MPI_SUCCESS || inter) {
        return SHOAL_ERR_INVALID_ARG;
    }
    status = shoal_mpi_check(MPI_Comm_rank(mpi_comm, &rank));
    if (status == SHOAL_OK) {
        status = shoal_mpi_check(MPI_Comm_size(mpi_comm, &nranks));
    }
    if (status != SHOAL_OK) {
        return status;
    }
    shoal_mpi_pending_reap();
    p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return SHOAL_ERR_NO_MEMORY;
    }
    timeout_ms = shoal__comm_timeout_ms(cfg != NULL ? cfg : &dflt);
    if (rank == 0) {
        p->msg.status = shoal__get_unique_id_cfg(&p->msg.uid, cfg != NULL ? cfg : &dflt);
    }
    /* Every rank takes part even when rank 0 failed: the status travels with the id. */
    status = shoal_mpi_bcast(p, mpi_comm, timeout_ms);
    if (status == SHOAL_ERR_TIMEOUT) {
        return status; /* p is still MPI's: kept on the pending list */
    }
    if (status == SHOAL_OK && p->msg.status != SHOAL_OK) {
        status = (shoal_status_t)p->msg.status;
    }
    if (status == SHOAL_OK) {
        status = shoal_comm_init(comm_p, nranks, rank, &p->msg.uid, cfg != NULL ? cfg : &dflt);
    }
    shoal_mpi_pending_free(p);
    return status;
}
