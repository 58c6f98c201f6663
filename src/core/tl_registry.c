/* Transports in preference order. A transport that is not built is not in the list. */
#include "core/tl.h"

#include <string.h>

static const shoal_tl_ops_t *const shoal_tl_registry[] = {
    &shoal_tl_shm_ops,
    &shoal_tl_tcp_ops,
#if SHOAL_HAVE_VERBS
    &shoal_tl_ib_ops, /* after tcp: used when forced with SHOAL_TRANSPORT=ib */
#endif
#if SHOAL_HAVE_UCX
    &shoal_tl_ucx_ops, /* after tcp: used when forced with SHOAL_TRANSPORT=ucx */
#endif
};

size_t shoal_tl_count(void)
{
    return SHOAL_ARRAY_SIZE(shoal_tl_registry);
}

const shoal_tl_ops_t *shoal_tl_get(size_t i)
{
    return i < shoal_tl_count() ? shoal_tl_registry[i] : NULL;
}

const shoal_tl_ops_t *shoal_tl_find(const char *name)
{
    for (size_t i = 0; i < shoal_tl_count(); i++) {
        if (strcmp(shoal_tl_registry[i]->name, name) == 0) {
            return shoal_tl_registry[i];
        }
    }
    return NULL;
}
