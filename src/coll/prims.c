/* Channel primitives for the algorithms. */
#include "coll/coll.h"

shoal_status_t shoal_prim_sendrecv(struct shoal_comm *comm, int to, const void *sbuf,
                                   size_t slen, int from, void *rbuf, size_t rlen, uint32_t seq,
                                   uint32_t step, uint32_t chunk)
{
    shoal_tl_req_t sreq, rreq;
    shoal_tl_req_t *reqs[2] = {&rreq, &sreq};
    int peers[2] = {from, to};
    SHOAL_CHECK(shoal_chan_irecv(comm, from, rbuf, rlen, seq, step, chunk, &rreq));
    SHOAL_CHECK(shoal_chan_isend(comm, to, sbuf, slen, seq, step, chunk, &sreq));
    return shoal_chan_waitall(comm, reqs, peers, 2);
}

shoal_status_t shoal_prim_send(struct shoal_comm *comm, int to, const void *buf, size_t len,
                               uint32_t seq, uint32_t step, uint32_t chunk)
{
    shoal_tl_req_t req;
    shoal_tl_req_t *reqs[1] = {&req};
    SHOAL_CHECK(shoal_chan_isend(comm, to, buf, len, seq, step, chunk, &req));
    return shoal_chan_waitall(comm, reqs, &to, 1);
}

shoal_status_t shoal_prim_recv(struct shoal_comm *comm, int from, void *buf, size_t len,
                               uint32_t seq, uint32_t step, uint32_t chunk)
{
    shoal_tl_req_t req;
    shoal_tl_req_t *reqs[1] = {&req};
    SHOAL_CHECK(shoal_chan_irecv(comm, from, buf, len, seq, step, chunk, &req));
    return shoal_chan_waitall(comm, reqs, &from, 1);
}
