// threadpool.h — a persistent pool that splits one index range across its workers.
//
// A decode step issues a few hundred parallel regions (one per matmul/attention/DeltaNet op), so
// workers are created once and woken per region: they spin briefly (the next region usually
// follows within microseconds) before sleeping on a condition variable. The range is cut into
// chunks that every participant, the calling thread included, claims from a shared counter: if a
// worker is slow to wake (a busy machine), the caller simply does its chunks, and only waits for
// chunks that were actually claimed. run() passes the body by pointer (no std::function), so a
// region allocates nothing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace luce {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);  // n_threads <= 0: one per core
    ~ThreadPool();
    int size() const { return n_threads_; }

    // Calls body(begin, end) on disjoint chunks covering [0, n), each at least `grain` long;
    // returns when all are done. Chunks may run on any thread, in any order.
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
    void worker();
    void claim_chunks();

    int n_threads_ = 1;
    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::atomic<uint64_t> generation_{0};  // bumped per region; workers sleep until it changes
    std::atomic<bool> stop_{false};
    // The current region, written by the caller before it publishes claim_.
    // claim_ = region tag (32 bits) | chunk count (16) | next chunk (16): a claim is one CAS
    // that also proves the chunk belongs to the region the claimer read.
    std::atomic<uint64_t> claim_{0};
    std::atomic<int> done_{0};
    int64_t n_ = 0, chunk_ = 0;
    void *ctx_ = nullptr;
    Trampoline fn_ = nullptr;
};

}  // namespace luce
