// threadpool.cpp — see threadpool.h.
#include "threadpool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LUCE_PAUSE() _mm_pause()
#else
#define LUCE_PAUSE() ((void)0)
#endif

namespace luce {

namespace {
// Spin rounds before a worker sleeps (~tens of microseconds): ops of one step follow each other
// within microseconds, but a longer spin only burns a core the OS could give to a worker.
constexpr int SPIN_ROUNDS = 4000;
// Spin rounds of the dispatching thread before it yields while waiting for stragglers (a worker
// may have been descheduled on a busy machine; spinning would then delay it further).
constexpr int WAIT_SPINS = 256;
}

ThreadPool::ThreadPool(int n_threads) {
    if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
    n_threads_ = n_threads;
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
        generation_.fetch_add(1);
    }
    wake_.notify_all();
    for (auto &t : workers_) t.join();
}

void ThreadPool::run_share(int index) {
    if (index >= n_chunks_) return;
    int64_t b = int64_t(index) * chunk_;
    int64_t e = std::min(n_, b + chunk_);
    if (b < e) fn_(ctx_, b, e);
}

void ThreadPool::dispatch(int64_t n, int64_t grain, void *ctx, Trampoline fn) {
    grain = std::max<int64_t>(1, grain);
    int64_t max_chunks = (n + grain - 1) / grain;
    int n_chunks = int(std::min<int64_t>(n_threads_, max_chunks));
    if (n_chunks <= 1) {
        fn(ctx, 0, n);
        return;
    }
    n_ = n;
    n_chunks_ = n_chunks;
    chunk_ = (n + n_chunks - 1) / n_chunks;
    ctx_ = ctx;
    fn_ = fn;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    run_share(0);
    for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
        if (spins < WAIT_SPINS) LUCE_PAUSE();
        else std::this_thread::yield();
    }
}

void ThreadPool::worker(int index) {
    uint64_t seen = 0;
    for (;;) {
        int spins = 0;
        while (generation_.load(std::memory_order_acquire) == seen && spins < SPIN_ROUNDS) {
            LUCE_PAUSE();
            ++spins;
        }
        if (generation_.load(std::memory_order_acquire) == seen) {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return generation_.load() != seen; });
        }
        seen = generation_.load(std::memory_order_acquire);
        if (stop_) return;
        run_share(index);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

}  // namespace luce
