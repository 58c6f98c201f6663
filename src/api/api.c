/* The public collective calls (above coll and cuda): validate, order, run (or hand to the
 * proxy thread as a plan). */
#include "api/api.h"
#include "coll/coll.h"
#include "cuda/cuda.h"
#include "meter/meter.h"

_Static_assert((int)SHOAL_METER_NCOLL == (int)SHOAL_COLL_TYPE_COUNT &&
               (int)SHOAL_METER_SEND == (int)SHOAL_COLL_SEND &&
               (int)SHOAL_METER_ALLTOALL == (int)SHOAL_COLL_ALLTOALL,
               "the meter page's collectives follow shoal_coll_type_t");

/* Runs a call that holds its ticket, metered (src/meter/meter.h): seqlock, a few single-writer
 * increments, and the time from t0 (the call's entry, shoal_ticks) to one clock read at the
 * end. */
static shoal_status_t shoal_api_run(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                    uint64_t t0)
{
    struct shoal_meter *m = comm->meter;
    shoal_status_t st;

    if (m == NULL) {
        return shoal_coll_run(comm, a);
    }
    shoal_meter_call_enter(m);
    st = shoal_coll_run(comm, a);
    shoal_meter_call_end(m, (int)a->type, st, t0);
    return st;
}

/* A call refused before it ran: counted in errors (st is returned). Not in a process forked
 * from comm's: the meter page is shared with the parent (MAP_SHARED), and the child's refused
 * calls were billed as the parent's errors; such a call touches nothing. */
static shoal_status_t shoal_api_refused(shoal_comm_t comm, shoal_status_t st)
{
    if (comm != NULL && !shoal_comm_forked(comm)) {
        shoal_meter_count_refused(comm->meter);
    }
    return st;
}

/* name: the call's, NULL for the blocking call of a's type. */
static shoal_status_t shoal_api_check_comm(shoal_comm_t comm, const shoal_coll_args_t *a,
                                           const char *name)
{
    if (comm == NULL) {
        if (name != NULL) {
            shoal_error(COLL, "%s: NULL communicator", name);
        } else {
            shoal_error(COLL, "shoal_%s: NULL communicator", shoal_coll_type_name(a->type));
        }
        return SHOAL_ERR_INVALID_ARG;
    }
    return shoal_comm_check_usable(comm);
}

/* Whether sendbuf and recvbuf share bytes other than in one of the documented in-place
 * layouts (sendbuf == recvbuf; AllGather's input at its own block of recvbuf, ReduceScatter's
 * output at its own block of sendbuf). The algorithms read inputs after they wrote outputs, so
 * any other overlap gave wrong results with SHOAL_OK; count is already known not to overflow. */
static int shoal_api_bad_overlap(shoal_comm_t comm, const shoal_coll_args_t *a)
{
    size_t bytes = a->count * shoal_dtype_esize(a->dtype), all = bytes * (size_t)comm->nranks;
    size_t sbytes = bytes, rbytes = bytes, own = bytes * (size_t)comm->rank;
    uintptr_t s = (uintptr_t)a->sendbuf, r = (uintptr_t)a->recvbuf;

    if (s == r || bytes == 0) {
        return 0;
    }
    if (a->type == SHOAL_COLL_ALLGATHER) {
        rbytes = all;
        if (s == r + own) {
            return 0;
        }
    } else if (a->type == SHOAL_COLL_REDUCE_SCATTER) {
        sbytes = all;
        if (r == s + own) {
            return 0;
        }
    } else if (a->type == SHOAL_COLL_ALLTOALL) {
        sbytes = rbytes = all;
    }
    return s < r + rbytes && r < s + sbytes;
}

static shoal_status_t shoal_api_check_args(shoal_comm_t comm, const shoal_coll_args_t *a)
{
    int need_send = 1, need_recv = 1;
    if ((unsigned)a->dtype >= SHOAL_DTYPE_COUNT || (unsigned)a->op >= SHOAL_OP_COUNT) {
        shoal_error(COLL, "invalid dtype %d or op %d", (int)a->dtype, (int)a->op);
        return SHOAL_ERR_INVALID_ARG;
    }
    switch (a->type) {
    case SHOAL_COLL_BROADCAST:
    case SHOAL_COLL_REDUCE:
        if (a->root < 0 || a->root >= comm->nranks) {
            shoal_error(COLL, "root %d out of range [0, %d)", a->root, comm->nranks);
            return SHOAL_ERR_INVALID_ARG;
        }
        need_send = a->type == SHOAL_COLL_REDUCE || comm->rank == a->root;
        need_recv = a->type == SHOAL_COLL_BROADCAST || comm->rank == a->root;
        break;
    case SHOAL_COLL_SEND:
    case SHOAL_COLL_RECV:
        if (a->root < 0 || a->root >= comm->nranks || a->root == comm->rank) {
            shoal_error(COLL, "peer %d is not another rank of this communicator (size %d)",
                        a->root, comm->nranks);
            return SHOAL_ERR_INVALID_ARG;
        }
        need_send = a->type == SHOAL_COLL_SEND;
        need_recv = a->type == SHOAL_COLL_RECV;
        break;
    case SHOAL_COLL_BARRIER:
        return SHOAL_OK;
    default:
        break;
    }
    if (a->count > 0 && ((need_send && a->sendbuf == NULL) || (need_recv && a->recvbuf == NULL))) {
        shoal_error(COLL, "NULL buffer with count %zu", a->count);
        return SHOAL_ERR_INVALID_ARG;
    }
    /* count > SIZE_MAX / 8 / nranks, without the division */
    if (__builtin_mul_overflow(a->count, (size_t)comm->nranks * 8, &(size_t){0})) {
        shoal_error(COLL, "count %zu is too large", a->count);
        return SHOAL_ERR_INVALID_ARG;
    }
    if (need_send && need_recv && shoal_api_bad_overlap(comm, a)) {
        shoal_error(COLL, "sendbuf %p and recvbuf %p overlap (in place is sendbuf == recvbuf)",
                    a->sendbuf, (void *)a->recvbuf);
        return SHOAL_ERR_INVALID_ARG;
    }
    return SHOAL_OK;
}

/* Blocking call: runs on the caller's thread in issue order. */
static shoal_status_t shoal_api_call(shoal_comm_t comm, const shoal_coll_args_t *a, void *stream)
{
    uint64_t ticket, t0 = 0;
    shoal_status_t st;

    st = shoal_api_check_comm(comm, a, NULL);
    if (st == SHOAL_OK) {
        st = shoal_api_check_args(comm, a);
    }
    if (SHOAL_UNLIKELY(st != SHOAL_OK)) {
        return shoal_api_refused(comm, st);
    }
    /* The call's entry time, once: the meter's start, and the clock of the CUDA layer's look
     * for a loaded driver (which reads it itself when the meter is off and it needs it). */
    if (comm->meter != NULL) {
        t0 = shoal_ticks();
    }
    /* A group's blocking sends and receives are recorded together, on host and device
     * buffers alike, and posted at its end in the order they were made (group.c): recorded
     * apart, each kind was posted and waited for after the other, and a rank that sent from
     * host memory and received into device memory waited for its peer, which did the same,
     * until the timeout. */
    if ((a->type == SHOAL_COLL_SEND || a->type == SHOAL_COLL_RECV) && stream == NULL &&
        shoal_group_depth() > 0) {
        return shoal_api_group_add(comm, a); /* posted with the others at the group's end */
    }
    if (shoal_cuda_wants(a, stream, &t0)) {
        return shoal_cuda_call(comm, a, stream); /* stream-ordered or device buffers */
    }
    ticket = shoal_comm_ticket_take(comm);
    st = shoal_comm_ticket_wait(comm, ticket);
    if (st == SHOAL_OK) {
        st = shoal_api_run(comm, a, t0);
    } else {
        shoal_meter_count_refused(comm->meter);
    }
    shoal_comm_ticket_release(comm);
    return st;
}

shoal_status_t shoal_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                               shoal_dtype_t dtype, shoal_op_t op, shoal_comm_t comm, void *stream)
{
    shoal_coll_args_t a = {.type = SHOAL_COLL_ALLREDUCE, .sendbuf = sendbuf, .recvbuf = recvbuf,
                           .count = count, .dtype = dtype, .op = op};
    return shoal_api_call(comm, &a, stream);
}

shoal_status_t shoal_broadcast(const void *sendbuf, void *recvbuf, size_t count,
                               shoal_dtype_t dtype, int root, shoal_comm_t comm, void *stream)
{
    shoal_coll_args_t a = {.type = SHOAL_COLL_BROADCAST, .sendbuf = sendbuf, .recvbuf = recvbuf,
                           .count = count, .dtype = dtype, .root = root};
    return shoal_api_call(comm, &a, stream);
}

shoal_status_t shoal_reduce(const void *sendbuf, void *recvbuf, size_t count, shoal_dtype_t dtype,
                            shoal_op_t op, int root, shoal_comm_t comm, void *stream)
{
    shoal_coll_args_t a = {.type = SHOAL_COLL_REDUCE, .sendbuf = sendbuf, .recvbuf = recvbuf,
                           .count = count, .dtype = dtype, .op = op, .root = root};
    return shoal_api_call(comm, &a, stream);
}

shoal_status_t shoal_allgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                               shoal_dtype_t dtype, shoal_comm_t comm, void *stream)
{
    shoal_coll_args_t a = {.type = SHOAL_COLL_ALLGATHER, .sendbuf = sendbuf, .recvbuf = recvbuf,
                           .count = sendcount, .dtype = dtype};
    return shoal_api_call(comm, &a, stream);
}

shoal_status_t shoal_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                    shoal_dtype_t dtype, shoal_op_t op, shoal_comm_t comm,
                                    void *stream)
{
    shoal_coll_args_t a = {.type = SHOAL_COLL_REDUCE_SCATTER, .sendbuf = sendbuf,
                           .recvbuf = recvbuf, .count = recvcount, .dtype = dtype, .op = op};
    return shoal_api_call(comm, &a, stream);
}

shoal_status_t shoal_alltoall(const void *sendbuf, void *recvbuf, size_t count,
                              shoal_dtype_t dtype, shoal_comm_t comm, void *stream)
{
    shoal_coll_args_t a = {.type = SHOAL_COLL_ALLTOALL, .sendbuf = sendbuf, .recvbuf = recvbuf,
                           .count = count, .dtype = dtype};
    return shoal_api_call(comm, &a, stream);
}

shoal_status_t shoal_barrier(shoal_comm_t comm, void *stream)
{
    shoal_coll_args_t a = {.type = SHOAL_COLL_BARRIER};
    return shoal_api_call(comm, &a, stream);
}

shoal_status_t shoal_send(const void *sendbuf, size_t count, shoal_dtype_t dtype, int peer,
                          shoal_comm_t comm, void *stream)
{
    shoal_coll_args_t a = {.type = SHOAL_COLL_SEND, .sendbuf = sendbuf, .count = count,
                           .dtype = dtype, .root = peer};
    return shoal_api_call(comm, &a, stream);
}

shoal_status_t shoal_recv(void *recvbuf, size_t count, shoal_dtype_t dtype, int peer,
                          shoal_comm_t comm, void *stream)
{
    shoal_coll_args_t a = {.type = SHOAL_COLL_RECV, .recvbuf = recvbuf, .count = count,
                           .dtype = dtype, .root = peer};
    return shoal_api_call(comm, &a, stream);
}

/* ---- nonblocking calls: plans on the proxy thread ---- */

/* The plan's outcome, metered like a blocking call: ops, time from its start, errors. Plans
 * of one communicator overlap: the page's sequence stays odd until the last one ends
 * (shoal_meter_plan_begin). */
static void shoal_api_plan_done(struct shoal_comm *comm, shoal_coll_plan_t *cp,
                                shoal_status_t st)
{
    shoal_meter_plan_end(comm->meter, (int)cp->a.type, st, cp->t0);
}

/* The proxy starts the call in issue order (its ticket is served). */
static shoal_status_t shoal_api_plan_start(struct shoal_comm *comm, void *arg,
                                           shoal_plan_t **plan_p)
{
    const shoal_coll_args_t *a = arg;
    struct shoal_meter *m = comm->meter;
    shoal_coll_plan_t *cp;
    uint64_t t0 = 0;
    shoal_status_t st;

    if (m != NULL) {
        t0 = shoal_meter_plan_begin(m);
    }
    st = shoal_coll_plan(comm, a, 0, &cp);
    if (cp == NULL) {
        if (m != NULL) {
            shoal_meter_plan_end(m, (int)a->type, st, t0);
        }
        *plan_p = NULL;
        return st;
    }
    if (m != NULL) {
        cp->on_done = shoal_api_plan_done;
        cp->t0 = t0;
    }
    *plan_p = &cp->base;
    return SHOAL_OK;
}

static shoal_status_t shoal_api_icall(shoal_comm_t comm, const shoal_coll_args_t *a,
                                      const char *name, shoal_request_t *req_p)
{
    shoal_status_t st;
    /* Every refusal counts in errors, as the blocking calls' do (shoal_api_refused). */
    if (req_p == NULL) {
        shoal_error(COLL, "%s: NULL request pointer", name);
        return shoal_api_refused(comm, SHOAL_ERR_INVALID_ARG);
    }
    /* A refused call leaves a completed request: a later wait on it, which a caller's
     * cleanup path does without looking at the status, waited on whatever was there. */
    *req_p = NULL;
    st = shoal_api_check_comm(comm, a, name);
    if (st == SHOAL_OK) {
        st = shoal_api_check_args(comm, a);
    }
    if (st != SHOAL_OK) {
        return shoal_api_refused(comm, st);
    }
    if (shoal_cuda_wants(a, NULL, &(uint64_t){0})) {
        shoal_error(COLL, "%s takes host buffers; for device buffers pass a stream to the "
                    "blocking call", name);
        return shoal_api_refused(comm, SHOAL_ERR_UNSUPPORTED);
    }
    st = shoal_proxy_post_plan(comm, shoal_api_plan_start, a, sizeof(*a), req_p);
    return st == SHOAL_OK ? st : shoal_api_refused(comm, st); /* not posted: never runs */
}

shoal_status_t shoal_iallreduce(const void *sendbuf, void *recvbuf, size_t count,
                                shoal_dtype_t dtype, shoal_op_t op, shoal_comm_t comm,
                                shoal_request_t *req_p)
{
    shoal_coll_args_t a = {.type = SHOAL_COLL_ALLREDUCE, .sendbuf = sendbuf, .recvbuf = recvbuf,
                           .count = count, .dtype = dtype, .op = op};
    return shoal_api_icall(comm, &a, "shoal_iallreduce", req_p);
}

shoal_status_t shoal_ibroadcast(const void *sendbuf, void *recvbuf, size_t count,
                                shoal_dtype_t dtype, int root, shoal_comm_t comm,
                                shoal_request_t *req_p)
{
    shoal_coll_args_t a = {.type = SHOAL_COLL_BROADCAST, .sendbuf = sendbuf, .recvbuf = recvbuf,
                           .count = count, .dtype = dtype, .root = root};
    return shoal_api_icall(comm, &a, "shoal_ibroadcast", req_p);
}

shoal_status_t shoal_iallgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                shoal_dtype_t dtype, shoal_comm_t comm, shoal_request_t *req_p)
{
    shoal_coll_args_t a = {.type = SHOAL_COLL_ALLGATHER, .sendbuf = sendbuf, .recvbuf = recvbuf,
                           .count = sendcount, .dtype = dtype};
    return shoal_api_icall(comm, &a, "shoal_iallgather", req_p);
}

shoal_status_t shoal_ireduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                     shoal_dtype_t dtype, shoal_op_t op, shoal_comm_t comm,
                                     shoal_request_t *req_p)
{
    shoal_coll_args_t a = {.type = SHOAL_COLL_REDUCE_SCATTER, .sendbuf = sendbuf,
                           .recvbuf = recvbuf, .count = recvcount, .dtype = dtype, .op = op};
    return shoal_api_icall(comm, &a, "shoal_ireduce_scatter", req_p);
}

shoal_status_t shoal_ialltoall(const void *sendbuf, void *recvbuf, size_t count,
                               shoal_dtype_t dtype, shoal_comm_t comm, shoal_request_t *req_p)
{
    shoal_coll_args_t a = {.type = SHOAL_COLL_ALLTOALL, .sendbuf = sendbuf, .recvbuf = recvbuf,
                           .count = count, .dtype = dtype};
    return shoal_api_icall(comm, &a, "shoal_ialltoall", req_p);
}

shoal_status_t shoal_ireduce(const void *sendbuf, void *recvbuf, size_t count,
                             shoal_dtype_t dtype, shoal_op_t op, int root, shoal_comm_t comm,
                             shoal_request_t *req_p)
{
    shoal_coll_args_t a = {.type = SHOAL_COLL_REDUCE, .sendbuf = sendbuf, .recvbuf = recvbuf,
                           .count = count, .dtype = dtype, .op = op, .root = root};
    return shoal_api_icall(comm, &a, "shoal_ireduce", req_p);
}

shoal_status_t shoal_ibarrier(shoal_comm_t comm, shoal_request_t *req_p)
{
    shoal_coll_args_t a = {.type = SHOAL_COLL_BARRIER};
    return shoal_api_icall(comm, &a, "shoal_ibarrier", req_p);
}
