// threadpool.h — a persistent pool that splits one index range across its workers.
//
// A decode step issues a few hundred parallel regions (one per matmul/attention/DeltaNet op), so
// workers are created once and woken per region: they spin briefly on a generation counter (the
// next region usually follows within microseconds) before sleeping on a condition variable.
// run() passes the body by pointer (no std::function), so a region allocates nothing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace luce {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);  // n_threads <= 0: one per core
    ~ThreadPool();
    int size() const { return n_threads_; }

    // Calls body(begin, end) on disjoint chunks covering [0, n); returns when all are done.
    // Chunks are contiguous and at least `grain` long, one per thread (static split: every chunk
    // costs about the same in the ops we run).
    template <class F>
    void run(int64_t n, F &&body, int64_t grain = 1) {
        if (n <= 0) return;
        using Fn = std::remove_reference_t<F>;
        dispatch(n, grain, const_cast<void *>(static_cast<const void *>(&body)),
                 [](void *ctx, int64_t b, int64_t e) { (*static_cast<Fn *>(ctx))(b, e); });
    }

private:
    using Trampoline = void (*)(void *, int64_t, int64_t);
    void dispatch(int64_t n, int64_t grain, void *ctx, Trampoline fn);
    void worker(int index);
    void run_share(int index);

    int n_threads_ = 1;
    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stop_{false};
    // The current region (written before generation_ is bumped).
    int64_t n_ = 0, chunk_ = 0;
    int n_chunks_ = 0;
    void *ctx_ = nullptr;
    Trampoline fn_ = nullptr;
};

}  // namespace luce
