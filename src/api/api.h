/* What api.c and group.c share (src/api, above core, coll and cuda). */
#ifndef SHOAL_API_H
#define SHOAL_API_H

#include "core/call.h"
#include "core/core.h"

/* Inside shoal_group_start/end: records a host send or receive (args validated, stream NULL,
 * host buffers) for the outermost shoal_group_end, which posts the group's sends and
 * receives at once. Refused (and counted so) on no memory. */
SHOAL_HIDDEN shoal_status_t shoal_api_group_add(struct shoal_comm *comm,
                                                const shoal_coll_args_t *a);
/* comm is being destroyed: the sends and receives the calling thread's group recorded on it
 * are dropped (its end would run them on freed memory), and that end fails. */
SHOAL_HIDDEN void shoal_api_group_forget(struct shoal_comm *comm);

#endif
