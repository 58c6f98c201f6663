/* Proxy-thread extensions for the CUDA layer (src/cuda): detached requests (no caller waits;
 * the proxy frees them) and one per-communicator extension slot whose fini runs when the
 * proxy stops (shoal_comm_destroy), after every queued request ran or was cancelled.
 * Defined in proxy.c; meant to move into core.h. */
#ifndef SHOAL_CORE_PROXY_EXT_H
#define SHOAL_CORE_PROXY_EXT_H

#include "core/core.h"

typedef void (*shoal_proxy_ext_fini_t)(struct shoal_comm *comm, void *ext);

/* Like shoal_proxy_post, but nobody waits: fn reports its own errors (a request cancelled by
 * shoal_comm_destroy is freed without fn running). */
SHOAL_HIDDEN shoal_status_t shoal_proxy_post_detached(struct shoal_comm *comm,
                                                      shoal_proxy_fn_t fn, const void *arg,
                                                      size_t arglen);
/* Starts the proxy if needed; *ext_p = the slot's value (NULL until set). Not thread-safe
 * against itself: the caller serialises (src/cuda holds a lock). */
SHOAL_HIDDEN shoal_status_t shoal_proxy_ext_get(struct shoal_comm *comm, void **ext_p);
/* Only after shoal_proxy_ext_get succeeded. */
SHOAL_HIDDEN void shoal_proxy_ext_set(struct shoal_comm *comm, void *ext,
                                      shoal_proxy_ext_fini_t fini);

#endif
