// shoal as a torch.distributed backend: a c10d::Backend whose collectives run on a shoal
// communicator.
//
// CPU tensors: each backend owns one worker thread that runs their operations in issue order
// (shoal's blocking host calls); a Work completes when the worker finishes it, so async_op=True
// and DDP's communication hooks overlap with the caller. Its future is marked right after, on
// one of the backend's completion threads (there its then-callbacks run), never on the worker.
//
// CUDA tensors (extension built with SHOAL_TORCH_CUDA): the operation is issued on the
// caller's thread as stream-ordered shoal calls on the current CUDA stream of the tensors'
// device; shoal returns at once, the stream runs the collective after the work queued on it
// before, and the work queued after waits for it. The Work records a CUDA event behind the
// call: wait() makes the caller's current stream wait for it (the host does not block),
// isCompleted() queries it, and its future is CUDA-aware (completed at once, in stream order,
// as NCCL's), so DDP and its communication hooks chain on it without a host sync.
// Both kinds go to one communicator in one issue order: a CUDA call first waits until the CPU
// operations queued before it on the worker are done (they took their places in shoal's order).
//
// Rendezvous goes through the c10d Store that torch hands a backend: rank 0 creates the unique
// id and sets it, the others get it (blocking up to the store's timeout). The process group's
// timeout becomes the communicator's (shoal_config_t.timeout_ms): every wait inside shoal has that
// deadline, so a dead or stuck peer becomes an error on every surviving rank, carrying shoal's
// sentence (shoal_comm_last_error, which names the failed rank).

#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Utils.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#ifdef SHOAL_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_set>
#include <vector>

#include <pthread.h>
#include <unistd.h>

extern "C" {
#include <shoal.h>
}

namespace shoal_torch {

namespace {

const char kUidKey[] = "shoal_uid";

// A clear error for what shoal cannot do, raised in the caller's thread (ValueError in Python
// for bad arguments, NotImplementedError for what shoal has no support for).
[[noreturn]] void unsupported(const std::string &what)
{
    TORCH_CHECK_NOT_IMPLEMENTED(false, "shoal backend: ", what);
}

// shoal's dtype of a torch dtype; false when shoal has none.
bool shoal_dtype_of(at::ScalarType st, shoal_dtype_t *dt)
{
    switch (st) {
    case at::kChar: *dt = SHOAL_INT8; return true;
    case at::kByte: *dt = SHOAL_UINT8; return true;
    case at::kInt: *dt = SHOAL_INT32; return true;
    case at::kUInt32: *dt = SHOAL_UINT32; return true;
    case at::kLong: *dt = SHOAL_INT64; return true;
    case at::kUInt64: *dt = SHOAL_UINT64; return true;
    case at::kHalf: *dt = SHOAL_FLOAT16; return true;
    case at::kBFloat16: *dt = SHOAL_BFLOAT16; return true;
    case at::kFloat: *dt = SHOAL_FLOAT32; return true;
    case at::kDouble: *dt = SHOAL_FLOAT64; return true;
    default: return false;
    }
}

shoal_dtype_t to_shoal_dtype(const at::Tensor &t)
{
    shoal_dtype_t dt;
    if (!shoal_dtype_of(t.scalar_type(), &dt)) {
        unsupported(std::string("dtype ") + c10::toString(t.scalar_type()) +
                    " is not supported in reductions (shoal has int8, uint8, int32, uint32, "
                    "int64, uint64, float16, bfloat16, float32, float64; data movement takes "
                    "any dtype)");
    }
    return dt;
}

shoal_op_t to_shoal_op(const c10d::ReduceOp &op)
{
    switch (op.op_) {
    case c10d::ReduceOp::SUM: return SHOAL_SUM;
    case c10d::ReduceOp::PRODUCT: return SHOAL_PROD;
    case c10d::ReduceOp::MIN: return SHOAL_MIN;
    case c10d::ReduceOp::MAX: return SHOAL_MAX;
    case c10d::ReduceOp::AVG: return SHOAL_AVG;
    case c10d::ReduceOp::BAND: unsupported("ReduceOp.BAND (bitwise AND) is not supported");
    case c10d::ReduceOp::BOR: unsupported("ReduceOp.BOR (bitwise OR) is not supported");
    case c10d::ReduceOp::BXOR: unsupported("ReduceOp.BXOR (bitwise XOR) is not supported");
    case c10d::ReduceOp::PREMUL_SUM:
        unsupported("ReduceOp.PREMUL_SUM is not supported (scale the tensor, then SUM)");
    default: unsupported("this ReduceOp is not supported");
    }
}

#ifdef SHOAL_TORCH_CUDA
constexpr bool kCudaBuilt = true;
#else
constexpr bool kCudaBuilt = false;
#endif

// What an operation that only moves data (no reduction) hands shoal: the tensor's own dtype
// where shoal has it, else its bytes (bool, int16, uint16, complex, ... as uint8, the count
// scaled by the element size): nothing is computed on them, the bits arrive unchanged. They
// were refused, though Gloo and NCCL broadcast a bool or int16 tensor.
struct Moved {
    shoal_dtype_t dtype;
    int64_t scale; // shoal elements per tensor element
};

Moved moved_dtype(const at::Tensor &t)
{
    shoal_dtype_t dt;
    if (shoal_dtype_of(t.scalar_type(), &dt)) {
        return {dt, 1};
    }
    return {SHOAL_UINT8, static_cast<int64_t>(t.element_size())};
}

// Every tensor handed to shoal: dense, contiguous, on the CPU (or a CUDA device in a CUDA
// build); of a dtype shoal has when it is reduced (reduce: false for data movement, which
// takes any dtype as bytes, moved_dtype). Element-wise calls (all_reduce, reduce, broadcast,
// send, recv: any_format) also take a tensor dense in its own memory format (channels_last),
// as NCCL and Gloo do: its elements lie in one block, in the same order on every rank that
// uses that format.
void check_tensor(const at::Tensor &t, const char *what, bool reduce = true,
                  bool any_format = false)
{
    TORCH_CHECK_VALUE(t.defined(), "shoal backend: ", what, " is undefined");
    if (t.layout() != at::kStrided) {
        unsupported(std::string(what) + ": only dense (strided) tensors are supported");
    }
    if (t.device().is_cuda() && !kCudaBuilt) {
        unsupported(std::string(what) + " is on " + t.device().str() +
                    "; this build of the shoal backend takes CPU tensors only (it was built "
                    "without CUDA: rebuild it where torch has CUDA, the CUDA toolkit is found "
                    "and libshoal was built with CUDA; see SHOAL_TORCH_CUDA in setup.py)");
    }
    if (!t.device().is_cpu() && !t.device().is_cuda()) {
        unsupported(std::string(what) + " is on " + t.device().str() +
                    "; the shoal backend takes CPU and CUDA tensors");
    }
    if (reduce && t.is_complex()) {
        unsupported(std::string(what) + ": complex tensors are not supported in reductions");
    }
    if (reduce && t.scalar_type() == at::kBool) {
        unsupported(std::string(what) + ": bool tensors are not supported in reductions");
    }
    TORCH_CHECK_VALUE(t.is_contiguous() ||
                          (any_format && t.is_contiguous(t.suggest_memory_format())),
                      "shoal backend: ", what, " is not contiguous; call .contiguous() first");
    if (reduce) {
        (void)to_shoal_dtype(t);
    }
}

void check_single(const std::vector<at::Tensor> &ts, const char *what, bool reduce = true,
                  bool any_format = false)
{
    TORCH_CHECK_VALUE(ts.size() == 1, "shoal backend: ", what,
                      " takes exactly one tensor per call (got ", ts.size(), ")");
    check_tensor(ts[0], what, reduce, any_format);
}

void check_same(const at::Tensor &a, const at::Tensor &b, const char *what)
{
    TORCH_CHECK_VALUE(a.scalar_type() == b.scalar_type(), "shoal backend: ", what,
                      ": dtypes differ (", a.scalar_type(), " vs ", b.scalar_type(), ")");
}

// The one device of a call's tensors: all on the CPU, or all on one CUDA device (CPU when the
// call has none, as barrier). A mix is refused before anything runs.
c10::Device call_device(const std::vector<at::Tensor> &ts, const char *what)
{
    c10::Device dev(c10::kCPU);
    bool first = true;
    for (const auto &t : ts) {
        if (!t.defined()) {
            continue;
        }
        if (first) {
            dev = t.device();
            first = false;
            continue;
        }
        if (t.device() == dev) {
            continue;
        }
        TORCH_CHECK_VALUE(t.device().type() != dev.type(), "shoal backend: ", what,
                          " has tensors on two devices (", dev, " and ", t.device(),
                          "); every tensor of one call must be on the same device");
        TORCH_CHECK_VALUE(false, "shoal backend: ", what, " mixes CPU and CUDA tensors (",
                          dev, " and ", t.device(),
                          "); every tensor of one call must be on the same device");
    }
    return dev;
}

// The title of a Work without the "shoal:" prefix, for messages.
const char *op_name(const char *title)
{
    return strncmp(title, "shoal:", 6) == 0 ? title + 6 : title;
}

// The deadline of a wait of timeout from now. steady_clock counts nanoseconds in 64 bits: a
// timeout beyond about 292 years (timedelta(days=200000), as "no limit") overflowed into the
// past, and the wait raised at once that it had timed out. 100 years is the most it waits.
std::chrono::steady_clock::time_point wait_deadline(std::chrono::milliseconds timeout)
{
    constexpr std::chrono::milliseconds kLongest = std::chrono::hours(24 * 365 * 100);
    return std::chrono::steady_clock::now() + std::min(timeout, kLongest);
}

// A wait's timeout as the waits read it: a negative one is no limit. torch turns a Python
// timedelta into milliseconds through microseconds, which overflow past about 292000 years:
// wait(timeout=timedelta.max), as "no limit", arrived negative and raised at once that the
// call had not completed within its timeout.
std::chrono::milliseconds wait_timeout(std::chrono::milliseconds timeout)
{
    return timeout.count() < 0 ? ::kNoTimeout : timeout;
}

// The exception a failed shoal call becomes: torch.distributed.DistBackendError (a
// RuntimeError) with shoal's status and its sentence.
std::exception_ptr make_error(const std::string &msg)
{
    try {
        C10_THROW_ERROR(DistBackendError, msg);
    } catch (...) {
        return std::current_exception();
    }
}

// A failed communicator, asked without blocking or a collective (shoal_comm_get_async_error:
// a failure the progress engine or the proxy thread saw, a timeout, an abort, or a peer of this
// host that died while the communicator was idle): false while it is usable; otherwise true
// and why it failed (its status and shoal_comm_last_error's sentence, which names the rank).
bool comm_failed(shoal_comm_t comm, std::string *why)
{
    shoal_status_t async = SHOAL_OK;
    if (shoal_comm_get_async_error(comm, &async) != SHOAL_OK || async == SHOAL_OK) {
        return false;
    }
    *why = std::string(shoal_status_name(async)) + ": " + shoal_comm_last_error(comm);
    return true;
}

} // namespace

// Wipes a secret's bytes (a buffer, or a byte vector's contents) when it goes out of scope.
class Wiped {
  public:
    Wiped(void *p, size_t len) : p_(p), len_(len) {}
    explicit Wiped(std::vector<uint8_t> *v) : v_(v) {}
    Wiped(const Wiped &) = delete;
    Wiped &operator=(const Wiped &) = delete;
    ~Wiped()
    {
        if (p_ != nullptr) {
            explicit_bzero(p_, len_);
        }
        if (v_ != nullptr && !v_->empty()) {
            explicit_bzero(v_->data(), v_->size());
        }
    }

  private:
    void *p_ = nullptr;
    size_t len_ = 0;
    std::vector<uint8_t> *v_ = nullptr;
};

// The communicator, shared by the backend and its Works (which ask it whether it failed). The
// backend releases it when the group ends (shutdown(), which destroy_process_group calls, or
// the backend's destructor): it was destroyed only with the last holder, so a Work the script
// still held (a list of handles, a future) kept the communicator alive, and metered by the
// node agent, until Python dropped it. A Work that asks after the release finds the failure
// the communicator had then, if any.
class CommRef {
  public:
    explicit CommRef(shoal_comm_t comm) : comm_(comm) {}
    CommRef(const CommRef &) = delete;
    CommRef &operator=(const CommRef &) = delete;
    ~CommRef() { release(); }

    // comm_failed while it lives, else its failure at the release; *released (when given):
    // whether it was released.
    bool failed(std::string *why, bool *released = nullptr)
    {
        std::shared_lock<std::shared_mutex> g(mu_);
        if (released != nullptr) {
            *released = comm_ == nullptr;
        }
        if (comm_ == nullptr) {
            *why = failed_why_;
            return !failed_why_.empty();
        }
        return comm_failed(comm_, why);
    }

    // Runs fn while the communicator cannot be released under it; false (fn not run) once it
    // was released.
    bool use(const std::function<void()> &fn)
    {
        std::shared_lock<std::shared_mutex> g(mu_);
        if (comm_ == nullptr) {
            return false;
        }
        fn();
        return true;
    }

    // Destroys the communicator now (once); its Works no longer need it.
    void release()
    {
        std::unique_lock<std::shared_mutex> g(mu_);
        if (comm_ == nullptr) {
            return;
        }
        std::string why;
        if (comm_failed(comm_, &why)) {
            failed_why_ = why;
        }
        shoal_comm_destroy(comm_);
        comm_ = nullptr;
    }

    // In a forked process: the communicator is the parent's (shoal refuses to destroy it
    // there), the lock a copy of the parent's that one of its threads may hold.
    void forget()
    {
        new (&mu_) std::shared_mutex();
        comm_ = nullptr;
    }

  private:
    std::shared_mutex mu_;
    shoal_comm_t comm_;
    std::string failed_why_; // comm_failed's sentence at the release ("": it had not failed)
};

class ShoalWork;

// The CPU Works whose futures are not marked yet, for settle_forked_works: in a forked process
// the threads that would mark them are the parent's. The lock is held across fork()
// (pthread_atfork), so that the child's copy of the set is whole.
std::mutex g_unmarked_mu;
std::unordered_set<ShoalWork *> g_unmarked;

// A Work of CPU tensors, run by the backend's worker thread. wait() returns when the worker
// finished it (raising its error) and its future is marked, or raises at once when the
// communicator failed meanwhile (a dead peer, seen by shoal_comm_get_async_error without
// waiting for the worker's call to give up), or when the wait's timeout passes.
class ShoalWork : public c10d::Work {
  public:
    ShoalWork(int rank, c10d::OpType type, const char *title, std::vector<at::Tensor> outputs,
              std::shared_ptr<CommRef> comm, std::string who)
        : c10d::Work(rank, type, title), outputs_(std::move(outputs)),
          future_(c10::make_intrusive<c10::ivalue::Future>(
              c10::ListType::create(c10::TensorType::get()))),
          comm_(std::move(comm)), who_(std::move(who)), title_(op_name(title))
    {
        // The first callback, so it runs as the future is marked, before any of then()'s
        // (which may block): wait() returns once it ran.
        future_->addCallback(
            [this](c10::ivalue::Future &) {
                std::lock_guard<std::mutex> g(mutex_);
                marked_ = true;
                cv_.notify_all();
            },
            false);
        std::lock_guard<std::mutex> g(g_unmarked_mu);
        g_unmarked.insert(this);
    }

    ~ShoalWork() override
    {
        std::lock_guard<std::mutex> g(g_unmarked_mu);
        g_unmarked.erase(this);
    }

    std::vector<at::Tensor> result() override { return outputs_; }
    const std::string &name() const { return title_; }

    // In a process forked while it was pending, its future is never marked (as for wait()):
    // get_future().wait() there waited for ever.
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override
    {
        std::lock_guard<std::mutex> g(mutex_);
        refuse_if_forked_pending();
        return future_;
    }

    bool wait(std::chrono::milliseconds timeout) override
    {
        // How often a waiter asks the communicator (it answers in microseconds, and looks at
        // its local peers at most every 2 ms).
        constexpr auto kPoll = std::chrono::milliseconds(5);
        // How long a failed communicator's worker has to say how its call ended.
        constexpr auto kWorkerGrace = std::chrono::milliseconds(500);
        timeout = wait_timeout(timeout);
        auto deadline = wait_deadline(timeout);
        if (batched_.load(std::memory_order_acquire)) {
            // It runs when its batch ends (endCoalescing), which a wait inside the batch (a
            // blocking call in torch's coalescing manager) never reaches: it waited for ever.
            C10_THROW_ERROR(DistBackendError,
                            who_ + ": " + title_ + " is part of a batch (torch's coalescing "
                            "manager) that has not ended: it runs when the batch ends, so it "
                            "cannot be waited for inside the batch");
        }
        std::unique_lock<std::mutex> lock(mutex_);
        refuse_if_forked_pending();
        for (;;) {
            auto slice = kPoll;
            if (timeout != ::kNoTimeout) {
                auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now());
                slice = std::max(std::chrono::milliseconds(0), std::min(slice, left));
            }
            if (cv_.wait_for(lock, slice, [this] { return completed_; })) {
                break;
            }
            std::string why;
            bool released = false;
            lock.unlock();
            bool failed = comm_->failed(&why, &released);
            lock.lock();
            if (!failed && released) {
                // not seen so far: the group completes or fails every work before it releases
                // the communicator, so this one's end is on its way
                failed = true;
                why = "the process group was destroyed";
            }
            if (completed_) {
                break; // the worker's own error (or result) comes first
            }
            // The worker's own answer stays the truth when it comes soon: a peer that sent its
            // last message and exited (a job's end) completes this call rather than failing
            // it, and a call that cannot complete fails at its driver's next idle step. The
            // grace ends at the wait's deadline: it overran a short timeout by up to 500 ms.
            auto grace = std::chrono::steady_clock::now() + kWorkerGrace;
            if (timeout != ::kNoTimeout) {
                grace = std::min(grace, deadline);
            }
            if (failed && cv_.wait_until(lock, grace, [this] { return completed_; })) {
                break;
            }
            if (failed) {
                C10_THROW_ERROR(DistBackendError, who_ + ": " + title_ +
                                                      " cannot complete, the communicator "
                                                      "failed: " + why);
            }
            if (timeout != ::kNoTimeout && std::chrono::steady_clock::now() >= deadline) {
                C10_THROW_ERROR(DistBackendError,
                                who_ + ": " + title_ + " did not complete within the wait's "
                                "timeout of " + std::to_string(timeout.count()) + " ms");
            }
        }
        // The future is marked just after, on a completion thread (another starts when every
        // one is stuck in a callback, 16 at most): wait() then get_future().value() must find
        // it marked.
        if (timeout == ::kNoTimeout) {
            cv_.wait(lock, [this] { return marked_; });
        } else if (!cv_.wait_until(lock, deadline, [this] { return marked_; })) {
            C10_THROW_ERROR(DistBackendError,
                            who_ + ": " + title_ + " completed, but its future was not marked "
                            "within the wait's timeout of " + std::to_string(timeout.count()) +
                            " ms");
        }
        if (exception_) {
            std::rethrow_exception(exception_);
        }
        return true;
    }

    // Whether it waits in an open batch (set and cleared by the backend, under its lock).
    void set_batched(bool batched) { batched_.store(batched, std::memory_order_release); }

    // Called once, for a work that never reached the worker (dropped, abandoned, empty).
    void complete(std::exception_ptr err)
    {
        finish(err);
        mark_future(err);
    }

    // The worker's half of complete(): wait() and isCompleted() see the outcome.
    void finish_work(std::exception_ptr err) { finish(err); }

    // The completion thread's half: marks the future, running its callbacks here.
    void mark_future(std::exception_ptr err)
    {
        if (err) {
            future_->setError(err);
        } else {
            future_->markCompleted(c10::IValue(outputs_));
        }
        std::lock_guard<std::mutex> g(g_unmarked_mu);
        g_unmarked.erase(this);
    }

    bool forked() const { return getpid() != owner_; }

    // In a process forked while its future was not marked (settle_forked_works, right after
    // the fork): nothing here would ever mark it, so a future taken before the fork (or one
    // chained on it) waited for ever. It is marked now: with the work's outcome when the
    // worker had finished it before the fork (its outputs are in this process's copy), else
    // with the error that wait() raises here.
    void settle_forked()
    {
        // the copies of the parent's lock and condition variable, which its threads may have
        // held or waited on: made anew, without their destructors
        new (&mutex_) std::mutex();
        new (&cv_) std::condition_variable();
        if (!isCompleted()) {
            finish(make_error(forked_message()));
        }
        if (!future_->completed()) {
            mark_future(exception());
        }
    }

  private:
    // Under mutex_: raises in a process forked while it was pending: the threads that would
    // finish it and mark its future are the parent's. Its wait() raised "the communicator
    // failed: SHOAL_ERR_INVALID_ARG: no error" (shoal refusing the child), or, finished but
    // not yet marked at the fork, waited for ever for the mark.
    void refuse_if_forked_pending() const
    {
        if ((!completed_ || !marked_) && forked()) {
            C10_THROW_ERROR(DistBackendError, forked_message());
        }
    }

    std::string forked_message() const
    {
        return who_ + ": " + title_ + " was issued by process " + std::to_string(owner_) +
               ", which forked this one while it was pending: it completes there, not here";
    }

    std::vector<at::Tensor> outputs_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    std::shared_ptr<CommRef> comm_;
    std::string who_;
    std::string title_;
    std::atomic<bool> batched_{false};
    bool marked_ = false; // its future is marked (under mutex_)
    pid_t owner_ = getpid(); // the process that issued it
};

// Right after a fork, in the child (shoal_torch registers it with os.register_at_fork, so that
// the futures' then-callbacks run where Python is ready for them): marks the futures of the
// CPU Works the parent had not marked (ShoalWork::settle_forked).
void settle_forked_works()
{
    std::vector<c10::intrusive_ptr<ShoalWork>> works;
    {
        std::lock_guard<std::mutex> g(g_unmarked_mu);
        for (ShoalWork *w : g_unmarked) {
            // one a parent's thread was destroying at the fork is left alone
            if (w->forked() && c10::raw::intrusive_ptr::use_count(w) > 0) {
                works.push_back(c10::intrusive_ptr<ShoalWork>::unsafe_reclaim_from_nonowning(w));
            }
        }
    }
    for (auto &w : works) { // not under the lock: marking erases them, callbacks make more
        w->settle_forked();
    }
}

#ifdef SHOAL_TORCH_CUDA
// A Work of CUDA tensors: the operation is on its stream; the event recorded behind it marks
// its end. Like NCCL's WorkNCCL (not copied): wait() and synchronize() make the caller's
// current stream wait for the event and return at once; isCompleted() queries the event; the
// future is CUDA-aware and completed at once (its value is ready in stream order), so
// then-callbacks and DDP's hooks run on streams that wait for the event. A failure found
// after the call returned (a peer died) fails the communicator and releases the stream with
// undefined results: once the event passed, a failed communicator makes isCompleted() report
// the error and wait() raise it, and every later call raises it at once.
class ShoalCudaWork : public c10d::Work {
  public:
    ShoalCudaWork(int rank, c10d::OpType type, const char *title, std::vector<at::Tensor> outputs,
                  c10::Device dev, const c10::cuda::CUDAStream &stream,
                  std::shared_ptr<CommRef> comm, std::string who,
                  std::chrono::milliseconds timeout)
        : c10d::Work(rank, type, title), outputs_(std::move(outputs)), dev_(dev),
          stream_(stream), comm_(std::move(comm)), who_(std::move(who)),
          title_(op_name(title)), timeout_(timeout)
    {
        event_.record(stream);
        future_ = c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()), std::vector<c10::Device>{dev});
        c10::cuda::CUDAStreamGuard guard(stream); // the future's events go on this stream
        future_->markCompleted(c10::IValue(outputs_));
    }

    std::vector<at::Tensor> result() override { return outputs_; }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
    c10::Device device() const { return dev_; }
    // the stream the operation was issued on (its event follows it there)
    const c10::cuda::CUDAStream &stream() const { return stream_; }
    // c10d::Work::getTimeout is virtual in newer torch (2.15 has it, 2.11 does not): without
    // `override` this overrides it where it exists and is a plain member elsewhere.
    std::chrono::milliseconds getTimeout() const { return timeout_; }

    bool isCompleted() override
    {
        if (settled_.load(std::memory_order_acquire)) {
            return true;
        }
        if (!event_.query()) {
            return false;
        }
        settle();
        return true;
    }

    void synchronize() override
    {
        c10::cuda::CUDAGuard guard(dev_);
        event_.block(c10::cuda::getCurrentCUDAStream(dev_.index()));
    }

    // The current stream waits for the operation; the host blocks only when the caller gives
    // a timeout (then up to it, raising at once when the communicator fails meanwhile: a dead
    // peer is seen by shoal_comm_get_async_error before the event passes). Raises the
    // communicator's failure once the event passed.
    bool wait(std::chrono::milliseconds timeout) override
    {
        synchronize();
        timeout = wait_timeout(timeout);
        if (timeout != ::kNoTimeout) {
            auto deadline = wait_deadline(timeout);
            while (!isCompleted()) {
                std::string why;
                if (comm_->failed(&why)) { // a dead peer: now, not at the deadline
                    C10_THROW_ERROR(DistBackendError,
                                    who_ + ": " + title_ + " on " + dev_.str() +
                                        " cannot complete, the communicator failed (its stream "
                                        "is released, the results are undefined): " + why);
                }
                if (std::chrono::steady_clock::now() >= deadline) {
                    C10_THROW_ERROR(DistBackendError,
                                    who_ + ": " + title_ + " on " + dev_.str() +
                                        " did not complete within the wait's timeout of " +
                                        std::to_string(timeout.count()) + " ms");
                }
                std::this_thread::sleep_for(std::chrono::microseconds(200));
            }
        } else {
            (void)isCompleted();
        }
        std::exception_ptr err = exception();
        if (err) {
            std::rethrow_exception(err);
        }
        return true;
    }

  private:
    void settle()
    {
        std::lock_guard<std::mutex> g(settle_mu_);
        if (settled_.load(std::memory_order_relaxed)) {
            return;
        }
        std::string why;
        std::exception_ptr err;
        if (comm_->failed(&why)) {
            err = make_error(who_ + ": " + title_ + " on " + dev_.str() +
                             " ran on a communicator that failed (its stream was released, the "
                             "results are undefined): " + why);
        }
        finish(err);
        settled_.store(true, std::memory_order_release);
    }

    std::vector<at::Tensor> outputs_;
    c10::Device dev_;
    c10::cuda::CUDAStream stream_;
    std::shared_ptr<CommRef> comm_;
    std::string who_;
    std::string title_;
    std::chrono::milliseconds timeout_;
    at::cuda::CUDAEvent event_; // cudaEventDisableTiming
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    std::mutex settle_mu_;
    std::atomic<bool> settled_{false};
};

// A batch (torch's coalescing manager: batch_isend_irecv) of CPU and CUDA operations: the CPU
// ones run on the worker as one batch (cpu), the CUDA ones were issued at once on their
// stream (cuda: the last one's Work, whose event follows them all). endCoalescing returned
// the CPU batch's Work alone, and batch_isend_irecv returns only what endCoalescing does: its
// wait() neither waited for the CUDA operations nor ordered the caller's stream after them
// (a CUDA receive's tensor was read before its data came), and result() and the future held
// the CPU tensors only. This Work covers both: wait() orders the current stream after the
// CUDA part, as ShoalCudaWork's, then waits for the CPU part; its future, CUDA-aware as
// ShoalCudaWork's, is marked when the CPU part's is, in stream order after the CUDA part.
class ShoalMixedWork : public c10d::Work {
  public:
    ShoalMixedWork(int rank, c10::intrusive_ptr<ShoalWork> cpu,
                   c10::intrusive_ptr<ShoalCudaWork> cuda)
        : c10d::Work(rank, c10d::OpType::COALESCED, "shoal:coalesced"), cpu_(std::move(cpu)),
          cuda_(std::move(cuda))
    {
        std::vector<at::Tensor> outputs = result();
        future_ = c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()),
            std::vector<c10::Device>{cuda_->device()});
        auto fut = future_;
        c10::cuda::CUDAStream stream = cuda_->stream();
        cpu_->getFuture()->addCallback([fut, outputs, stream](c10::ivalue::Future &f) {
            if (f.hasError()) {
                fut->setError(f.exception_ptr());
                return;
            }
            c10::cuda::CUDAStreamGuard guard(stream); // its events go behind the CUDA part
            fut->markCompleted(c10::IValue(outputs));
        });
    }

    std::vector<at::Tensor> result() override
    {
        std::vector<at::Tensor> all = cpu_->result();
        for (auto &t : cuda_->result()) {
            all.push_back(t);
        }
        return all;
    }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
    bool isCompleted() override { return cuda_->isCompleted() && cpu_->isCompleted(); }
    void synchronize() override { cuda_->synchronize(); }

    // Either part's error is raised; the CPU part gets what is left of the timeout.
    bool wait(std::chrono::milliseconds timeout) override
    {
        auto start = std::chrono::steady_clock::now();
        timeout = wait_timeout(timeout);
        cuda_->wait(timeout);
        if (timeout != ::kNoTimeout) {
            auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - start);
            // at least 1 ms: 0 is kNoTimeout
            timeout = std::max(std::chrono::milliseconds(1), timeout - spent);
        }
        return cpu_->wait(timeout);
    }

  private:
    c10::intrusive_ptr<ShoalWork> cpu_;
    c10::intrusive_ptr<ShoalCudaWork> cuda_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
};
#endif

class ShoalBackend : public c10d::Backend {
  public:
    ShoalBackend(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                 std::chrono::milliseconds timeout)
        : c10d::Backend(rank, size), timeout_(timeout)
    {
        // The unique id carries the job secret: every copy of it (the id, the store's byte
        // vectors) is wiped when it goes out of scope, thrown past or not.
        shoal_uid_t uid;
        std::vector<uint8_t> v;
        Wiped wipe_uid(&uid, sizeof(uid)), wipe_v(&v);
        if (rank == 0) {
            check_init(shoal_get_unique_id(&uid), "shoal_get_unique_id");
            const uint8_t *p = reinterpret_cast<const uint8_t *>(uid.internal);
            v.assign(p, p + sizeof(uid.internal));
            store->set(kUidKey, v);
        } else {
            v = store->get(kUidKey);
            TORCH_CHECK(v.size() == sizeof(uid.internal),
                        "shoal backend: the store holds a unique id of ", v.size(),
                        " bytes, expected ", sizeof(uid.internal));
            memcpy(uid.internal, v.data(), v.size());
        }
        shoal_config_t cfg = SHOAL_CONFIG_INIT;
        long long ms = timeout.count();
        cfg.timeout_ms = ms <= 0 ? -1 : (ms > INT32_MAX ? INT32_MAX : static_cast<int>(ms));
        shoal_status_t st = shoal_comm_init(&comm_, size, rank, &uid, &cfg);
        if (rank == 0) {
            // Every rank has read the id once rank 0's init is over (none joins without it);
            // the store (unauthenticated, and alive for the whole job) must not keep handing
            // the secret out. A store that cannot delete keys keeps it: nothing more to do.
            try {
                store->deleteKey(kUidKey);
            } catch (const std::exception &) {
            }
        }
        check_init(st, "shoal_comm_init");
        comm_ref_ = std::make_shared<CommRef>(comm_);
        worker_ = std::thread([this] { run_worker(); });
    }

    ~ShoalBackend() override
    {
        if (forked()) {
            forget_parent_threads();
            // the communicator is the parent's: shoal would refuse to destroy it here
            comm_ref_->forget();
            return;
        }
        {
            std::lock_guard<std::mutex> g(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        if (worker_.joinable()) {
            worker_.join();
        }
        stop_completers();
        done_.clear();
        comm_ref_->release(); // a Work still held does not keep it
    }

    const std::string getBackendName() const override { return "shoal"; }

    // A failed communicator makes shoal_comm_abort end every call blocked on it at once.
    // A forked process is refused as by every other entry point: shoal refused the abort
    // there (a line on stderr) and the call returned as if the group were aborted.
    void abort() override
    {
        refuse_if_forked("abort");
        (void)comm_ref_->use([this] { shoal_comm_abort(comm_); });
    }
    // torch's destroy_process_group calls it, for a normal end. It did nothing: the operations
    // still queued or running waited for their peers until the group's timeout (30 minutes
    // by default), and so did every thread waiting for them. Now, when any is left, the
    // communicator is aborted (shoal tells the peers: their calls with this rank fail at once),
    // the running one fails, the queued ones fail without running, and the worker ends; an
    // idle group aborts nothing. Then the communicator is destroyed, whoever still holds the
    // backend or its Works. Every later call on the group raises.
    void shutdown() override
    {
        if (forked()) {
            return; // nothing of the group runs here to abort or end (see forked())
        }
        std::deque<Task> dropped, done;
        bool busy;
        {
            std::lock_guard<std::mutex> g(mu_);
            if (shut_down_) {
                return; // torch calls it once per device type (cpu and cuda: this backend)
            }
            shut_down_ = true;
            dropped.swap(queue_);
            pending_ -= dropped.size();
            busy = pending_ > 0 || !dropped.empty();
            stop_ = true;
        }
        if (busy && comm_ != nullptr) {
            shoal_comm_abort(comm_);
        }
        cv_.notify_all();
        for (auto &t : dropped) {
            t.work->complete(make_error(who() + ": " + t.work->name() +
                                        " was not run: the process group was shut down "
                                        "(destroy_process_group)"));
        }
        abandon_batch("the process group was shut down (destroy_process_group) before its "
                      "batch ended");
        if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) {
            worker_.join();
            // every CPU work has its outcome: the communicator is no one's now
            comm_ref_->release();
        }
        {
            std::lock_guard<std::mutex> g(mu_);
            done.swap(done_);
        }
        idle_cv_.notify_all();
    }

    // Collectives issued on this group so far (point to point not counted); the same on every
    // rank unless the ranks disagree. TORCH_DISTRIBUTED_DEBUG=DETAIL's wrapper compares it.
    void setSequenceNumberForGroup() override {}
    uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                             const c10d::BroadcastOptions &opts) override
    {
        check_single(tensors, "broadcast tensor", false, true);
        check_root(opts.rootRank);
        at::Tensor t = tensors[0];
        int root = static_cast<int>(opts.rootRank);
        return enqueue(c10d::OpType::BROADCAST, "shoal:broadcast", {t},
                       [=, this](void *stream, std::string *) {
            Moved m = moved_dtype(t);
            return shoal_broadcast(t.data_ptr(), t.data_ptr(), t.numel() * m.scale, m.dtype,
                                   root, comm_, stream);
        });
    }

    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                             const c10d::AllreduceOptions &opts) override
    {
        check_single(tensors, "all_reduce tensor", true, true);
        at::Tensor t = tensors[0];
        shoal_op_t op = to_shoal_op(opts.reduceOp);
        return enqueue(c10d::OpType::ALLREDUCE, "shoal:all_reduce", {t},
                       [=, this](void *stream, std::string *) {
            return shoal_allreduce(t.data_ptr(), t.data_ptr(), t.numel(), to_shoal_dtype(t), op,
                                   comm_, stream);
        });
    }

    c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
        std::vector<at::Tensor> &tensors, const c10d::AllreduceCoalescedOptions &opts) override
    {
        TORCH_CHECK_VALUE(!tensors.empty(), "shoal backend: allreduce_coalesced of no tensors");
        for (const auto &t : tensors) {
            check_tensor(t, "allreduce_coalesced tensor");
            check_same(t, tensors[0], "allreduce_coalesced");
        }
        shoal_op_t op = to_shoal_op(opts.reduceOp);
        std::vector<at::Tensor> ts = tensors;
        return enqueue(c10d::OpType::ALLREDUCE_COALESCED, "shoal:allreduce_coalesced", ts,
                       [=, this](void *stream, std::string *) {
                           at::Tensor flat = at::cat(flatten_all(ts));
                           shoal_status_t st = shoal_allreduce(
                               flat.data_ptr(), flat.data_ptr(), flat.numel(),
                               to_shoal_dtype(flat), op, comm_, stream);
                           if (st == SHOAL_OK) {
                               unflatten_into(flat, ts);
                           }
                           return st;
                       });
    }

    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors,
                                          const c10d::ReduceOptions &opts) override
    {
        check_single(tensors, "reduce tensor", true, true);
        check_root(opts.rootRank);
        at::Tensor t = tensors[0];
        shoal_op_t op = to_shoal_op(opts.reduceOp);
        int root = static_cast<int>(opts.rootRank);
        return enqueue(c10d::OpType::REDUCE, "shoal:reduce", {t},
                       [=, this](void *stream, std::string *) {
            return shoal_reduce(t.data_ptr(), t.data_ptr(), t.numel(), to_shoal_dtype(t), op,
                                root, comm_, stream);
        });
    }

    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                             std::vector<at::Tensor> &inputs,
                                             const c10d::AllgatherOptions &) override
    {
        check_single(inputs, "all_gather input", false);
        TORCH_CHECK_VALUE(outputs.size() == 1, "shoal backend: all_gather takes one output list");
        check_list(outputs[0], inputs[0], "all_gather", false);
        at::Tensor in = inputs[0];
        std::vector<at::Tensor> outs = outputs[0];
        auto fn = [=, this](void *stream, std::string *) {
            at::Tensor flat = at::empty({static_cast<int64_t>(outs.size()) * in.numel()},
                                        in.options());
            Moved m = moved_dtype(in);
            shoal_status_t st = shoal_allgather(in.data_ptr(), flat.data_ptr(),
                                                in.numel() * m.scale, m.dtype, comm_, stream);
            if (st == SHOAL_OK) {
                unflatten_into(flat, outs);
            }
            return st;
        };
        return enqueue(c10d::OpType::ALLGATHER, "shoal:all_gather", outs, fn, {in});
    }

    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                   const c10d::AllgatherOptions &) override
    {
        check_allgather_base(output, input);
        at::Tensor in = input, out = output;
        return enqueue(c10d::OpType::_ALLGATHER_BASE, "shoal:all_gather_into_tensor", {out},
                       [=, this](void *stream, std::string *) {
                           Moved m = moved_dtype(in);
                           return shoal_allgather(in.data_ptr(), out.data_ptr(),
                                                  in.numel() * m.scale, m.dtype, comm_, stream);
                       },
                       {in});
    }

    c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
        std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
        const c10d::AllgatherOptions &) override
    {
        TORCH_CHECK_VALUE(outputs.size() == inputs.size(),
                          "shoal backend: allgather_into_tensor_coalesced: ", outputs.size(),
                          " outputs for ", inputs.size(), " inputs");
        if (inputs.empty()) {
            return barrier_work();
        }
        for (size_t i = 0; i < inputs.size(); i++) {
            check_allgather_base(outputs[i], inputs[i]);
        }
        // One Work for them all, run in issue order: the last one's Work alone (returned by
        // torch's coalescing manager) said nothing of an earlier one that failed, and held
        // only the last output.
        std::vector<at::Tensor> ins = inputs, outs = outputs;
        return enqueue(c10d::OpType::_ALLGATHER_BASE,
                       "shoal:all_gather_into_tensor_coalesced", outs,
                       [=, this](void *stream, std::string *) {
                           for (size_t i = 0; i < ins.size(); i++) {
                               Moved m = moved_dtype(ins[i]);
                               shoal_status_t st = shoal_allgather(
                                   ins[i].data_ptr(), outs[i].data_ptr(),
                                   ins[i].numel() * m.scale, m.dtype, comm_, stream);
                               if (st != SHOAL_OK) {
                                   return st;
                               }
                           }
                           return SHOAL_OK;
                       },
                       ins);
    }

    c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                          std::vector<at::Tensor> &inputs,
                                          const c10d::GatherOptions &opts) override
    {
        check_single(inputs, "gather input", false);
        check_root(opts.rootRank);
        int root = static_cast<int>(opts.rootRank);
        at::Tensor in = inputs[0];
        std::vector<at::Tensor> outs;
        if (getRank() == root) {
            TORCH_CHECK_VALUE(outputs.size() == 1, "shoal backend: gather takes one output list");
            check_list(outputs[0], in, "gather", false);
            outs = outputs[0];
        } else {
            TORCH_CHECK_VALUE(outputs.empty() || outputs[0].empty(),
                              "shoal backend: gather: only the root passes outputs");
        }
        int me = getRank(), n = getSize();
        auto fn = [=, this](void *stream, std::string *) {
            Moved m = moved_dtype(in);
            if (me != root) {
                return shoal_send(in.data_ptr(), in.numel() * m.scale, m.dtype, root, comm_,
                                  stream);
            }
            for (int r = 0; r < n; r++) {
                shoal_status_t st = SHOAL_OK;
                if (r == me) {
                    outs[r].copy_(in.view(outs[r].sizes()));
                } else {
                    st = shoal_recv(outs[r].data_ptr(), outs[r].numel() * m.scale, m.dtype, r,
                                    comm_, stream);
                }
                if (st != SHOAL_OK) {
                    return st;
                }
            }
            return SHOAL_OK;
        };
        return enqueue(c10d::OpType::GATHER, "shoal:gather", outs, fn, {in});
    }

    c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                           std::vector<std::vector<at::Tensor>> &inputs,
                                           const c10d::ScatterOptions &opts) override
    {
        check_single(outputs, "scatter output", false);
        check_root(opts.rootRank);
        int root = static_cast<int>(opts.rootRank);
        at::Tensor out = outputs[0];
        std::vector<at::Tensor> ins;
        if (getRank() == root) {
            TORCH_CHECK_VALUE(inputs.size() == 1, "shoal backend: scatter takes one input list");
            check_list(inputs[0], out, "scatter", false);
            ins = inputs[0];
        }
        int me = getRank(), n = getSize();
        auto fn = [=, this](void *stream, std::string *) {
            Moved m = moved_dtype(out);
            if (me != root) {
                return shoal_recv(out.data_ptr(), out.numel() * m.scale, m.dtype, root, comm_,
                                  stream);
            }
            for (int r = 0; r < n; r++) {
                shoal_status_t st = SHOAL_OK;
                if (r == me) {
                    out.copy_(ins[r].view(out.sizes()));
                } else {
                    st = shoal_send(ins[r].data_ptr(), ins[r].numel() * m.scale, m.dtype, r,
                                    comm_, stream);
                }
                if (st != SHOAL_OK) {
                    return st;
                }
            }
            return SHOAL_OK;
        };
        return enqueue(c10d::OpType::SCATTER, "shoal:scatter", {out}, fn, ins);
    }

    c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                  std::vector<std::vector<at::Tensor>> &inputs,
                                                  const c10d::ReduceScatterOptions &opts) override
    {
        check_single(outputs, "reduce_scatter output");
        TORCH_CHECK_VALUE(inputs.size() == 1, "shoal backend: reduce_scatter takes one input list");
        check_list(inputs[0], outputs[0], "reduce_scatter");
        at::Tensor out = outputs[0];
        std::vector<at::Tensor> ins = inputs[0];
        shoal_op_t op = to_shoal_op(opts.reduceOp);
        auto fn = [=, this](void *stream, std::string *) {
            at::Tensor flat = at::cat(flatten_all(ins));
            return shoal_reduce_scatter(flat.data_ptr(), out.data_ptr(), out.numel(),
                                        to_shoal_dtype(out), op, comm_, stream);
        };
        return enqueue(c10d::OpType::REDUCE_SCATTER, "shoal:reduce_scatter", {out}, fn, ins);
    }

    c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
        at::Tensor &output, at::Tensor &input, const c10d::ReduceScatterOptions &opts) override
    {
        check_reduce_scatter_base(output, input);
        at::Tensor in = input, out = output;
        shoal_op_t op = to_shoal_op(opts.reduceOp);
        return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, "shoal:reduce_scatter_tensor", {out},
                       [=, this](void *stream, std::string *) {
                           return shoal_reduce_scatter(in.data_ptr(), out.data_ptr(),
                                                       out.numel(), to_shoal_dtype(out), op,
                                                       comm_, stream);
                       },
                       {in});
    }

    c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
        std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
        const c10d::ReduceScatterOptions &opts) override
    {
        TORCH_CHECK_VALUE(outputs.size() == inputs.size(),
                          "shoal backend: reduce_scatter_tensor_coalesced: ", outputs.size(),
                          " outputs for ", inputs.size(), " inputs");
        if (inputs.empty()) {
            return barrier_work();
        }
        for (size_t i = 0; i < inputs.size(); i++) {
            check_reduce_scatter_base(outputs[i], inputs[i]);
        }
        shoal_op_t op = to_shoal_op(opts.reduceOp);
        // One Work for them all (see allgather_into_tensor_coalesced)
        std::vector<at::Tensor> ins = inputs, outs = outputs;
        return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE,
                       "shoal:reduce_scatter_tensor_coalesced", outs,
                       [=, this](void *stream, std::string *) {
                           for (size_t i = 0; i < ins.size(); i++) {
                               shoal_status_t st = shoal_reduce_scatter(
                                   ins[i].data_ptr(), outs[i].data_ptr(), outs[i].numel(),
                                   to_shoal_dtype(outs[i]), op, comm_, stream);
                               if (st != SHOAL_OK) {
                                   return st;
                               }
                           }
                           return SHOAL_OK;
                       },
                       ins);
    }

    c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                                 std::vector<int64_t> &outSplits,
                                                 std::vector<int64_t> &inSplits,
                                                 const c10d::AllToAllOptions &) override;

    c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs,
                                            std::vector<at::Tensor> &inputs,
                                            const c10d::AllToAllOptions &opts) override
    {
        int n = getSize();
        TORCH_CHECK_VALUE(static_cast<int>(inputs.size()) == n &&
                              static_cast<int>(outputs.size()) == n,
                          "shoal backend: all_to_all takes world size (", n,
                          ") input and output tensors");
        for (int r = 0; r < n; r++) {
            check_tensor(inputs[r], "all_to_all input", false);
            check_tensor(outputs[r], "all_to_all output", false);
            check_same(inputs[r], inputs[0], "all_to_all");
            check_same(outputs[r], inputs[0], "all_to_all");
        }
        std::vector<at::Tensor> all = inputs;
        all.insert(all.end(), outputs.begin(), outputs.end());
        (void)call_device(all, "all_to_all"); // before the cat in enqueue_alltoallv mixes them
        // One all_to_all_single with splits of whole tensors (in elements): the inputs are
        // copied in when it runs (an operation queued before it may still write them), the
        // outputs copied out after.
        std::vector<int64_t> ins(n), outs(n);
        int64_t in_total = 0, total = 0;
        for (int r = 0; r < n; r++) {
            ins[r] = inputs[r].numel();
            outs[r] = outputs[r].numel();
            in_total += ins[r];
            total += outs[r];
        }
        at::Tensor in = at::empty({in_total}, inputs[0].options());
        at::Tensor out = at::empty({total}, in.options());
        std::vector<at::Tensor> dst = outputs;
        return enqueue_alltoallv(out, in, outs, ins, 1, dst, "shoal:all_to_all", inputs);
    }

    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &) override
    {
        return barrier_work();
    }

    // Point to point: shoal matches sends and receives between two ranks in issue order (tags
    // are not matched, as in NCCL); both run in this group's issue order (CPU tensors on its
    // worker, CUDA tensors stream-ordered on the current stream).
    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dst,
                                        int /*tag*/) override
    {
        BatchGuard batch_guard(this);
        check_single(tensors, "send tensor", false, true);
        check_peer(dst, "send");
        at::Tensor t = tensors[0];
        return enqueue(c10d::OpType::SEND, "shoal:send", {t},
                       [=, this](void *stream, std::string *) {
            Moved m = moved_dtype(t);
            return shoal_send(t.data_ptr(), t.numel() * m.scale, m.dtype, dst, comm_, stream);
        });
    }

    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int src,
                                        int /*tag*/) override
    {
        BatchGuard batch_guard(this);
        check_single(tensors, "recv tensor", false, true);
        check_peer(src, "recv");
        at::Tensor t = tensors[0];
        return enqueue(c10d::OpType::RECV, "shoal:recv", {t},
                       [=, this](void *stream, std::string *) {
            Moved m = moved_dtype(t);
            return shoal_recv(t.data_ptr(), t.numel() * m.scale, m.dtype, src, comm_, stream);
        });
    }

    c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> &, int) override
    {
        BatchGuard batch_guard(this);
        unsupported("recv from any source is not supported (name the source rank)");
    }

    // batch_isend_irecv (torch's coalescing manager): the operations on CPU tensors issued
    // between startCoalescing and endCoalescing become one worker task that runs them between
    // shoal_group_start and shoal_group_end, where shoal posts the batch's sends and receives
    // at once. Run one after the other, a send larger than shoal's transport buffers waits for
    // its receiver, so two ranks that both send first waited for each other until the group's
    // timeout. Each operation's Work completes when the batch does. Operations on CUDA tensors
    // are issued at once, stream-ordered, as outside a batch; the batch's Work covers them too
    // (ShoalMixedWork).
    bool supportsCoalescing() const override { return true; }

    // The coalescing entry points refuse a forked process as enqueue does: the batch state and
    // mu_ there are copies of the parent's (a batch the parent had open, a lock its worker
    // held at the fork), so startCoalescing succeeded or said "a batch is open", and
    // endCoalescing returned a finished empty batch or raised "without startCoalescing".
    void startCoalescing() override
    {
        refuse_if_forked("startCoalescing (batch_isend_irecv)");
        std::lock_guard<std::mutex> g(mu_);
        TORCH_CHECK(!coalescing_, "shoal backend: startCoalescing while a batch is open");
        coalescing_ = true;
    }

    c10::intrusive_ptr<c10d::Work> endCoalescing() override
    {
        refuse_if_forked("endCoalescing (batch_isend_irecv)");
        std::vector<Task> batch;
        c10::intrusive_ptr<c10d::Work> cuda_work;
        {
            std::lock_guard<std::mutex> g(mu_);
            TORCH_CHECK(coalescing_, "shoal backend: endCoalescing without startCoalescing");
            coalescing_ = false;
            batch.swap(batch_);
            cuda_work.swap(batch_cuda_work_);
            for (auto &t : batch) {
                t.work->set_batched(false);
            }
        }
        if (batch.empty() && cuda_work) {
            return cuda_work; // its event follows every CUDA operation of the batch
        }
        if (batch.empty()) {
            // Nothing to run (torch's abort of a process group brackets its aborts with an
            // empty batch and waits for it): done now, not behind the worker's queue.
            auto work = c10::make_intrusive<ShoalWork>(getRank(), c10d::OpType::COALESCED,
                                                      "shoal:coalesced",
                                                      std::vector<at::Tensor>{}, comm_ref_,
                                                      who());
            work->complete(nullptr);
            return work;
        }
        std::vector<at::Tensor> outputs;
        for (auto &t : batch) {
            for (auto &o : t.work->result()) {
                outputs.push_back(o);
            }
        }
        auto tasks = std::make_shared<std::vector<Task>>(std::move(batch));
        auto work = enqueue(c10d::OpType::COALESCED, "shoal:coalesced", std::move(outputs),
                            [tasks, this](void *, std::string *why) {
                                return run_batch(*tasks, why);
                            },
                            {}, false);
#ifdef SHOAL_TORCH_CUDA
        if (cuda_work) { // CPU tensors: a ShoalWork; cuda_work came from run_cuda
            return c10::make_intrusive<ShoalMixedWork>(
                getRank(),
                c10::intrusive_ptr<ShoalWork>::unsafe_reclaim_from_nonowning(
                    static_cast<ShoalWork *>(work.get())),
                c10::intrusive_ptr<ShoalCudaWork>::unsafe_reclaim_from_nonowning(
                    static_cast<ShoalCudaWork *>(cuda_work.get())));
        }
#endif
        return work;
    }

    // Abandons the batch open on this backend (see abandon_batch); true when one was open.
    // The Python package calls it when torch's coalescing manager raised inside a batch of a
    // shoal group, where the backend did not see the exception (torch's own checks, the
    // caller's code).
    bool abandon_open_batch()
    {
        return abandon_batch("its batch (torch's coalescing manager) raised before it ended");
    }

  private:
    // torch's coalescing manager (batch_isend_irecv) never calls endCoalescing when an
    // operation of its batch raised: the batch stayed open, every later operation of the group
    // joined it and never ran, and a later blocking call (a broadcast) waited forever. An
    // operation refused inside a batch now abandons the batch: the operations batched before
    // it fail, and the group runs the next ones as usual.
    class BatchGuard {
      public:
        explicit BatchGuard(ShoalBackend *b) : b_(b), raised_(std::uncaught_exceptions()) {}
        BatchGuard(const BatchGuard &) = delete;
        BatchGuard &operator=(const BatchGuard &) = delete;
        ~BatchGuard()
        {
            if (std::uncaught_exceptions() > raised_) {
                b_->abandon_batch("an operation issued after it in the same batch "
                                  "(batch_isend_irecv) was refused");
            }
        }

      private:
        ShoalBackend *b_;
        int raised_;
    };

    // Closes the open batch, if any, without running it: its operations fail, saying why.
    // Returns whether one was open.
    bool abandon_batch(const char *why) noexcept
    {
        if (forked()) {
            return false; // the parent's batch (and its lock), not this process's
        }
        std::vector<Task> batch;
        {
            std::lock_guard<std::mutex> g(mu_);
            if (!coalescing_) {
                return false;
            }
            coalescing_ = false;
            batch.swap(batch_);
            batch_cuda_work_.reset();
            for (auto &t : batch) {
                t.work->set_batched(false);
            }
        }
        for (auto &t : batch) {
            t.work->complete(make_error(who() + ": " + t.work->name() + " was not run: " + why));
        }
        return true;
    }

    // One operation as shoal calls: stream is NULL on the worker (CPU tensors, blocking host
    // calls) or the caller's current CUDA stream (stream-ordered calls); *why may be set to a
    // binding-level reason for a failing status.
    using Fn = std::function<shoal_status_t(void *stream, std::string *why)>;
    struct Task {
        c10::intrusive_ptr<ShoalWork> work;
        Fn fn;
    };

    void check_init(shoal_status_t st, const char *call)
    {
        if (st != SHOAL_OK) {
            std::string msg = std::string("shoal backend: ") + call + " failed: " +
                              shoal_status_name(st) + " (" + shoal_strerror(st) + ")";
            if (comm_ != nullptr) {
                msg += ": " + std::string(shoal_comm_last_error(comm_));
            }
            C10_THROW_ERROR(DistBackendError, msg);
        }
    }

    void check_root(int64_t root) const
    {
        TORCH_CHECK_VALUE(root >= 0 && root < getSize(), "shoal backend: root rank ", root,
                          " is outside the group (size ", getSize(), ")");
    }

    void check_peer(int peer, const char *what) const
    {
        TORCH_CHECK_VALUE(peer >= 0 && peer < getSize() && peer != getRank(), "shoal backend: ",
                          what, ": peer ", peer, " is not another rank of the group (rank ",
                          getRank(), " of ", getSize(), ")");
    }

    void check_list(const std::vector<at::Tensor> &list, const at::Tensor &one,
                    const char *what, bool reduce = true) const
    {
        TORCH_CHECK_VALUE(static_cast<int>(list.size()) == getSize(), "shoal backend: ", what,
                          " takes a list of world size (", getSize(), ") tensors, got ",
                          list.size());
        for (const auto &t : list) {
            check_tensor(t, what, reduce);
            check_same(t, one, what);
            TORCH_CHECK_VALUE(t.numel() == one.numel(), "shoal backend: ", what,
                              ": list tensors have ", t.numel(), " elements, the other has ",
                              one.numel());
        }
    }

    // all_gather_into_tensor's arguments (alone or coalesced)
    void check_allgather_base(const at::Tensor &output, const at::Tensor &input) const
    {
        check_tensor(input, "all_gather_into_tensor input", false);
        check_tensor(output, "all_gather_into_tensor output", false);
        check_same(input, output, "all_gather_into_tensor");
        TORCH_CHECK_VALUE(output.numel() == input.numel() * getSize(),
                          "shoal backend: all_gather_into_tensor: the output has ",
                          output.numel(), " elements, expected world size x input = ",
                          input.numel() * getSize());
    }

    // reduce_scatter_tensor's arguments (alone or coalesced)
    void check_reduce_scatter_base(const at::Tensor &output, const at::Tensor &input) const
    {
        check_tensor(input, "reduce_scatter_tensor input");
        check_tensor(output, "reduce_scatter_tensor output");
        check_same(input, output, "reduce_scatter_tensor");
        TORCH_CHECK_VALUE(input.numel() == output.numel() * getSize(),
                          "shoal backend: reduce_scatter_tensor: the input has ", input.numel(),
                          " elements, expected world size x output = ",
                          output.numel() * getSize());
    }

    static std::vector<at::Tensor> flatten_all(const std::vector<at::Tensor> &ts)
    {
        std::vector<at::Tensor> flat;
        flat.reserve(ts.size());
        for (const auto &t : ts) {
            flat.push_back(t.reshape({-1}));
        }
        return flat;
    }

    static void unflatten_into(const at::Tensor &flat, const std::vector<at::Tensor> &ts)
    {
        int64_t off = 0;
        for (const auto &t : ts) {
            t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
            off += t.numel();
        }
    }

    c10::intrusive_ptr<c10d::Work> barrier_work()
    {
        return enqueue(c10d::OpType::BARRIER, "shoal:barrier", {},
                       [this](void *stream, std::string *) {
                           return shoal_barrier(comm_, stream);
                       });
    }

    c10::intrusive_ptr<c10d::Work> enqueue_alltoallv(at::Tensor out, at::Tensor in,
                                                     std::vector<int64_t> outSplits,
                                                     std::vector<int64_t> inSplits,
                                                     int64_t row, std::vector<at::Tensor> dst,
                                                     const char *title,
                                                     std::vector<at::Tensor> src = {});
    shoal_status_t run_alltoallv(const at::Tensor &out, const at::Tensor &in,
                                 const std::vector<int64_t> &outSplits,
                                 const std::vector<int64_t> &inSplits, int64_t row,
                                 void *stream, std::string *why);

    // Runs one operation: CUDA tensors on the caller's thread, stream-ordered (run_cuda), CPU
    // tensors (and calls without tensors) on the worker. inputs: the tensors read besides the
    // outputs (their device is checked with the outputs').
    // batchable: false for the batch itself (endCoalescing), which runs the batched ones.
    c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char *title,
                                           std::vector<at::Tensor> outputs, Fn fn,
                                           std::vector<at::Tensor> inputs = {},
                                           bool batchable = true)
    {
        refuse_if_forked(op_name(title));
        {
            std::lock_guard<std::mutex> g(mu_);
            refuse_if_shut_down(title);
        }
        inputs.insert(inputs.end(), outputs.begin(), outputs.end());
        c10::Device dev = call_device(inputs, op_name(title));
        if (dev.is_cuda()) {
            auto work = run_cuda(type, title, std::move(outputs), inputs, fn, dev);
            std::lock_guard<std::mutex> g(mu_);
            if (coalescing_) {
                batch_cuda_work_ = work;
            }
            return work;
        }
        if (type != c10d::OpType::SEND && type != c10d::OpType::RECV &&
            type != c10d::OpType::COALESCED) {
            seq_++;
        }
        auto work = c10::make_intrusive<ShoalWork>(getRank(), type, title, std::move(outputs),
                                                  comm_ref_, who());
        std::deque<Task> done;
        {
            std::lock_guard<std::mutex> g(mu_);
            // Again, under the lock that queues it: a shutdown() on another thread since the
            // check above had ended the worker, and the task queued after it never ran (its
            // wait() without a timeout waited for ever).
            refuse_if_shut_down(title);
            if (batchable && coalescing_) {
                work->set_batched(true);
                batch_.push_back(Task{work, std::move(fn)}); // run by endCoalescing's task
                return work;
            }
            queue_.push_back(Task{work, std::move(fn)});
            pending_++;
            done.swap(done_);
        }
        cv_.notify_one();
        return work; // `done` (finished tasks and their tensors) released here, on this thread
    }

    // Under mu_: raises once shutdown() ran.
    void refuse_if_shut_down(const char *title) const
    {
        if (shut_down_) {
            C10_THROW_ERROR(DistBackendError, who() + ": " + op_name(title) +
                                                  ": the process group was shut down "
                                                  "(destroy_process_group)");
        }
    }

    // Waits until the worker has finished every task queued before (they have taken their
    // places in the communicator's issue order), and releases them on this thread.
    void drain()
    {
        std::deque<Task> done;
        {
            std::unique_lock<std::mutex> lk(mu_);
            idle_cv_.wait(lk, [this] { return pending_ == 0; });
            done.swap(done_);
        }
    }

    c10::intrusive_ptr<c10d::Work> run_cuda(c10d::OpType type, const char *title,
                                            std::vector<at::Tensor> outputs,
                                            const std::vector<at::Tensor> &touched, const Fn &fn,
                                            c10::Device dev)
    {
#ifdef SHOAL_TORCH_CUDA
        // shoal binds a communicator to one device at its first CUDA call
        int idx = dev.index(), bound = -1;
        if (!cuda_device_.compare_exchange_strong(bound, idx) && bound != idx) {
            TORCH_CHECK_VALUE(false, "shoal backend: ", op_name(title), " on ", dev,
                              ", but this process group's CUDA calls use cuda:", bound,
                              " (one device per rank: torch.cuda.set_device(local_rank) "
                              "before the first collective)");
        }
        drain(); // the CPU operations queued before this one first, in the same order everywhere
        if (type != c10d::OpType::SEND && type != c10d::OpType::RECV) {
            seq_++;
        }
        c10::cuda::CUDAGuard guard(dev);
        c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(idx);
        // torch's default stream is the legacy default stream (handle 0); a NULL stream is a
        // blocking call for shoal, which names the legacy one cudaStreamLegacy (and waits on
        // the host for it: a device-side wait there stalled shoal's own device work)
        void *s = stream.stream() != nullptr ? static_cast<void *>(stream.stream())
                                             : static_cast<void *>(cudaStreamLegacy);
        std::string why, err;
        // the communicator stays while the call is issued (a shutdown on another thread)
        bool issued = comm_ref_->use([&] {
            shoal_status_t st = fn(s, &why);
            if (st != SHOAL_OK) {
                err = failure(st, why, true);
            }
        });
        if (!issued) { // released by shutdown() since enqueue's check
            C10_THROW_ERROR(DistBackendError, who() + ": " + op_name(title) +
                                                  ": the process group was shut down "
                                                  "(destroy_process_group)");
        }
        if (!err.empty()) {
            C10_THROW_ERROR(DistBackendError, err);
        }
        // The caching allocator must not hand these blocks out again before the stream passed
        // the call (a tensor allocated on another stream and freed meanwhile).
        for (const auto &t : touched) {
            if (t.defined() && t.is_cuda()) {
                c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream);
            }
        }
        return c10::make_intrusive<ShoalCudaWork>(getRank(), type, title, std::move(outputs),
                                                  dev, stream, comm_ref_, who(), timeout_);
#else
        (void)type;
        (void)outputs;
        (void)touched;
        (void)fn;
        unsupported(std::string(op_name(title)) + " on " + dev.str() +
                    ": this build of the shoal backend takes CPU tensors only");
#endif
    }

    // A process forked from the one that made the group (a DataLoader worker, a subprocess
    // started with fork) holds a copy of the backend but none of its threads, and copies of
    // its mutexes and condition variables as they were at the fork, with the parent's threads
    // as their waiters or owners: a collective there was queued for a worker that does not
    // exist (its wait raised "SHOAL_ERR_INVALID_ARG: no error"), and the destructor hung in
    // pthread_cond_destroy (waiting for the parent's worker to leave cv_). Every entry point
    // that would touch them asks this first.
    bool forked() const { return getpid() != owner_; }

    // Raises, in a forked process, what the group's entry points say there.
    void refuse_if_forked(const char *what) const
    {
        if (forked()) {
            C10_THROW_ERROR(DistBackendError,
                            who() + ": " + what + ": this process was forked from process " +
                                std::to_string(owner_) + ", which made the process group; a "
                                "forked process cannot use it (make a process group of its "
                                "own)");
        }
    }

    // In a forked process: the parent's threads are not joined (they are not here), and the
    // copied locks and condition variables are made anew, without their destructors, which
    // would wait for the parent's threads, so that the members that use them go quietly.
    void forget_parent_threads()
    {
        // std::thread has no way to drop a thread without joining or detaching it (pthread
        // calls on a thread of another process); the copies are left unreleased instead
        (void)new std::thread(std::move(worker_));
        (void)new std::vector<std::thread>(std::move(completers_));
        new (&mu_) std::mutex();
        new (&cv_) std::condition_variable();
        new (&idle_cv_) std::condition_variable();
        new (&cmu_) std::mutex();
        new (&ccv_) std::condition_variable();
    }

    std::string who() const
    {
        return std::string("shoal backend (rank ") + std::to_string(getRank()) + " of " +
               std::to_string(getSize()) + ")";
    }

    std::string failure(shoal_status_t st, const std::string &why, bool cuda = false)
    {
        std::string msg =
            who() + ": " + shoal_status_name(st) + " (" + shoal_strerror(st) + ")";
        shoal_status_t async = SHOAL_OK;
        if (!why.empty()) {
            msg += ": " + why;
        } else if (shoal_comm_get_async_error(comm_, &async) == SHOAL_OK && async != SHOAL_OK) {
            msg += ": " + std::string(shoal_comm_last_error(comm_));
        } else if (st == SHOAL_ERR_INVALID_ARG) {
            // shoal keeps no sentence for a refused call that leaves the communicator usable
            // (shoal_comm_last_error says "no error"); its reason went to the log (stderr)
            msg += ": the ranks passed arguments that differ (count, dtype or op), or shoal "
                   "refused them; shoal's log line on stderr names them, and "
                   "TORCH_DISTRIBUTED_DEBUG=DETAIL compares every collective's arguments "
                   "across ranks before it runs";
        } else if (cuda && st == SHOAL_ERR_UNSUPPORTED) {
            msg += ": libshoal takes no CUDA buffers here (built without CUDA, or no CUDA "
                   "driver or GPU found; `shoal_info -b` says which)";
        }
        return msg;
    }

    // On the worker: a batch's operations inside one shoal group (its sends and receives are
    // posted together at shoal_group_end), each operation's Work completed with the batch's
    // outcome (their futures marked on a completion thread, as the batch's own). Returns the
    // first failure (and its reason in *why).
    shoal_status_t run_batch(std::vector<Task> &tasks, std::string *why)
    {
        std::vector<std::exception_ptr> errs(tasks.size());
        shoal_status_t first = SHOAL_OK;
        shoal_status_t st = shoal_group_start();
        for (size_t i = 0; i < tasks.size() && st == SHOAL_OK; i++) {
            try {
                std::string w;
                shoal_status_t s = tasks[i].fn(nullptr, &w);
                if (s != SHOAL_OK && first == SHOAL_OK) {
                    first = s;
                    *why = w;
                }
                if (s != SHOAL_OK) {
                    errs[i] = make_error(failure(s, w));
                }
            } catch (...) {
                errs[i] = std::current_exception();
                first = first == SHOAL_OK ? SHOAL_ERR_INVALID_ARG : first;
            }
        }
        // Always closed, even after a failure: the group is per thread, and this worker runs
        // every later operation of the process group.
        shoal_status_t end = st == SHOAL_OK ? shoal_group_end() : st;
        first = end != SHOAL_OK ? end : first;
        for (size_t i = 0; i < tasks.size(); i++) {
            std::exception_ptr err = errs[i];
            if (!err && first != SHOAL_OK) {
                err = make_error(tasks[i].work->name() + " failed with its batch: " +
                                 failure(first, *why));
            }
            tasks[i].work->finish_work(err);
            post_completion(Task{tasks[i].work, nullptr}, err);
        }
        return first;
    }

    void run_worker()
    {
        for (;;) {
            Task task;
            {
                std::unique_lock<std::mutex> lk(mu_);
                while (!stop_ && queue_.empty()) {
                    // idle with completions queued: look again for completion threads that
                    // all block (post_completion only looks when a completion comes)
                    if (!cq_waiting_.load(std::memory_order_acquire)) {
                        cv_.wait(lk);
                    } else if (cv_.wait_for(lk, kCompleterStall) == std::cv_status::timeout) {
                        lk.unlock();
                        {
                            std::lock_guard<std::mutex> g(cmu_);
                            add_completer_if_stalled();
                        }
                        lk.lock();
                    }
                }
                if (queue_.empty()) {
                    return; // stopping, nothing left
                }
                task = std::move(queue_.front());
                queue_.pop_front();
            }
            run_task(task);
        }
    }

    // On the worker thread: runs one task taken off the queue, completes its work.
    void run_task(Task &task)
    {
        std::exception_ptr err;
        try {
            std::string why;
            shoal_status_t st = task.fn(nullptr, &why);
            if (st != SHOAL_OK) {
                err = make_error(failure(st, why));
            }
        } catch (...) {
            err = std::current_exception();
        }
        task.work->finish_work(err);
        {
            std::lock_guard<std::mutex> g(mu_);
            pending_--;
        }
        idle_cv_.notify_all();
        post_completion(std::move(task), err);
    }

    // A finished task's future is marked on a completion thread, not on the worker: torch
    // runs a future's then-callbacks where it is marked, and a callback that waited for the
    // future of a later work (w2.get_future().wait()) held the one thread that would run w2,
    // for ever. One completion thread marks them in order; another is added only when every
    // one has marked nothing for kCompleterStall while completions wait (a callback that
    // blocks), at most one per kCompleterStall and kMaxCompleters in all: adding one for each
    // completion that found the others busy made 178 threads for 2000 async all_reduces with
    // a callback each. Returns at once.
    void post_completion(Task task, std::exception_ptr err)
    {
        std::unique_lock<std::mutex> lk(cmu_);
        cq_.push_back(Completion{std::move(task), std::move(err), Clock::now()});
        cq_waiting_.store(true, std::memory_order_release);
        if (cidle_ > 0) {
            lk.unlock();
            ccv_.notify_one();
            return;
        }
        add_completer_if_stalled();
    }

    // Under cmu_: a completion thread more when there is none, or when completions wait and
    // every thread has been in one callback for kCompleterStall.
    void add_completer_if_stalled()
    {
        auto now = Clock::now();
        if (cq_.empty() || cidle_ > 0 || cstop_) {
            return;
        }
        if (!completers_.empty() &&
            (completers_.size() >= kMaxCompleters || now - cq_.front().queued < kCompleterStall ||
             now - last_mark_ < kCompleterStall || now - last_spawn_ < kCompleterStall)) {
            return;
        }
        try {
            completers_.emplace_back([this] { run_completer(); });
            last_spawn_ = now;
        } catch (const std::system_error &) {
            // no thread to be had: a busy one takes it when its callback returns
        }
    }

    void run_completer()
    {
        bool orphaned = false; // set by stop_completers on this thread: the backend is gone
        orphaned_ = &orphaned;
        for (;;) {
            Completion c;
            {
                std::unique_lock<std::mutex> lk(cmu_);
                cidle_++;
                ccv_.wait(lk, [this] { return cstop_ || !cq_.empty(); });
                cidle_--;
                if (cq_.empty()) {
                    return; // stopping, nothing left
                }
                c = std::move(cq_.front());
                cq_.pop_front();
                cq_waiting_.store(!cq_.empty(), std::memory_order_release);
            }
            c.task.work->mark_future(c.err);
            if (orphaned) {
                return; // a callback dropped the backend: `this` is gone (c is released here)
            }
            {
                std::lock_guard<std::mutex> lk(cmu_);
                last_mark_ = Clock::now();
            }
            // A completion thread never drops a task's tensors: the last reference to a tensor
            // that has a Python object takes the GIL, which a thread other than Python's own
            // must not do while the interpreter finalizes (it exits the thread under us:
            // std::terminate). They are released by the next enqueue or by the destructor.
            std::lock_guard<std::mutex> g(mu_);
            done_.push_back(std::move(c.task));
        }
    }

    // Ends the completion threads once every posted completion is marked.
    void stop_completers()
    {
        std::vector<std::thread> threads;
        {
            std::lock_guard<std::mutex> lk(cmu_);
            cstop_ = true;
            threads.swap(completers_);
        }
        ccv_.notify_all();
        for (auto &t : threads) {
            if (t.get_id() == std::this_thread::get_id()) {
                // A then-callback run by this completion thread dropped the last reference to
                // the backend (destroy_process_group in a callback): the thread joined itself,
                // std::system_error out of the destructor, std::terminate. It is left to end
                // by itself when the callback returns, without touching the backend again.
                *orphaned_ = true;
                t.detach();
                continue;
            }
            t.join();
        }
        // Completions no thread took (the only one was this thread, or none could be started):
        // their futures are marked here, so that no waiter waits for ever.
        std::deque<Completion> left;
        {
            std::lock_guard<std::mutex> lk(cmu_);
            left.swap(cq_);
        }
        for (auto &c : left) {
            c.task.work->mark_future(c.err);
        }
    }

    pid_t owner_ = getpid(); // the process that made it (forked())
    shoal_comm_t comm_ = nullptr;
    std::shared_ptr<CommRef> comm_ref_; // owns comm_ (its Works share it)
    std::chrono::milliseconds timeout_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::condition_variable idle_cv_; // pending_ reached 0
    std::deque<Task> queue_;
    std::deque<Task> done_; // finished tasks, released off the worker and completion threads
    bool coalescing_ = false;           // between startCoalescing and endCoalescing
    std::vector<Task> batch_;           // the CPU operations issued meanwhile
    c10::intrusive_ptr<c10d::Work> batch_cuda_work_; // the last CUDA one issued meanwhile
    size_t pending_ = 0;    // tasks queued or running on the worker
    bool stop_ = false;
    bool shut_down_ = false; // shutdown(): every later call raises
    std::atomic<uint64_t> seq_{0};
    std::atomic<int> cuda_device_{-1}; // the device of this group's CUDA calls, once known
    std::thread worker_;
    using Clock = std::chrono::steady_clock;
    static constexpr auto kCompleterStall = std::chrono::milliseconds(100);
    static constexpr size_t kMaxCompleters = 16;
    struct Completion {
        Task task;
        std::exception_ptr err;
        Clock::time_point queued;
    };
    std::mutex cmu_; // the completion threads' (post_completion)
    std::condition_variable ccv_;
    std::deque<Completion> cq_;          // finished tasks whose futures are to be marked
    std::atomic<bool> cq_waiting_{false}; // cq_ is not empty (the worker's idle look)
    std::vector<std::thread> completers_;
    // A completion thread's flag that tells it the backend was destroyed under it (by a
    // callback it ran); set by run_completer for its own thread.
    static thread_local bool *orphaned_;
    size_t cidle_ = 0;   // completion threads waiting for one
    bool cstop_ = false; // the destructor ends them
    Clock::time_point last_mark_{};  // a completion thread last finished marking a future
    Clock::time_point last_spawn_{}; // the last completion thread added

  public:
    static c10::intrusive_ptr<c10d::Backend> create(const c10::intrusive_ptr<c10d::Store> &store,
                                                    int rank, int size, int64_t timeout_ms)
    {
        return c10::make_intrusive<ShoalBackend>(store, rank, size,
                                                 std::chrono::milliseconds(timeout_ms));
    }
};

thread_local bool *ShoalBackend::orphaned_ = nullptr;

// all_to_all_single. Equal splits are one shoal_alltoall. Unequal splits: the ranks first
// exchange their send sizes (an alltoall of world-size int64), each checks that what its peers
// will send is what it expects, and one allreduce(MAX) agrees on both the verdict and the
// largest block; then every block is padded to that size for one shoal_alltoall, and the
// blocks are copied out to their places. A mismatch fails on every rank with the same error.
c10::intrusive_ptr<c10d::Work> ShoalBackend::alltoall_base(at::Tensor &output, at::Tensor &input,
                                                           std::vector<int64_t> &outSplits,
                                                           std::vector<int64_t> &inSplits,
                                                           const c10d::AllToAllOptions &)
{
    int n = getSize();
    check_tensor(input, "all_to_all_single input", false);
    check_tensor(output, "all_to_all_single output", false);
    check_same(input, output, "all_to_all_single");
    TORCH_CHECK_VALUE(input.dim() >= 1 && output.dim() >= 1,
                      "shoal backend: all_to_all_single takes tensors with a first dimension");
    // The elements of one row: the product of the other dimensions. It was numel / rows, 0 for a
    // tensor of 0 rows: a rank that sent and received nothing (expert parallelism's rank that
    // got no tokens) padded its blocks to 0 elements, the others to theirs, and they waited
    // for it until the group's timeout.
    auto row_of = [](const at::Tensor &t) {
        return c10::multiply_integers(t.sizes().begin() + 1, t.sizes().end());
    };
    int64_t row = row_of(input);
    int64_t orow = row_of(output);
    TORCH_CHECK_VALUE(input.size(0) == 0 || output.size(0) == 0 || row == orow,
                      "shoal backend: all_to_all_single: input and output rows differ (", row,
                      " vs ", orow, " elements)");
    if (input.size(0) == 0) {
        row = orow;
    }
    std::vector<int64_t> ins = inSplits, outs = outSplits;
    auto fill = [n](std::vector<int64_t> &s, const at::Tensor &t, const char *what) {
        if (s.empty()) {
            TORCH_CHECK_VALUE(t.size(0) % n == 0, "shoal backend: all_to_all_single: the ",
                              what, "'s first dimension (", t.size(0),
                              ") is not divisible by the world size (", n, ")");
            s.assign(n, t.size(0) / n);
        }
        TORCH_CHECK_VALUE(static_cast<int>(s.size()) == n, "shoal backend: all_to_all_single: ",
                          what, " split sizes have ", s.size(), " entries, world size is ", n);
        int64_t sum = 0;
        for (int64_t v : s) {
            TORCH_CHECK_VALUE(v >= 0, "shoal backend: all_to_all_single: negative split size");
            sum += v;
        }
        TORCH_CHECK_VALUE(sum == t.size(0), "shoal backend: all_to_all_single: ", what,
                          " split sizes add up to ", sum, ", the tensor has ", t.size(0),
                          " rows");
    };
    fill(ins, input, "input");
    fill(outs, output, "output");
    return enqueue_alltoallv(output, input, outs, ins, row, {}, "shoal:all_to_all_single");
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::enqueue_alltoallv(
    at::Tensor out, at::Tensor in, std::vector<int64_t> outSplits, std::vector<int64_t> inSplits,
    int64_t row, std::vector<at::Tensor> dst, const char *title, std::vector<at::Tensor> src)
{
    std::vector<at::Tensor> results = dst.empty() ? std::vector<at::Tensor>{out} : dst;
    std::vector<at::Tensor> touched = src;
    touched.push_back(in);
    touched.push_back(out);
    auto fn = [=, this](void *stream, std::string *why) {
        if (!src.empty()) { // all_to_all's list: read in issue order, not when it was issued
            at::Tensor buf = in;
            at::cat_out(buf, flatten_all(src));
        }
        shoal_status_t st = run_alltoallv(out, in, outSplits, inSplits, row, stream, why);
        if (st == SHOAL_OK && !dst.empty()) {
            unflatten_into(out, dst);
        }
        return st;
    };
    return enqueue(c10d::OpType::ALLTOALL_BASE, title, results, fn, touched);
}

shoal_status_t ShoalBackend::run_alltoallv(const at::Tensor &out, const at::Tensor &in,
                                           const std::vector<int64_t> &outSplits,
                                           const std::vector<int64_t> &inSplits, int64_t row,
                                           void *stream, std::string *why)
{
    int n = getSize();
    Moved m = moved_dtype(in);
    bool equal = true;
    for (int r = 0; r < n; r++) {
        equal = equal && inSplits[r] == inSplits[0] && outSplits[r] == inSplits[0];
    }
    // Equal splits on every rank need no agreement round only when every rank knows they are
    // equal; a rank cannot know that about its peers, so the size exchange always runs.
    at::Tensor mine = at::tensor(inSplits, at::kLong);
    at::Tensor theirs = at::empty({n}, at::kLong);
    shoal_status_t st =
        shoal_alltoall(mine.data_ptr(), theirs.data_ptr(), 1, SHOAL_INT64, comm_, nullptr);
    if (st != SHOAL_OK) {
        return st;
    }
    const int64_t *th = theirs.data_ptr<int64_t>();
    int64_t bad = -1, maxc = 0;
    for (int r = 0; r < n; r++) {
        if (th[r] != outSplits[r] && bad < 0) {
            bad = r;
        }
        maxc = std::max({maxc, inSplits[r], outSplits[r]});
    }
    int64_t agree[3] = {bad >= 0 ? 1 : 0, maxc, equal ? 0 : 1};
    st = shoal_allreduce(agree, agree, 3, SHOAL_INT64, SHOAL_MAX, comm_, nullptr);
    if (st != SHOAL_OK) {
        return st;
    }
    if (agree[0] != 0) {
        *why = "all_to_all_single: split sizes do not match across ranks";
        if (bad >= 0) {
            *why += " (rank " + std::to_string(bad) + " sends " + std::to_string(th[bad]) +
                    " rows to rank " + std::to_string(getRank()) + ", which expects " +
                    std::to_string(outSplits[bad]) + ")";
        }
        return SHOAL_ERR_INVALID_ARG;
    }
    if (agree[2] == 0) { // every rank has equal splits: one alltoall in place
        return shoal_alltoall(in.data_ptr(), out.data_ptr(), inSplits[0] * row * m.scale,
                              m.dtype, comm_, stream);
    }
    int64_t block = agree[1] * row;
    at::Tensor sendbuf = at::zeros({n * block}, in.options());
    at::Tensor recvbuf = at::empty({n * block}, in.options());
    at::Tensor inflat = in.reshape({-1}), outflat = out.view({-1});
    int64_t off = 0;
    for (int r = 0; r < n; r++) {
        int64_t len = inSplits[r] * row;
        sendbuf.narrow(0, r * block, len).copy_(inflat.narrow(0, off, len));
        off += len;
    }
    st = shoal_alltoall(sendbuf.data_ptr(), recvbuf.data_ptr(), block * m.scale, m.dtype, comm_,
                        stream);
    if (st != SHOAL_OK) {
        return st;
    }
    off = 0;
    for (int r = 0; r < n; r++) {
        int64_t len = outSplits[r] * row;
        outflat.narrow(0, off, len).copy_(recvbuf.narrow(0, r * block, len));
        off += len;
    }
    return SHOAL_OK;
}

} // namespace shoal_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.doc() = "shoal as a torch.distributed backend (C++ part)";
    m.def("create_backend", &shoal_torch::ShoalBackend::create, py::arg("store"), py::arg("rank"),
          py::arg("size"), py::arg("timeout_ms"), py::call_guard<py::gil_scoped_release>());
    // Abandons the batch left open on a shoal backend (on any other backend: nothing); true
    // when one was open. shoal_torch calls it when torch's coalescing manager raised.
    m.def(
        "abandon_batch",
        [](const c10::intrusive_ptr<c10d::Backend> &backend) {
            auto *b = dynamic_cast<shoal_torch::ShoalBackend *>(backend.get());
            return b != nullptr && b->abandon_open_batch();
        },
        py::arg("backend"), py::call_guard<py::gil_scoped_release>());
    m.def("version", [] { return std::string(shoal_version_string()); });
    // Marks, in a forked child, the futures of the CPU Works its parent had pending (see
    // settle_forked_works); shoal_torch calls it through os.register_at_fork.
    m.def("settle_forked_works", &shoal_torch::settle_forked_works,
          py::call_guard<py::gil_scoped_release>());
    // the set of unmarked Works is copied whole into a forked child
    static int atfork = pthread_atfork([] { shoal_torch::g_unmarked_mu.lock(); },
                                       [] { shoal_torch::g_unmarked_mu.unlock(); },
                                       [] { shoal_torch::g_unmarked_mu.unlock(); });
    (void)atfork;
    // True when this extension takes CUDA tensors (stream-ordered calls on the current stream)
    m.def("cuda_built", [] { return shoal_torch::kCudaBuilt; });
}
