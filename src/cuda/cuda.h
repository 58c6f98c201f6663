/*
 * The CUDA layer as the collective API sees it (src/api/api.c, src/cuda/group.c). A call goes
 * to the layer when it names a stream or any of its buffers is device memory; the layer runs
 * it stream-ordered through the proxy thread (stream != NULL) or blocking (stream == NULL).
 * Without a CUDA build the layer is absent: a stream is SHOAL_ERR_UNSUPPORTED.
 */
#ifndef SHOAL_CUDA_H
#define SHOAL_CUDA_H

#include "core/call.h"
#include "core/core.h"
#include "meter/meter.h"

/* How the CUDA layer runs a call on host memory (a staged chunk, host buffers on a stream):
 * through coll's algorithms, which sit above it (DESIGN.md section 1: cuda < coll). The
 * assembly (src/api/assemble.c) defines the table; the CUDA layer never names coll. */
typedef struct {
    shoal_status_t (*run)(struct shoal_comm *comm, const shoal_coll_args_t *a);
} shoal_cuda_host_t;
extern SHOAL_HIDDEN const shoal_cuda_host_t shoal_cuda_host;

#if SHOAL_HAVE_CUDA
/* 1 if the call is for the CUDA layer (stream != NULL or a device buffer). Cheap for host
 * buffers in a process that never loaded libcuda: the look for the driver is rate-limited by
 * the call's entry time *now_ticks (shoal_ticks(); 0: read here and left there). */
SHOAL_HIDDEN int shoal_cuda_wants(const shoal_coll_args_t *a, void *stream, uint64_t *now_ticks);
/* Runs or enqueues one call (args validated, communicator usable); inside
 * shoal_group_start/end it is recorded and runs at the group's end. */
SHOAL_HIDDEN shoal_status_t shoal_cuda_call(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                            void *stream);
/* The outermost shoal_group_end of this thread: submits what the group recorded. */
SHOAL_HIDDEN shoal_status_t shoal_cuda_group_flush(void);
/* A group's blocking sends and receives on comm (ops[0..n), stream NULL, validated), some on
 * device buffers: all posted at once, in their order, waited for before it returns. */
SHOAL_HIDDEN shoal_status_t shoal_cuda_p2p_batch(struct shoal_comm *comm,
                                                 const shoal_coll_args_t *ops, int n);
/* comm is being destroyed: the calling thread's open group drops what it recorded on it (and
 * its end fails) instead of submitting on freed memory. */
SHOAL_HIDDEN void shoal_cuda_group_forget(struct shoal_comm *comm);
#else
static inline int shoal_cuda_wants(const shoal_coll_args_t *a, void *stream,
                                   uint64_t *now_ticks)
{
    (void)a;
    (void)now_ticks;
    return stream != NULL;
}
static inline shoal_status_t shoal_cuda_call(struct shoal_comm *comm, const shoal_coll_args_t *a,
                                             void *stream)
{
    (void)a;
    (void)stream;
    shoal_warn_once(CUDA, "stream-ordered collectives need a CUDA build; this build has none "
                    "(pass stream = NULL for a blocking host call)");
    shoal_meter_count_refused(comm->meter); /* a refused call counts in errors */
    return SHOAL_ERR_UNSUPPORTED;
}
static inline shoal_status_t shoal_cuda_group_flush(void)
{
    return SHOAL_OK;
}
static inline shoal_status_t shoal_cuda_p2p_batch(struct shoal_comm *comm,
                                                  const shoal_coll_args_t *ops, int n)
{
    (void)ops;
    (void)n;
    shoal_meter_count_refused(comm->meter); /* not reached: no buffer is a device one here */
    return SHOAL_ERR_UNSUPPORTED;
}
static inline void shoal_cuda_group_forget(struct shoal_comm *comm)
{
    (void)comm;
}
#endif

/* Depth of shoal_group_start nesting on this thread (group.c). */
SHOAL_HIDDEN int shoal_group_depth(void);
/* shoal_group_start and shoal_group_end (src/api/group.c) as this layer sees them: one level
 * deeper; one level out, and at the outermost (*outermost_p = 1) the layer's recorded calls
 * are submitted (their status is returned). */
SHOAL_HIDDEN void shoal_group_enter(void);
SHOAL_HIDDEN shoal_status_t shoal_group_leave(int *outermost_p);

#endif
