/* shoal_group_start / shoal_group_end. The CUDA layer records its calls (stream-ordered or on
 * device buffers) and submits them at the outermost end (src/cuda/group.c); host sends and
 * receives (host buffers, stream NULL) are recorded here, per thread, and at the outermost
 * end posted all at once on their communicator's channels and waited for together: a large
 * send completes only once the peer receives it, so two ranks that each send before they
 * receive would wait for each other forever if each call ran at once (a torch
 * batch_isend_irecv). Host collectives inside a group still run at once. */
#include "api/api.h"
#include "coll/coll.h"
#include "cuda/cuda.h"
#include "meter/meter.h"

#include <stdlib.h>

typedef struct {
    struct shoal_comm *comm;   /* NULL once run */
    shoal_coll_args_t a;
} shoal_api_gop_t;

static __thread shoal_api_gop_t *shoal_api_group_ops;
static __thread int shoal_api_group_n, shoal_api_group_cap;
static __thread int shoal_api_group_dropped; /* recorded on a communicator destroyed since */

shoal_status_t shoal_api_group_add(struct shoal_comm *comm, const shoal_coll_args_t *a)
{
    if (shoal_api_group_n == shoal_api_group_cap) {
        int cap = shoal_api_group_cap > 0 ? 2 * shoal_api_group_cap : 16;
        shoal_api_gop_t *p = realloc(shoal_api_group_ops, (size_t)cap * sizeof(*p));
        if (p == NULL) {
            shoal_error(COLL, "no memory to record a send/receive of a group");
            shoal_meter_count_refused(comm->meter);
            return SHOAL_ERR_NO_MEMORY;
        }
        shoal_api_group_ops = p;
        shoal_api_group_cap = cap;
    }
    shoal_api_group_ops[shoal_api_group_n++] = (shoal_api_gop_t){.comm = comm, .a = *a};
    return SHOAL_OK;
}

void shoal_api_group_forget(struct shoal_comm *comm)
{
    int k = 0, n = shoal_api_group_n;
    for (int i = 0; i < n; i++) {
        if (shoal_api_group_ops[i].comm != comm) {
            shoal_api_group_ops[k++] = shoal_api_group_ops[i];
        }
    }
    if (k < n) {
        shoal_error(COLL, "rank %d: communicator %08x destroyed inside a group: its %d "
                    "send(s)/receive(s) recorded since shoal_group_start are dropped, and "
                    "shoal_group_end fails", comm->rank, comm->comm_id, n - k);
        shoal_api_group_n = k;
        shoal_api_group_dropped += n - k;
    }
}

static int shoal_api_batch_cmp(const void *x, const void *y)
{
    uintptr_t a = (uintptr_t)((const shoal_p2p_batch_t *)x)->comm;
    uintptr_t b = (uintptr_t)((const shoal_p2p_batch_t *)y)->comm;
    return a < b ? -1 : a > b;
}

/* Runs the batches (one per communicator) as one: each communicator's ticket is taken and
 * waited for in the order of the communicators' addresses, so that two threads whose groups
 * span the same communicators cannot each hold one that the other waits for; then every
 * message of every batch is posted before any wait (shoal_p2p_run_batches). Run one
 * communicator after the other, a rank that waited on A's send while its peer waited on B's
 * receive waited until the timeout. A batch's n calls are metered as n calls that ran as one:
 * an op each, the time once, one error. A batch whose communicator cannot run (failed,
 * aborted) counts its calls as refused, and the others run: their peers wait for them. */
static shoal_status_t shoal_api_group_run(shoal_p2p_batch_t *b, int nb)
{
    shoal_p2p_batch_t *run = malloc((size_t)nb * sizeof(*run));
    uint64_t t0 = shoal_ticks();
    shoal_status_t st = SHOAL_OK;
    int nrun = 0;

    if (run == NULL) {
        shoal_error(COLL, "no memory to run a group over %d communicators", nb);
        return SHOAL_ERR_NO_MEMORY;
    }
    qsort(b, (size_t)nb, sizeof(*b), shoal_api_batch_cmp);
    for (int k = 0; k < nb; k++) {
        struct shoal_comm *comm = b[k].comm;
        uint64_t ticket = shoal_comm_ticket_take(comm);
        b[k].status = shoal_comm_ticket_wait(comm, ticket);
        if (b[k].status != SHOAL_OK) {
            for (int i = 0; i < b[k].n; i++) {
                shoal_meter_count_refused(comm->meter); /* as each blocking call would be */
            }
            st = st != SHOAL_OK ? st : b[k].status;
            continue;
        }
        if (comm->meter != NULL) {
            shoal_meter_call_enter(comm->meter);
        }
        run[nrun++] = b[k];
    }
    if (nrun > 0) {
        shoal_status_t st2 = shoal_p2p_run_batches(run, nrun);
        st = st != SHOAL_OK ? st : st2;
    }
    for (int k = 0; k < nrun; k++) {
        struct shoal_meter *m = run[k].comm->meter;
        if (m != NULL) {
            for (int i = 1; i < run[k].n; i++) {
                shoal_meter_add(&m->page->ops[run[k].ops[i].type], 1);
            }
            shoal_meter_call_end(m, (int)run[k].ops[0].type, run[k].status, t0);
        }
    }
    for (int k = 0; k < nb; k++) {
        shoal_comm_ticket_release(b[k].comm);
    }
    free(run);
    return st;
}

/* Runs and forgets what the thread's group recorded: one batch per communicator, its calls in
 * the order they were made; the first failure is returned. */
static shoal_status_t shoal_api_group_flush(void)
{
    shoal_api_gop_t *g = shoal_api_group_ops;
    int n = shoal_api_group_n, nb = 0, k = 0;
    shoal_coll_args_t *ops = n > 0 ? malloc((size_t)n * sizeof(*ops)) : NULL;
    shoal_p2p_batch_t *b = n > 0 ? malloc((size_t)n * sizeof(*b)) : NULL;
    shoal_status_t st = SHOAL_OK;

    if (n > 0 && (ops == NULL || b == NULL)) {
        shoal_error(COLL, "no memory to run a group of %d sends/receives", n);
        st = SHOAL_ERR_NO_MEMORY;
        n = 0;
    }
    for (int i = 0; i < n; i++) {
        if (g[i].comm == NULL) {
            continue;
        }
        b[nb] = (shoal_p2p_batch_t){.comm = g[i].comm, .ops = ops + k};
        for (int j = i; j < n; j++) {
            if (g[j].comm == b[nb].comm) {
                ops[k++] = g[j].a;
                b[nb].n++;
                if (j > i) {
                    g[j].comm = NULL;
                }
            }
        }
        nb++;
    }
    if (nb > 0) {
        st = shoal_api_group_run(b, nb);
    }
    free(b);
    free(ops);
    free(shoal_api_group_ops);
    shoal_api_group_ops = NULL;
    shoal_api_group_n = shoal_api_group_cap = 0;
    return st;
}

shoal_status_t shoal_group_start(void)
{
    shoal_group_enter();
    return SHOAL_OK;
}

shoal_status_t shoal_group_end(void)
{
    int outermost;
    shoal_status_t st = shoal_group_leave(&outermost), st2;

    if (!outermost) {
        return st;
    }
    /* The host sends and receives run even when the CUDA layer's submission failed: their
     * peers wait for them. */
    st2 = shoal_api_group_flush();
    st = st != SHOAL_OK ? st : st2;
    if (shoal_api_group_dropped > 0) {
        /* calls the application was told were recorded never ran */
        shoal_error(COLL, "shoal_group_end: %d send(s)/receive(s) of this group were on a "
                    "communicator destroyed before the end", shoal_api_group_dropped);
        shoal_api_group_dropped = 0;
        st = st != SHOAL_OK ? st : SHOAL_ERR_INVALID_ARG;
    }
    return st;
}
