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
#include "util/trec.h"

#include <stdlib.h>

typedef struct {
    struct shoal_comm *comm;   /* first (util/trec.h): NULL once dropped */
    shoal_coll_args_t a;
} shoal_api_gop_t;

/* Every thread's recorded sends and receives (util/trec.h): the destroy of a communicator may
 * come from another thread than the group's, and must drop what every group recorded on it;
 * a thread that exits inside a group leaves nothing behind. */
static shoal_trec_list_t shoal_api_group_recs = SHOAL_TREC_LIST_INIT(shoal_api_gop_t);

/* The library unloaded (dlclose): no later thread exit may call into it. */
__attribute__((destructor)) static void shoal_api_group_unload(void)
{
    shoal_trec_unload(&shoal_api_group_recs);
}

shoal_status_t shoal_api_group_add(struct shoal_comm *comm, const shoal_coll_args_t *a)
{
    shoal_api_gop_t op = {.comm = comm, .a = *a};

    if (shoal_trec_add(&shoal_api_group_recs, &op) != SHOAL_OK) {
        shoal_error(COLL, "no memory to record a send/receive of a group");
        shoal_meter_count_refused(comm->meter);
        return SHOAL_ERR_NO_MEMORY;
    }
    return SHOAL_OK;
}

void shoal_api_group_forget(struct shoal_comm *comm)
{
    int dropped = shoal_trec_forget(&shoal_api_group_recs, comm);

    if (dropped > 0) {
        shoal_error(COLL, "rank %d: communicator %08x destroyed inside a group: its %d "
                    "send(s)/receive(s) recorded since shoal_group_start are dropped, and "
                    "shoal_group_end fails", comm->rank, comm->comm_id, dropped);
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
        uint64_t ticket;
        /* A group the parent recorded before it forked this process, ended here: refused
         * before a ticket (a call of the parent's in flight at the fork holds one that nobody
         * serves here: the end waited forever) and not counted (the meter page is the
         * parent's: its errors grew by the child's calls). */
        if (shoal_comm_forked(comm)) {
            b[k].status = shoal_comm_check_usable(comm);
            st = st != SHOAL_OK ? st : b[k].status;
            continue;
        }
        ticket = shoal_comm_ticket_take(comm);
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
        if (!shoal_comm_forked(b[k].comm)) { /* a forked process's took none */
            shoal_comm_ticket_release(b[k].comm);
        }
    }
    free(run);
    return st;
}

/* Runs what the thread's group recorded (g[0..n), taken away from the list: a destroy after
 * that no longer drops them): one batch per communicator, its calls in the order they were
 * made; the first failure is returned. */
static shoal_status_t shoal_api_group_flush(shoal_api_gop_t *g, int n)
{
    int nb = 0, k = 0;
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
                g[j].comm = NULL;
            }
        }
        /* a batch with a device buffer goes to the CUDA layer whole, every message posted at
         * once there (its host buffers too) */
        int dev = 0;
        for (int j = 0; j < b[nb].n && !dev; j++) {
            dev = shoal_cuda_wants(&b[nb].ops[j], NULL, &(uint64_t){0});
        }
        if (dev) {
            shoal_status_t st2 = shoal_cuda_p2p_batch(b[nb].comm, b[nb].ops, b[nb].n);
            st = st != SHOAL_OK ? st : st2;
            continue;
        }
        nb++;
    }
    if (nb > 0) {
        shoal_status_t st2 = shoal_api_group_run(b, nb);
        st = st != SHOAL_OK ? st : st2;
    }
    free(b);
    free(ops);
    return st;
}

shoal_status_t shoal_group_start(void)
{
    shoal_group_enter();
    return SHOAL_OK;
}

shoal_status_t shoal_group_end(void)
{
    int outermost, n, dropped;
    shoal_status_t st = shoal_group_leave(&outermost), st2;
    shoal_api_gop_t *g;

    if (!outermost) {
        return st;
    }
    /* The host sends and receives run even when the CUDA layer's submission failed: their
     * peers wait for them. */
    g = shoal_trec_take(&shoal_api_group_recs, &n, &dropped);
    st2 = shoal_api_group_flush(g, n);
    st = st != SHOAL_OK ? st : st2;
    free(g);
    if (dropped > 0) {
        /* calls the application was told were recorded never ran */
        shoal_error(COLL, "shoal_group_end: %d send(s)/receive(s) of this group were on a "
                    "communicator destroyed before the end", dropped);
        st = st != SHOAL_OK ? st : SHOAL_ERR_INVALID_ARG;
    }
    return st;
}
