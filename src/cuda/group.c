/* The nesting of shoal_group_start / shoal_group_end per thread (the public calls are in
 * src/api/group.c, above this layer): calls of the CUDA layer issued inside a group
 * (stream-ordered or on device buffers) are recorded and submitted at the outermost end as one
 * proxy task per (communicator, stream). Built with and without CUDA. */
#include "cuda/cuda.h"

static __thread int shoal_group_nesting;

int shoal_group_depth(void)
{
    return shoal_group_nesting;
}

void shoal_group_enter(void)
{
    shoal_group_nesting++;
}

shoal_status_t shoal_group_leave(int *outermost_p)
{
    *outermost_p = 0;
    if (shoal_group_nesting <= 0) {
        shoal_error(CUDA, "shoal_group_end without shoal_group_start");
        return SHOAL_ERR_INVALID_ARG;
    }
    if (--shoal_group_nesting > 0) {
        return SHOAL_OK;
    }
    *outermost_p = 1;
    return shoal_cuda_group_flush();
}
