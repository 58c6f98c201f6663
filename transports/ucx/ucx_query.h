/* Whether the ucx transport is chosen across hosts (issue 14; ucx_query.c): ahead of tcp only
 * where UCX reaches other hosts over an RDMA transport. */
#ifndef SHOAL_UCX_QUERY_H
#define SHOAL_UCX_QUERY_H

#include "core/tl.h"

/* lib->present: a device with an ACTIVE port in SHOAL_UCX_SYSFS_ROOT/class/infiniband (no
 * library loaded); the finding in shoal_ucx_lib.note */
SHOAL_HIDDEN int shoal_ucx_present(void);
/* ops->query: libucp loads (first call) */
SHOAL_HIDDEN int shoal_ucx_query(void);
/* lib->auto_ok (after a yes from query): UCX's own resources (libuct's components, memory
 * domains, transports) hold a network transport other than tcp that UCX_TLS and
 * UCX_NET_DEVICES allow (rc_verbs, rc_mlx5, dc_mlx5, ud_verbs, ...); computed once */
SHOAL_HIDDEN int shoal_ucx_auto_ok(void);

/* 1 if UCX_TLS (NULL or "": unset) lets UCX use transport tl ("rc_verbs"): a name in the
 * list, an alias that prefixes it ("rc" for rc_verbs and rc_mlx5; "ib" and "all" for every
 * one), or a list starting with '^' that names none of those; ":aux" entries do not count
 * (used for connection setup only). */
SHOAL_HIDDEN int shoal_ucx_tls_allows(const char *tls, const char *tl);
/* 1 if UCX_NET_DEVICES (NULL, "" or "all": every one) names device dev ("rxe0:1"). */
SHOAL_HIDDEN int shoal_ucx_dev_allowed(const char *devs, const char *dev);
/* Reads root/class/infiniband: 1 if some port of a device is ACTIVE; a sentence in note. */
SHOAL_HIDDEN int shoal_ucx_sysfs_active(const char *root, char *note, size_t len);

#endif
