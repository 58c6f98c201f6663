/* reduce_scatter_perf: shoal_reduce_scatter bandwidth and correctness, nccl-tests style.
 * The size column is the send (total) buffer; count is what each rank receives. In place,
 * each rank's receive buffer is its own block of the send buffer (NCCL's convention). */
#include "perf/common.h"

static void reduce_scatter_counts(size_t count, int nranks, perf_counts_t *c_p)
{
    size_t per_rank = count / (size_t)nranks;

    *c_p = (perf_counts_t){.send = per_rank * (size_t)nranks, .recv = per_rank,
                           .param = per_rank, .recv_ip_off = per_rank};
}

/* Each rank sends the (n-1)/n of the total that it does not keep. */
static double reduce_scatter_bus_factor(int nranks)
{
    return (double)(nranks - 1) / nranks;
}

static void reduce_scatter_fill(const perf_test_t *t, void *send)
{
    for (size_t i = 0; i < t->counts.send; i++) {
        perf_data_store(t->dtype, send, i, perf_data_value(t, t->rank, i));
    }
}

static size_t reduce_scatter_check(const perf_test_t *t, const void *recv)
{
    size_t wrong = 0, base = (size_t)t->rank * t->counts.param;

    for (size_t i = 0; i < t->counts.param; i++) {
        wrong += !perf_data_ok(t, recv, i, perf_data_expected(t, base + i));
    }
    return wrong;
}

int main(int argc, char **argv)
{
    static const perf_coll_t coll = {
        .name = "reduce_scatter",
        .kind = PERF_COLL_REDUCE_SCATTER,
        .has_op = 1,
        .counts = reduce_scatter_counts,
        .bus_factor = reduce_scatter_bus_factor,
        .fill = reduce_scatter_fill,
        .check = reduce_scatter_check,
    };

    return perf_main(&coll, argc, argv);
}
