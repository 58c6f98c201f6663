/* allgather_perf: shoal_allgather bandwidth and correctness, nccl-tests style.
 * The size column is the gathered (total) buffer; count is what each rank sends. In place,
 * each rank's send buffer is its own block of the receive buffer (NCCL's convention). */
#include "perf/common.h"

static void allgather_counts(size_t count, int nranks, perf_counts_t *c_p)
{
    size_t per_rank = count / (size_t)nranks;

    *c_p = (perf_counts_t){.send = per_rank, .recv = per_rank * (size_t)nranks,
                           .param = per_rank, .send_ip_off = per_rank};
}

/* Each rank receives the (n-1)/n of the total that it does not own. */
static double allgather_bus_factor(int nranks)
{
    return (double)(nranks - 1) / nranks;
}

static void allgather_fill(const perf_test_t *t, void *send)
{
    for (size_t i = 0; i < t->counts.param; i++) {
        perf_data_store(t->dtype, send, i, perf_data_value(t, t->rank, i));
    }
}

static size_t allgather_check(const perf_test_t *t, const void *recv)
{
    size_t wrong = 0, n = t->counts.param;

    for (int r = 0; r < t->nranks; r++) {
        for (size_t i = 0; i < n; i++) {
            wrong += !perf_data_ok(t, recv, (size_t)r * n + i, perf_data_value(t, r, i));
        }
    }
    return wrong;
}

int main(int argc, char **argv)
{
    static const perf_coll_t coll = {
        .name = "allgather",
        .kind = PERF_COLL_ALLGATHER,
        .counts = allgather_counts,
        .bus_factor = allgather_bus_factor,
        .fill = allgather_fill,
        .check = allgather_check,
    };

    return perf_main(&coll, argc, argv);
}
