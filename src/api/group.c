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

/* One communicator's n sends and receives, in issue order with the other calls on it (its
 * ticket), metered as n calls that ran as one: an op each, the time once, one error. */
static shoal_status_t shoal_api_group_run(struct shoal_comm *comm, const shoal_coll_args_t *ops,
                                          int n)
{
    struct shoal_meter *m = comm->meter;
    uint64_t ticket, t0 = 0;
    shoal_status_t st;

    if (m != NULL) {
        t0 = shoal_ticks();
    }
    ticket = shoal_comm_ticket_take(comm);
    st = shoal_comm_ticket_wait(comm, ticket);
    if (st != SHOAL_OK) {
        for (int i = 0; i < n; i++) {
            shoal_meter_count_refused(m); /* as each blocking call would have been */
        }
    } else if (m == NULL) {
        st = shoal_p2p_run_many(comm, ops, n);
    } else {
        shoal_meter_call_enter(m);
        st = shoal_p2p_run_many(comm, ops, n);
        for (int i = 1; i < n; i++) {
            shoal_meter_add(&m->page->ops[ops[i].type], 1);
        }
        shoal_meter_call_end(m, (int)ops[0].type, st, t0);
    }
    shoal_comm_ticket_release(comm);
    return st;
}

/* Runs and forgets what the thread's group recorded: one communicator after the other, in
 * the order of their first call; every one runs even after another failed (its peers wait
 * for it), and the first failure is returned. */
static shoal_status_t shoal_api_group_flush(void)
{
    shoal_api_gop_t *g = shoal_api_group_ops;
    int n = shoal_api_group_n;
    shoal_coll_args_t *batch = n > 0 ? malloc((size_t)n * sizeof(*batch)) : NULL;
    shoal_status_t st = SHOAL_OK, st2;

    if (n > 0 && batch == NULL) {
        shoal_error(COLL, "no memory to run a group of %d sends/receives", n);
        st = SHOAL_ERR_NO_MEMORY;
        n = 0;
    }
    for (int i = 0; i < n; i++) {
        int k = 0;
        if (g[i].comm == NULL) {
            continue;
        }
        for (int j = i; j < n; j++) {
            if (g[j].comm == g[i].comm) {
                batch[k++] = g[j].a;
                if (j > i) {
                    g[j].comm = NULL;
                }
            }
        }
        st2 = shoal_api_group_run(g[i].comm, batch, k);
        st = st != SHOAL_OK ? st : st2;
    }
    free(batch);
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
