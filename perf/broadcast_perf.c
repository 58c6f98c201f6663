/* broadcast_perf: shoal_broadcast bandwidth and correctness, nccl-tests style. */
#include "perf/common.h"

static void broadcast_counts(size_t count, int nranks, perf_counts_t *c_p)
{
    *c_p = (perf_counts_t){.send = count, .recv = count, .param = count};
}

/* Every byte crosses each link once. */
static double broadcast_bus_factor(int nranks)
{
    return 1.0;
}

static void broadcast_fill(const perf_test_t *t, void *send)
{
    if (t->rank != t->root) {
        return;
    }
    for (size_t i = 0; i < t->counts.param; i++) {
        perf_data_store(t->dtype, send, i, perf_data_value(t, t->root, i));
    }
}

static size_t broadcast_check(const perf_test_t *t, const void *recv)
{
    size_t wrong = 0;

    for (size_t i = 0; i < t->counts.param; i++) {
        wrong += !perf_data_ok(t, recv, i, perf_data_value(t, t->root, i));
    }
    return wrong;
}

int main(int argc, char **argv)
{
    static const perf_coll_t coll = {
        .name = "broadcast",
        .kind = PERF_COLL_BROADCAST,
        .has_root = 1,
        .counts = broadcast_counts,
        .bus_factor = broadcast_bus_factor,
        .fill = broadcast_fill,
        .check = broadcast_check,
    };

    return perf_main(&coll, argc, argv);
}
