// batch.cpp — continuous batching (luce_batch_*): up to n_parallel sequences in flight, one
// forward per decode step over the newest token of each.
//
// A request entering a free slot takes KV pages from the pool and zeroed DeltaNet state, and is
// prefilled alone in the worker session (chunked, as session_eval always runs, on the slot's state
// swapped in). Decode steps then run all active slots together: one row each, one StepSegment each
// (session.h), so the weight matmuls read every weight once for the whole batch while attention,
// conv and the delta rule run per sequence on its own state. A matmul row does not depend on the
// number of rows in the step (T <= MAX_STEP, which n_parallel never exceeds), attention and the
// recurrence see only the sequence's own state, and prefill and the token choice are the ones
// generate() runs: greedy tokens equal one-by-one generation's. A slot whose sequence finishes is
// given the next request before the next step.
//
// With a drafter (set_drafter) every sequence decodes speculatively through its own SpecSequence
// (speculative.h: generate_speculative's loop cut at the verify): each step, each sequence drafts
// its block (or takes a plain step, as its adaptive policy says) with its state swapped into the
// worker, then one forward over all sequences' rows verifies every block, one segment per sequence
// with its taps captured, and each sequence accepts, rolls back and commits on its own state. The
// logits hold MAX_STEP rows, so blocks whose rows do not fit run in a further forward of the same
// step. Verify rows are batch-invariant like decode rows: greedy tokens equal one-by-one plain
// generation's.
#include "batch.h"

#include <algorithm>

#include "errors.h"

namespace luce {

namespace {

// Bytes of one KV page: one attention layer's K or V for a whole context, sized for the widest
// layer and the wider of the K and V row types.
size_t kv_page_bytes(const Hparams &hp, int n_ctx, KvFormat f) {
    int max_hkv = 0;
    for (int i = 0; i < hp.n_layer; ++i)
        if (!hp.recurrent[size_t(i)]) max_hkv = std::max(max_hkv, hp.n_head_kv[size_t(i)]);
    const size_t row = std::max(kv_row_bytes(f.k, hp.head_dim), kv_row_bytes(f.v, hp.head_dim));
    return size_t(std::max(max_hkv, 1)) * size_t(n_ctx) * row;
}

// n_parallel, once it is known to be in 1..MAX_STEP (checked before anything is allocated for it).
int checked_parallel(int n_parallel) {
    if (n_parallel < 1 || n_parallel > MAX_STEP)
        fail(LUCE_ERR_INVALID_ARGUMENT, "n_parallel %d is not in 1..%d", n_parallel, MAX_STEP);
    return n_parallel;
}

int attention_layers(const Hparams &hp) {
    return int(std::count(hp.recurrent.begin(), hp.recurrent.end(), false));
}

}  // namespace

BatchRunner::BatchRunner(Model *m, int n_parallel, int n_ctx, KvFormat kv_format)
    : model_(m),
      n_ctx_((checked_parallel(n_parallel), n_ctx)),
      kv_format_(kv_format),
      worker_(m, n_ctx, kv_format, /*own_state=*/false),
      pool_(*m->backend, kv_page_bytes(m->hp, n_ctx, kv_format), std::max(1, 2 * attention_layers(m->hp) * n_parallel)) {
    const Hparams &hp = m->hp;
    Backend &be = *m->backend;
    const size_t n_conv = size_t(hp.ssm_conv - 1) * size_t(hp.conv_channels());
    const size_t n_ssm = size_t(hp.ssm_hv) * size_t(hp.ssm_dv) * size_t(hp.ssm_dk);
    auto take = [&](size_t n) {
        state_memory_.push_back(be.alloc(std::max<size_t>(n, 1) * sizeof(float)));
        return static_cast<float *>(state_memory_.back());
    };
    try {
        slots_.resize(size_t(n_parallel));
        for (Slot &slot : slots_) {
            slot.kv.resize(size_t(hp.n_layer));
            slot.recurrent.resize(size_t(hp.n_layer));
            for (int i = 0; i < hp.n_layer; ++i) {
                if (!hp.recurrent[size_t(i)]) continue;
                slot.recurrent[size_t(i)].conv = take(n_conv);
                slot.recurrent[size_t(i)].ssm = take(n_ssm);
            }
        }
        argmax_out_ = static_cast<int32_t *>(be.alloc(MAX_STEP * sizeof(int32_t)));
        host_row_.resize(size_t(hp.n_vocab));
    } catch (...) {
        for (void *p : state_memory_) be.release(p);
        throw;
    }
}

BatchRunner::~BatchRunner() {
    Backend &be = *model_->backend;
    release_drafter_memory();
    if (argmax_out_) be.release(argmax_out_);
    for (void *p : state_memory_) be.release(p);
}

// The drafter's buffers for one prompt chunk or one verify forward of up to MAX_STEP rows,
// whichever sequence they belong to: the taps, and the DeltaNet rollback history (per recurrent layer, MAX_STEP states and
// raw qkv rows), which a sequence needs only until its end of step.
void BatchRunner::set_drafter(Drafter *d) {
    if (d && d->target != model_) fail(LUCE_ERR_INVALID_ARGUMENT, "the drafter is bound to another target model");
    release_drafter_memory();
    drafter_ = nullptr;
    if (!d) return;
    const Hparams &hp = model_->hp;
    Backend &be = *model_->backend;
    auto take = [&](size_t n_floats) {
        drafter_memory_.push_back(be.alloc(n_floats * sizeof(float)));
        return static_cast<float *>(drafter_memory_.back());
    };
    const size_t CD = size_t(hp.conv_channels()), SS = size_t(hp.ssm_hv) * hp.ssm_dk * hp.ssm_dv;
    try {
        taps_ = take(size_t(worker_.prefill_step) * d->n_taps() * d->hp.n_embd);  // a prompt chunk's, or a verify's
        history_.ssm.assign(size_t(hp.n_layer), nullptr);
        history_.qkv.assign(size_t(hp.n_layer), nullptr);
        for (int i = 0; i < hp.n_layer; ++i) {
            if (!hp.recurrent[size_t(i)]) continue;
            history_.ssm[size_t(i)] = take(MAX_STEP * SS);
            history_.qkv[size_t(i)] = take(MAX_STEP * CD);
        }
    } catch (...) {
        release_drafter_memory();
        throw;
    }
    drafter_ = d;
}

void BatchRunner::release_drafter_memory() {
    for (void *p : drafter_memory_) model_->backend->release(p);
    drafter_memory_.clear();
    taps_ = nullptr;
    history_ = CheckpointRows{};
}

// Runs f with the slot's KV layers, DeltaNet state and n_past in the worker session (swapped back
// on any exit): a prefill, or a speculative sequence's own work around the shared verify.
template <class F>
void BatchRunner::in_worker(Slot &slot, F &&f) {
    struct StateSwap {
        Session &s;
        Slot &slot;
        StateSwap(Session &s_, Slot &slot_) : s(s_), slot(slot_) {
            swap();
            s.n_past = slot.n_past;
        }
        ~StateSwap() {
            slot.n_past = s.n_past;
            s.n_past = 0;
            swap();
        }
        void swap() {
            s.kv.swap(slot.kv);
            s.recurrent.swap(slot.recurrent);
        }
    } in_worker(worker_, slot);
    f();
}

void BatchRunner::check_request(const luce_batch_request &r, int index) const {
    try {
        if (!r.params) fail(LUCE_ERR_INVALID_ARGUMENT, "params is NULL");
        check_generate_request(worker_, r.prompt, r.n_prompt, *r.params, r.out_tokens, r.out_capacity);
        if (drafter_) {
            if (r.params->ddtree)
                fail(LUCE_ERR_UNSUPPORTED, "DDTree inside a batch is not implemented; use chain drafting (no --ddtree)");
            check_speculative_request(worker_, *drafter_, *r.params);
        }
    } catch (const Error &e) {
        fail(e.status, "request %d: %s", index, e.what());
    }
}

bool BatchRunner::admit(Slot &slot, int index, const luce_batch_request &r) {
    const Hparams &hp = model_->hp;
    Backend &be = *model_->backend;
    const luce_generate_params &p = *r.params;
    slot.request = index;
    for (int i = 0; i < hp.n_layer; ++i) {
        if (hp.recurrent[size_t(i)]) continue;
        const int k = pool_.take();
        slot.pages.push_back(k);
        const int v = pool_.take();
        slot.pages.push_back(v);
        slot.kv[size_t(i)] = KvLayer{pool_.data(k), pool_.data(v), n_ctx_, kv_format_};
    }
    clear_recurrent_state(*model_, slot.recurrent);
    slot.n_past = 0;
    slot.stats = luce_generate_stats{};
    slot.stats.n_prompt = r.n_prompt;
    if (drafter_) {  // the speculative loop prefills and emits the first token itself
        slot.spec = std::make_unique<SpecSequence>(worker_, *drafter_, r.n_prompt, p, r.out_tokens, taps_);
        in_worker(slot, [&] { slot.going = slot.spec->start(r.prompt, r.n_prompt); });
        return slot.going;
    }
    slot.sampler.reset();
    slot.top_k.reset();
    if (p.temperature > 0.f) {
        slot.sampler = std::make_unique<Sampler>(SamplerParams{p.temperature, p.top_k, p.top_p}, p.seed, hp.n_vocab);
        // As generate() decodes: the k best ranked where the logits are, only they come back.
        if (const int k = backend_top_k(p, hp.n_vocab)) slot.top_k = std::make_unique<TopKRows>(be, 1, k);
    }

    const double t0 = now_seconds();
    in_worker(slot, [&] {
        if (p.max_tokens > 0) {
            session_eval(worker_, r.prompt, r.n_prompt, host_row_.data(), 1);
            slot.next = p.temperature == 0.f ? be.argmax(host_row_.data(), hp.n_vocab) : slot.sampler->sample(host_row_.data());
        } else {
            session_eval(worker_, r.prompt, r.n_prompt, nullptr, 0);
        }
    });
    slot.decode_start = now_seconds();
    slot.stats.prefill_seconds = slot.decode_start - t0;
    return commit(slot, r);
}

void BatchRunner::release(Slot &slot) {
    for (int page : slot.pages) pool_.give_back(page);
    slot.pages.clear();
    slot.spec.reset();
    // A run that ended mid-verify may have left a chain's history attached: no later step writes there.
    for (RecurrentState &st : slot.recurrent) st.ssm_history = st.qkv_history = nullptr;
    slot.request = -1;
}

// generate()'s loop body: stop at an end-of-generation id, else commit the pending token.
bool BatchRunner::commit(Slot &slot, const luce_batch_request &r) {
    const luce_generate_params &p = *r.params;
    luce_generate_stats &st = slot.stats;
    if (st.n_generated >= p.max_tokens) return false;
    const bool stop = !p.ignore_eos && std::find(p.stop_ids, p.stop_ids + p.n_stop_ids, slot.next) != p.stop_ids + p.n_stop_ids;
    if (stop) {
        st.stopped_by_eos = 1;
        return false;
    }
    r.out_tokens[st.n_generated++] = slot.next;
    return st.n_generated < p.max_tokens;
}

bool BatchRunner::still_going(Slot &slot, const luce_batch_request &r) {
    return slot.spec ? slot.going : commit(slot, r);
}

// The argmax of each of a step's T logits rows, for its greedy sequences: one reduction where the
// logits are and one copy of T ids back, not one per sequence (on a GPU each copy back waits for
// the device).
void BatchRunner::argmax_picks(const float *rows, int T, int32_t *picks) {
    Backend &be = *model_->backend;
    be.argmax_rows(rows, T, model_->hp.n_vocab, argmax_out_);
    be.download(picks, argmax_out_, size_t(T) * sizeof(int32_t));
}

// One forward over the slots' rows (rows[i] new tokens of slots[i] at its n_past, tokens in slot
// order): the logits rows [T][V] in backend memory. n_past is the caller's to advance.
const float *BatchRunner::forward_segments(const std::vector<Slot *> &slots, const int *rows, const int32_t *tokens,
                                           int T, const HiddenCapture *capture) {
    std::vector<StepSegment> segments;
    for (size_t i = 0, row0 = 0; i < slots.size(); row0 += size_t(rows[i++]))
        segments.push_back(StepSegment{&slots[i]->kv, &slots[i]->recurrent, slots[i]->n_past, int(row0), rows[i]});
    struct Scope {
        Session &s;
        ~Scope() { s.segments = nullptr; }
    } scope{worker_};
    worker_.segments = &segments;
    return forward_step_rows(worker_, tokens, T, 0, capture);
}

void BatchRunner::decode_step(const std::vector<Slot *> &active) {
    Backend &be = *model_->backend;
    const int64_t V = model_->hp.n_vocab;
    const int T = int(active.size());
    std::vector<int32_t> tokens;
    for (const Slot *slot : active) tokens.push_back(slot->next);
    const std::vector<int> one_each(active.size(), 1);
    const float *rows = forward_segments(active, one_each.data(), tokens.data(), T, nullptr);
    const bool any_greedy = std::any_of(active.begin(), active.end(), [](const Slot *s) { return !s->sampler; });
    int32_t picks[MAX_STEP];
    if (any_greedy) argmax_picks(rows, T, picks);
    for (int i = 0; i < T; ++i) {
        Slot &slot = *active[size_t(i)];
        slot.n_past += 1;
        if (!slot.sampler) {
            slot.next = picks[i];
            continue;
        }
        const float *row = rows + int64_t(i) * V;
        if (slot.top_k) {
            slot.top_k->fetch(row, 1, V);
            slot.next = slot.sampler->sample_ranked(slot.top_k->ids(0), slot.top_k->values(0), slot.top_k->k());
            continue;
        }
        be.download(host_row_.data(), row, size_t(V) * sizeof(float));
        slot.next = slot.sampler->sample(host_row_.data());
    }
}

// Each active sequence drafts its block, then the blocks are verified, as many per forward as
// MAX_STEP logits rows hold (all of them, unless blocks are wide and sequences many).
void BatchRunner::spec_step(const std::vector<Slot *> &active) {
    std::vector<int> rows(active.size());
    for (size_t i = 0; i < active.size(); ++i)
        in_worker(*active[i], [&] { rows[i] = active[i]->spec->begin_step(); });
    for (size_t first = 0, last = 0; first < active.size(); first = last) {
        int T = 0;
        while (last < active.size() && T + rows[last] <= MAX_STEP) T += rows[last++];
        verify(active.data() + first, rows.data() + first, int(last - first));
    }
}

// One target forward over the steps of n sequences, taps captured, then each sequence's end of
// step on its own rows.
void BatchRunner::verify(Slot *const *slots, const int *rows, int n) {
    const std::vector<Slot *> group(slots, slots + n);
    std::vector<int32_t> tokens;
    for (int i = 0; i < n; ++i) {
        const int32_t *t = slots[i]->spec->step_tokens();
        tokens.insert(tokens.end(), t, t + rows[i]);
    }
    for (int i = 0, row0 = 0; i < n; row0 += rows[i++])
        in_worker(*slots[i], [&] { slots[i]->spec->attach_checkpoints(history_, row0); });
    const Drafter &d = *drafter_;
    const int64_t V = model_->hp.n_vocab, tap_row = int64_t(d.n_taps()) * d.hp.n_embd;
    const HiddenCapture capture{d.hp.target_layer_ids.data(), d.n_taps(), taps_, true};
    const int T = int(tokens.size());
    const float *logits = forward_segments(group, rows, tokens.data(), T, &capture);
    int32_t ids[MAX_STEP];
    const bool any_greedy = std::any_of(group.begin(), group.end(), [](const Slot *s) { return s->spec->greedy(); });
    if (any_greedy) argmax_picks(logits, T, ids);
    for (int i = 0, row0 = 0; i < n; row0 += rows[i++]) {
        Slot &slot = *slots[i];
        slot.n_past += rows[i];  // as a forward of the sequence alone advances it
        in_worker(slot, [&] {
            slot.going = slot.spec->end_step(logits + row0 * V, taps_ + row0 * tap_row, any_greedy ? ids + row0 : nullptr);
        });
    }
}

luce_status BatchRunner::run(const luce_batch_request *requests, int n, luce_batch_done_callback done,
                             void *user_data) {
    if (n < 0 || (n > 0 && !requests)) fail(LUCE_ERR_INVALID_ARGUMENT, "no requests");
    for (int i = 0; i < n; ++i) check_request(requests[i], i);
    // Every slot gives its pages back however the run ends.
    struct ReleaseAll {
        BatchRunner &b;
        ~ReleaseAll() {
            for (Slot &slot : b.slots_)
                if (slot.request >= 0) b.release(slot);
        }
    } release_all{*this};

    int next_request = 0;
    // Records a finished sequence and frees its slot; false when the caller asked to stop.
    auto finish = [&](Slot &slot) {
        const int index = slot.request;
        if (slot.spec) slot.stats = slot.spec->finish();
        else slot.stats.decode_seconds = now_seconds() - slot.decode_start;
        if (requests[index].stats) *requests[index].stats = slot.stats;
        release(slot);
        return !(done && done(user_data, index) != 0);
    };
    while (true) {
        for (Slot &slot : slots_) {
            while (slot.request < 0 && next_request < n) {
                const luce_batch_request &r = requests[next_request];
                if (!admit(slot, next_request++, r) && !finish(slot)) {
                    set_last_error("generation stopped by the done callback");
                    return LUCE_ERR_CANCELLED;
                }
            }
        }
        std::vector<Slot *> active;
        for (Slot &slot : slots_)
            if (slot.request >= 0) active.push_back(&slot);
        if (active.empty()) return LUCE_OK;
        if (drafter_) spec_step(active);
        else decode_step(active);
        for (Slot *slot : active) {
            if (still_going(*slot, requests[slot->request]) || finish(*slot)) continue;
            set_last_error("generation stopped by the done callback");
            return LUCE_ERR_CANCELLED;
        }
    }
}

}  // namespace luce
