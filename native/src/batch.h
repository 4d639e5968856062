// batch.h — continuous batching: many sequences, one forward per decode step (luce_batch_*).
#pragma once

#include <memory>
#include <vector>

#include "generate.h"
#include "kv_pool.h"
#include "luce.h"
#include "sampling.h"
#include "session.h"
#include "speculative.h"

namespace luce {

class BatchRunner {
public:
    BatchRunner(Model *m, int n_parallel, int n_ctx, KvFormat kv_format);
    ~BatchRunner();
    BatchRunner(const BatchRunner &) = delete;
    BatchRunner &operator=(const BatchRunner &) = delete;

    // Speculative decoding of every sequence with this drafter (bound to the same model); null: plain.
    void set_drafter(Drafter *d);

    // Every request, n_parallel at a time (luce.h luce_batch_generate).
    luce_status run(const luce_batch_request *requests, int n, luce_batch_done_callback done, void *user_data);

private:
    // A sequence in flight: its state, the request it serves and its pending token.
    struct Slot {
        int request = -1;                      // -1: free
        std::vector<int> pages;                // KV page table: K then V page of each attention layer
        std::vector<KvLayer> kv;               // per main layer, over the pages
        std::vector<RecurrentState> recurrent; // per main layer, allocated with the slot
        int n_past = 0;
        int32_t next = -1;                     // chosen, not yet committed
        std::unique_ptr<Sampler> sampler;      // temperature > 0 only
        std::unique_ptr<TopKRows> top_k;       // a sampled run's backend top-k (backend_top_k), else null
        luce_generate_stats stats{};
        double decode_start = 0;
        std::unique_ptr<SpecSequence> spec;    // with a drafter: the sequence's speculative loop
        bool going = false;                    // with a drafter: false once the sequence is finished
    };

    bool admit(Slot &slot, int index, const luce_batch_request &r);  // false: finished at once
    void release(Slot &slot);
    bool commit(Slot &slot, const luce_batch_request &r);  // false: the sequence is finished
    bool still_going(Slot &slot, const luce_batch_request &r);  // after a step
    void decode_step(const std::vector<Slot *> &active);
    void spec_step(const std::vector<Slot *> &active);
    void verify(Slot *const *slots, const int *rows, int n);
    const float *forward_segments(const std::vector<Slot *> &slots, const int *rows, const int32_t *tokens, int T,
                                  const HiddenCapture *capture);
    template <class F>
    void in_worker(Slot &slot, F &&f);
    void release_drafter_memory();
    void argmax_picks(const float *rows, int T, int32_t *picks);
    void check_request(const luce_batch_request &r, int index) const;

    Model *model_;
    int n_ctx_;
    KvFormat kv_format_;
    Session worker_;      // the step buffers; a prefill runs in it on the slot's state
    KvPagePool pool_;
    std::vector<Slot> slots_;
    std::vector<void *> state_memory_;  // the slots' recurrent state
    int32_t *argmax_out_ = nullptr;     // [MAX_STEP] greedy picks of a step, backend memory
    std::vector<float> host_row_;       // one logits row on the host
    Drafter *drafter_ = nullptr;
    float *taps_ = nullptr;             // with a drafter: a prefill chunk's or verify's taps [prefill_step][N][E], backend memory
    CheckpointRows history_;            // with a drafter: a verify forward's rollback history, MAX_STEP rows
    std::vector<void *> drafter_memory_;  // taps_ and history_'s buffers
};

}  // namespace luce
