/* allreduce_perf: shoal_allreduce bandwidth and correctness, nccl-tests style. */
#include "perf/common.h"

static void allreduce_counts(size_t count, int nranks, perf_counts_t *c_p)
{
    *c_p = (perf_counts_t){.send = count, .recv = count, .param = count};
}

/* Each rank sends and receives the whole buffer: 2(n-1)/n of it crosses the busiest link. */
static double allreduce_bus_factor(int nranks)
{
    return 2.0 * (nranks - 1) / nranks;
}

static void allreduce_fill(const perf_test_t *t, void *send)
{
    for (size_t i = 0; i < t->counts.param; i++) {
        perf_data_store(t->dtype, send, i, perf_data_value(t, t->rank, i));
    }
}

static size_t allreduce_check(const perf_test_t *t, const void *recv)
{
    size_t wrong = 0;

    for (size_t i = 0; i < t->counts.param; i++) {
        wrong += !perf_data_ok(t, recv, i, perf_data_expected(t, i));
    }
    return wrong;
}

int main(int argc, char **argv)
{
    static const perf_coll_t coll = {
        .name = "allreduce",
        .kind = PERF_COLL_ALLREDUCE,
        .has_op = 1,
        .counts = allreduce_counts,
        .bus_factor = allreduce_bus_factor,
        .fill = allreduce_fill,
        .check = allreduce_check,
    };

    return perf_main(&coll, argc, argv);
}
