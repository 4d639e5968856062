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
// within microseconds, but a longer spin only burns a core the OS could give to someone else.
constexpr int SPIN_ROUNDS = 4000;
// Spin rounds of the dispatching thread before it yields while a claimed chunk finishes.
constexpr int WAIT_SPINS = 256;
// Chunks per thread: a few, so a participant that starts late still finds work to take.
constexpr int64_t CHUNKS_PER_THREAD = 4;
constexpr uint64_t MAX_CHUNKS = 0xFFFF;

inline uint64_t tag_of(uint64_t c) { return c >> 32; }
inline uint64_t count_of(uint64_t c) { return (c >> 16) & 0xFFFF; }
inline uint64_t next_of(uint64_t c) { return c & 0xFFFF; }
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
    if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
    n_threads_ = n_threads;
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker(); });
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

// Claims and runs chunks of the current region until none are left. The fields of a region are
// only rewritten after all its chunks are done, and a chunk is done only after it ran, so a
// successful claim guarantees that n_/chunk_/fn_/ctx_ still describe the claimed region.
void ThreadPool::claim_chunks() {
    uint64_t c = claim_.load(std::memory_order_acquire);
    for (;;) {
        if (next_of(c) >= count_of(c)) return;
        if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire))
            continue;
        const int64_t b = int64_t(next_of(c)) * chunk_;
        const int64_t e = std::min(n_, b + chunk_);
        if (b < e) fn_(ctx_, b, e);
        done_.fetch_add(1, std::memory_order_acq_rel);
        c = claim_.load(std::memory_order_acquire);
    }
}

void ThreadPool::dispatch(int64_t n, int64_t grain, void *ctx, Trampoline fn) {
    grain = std::max<int64_t>(1, grain);
    const int64_t max_chunks = (n + grain - 1) / grain;
    const int64_t want = std::min<int64_t>(int64_t(n_threads_) * CHUNKS_PER_THREAD, int64_t(MAX_CHUNKS));
    const int64_t n_chunks = std::min(max_chunks, want);
    if (n_threads_ == 1 || n_chunks <= 1) {
        fn(ctx, 0, n);
        return;
    }
    chunk_ = (n + n_chunks - 1) / n_chunks;
    const int64_t used = (n + chunk_ - 1) / chunk_;  // chunks that are non-empty
    n_ = n;
    ctx_ = ctx;
    fn_ = fn;
    done_.store(0, std::memory_order_relaxed);
    const uint64_t tag = tag_of(claim_.load(std::memory_order_relaxed)) + 1;
    claim_.store((tag << 32) | (uint64_t(used) << 16), std::memory_order_release);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    claim_chunks();
    // Only chunks already claimed are outstanding; if their thread was preempted, yield to it.
    for (int spins = 0; done_.load(std::memory_order_acquire) != int(used); ++spins) {
        if (spins < WAIT_SPINS) LUCE_PAUSE();
        else std::this_thread::yield();
    }
}

void ThreadPool::worker() {
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
        claim_chunks();
    }
}

}  // namespace luce
