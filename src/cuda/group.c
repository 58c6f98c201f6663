/* shoal_group_start / shoal_group_end: calls of the CUDA layer issued between them (stream-
 * ordered or on device buffers) are recorded and submitted at the outermost end as one proxy
 * task per (communicator, stream). Host calls on host buffers run at once, as outside a group.
 * Built with and without CUDA. */
#include "cuda/cuda.h"

static __thread int shoal_group_nesting;

int shoal_group_depth(void)
{
    return shoal_group_nesting;
}

shoal_status_t shoal_group_start(void)
{
    shoal_group_nesting++;
    return SHOAL_OK;
}

shoal_status_t shoal_group_end(void)
{
    if (shoal_group_nesting <= 0) {
        shoal_error(CUDA, "shoal_group_end without shoal_group_start");
        return SHOAL_ERR_INVALID_ARG;
    }
    if (--shoal_group_nesting > 0) {
        return SHOAL_OK;
    }
    return shoal_cuda_group_flush();
}
