/*
 * gloo_twin: the Gloo twin of allreduce_perf for perf/compare.sh. It times Gloo's
 * AllreduceRingChunked<float> (sum) over Gloo's TCP transport and prints nccl-tests' table
 * like the perf tools do, so compare.sh reads all three the same way. Gloo's algorithm is in
 * place only: the out-of-place columns print "-".
 *
 * Ranks: SHOAL_RANK/SHOAL_NRANKS (shoalrun), else OMPI_COMM_WORLD_RANK/SIZE, else PMI_RANK/
 * PMI_SIZE. Rendezvous: a Gloo FileStore in a directory every rank sees (--store DIR or
 * GLOO_TWIN_STORE; use a fresh one per run). Transport: Gloo's tcp device bound to --host
 * ADDR (default 127.0.0.1) or to the address of --iface NAME.
 *
 * usage: gloo_twin --store DIR [--host ADDR | --iface NAME] [-b MIN] [-e MAX] [-f F] [-n N]
 *                  [-w N] [-c 0|1]
 */
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/config.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace {

struct twin_opts {
    size_t min_bytes = 32u << 20;
    size_t max_bytes = 32u << 20;
    double step_factor = 2.0;
    int iters = 20;
    int warmup = 5;
    int check = 1;
    std::string store;
    std::string host = "127.0.0.1";
    std::string iface;
};

double twin_now()
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int twin_parse_size(const char *s, size_t *out_p)
{
    char *end = nullptr;
    unsigned long long v = strtoull(s, &end, 10);

    if (end == s) {
        return -1;
    }
    switch (*end) {
    case 'G': case 'g': v <<= 30; end++; break;
    case 'M': case 'm': v <<= 20; end++; break;
    case 'K': case 'k': v <<= 10; end++; break;
    default: break;
    }
    if (*end != '\0') {
        return -1;
    }
    *out_p = (size_t)v;
    return 0;
}

int twin_env_int(const char *const *names, int *out_p)
{
    for (; *names != nullptr; names++) {
        const char *v = getenv(*names);

        if (v != nullptr && v[0] != '\0') {
            *out_p = atoi(v);
            return 0;
        }
    }
    return -1;
}

void twin_usage(FILE *f)
{
    fprintf(f, "usage: gloo_twin --store DIR [--host ADDR | --iface NAME] [-b MIN] [-e MAX] "
               "[-f F] [-n N] [-w N] [-c 0|1]\n");
}

int twin_opts_parse(twin_opts *o, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"store", required_argument, nullptr, 's'}, {"host", required_argument, nullptr, 'H'},
        {"iface", required_argument, nullptr, 'I'}, {"minbytes", required_argument, nullptr, 'b'},
        {"maxbytes", required_argument, nullptr, 'e'},
        {"stepfactor", required_argument, nullptr, 'f'},
        {"iters", required_argument, nullptr, 'n'},
        {"warmup_iters", required_argument, nullptr, 'w'},
        {"check", required_argument, nullptr, 'c'}, {"help", no_argument, nullptr, 'h'},
        {nullptr, 0, nullptr, 0},
    };
    const char *env_store = getenv("GLOO_TWIN_STORE");
    int c;

    if (env_store != nullptr) {
        o->store = env_store;
    }
    while ((c = getopt_long(argc, argv, "s:H:I:b:e:f:n:w:c:h", longopts, nullptr)) != -1) {
        switch (c) {
        case 's': o->store = optarg; break;
        case 'H': o->host = optarg; break;
        case 'I': o->iface = optarg; break;
        case 'b': if (twin_parse_size(optarg, &o->min_bytes) != 0) return -1; break;
        case 'e': if (twin_parse_size(optarg, &o->max_bytes) != 0) return -1; break;
        case 'f': o->step_factor = atof(optarg); break;
        case 'n': o->iters = atoi(optarg); break;
        case 'w': o->warmup = atoi(optarg); break;
        case 'c': o->check = atoi(optarg); break;
        case 'h': return 1;
        default: return -1;
        }
    }
    if (o->store.empty() || o->iters < 1 || o->warmup < 0 || o->min_bytes > o->max_bytes ||
        !(o->step_factor > 1.0)) {
        return -1;
    }
    return 0;
}

class twin_runner {
  public:
    twin_runner(std::shared_ptr<gloo::Context> ctx, const twin_opts &o)
        : ctx_(std::move(ctx)), o_(o), rank_(ctx_->rank), size_(ctx_->size) {}

    // Sum of v over ranks (Gloo's plain ring on one double).
    double sum(double v)
    {
        std::vector<double *> ptrs{&v};
        gloo::AllreduceRing<double> ar(ctx_, ptrs, 1);

        ar.run();
        return v;
    }

    void barrier()
    {
        gloo::BarrierAllToOne b(ctx_);

        b.run();
    }

    // Times one size; prints its row on rank 0.
    void run_size(std::vector<float> &buf, size_t bytes)
    {
        size_t count = bytes / sizeof(float);
        std::vector<float *> ptrs{buf.data()};
        gloo::AllreduceRingChunked<float> algo(ctx_, ptrs, (int)count);
        double usec, wrong = 0;

        for (int i = 0; i < o_.warmup; i++) {
            algo.run();
        }
        barrier();
        double t0 = twin_now();
        for (int i = 0; i < o_.iters; i++) {
            algo.run();
        }
        usec = (twin_now() - t0) * 1e6 / o_.iters;
        usec = sum(usec) / size_;
        if (o_.check) {
            wrong = sum((double)check(algo, buf, count));
        }
        if (rank_ == 0) {
            double algbw = usec > 0 ? (double)bytes / 1e3 / usec : 0;
            double busbw = algbw * 2.0 * (size_ - 1) / size_;

            printf("%12zu  %12zu  %8s  %6s  %6d  %7s  %6s  %6s  %5s  %7.1f  %6.2f  %6.2f  %5g\n",
                   count * sizeof(float), count, "float", "sum", -1, "-", "-", "-", "-", usec,
                   algbw, busbw, wrong);
            fflush(stdout);
        }
    }

  private:
    // One run with known inputs: rank + i % 7 summed over ranks.
    size_t check(gloo::AllreduceRingChunked<float> &algo, std::vector<float> &buf, size_t count)
    {
        long n = size_;
        size_t wrong = 0;

        for (size_t i = 0; i < count; i++) {
            buf[i] = (float)(rank_ + (long)(i % 7));
        }
        algo.run();
        for (size_t i = 0; i < count; i++) {
            wrong += buf[i] != (float)(n * (n - 1) / 2 + n * (long)(i % 7));
        }
        return wrong;
    }

    std::shared_ptr<gloo::Context> ctx_;
    const twin_opts &o_;
    int rank_;
    int size_;
};

int twin_main(const twin_opts &o, int rank, int size)
{
    gloo::transport::tcp::attr attr;

    if (!o.iface.empty()) {
        attr.iface = o.iface;
    } else {
        attr.hostname = o.host;
    }
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(o.store);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);

    ctx->connectFullMesh(store, dev);
    twin_runner run(ctx, o);
    std::vector<float> buf(o.max_bytes / sizeof(float) + 1, 0.0f); // zeroed: faulted in

    if (rank == 0) {
        printf("# gloo_twin: Gloo %d.%d.%d AllreduceRingChunked<float> over tcp (%s), %d ranks\n",
               GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR, GLOO_VERSION_PATCH,
               o.iface.empty() ? o.host.c_str() : o.iface.c_str(), size);
        printf("# warmup iters: %d iters: %d validation: %d\n#\n", o.warmup, o.iters, o.check);
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "size",
               "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
               "algbw", "busbw", "#wrong");
        fflush(stdout);
    }
    for (size_t s = o.min_bytes; s <= o.max_bytes;) {
        run.run_size(buf, s < sizeof(float) ? sizeof(float) : s);
        size_t next = (size_t)((double)s * o.step_factor);
        s = next > s ? next : s + 1;
    }
    // The end, through the store rather than a last Gloo message: a rank that exits right
    // after sending one closes its sockets, and Gloo 0.5 may then fail the peer's wait for
    // that message with "Connection closed by peer" although the data arrived first. Each
    // rank says it is done and waits until all did: when any rank exits, no rank has a
    // Gloo operation left.
    std::vector<std::string> done;
    for (int r = 0; r < size; r++) {
        done.push_back("gloo_twin_done_" + std::to_string(r));
    }
    store.set(done[rank], std::vector<char>{'1'});
    store.wait(done, std::chrono::seconds(120));
    return 0;
}

} // namespace

int main(int argc, char **argv)
{
    static const char *const rank_vars[] = {"SHOAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                            nullptr};
    static const char *const size_vars[] = {"SHOAL_NRANKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                            nullptr};
    twin_opts o;
    int rank = -1, size = -1;
    int rc = twin_opts_parse(&o, argc, argv);

    if (rc != 0) {
        twin_usage(rc > 0 ? stdout : stderr);
        return rc > 0 ? 0 : 2;
    }
    if (twin_env_int(rank_vars, &rank) != 0 || twin_env_int(size_vars, &size) != 0 ||
        rank < 0 || size < 1 || rank >= size) {
        fprintf(stderr, "gloo_twin: rank and size not found in SHOAL_RANK/SHOAL_NRANKS, "
                        "OMPI_COMM_WORLD_RANK/SIZE or PMI_RANK/PMI_SIZE\n");
        return 2;
    }
    try {
        return twin_main(o, rank, size);
    } catch (const std::exception &e) {
        fprintf(stderr, "gloo_twin: rank %d: %s\n", rank, e.what());
        return 1;
    }
}
