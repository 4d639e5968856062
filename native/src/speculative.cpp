// speculative.cpp — block-diffusion speculative decoding over a qwen35 target (spec engine.md §4,
// drafters.md §1.7). One step, with `anchor` the last committed token (not yet run by the target)
// at position p:
//   1. draft:  the drafter runs the block [anchor, mask x (B-1)] at p.. over the fused features of
//              positions < p; its heads give q proposals d_1..d_q (q = B-1, or B for DSpark
//              next-token slots; fewer near max_tokens, under the long-context cap or the DSpark
//              confidence gate).
//   2. verify: the target runs [anchor, d_1..d_q] (T = q+1 rows) with logits for every row,
//              capturing the drafter's taps and per-row DeltaNet checkpoints.
//   3. accept (greedy): n = longest prefix with d_{i+1} == argmax(row i); bonus = argmax(row n)
//      (the rows' argmax ids are formed by the backend, where the logits are: run_target).
//      accept (sampled, T > 0): standard rejection sampling. Row i's target distribution p_i
//              (the sampler's temperature/top-k/top-p) and the drafter's proposal q_i (the same
//              sampler over the drafter's scores, drafter.h ChainSampling): accept
//              d_{i+1} with probability min(1, p_i(d)/q_i(d)); at the first rejection the bonus is
//              drawn from normalize(max(p_i - q_i, 0)) (p_i if that has no mass); if all q are
//              accepted the bonus is drawn from p_q. Each committed token then has exactly the
//              target's distribution (Leviathan et al. 2023, Thm. 1), whatever q is.
//   4. commit anchor, d_1..d_n (n+1 positions), roll the target back to p+n+1 (rollback below),
//      append their taps to the drafter context, emit d_1..d_n and the bonus; bonus = next anchor.
// Greedy output therefore equals plain greedy decoding token for token: every committed token is
// the target's argmax given the committed prefix.
//
// The MTP drafter (kind DRAFT_MTP, mtp.h) replaces step 1: its block drafts d_1..d_k one row at a
// time from the anchor and the target's last hidden state (the one tap, the last main layer); step 4
// appends the committed tokens with their hidden states to its context instead of the taps.
//
// Adaptive policy (spec engine.md §4.8): spec_policy.h chooses plain or speculative for each step,
// and under auto the block width, from the step costs measured on this device and the decayed
// acceptance of each proposal position. Plain steps still
// capture features for the drafter context. Sampled runs too, where upstream turns the policy off:
// a plain step draws from p like any other.
#include "speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <queue>
#include <vector>

#include "errors.h"
#include "generate.h"
#include "mtp.h"
#include "sampling.h"
#include "spec_policy.h"

namespace luce {

namespace {

constexpr int MAX_DRAFT_BLOCK = 32;          // CLI hard cap on B (spec engine.md §3)
constexpr int DEFAULT_VERIFY_CAP_FROM = 8192;  // committed tokens (spec engine.md §4.9)
constexpr int VERIFY_CAP_MIN = 8;
constexpr int DEFAULT_DDTREE_BUDGET = 22;
constexpr int DDTREE_WIDE_K = 8;  // candidates per node when the budget exceeds the depth, else 1

constexpr int PENDING_ROWS = 64;     // plain steps' taps gathered before one context append
constexpr int AUTO_START_WIDTH = 4;  // auto's first spec step: the cheapest block that still shows
                                     // three positions' acceptance (the model extends it from there)
static_assert(sizeof(luce_generate_stats::width_seconds) / sizeof(double) == MAX_DRAFT_BLOCK + 1);

// The widest block a run may use: auto goes up to the checkpoint's horizon (past it proposals are
// rarely accepted, and every row costs verify memory).
int block_rows(const Drafter &d, const luce_generate_params &p) {
    if (d.hp.kind == DRAFT_MTP) {  // rows = drafts k; any k up to twice the horizon
        const int hi = 2 * MTP_HORIZON, k = p.draft_block_size;
        if (k == 0 || p.draft_block_auto) return MTP_HORIZON;
        if (k < 1 || k > hi)
            fail(LUCE_ERR_INVALID_ARGUMENT, "--draft-block-size must be in [1, %d] for MTP drafting, or auto; got %d",
                 hi, k);
        return k;
    }
    const int ckpt = d.hp.block_size, hi = std::min(2 * ckpt, MAX_DRAFT_BLOCK), requested = p.draft_block_size;
    if (requested == 0 || p.draft_block_auto) return std::min(ckpt, MAX_DRAFT_BLOCK);
    if (requested < 2 || requested > hi)
        fail(LUCE_ERR_INVALID_ARGUMENT, "--draft-block-size must be in [2, %d] for this drafter (up to 2x the "
             "checkpoint horizon %d, at most %d), or auto; got %d", hi, ckpt, MAX_DRAFT_BLOCK, requested);
    return requested;
}

// The policy for a run: auto chooses widths 2..B per step, a number is that width only; seeded
// from the cost cache when the caller has one. Auto keeps B under DDTree (its tree is built for one
// depth) and under --no-adaptive (which measures no plain step to weigh widths against).
SpecPolicy make_policy(const Drafter &d, const luce_generate_params &p, int B) {
    const bool chooses = p.draft_block_auto && !p.ddtree && !p.no_adaptive;
    SpecPolicy policy(!p.no_adaptive, chooses ? 2 : B, B, chooses ? AUTO_START_WIDTH : B, d.hp.sample_from_anchor);
    policy.seed(p.prior_plain_seconds, p.prior_width_seconds, p.n_prior_widths, p.prior_acceptance,
                p.n_prior_acceptance);
    return policy;
}

// Rollback checkpoints of every DeltaNet layer for one verify of up to W rows. Memory, per
// recurrent layer: W x (HV*DK*DV + CD) + (Kc-1) x CD floats (W = verify width; Qwen3.5-27B,
// W = 17: 48 layers x 17 x (48*128*128 + 10240) x 4 B ~= 2.6 GB). Restoring is a copy: no replay.
// The buffers are attached to the session only for the verify forward (attach/detach), since
// a prefill chunk or a plain step must not write checkpoints. A batch's sequences (own_history
// false) share one set of history rows instead, lent for each verify (lend).
struct Checkpoints {
    Session &s;
    int W = 0;
    std::vector<void *> owned;
    std::vector<float *> conv_before;  // per layer [(Kc-1)][CD] state before the verify step
    std::vector<float *> ssm_history, qkv_history;  // per layer [W][HV*DK*DV], [W][CD]
    std::vector<Backend::CopyOp> copies;             // attach's / restore's, one batch each

    Checkpoints(Session &s_, int W_, bool own_history) : s(s_), W(W_) {
        const Hparams &hp = s.model->hp;
        Backend &be = *s.model->backend;
        const size_t CD = size_t(hp.conv_channels()), SS = size_t(hp.ssm_hv) * hp.ssm_dk * hp.ssm_dv;
        conv_before.assign(size_t(hp.n_layer), nullptr);
        ssm_history.assign(size_t(hp.n_layer), nullptr);
        qkv_history.assign(size_t(hp.n_layer), nullptr);
        auto take = [&](size_t n_floats) {
            owned.push_back(be.alloc(n_floats * sizeof(float)));
            return static_cast<float *>(owned.back());
        };
        try {
            for (int i = 0; i < hp.n_layer; ++i) {
                if (!hp.recurrent[size_t(i)]) continue;
                if (own_history) {
                    ssm_history[size_t(i)] = take(size_t(W) * SS);
                    qkv_history[size_t(i)] = take(size_t(W) * CD);
                }
                conv_before[size_t(i)] = take(size_t(hp.ssm_conv - 1) * CD + 1);
            }
        } catch (...) {
            release();
            throw;
        }
    }
    ~Checkpoints() { release(); }
    void release() {
        detach();
        for (void *p : owned) s.model->backend->release(p);
        owned.clear();
    }
    // The next verify's history: rows [row0, row0 + W) of a batch's shared ones.
    void lend(const CheckpointRows &shared, int row0) {
        const Hparams &hp = s.model->hp;
        const size_t CD = size_t(hp.conv_channels()), SS = size_t(hp.ssm_hv) * hp.ssm_dk * hp.ssm_dv;
        for (int i = 0; i < hp.n_layer; ++i) {
            if (!hp.recurrent[size_t(i)]) continue;
            ssm_history[size_t(i)] = shared.ssm[size_t(i)] + size_t(row0) * SS;
            qkv_history[size_t(i)] = shared.qkv[size_t(i)] + size_t(row0) * CD;
        }
    }
    // Snapshot the conv windows and attach the per-row checkpoint buffers for a verify of <= W rows.
    void attach() {
        const Hparams &hp = s.model->hp;
        const size_t n = size_t(hp.ssm_conv - 1) * size_t(hp.conv_channels()) * sizeof(float);
        copies.clear();
        for (int i = 0; i < hp.n_layer; ++i) {
            if (!hp.recurrent[size_t(i)]) continue;
            RecurrentState &st = s.recurrent[size_t(i)];
            copies.push_back({conv_before[size_t(i)], st.conv, n});
            st.ssm_history = ssm_history[size_t(i)];
            st.qkv_history = qkv_history[size_t(i)];
        }
        s.model->backend->copy_batch(copies.data(), int(copies.size()));
    }
    void detach() {
        for (RecurrentState &st : s.recurrent) st.ssm_history = st.qkv_history = nullptr;
    }
    // After a verify step at position p, keep the given rows (row indices of the step in commit
    // order: 0..n for a chain, the accepted root-to-leaf path for a tree): the recurrent state is
    // the checkpoint after the last one, the conv state the last Kc-1 raw inputs of (state before
    // the step ++ those rows' qkv); attention needs only n_past (a tree's path K/V are moved to
    // consecutive slots by the caller).
    void restore(int p, const int32_t *rows, int n_rows) {
        const Hparams &hp = s.model->hp;
        Backend &be = *s.model->backend;
        const int S = hp.ssm_conv - 1;
        const size_t CD = size_t(hp.conv_channels()), SS = size_t(hp.ssm_hv) * hp.ssm_dk * hp.ssm_dv;
        copies.clear();
        for (int i = 0; i < hp.n_layer; ++i) {
            if (!hp.recurrent[size_t(i)]) continue;
            RecurrentState &st = s.recurrent[size_t(i)];
            copies.push_back({st.ssm, ssm_history[size_t(i)] + size_t(rows[n_rows - 1]) * SS, SS * sizeof(float)});
            const auto source = [&](int r) {  // conv state row r: row n_rows - S + r of (old state ++ kept rows)
                const int src = n_rows - S + r;
                return src < 0 ? conv_before[size_t(i)] + size_t(S + src) * CD
                               : qkv_history[size_t(i)] + size_t(rows[src]) * CD;
            };
            // One copy per run of rows adjacent in their source (a chain's rows are).
            for (int r = 0, n = 1; r < S; r += n, n = 1) {
                while (r + n < S && source(r + n) == source(r) + size_t(n) * CD) ++n;
                copies.push_back({st.conv + size_t(r) * CD, source(r), size_t(n) * CD * sizeof(float)});
            }
        }
        be.copy_batch(copies.data(), int(copies.size()));
        s.n_past = p + n_rows;
    }
};

// DDTree (spec engine.md §4.7): a best-first tree of at most `budget` nodes under the root (the
// anchor). Node depth d takes its candidates from proposal row d-1, conditioned on the node's own
// token as predecessor (draft_candidates): k = 8 per node when the budget exceeds the depth L,
// else 1 (a chain). Expansion order = cumulative log-probability, so the budget goes to the most
// likely branches; a node is always created after its parent.
struct TreeNode {
    int32_t token;
    int parent;  // -1 for the root
    int depth;
    float cum;   // sum of log-probabilities from the root
};

// U: the proposal rows' unary logits [L][V] in host memory; hidden: their rows [L][E] in
// backend memory.
std::vector<TreeNode> build_tree(const Drafter &d, DraftHeads &hd, const float *U, const float *hidden, int L,
                                 int32_t anchor, int budget) {
    const int V = d.target->hp.n_vocab, E = d.hp.n_embd, K = budget > L ? DDTREE_WIDE_K : 1;
    std::vector<TreeNode> nodes{{anchor, -1, 0, 0.f}};
    std::vector<std::vector<int32_t>> cand_ids;
    std::vector<std::vector<float>> cand_logp;
    std::vector<RowCandidates> rows(static_cast<size_t>(L));  // per proposal row
    auto expand = [&](int node) {  // candidates for the children of `node` (depth + 1 -> row depth)
        const int row = nodes[size_t(node)].depth;
        cand_ids.resize(size_t(node) + 1);
        cand_logp.resize(size_t(node) + 1);
        cand_ids[size_t(node)].resize(size_t(K));
        cand_logp[size_t(node)].resize(size_t(K));
        const int k = draft_candidates(d, hd, U + int64_t(row) * V, hidden + int64_t(row) * E,
                                       nodes[size_t(node)].token, K, cand_ids[size_t(node)].data(),
                                       cand_logp[size_t(node)].data(), rows[size_t(row)]);
        cand_ids[size_t(node)].resize(size_t(k));
        cand_logp[size_t(node)].resize(size_t(k));
    };
    struct Entry {
        float score;
        int parent, rank;
        bool operator<(const Entry &o) const { return score < o.score; }
    };
    std::priority_queue<Entry> heap;
    expand(0);
    heap.push({cand_logp[0][0], 0, 0});
    while (!heap.empty() && int(nodes.size()) < budget + 1) {
        const Entry e = heap.top();
        heap.pop();
        const int depth = nodes[size_t(e.parent)].depth + 1, n = int(nodes.size());
        nodes.push_back({cand_ids[size_t(e.parent)][size_t(e.rank)], e.parent, depth, e.score});
        if (e.rank + 1 < int(cand_ids[size_t(e.parent)].size()))  // its next sibling
            heap.push({nodes[size_t(e.parent)].cum + cand_logp[size_t(e.parent)][size_t(e.rank + 1)], e.parent,
                       e.rank + 1});
        if (depth < L) {  // its best child
            expand(n);
            heap.push({e.score + cand_logp[size_t(n)][0], n, 0});
        }
    }
    return nodes;
}

// Moves the K/V rows of the accepted path's nodes (cache slots start + path[i]) to the
// consecutive slots start + i they belong at now. path[i] >= i and increases, so in place.
void compact_kv(Session &s, int start, const std::vector<int32_t> &path) {
    const Hparams &hp = s.model->hp;
    Backend &be = *s.model->backend;
    for (int il = 0; il < hp.n_layer; ++il) {
        if (hp.recurrent[size_t(il)]) continue;
        KvLayer &kv = s.kv[size_t(il)];
        const size_t k_row = kv_row_bytes(kv.format.k, hp.head_dim), v_row = kv_row_bytes(kv.format.v, hp.head_dim);
        for (size_t i = 1; i < path.size(); ++i) {
            if (path[i] == int32_t(i)) continue;
            for (int h = 0; h < hp.n_head_kv[size_t(il)]; ++h) {
                const size_t dst = size_t(h) * kv.n_ctx + start + i, src = size_t(h) * kv.n_ctx + start + path[i];
                be.copy(static_cast<char *>(kv.k) + dst * k_row, static_cast<char *>(kv.k) + src * k_row, k_row);
                be.copy(static_cast<char *>(kv.v) + dst * v_row, static_cast<char *>(kv.v) + src * v_row, v_row);
            }
        }
    }
}

// Counts one speculative step: `drafted` proposals verified, `accepted` of them kept out of a
// block of q. Times are taken at the step's start, after drafting, after verifying and after
// rolling back; appending the committed context to the drafter (until now) counts as drafting.
void record_spec_step(luce_generate_stats &st, int drafted, int accepted, int q, double t_start,
                      double t_drafted, double t_verified, double t_rolled) {
    ++st.spec_steps;
    st.n_drafted += drafted;
    st.n_accepted += accepted;
    st.full_accept_steps += (accepted == q);
    st.zero_accept_steps += (accepted == 0);
    st.max_accepted = std::max(st.max_accepted, accepted);
    st.draft_seconds += (t_drafted - t_start) + (now_seconds() - t_rolled);
    st.verify_seconds += t_verified - t_drafted;
    st.rollback_seconds += t_rolled - t_verified;
}

// What the policy measured, and the speed achieved against its plain step.
void record_policy(luce_generate_stats &st, const SpecPolicy &policy) {
    st.block_size = policy.width();
    st.block_auto = policy.min_width() < policy.max_width();
    for (int w = 2; w <= std::min(policy.max_width(), MAX_DRAFT_BLOCK); ++w) {
        st.width_seconds[w] = policy.measured_seconds(w);
        st.width_model_seconds[w] = policy.step_seconds(w);
        st.width_tokens[w] = policy.expected_tokens(w);
    }
    st.n_positions = std::min(policy.observed_positions(), MAX_DRAFT_BLOCK);
    for (int i = 0; i < st.n_positions; ++i) st.position_acceptance[i] = policy.acceptance(i + 1);
    st.plain_step_seconds = policy.plain_seconds();
    st.spec_step_seconds = policy.spec_seconds();
    st.step_cost_ratio = policy.ratio();
    st.expected_speedup = policy.gain();
    st.achieved_speedup = st.decode_seconds > 0 && st.n_generated > 1
                              ? policy.plain_seconds() * (st.n_generated - 1) / st.decode_seconds : 0.0;
}

// How many candidates each sampled proposal row keeps, ranked on the backend (0: whole rows come
// to the host): the sampler's top-k, at most PROPOSAL_TOP_K. Rejection sampling is exact whatever
// q the drafts are drawn from, so q may be the sampler's distribution over fewer candidates than p
// has. 32 because the backend's top-k costs a selection round per candidate (the GPU kernel, gpu
// drafter.cu select_k: a 256-candidate call is ~8x a 32-candidate one, and DSpark ranks its rows
// one at a time) while tau did not move between 32, 256 and whole rows (reference pair,
// docs/benchmarks.md); a whole row instead is a vocabulary of scores (1 MiB at 248k) to bring back
// and a softmax over it on the host.
constexpr int PROPOSAL_TOP_K = 32;
int proposal_top_k(const luce_generate_params &p, int n_vocab) {
    if (!(p.temperature > 0.f)) return 0;
    const int k = (p.top_k > 0 && p.top_k < PROPOSAL_TOP_K) ? p.top_k : PROPOSAL_TOP_K;
    return k < n_vocab ? k : 0;
}

}  // namespace

// One generate_speculative call, or one sequence of a batch (SpecSequence): every buffer sized once
// up front, then prefill, and a loop of plain, chain or tree steps. Where each piece of data lives:
//   backend memory: the drafter context and heads scratch, taps [prefill_step][N][E] (captured device
//   to device by forward_step), the drafter's hidden rows [B][E], DDTree's unary logits [q][V];
//   host: greedy, the verify rows' argmax ids (reduced on the device, only the ids come back);
//   sampled, the verify rows' top-k candidates, or each row acceptance reaches (acceptance needs
//   the distributions); the proposals, and the copy
//   of DDTree's unary logits the host tree builder reads.
struct SpecLoop {
    Session &s;
    Drafter &d;
    const luce_generate_params &p;
    luce_token_callback callback;
    void *user_data;
    int32_t *out_tokens;
    Backend &be;
    const bool sampled;
    const int B, q_max, cap_from, V, E, N, budget, W;
    // Block drafters (DFlash, DFlash 2, DSpark): their context and heads; MTP: its context
    // (mtp.h). One or the other is null.
    std::unique_ptr<DraftContext> ctx;
    std::unique_ptr<DraftHeads> heads;
    std::unique_ptr<MtpContext> mtp;
    Checkpoints ckpt;
    BackendBuffers dev;
    float *taps, *hidden, *row_logits;
    float *pending;     // [PENDING_ROWS][N][E]: taps of plain steps not yet in the drafter context
    int32_t pending_tokens[PENDING_ROWS];  // the tokens those steps ran (the MTP pairs them with the taps)
    int n_pending = 0;
    int n_logged = 0;  // ints written to p.draft_log
    int32_t *dev_ids;  // greedy: the argmax of each target row, in backend memory
    std::vector<float> logit_row, conf, tree_U;
    const float *verify_rows = nullptr;  // sampled without a top-k: the last run_target's logit rows
                                         // (backend memory), each brought to the host when reached
    std::vector<Distribution> q_dists;  // sampled: each proposal row's q
    Distribution p_dist;                // sampled: the target's p at the row accept is at
    std::vector<int32_t> block, tokens, row_ids, tree_pos, tree_slot, tree_parent, path, chain_rows;
    std::vector<uint8_t> tree_mask;
    HiddenCapture capture;
    SamplerParams sampler;  // the target's distribution (sampled runs)
    Ranking ranking;
    TopKRows top_k;        // backend_top_k: each verify row's k candidates come back, not the row
    TopKRows draft_top_k;  // the drafter's proposal rows' candidates (sampled DFlash, DSpark)
    Rng rng;
    ChainSampling chain_sampling;
    SpecPolicy policy;
    luce_generate_stats st{};
    luce_status status = LUCE_OK;
    // The step in flight (begin_step .. end_step): plain or chain, its proposals, where the sequence
    // stood and when it started and finished drafting.
    bool step_spec = false;
    int step_q = 0, step_start = 0;
    double step_t0 = 0, step_t_drafted = 0;

    // batch_taps: a batch's sequence, whose taps buffer ([prefill_step][N][E]: its prompt's chunks;
    // its steps' taps come with end_step) is the batch's, and whose verify history rows the batch
    // lends (Checkpoints::lend). Sequences are prefilled one at a time, so one buffer serves all.
    SpecLoop(Session &s_, Drafter &d_, int n_prompt, const luce_generate_params &p_, luce_token_callback cb, void *ud,
             int32_t *out, float *batch_taps = nullptr)
        : s(s_), d(d_), p(p_), callback(cb), user_data(ud), out_tokens(out), be(*s_.model->backend),
          sampled(p_.temperature > 0.f), B(block_rows(d_, p_)), q_max(d_.proposals(B)),
          cap_from(p_.verify_cap_from == 0 ? DEFAULT_VERIFY_CAP_FROM : p_.verify_cap_from), V(s_.model->hp.n_vocab),
          E(d_.hp.n_embd), N(d_.n_taps()), budget(p_.ddtree_budget ? p_.ddtree_budget : DEFAULT_DDTREE_BUDGET),
          W(p_.ddtree ? std::max(q_max, budget) + 1 : q_max + 1),  // most rows one verify runs
          ckpt(s_, W, batch_taps == nullptr), dev(be),
          sampler{p_.temperature, p_.top_k, p_.top_p},
          top_k(be, W, backend_top_k(p_, V)), draft_top_k(be, q_max, proposal_top_k(p_, V)), rng(p_.seed),
          chain_sampling{sampler, &rng, nullptr, &draft_top_k}, policy(make_policy(d_, p_, B)) {
        const int cap = n_prompt + p.max_tokens + W + B + 1;
        if (d.hp.kind == DRAFT_MTP) {
            mtp = std::make_unique<MtpContext>(*s.model, cap);
        } else {
            ctx = std::make_unique<DraftContext>(d, cap);
            heads = std::make_unique<DraftHeads>(d, q_max);
        }
        taps = batch_taps ? batch_taps : dev.array<float>(size_t(s.prefill_step) * N * E);
        hidden = dev.array<float>(size_t(B) * E);
        pending = dev.array<float>(size_t(PENDING_ROWS) * N * E);
        row_logits = p.ddtree ? dev.array<float>(size_t(q_max) * V) : nullptr;
        dev_ids = dev.array<int32_t>(size_t(MAX_STEP));
        row_ids.resize(size_t(MAX_STEP));
        logit_row.resize(sampled && !top_k.k() ? size_t(V) : 0);
        q_dists.resize(sampled ? size_t(q_max) : 0);
        conf.resize(size_t(B));
        block.assign(size_t(B), d.hp.mask_token_id);
        tokens.resize(size_t(W) + 1);  // anchor, up to W - 1 proposals, then the bonus after a full accept
        for (auto *v : {&tree_pos, &tree_slot, &tree_parent}) v->resize(size_t(W));
        tree_mask.resize(p.ddtree ? size_t(W) * size_t(s.n_ctx) : 0);
        tree_U.resize(p.ddtree ? size_t(q_max) * V : 0);
        chain_rows.resize(size_t(W));
        std::iota(chain_rows.begin(), chain_rows.end(), 0);
        capture = HiddenCapture{d.hp.target_layer_ids.data(), N, taps, true};
        chain_sampling.q_out = sampled ? q_dists.data() : nullptr;
        st.n_prompt = n_prompt;
        st.block_size = B;
    }
    // Step graphs recorded during the run point into its taps and checkpoints (forward.cpp,
    // graph_key), which go with it.
    ~SpecLoop() { be.graph_clear(); }
    SpecLoop(const SpecLoop &) = delete;
    SpecLoop &operator=(const SpecLoop &) = delete;

    // The target over toks (T rows, taps captured); what each row r >= row0 says next is then
    // row_ids[r - row0] (greedy: argmax on the backend, so a GPU step downloads indices, not
    // (T - row0) vocabulary rows), or (sampled) the rows' top-k candidates in top_k, or
    // without a top-k the rows in verify_rows, left where they are until acceptance reaches
    // one (most of a step's rows past the first rejection are never read).
    void run_target(const int32_t *toks, int T, int row0) {
        read_rows(forward_step_rows(s, toks, T, row0, &capture), T - row0);
    }
    void read_rows(const float *rows, int n) {
        if (sampled && !top_k.k()) {
            verify_rows = rows;
            return;
        }
        if (sampled) {
            top_k.fetch(rows, n, V);
            return;
        }
        be.argmax_rows(rows, n, V, dev_ids);
        be.download(row_ids.data(), dev_ids, sizeof(int32_t) * size_t(n));
    }
    // The target's distribution after row r of the last run_target (sampled), into p_dist: over
    // the row's backend top-k candidates where there are some, else over the whole row.
    void target_row_probs(int r) {
        if (!top_k.k()) {
            be.download(logit_row.data(), verify_rows + size_t(r) * V, sizeof(float) * size_t(V));
            return target_probs(logit_row.data(), V, sampler, ranking, p_dist);
        }
        target_probs_ranked(top_k.ids(r), top_k.values(r), top_k.k(), sampler, p_dist);
    }
    // The next token after row r of the last run_target.
    int32_t choose(int r) {
        if (!sampled) return row_ids[size_t(r)];
        target_row_probs(r);
        return draw(p_dist, rng);
    }
    bool is_stop(int32_t id) const {
        return !p.ignore_eos && std::find(p.stop_ids, p.stop_ids + p.n_stop_ids, id) != p.stop_ids + p.n_stop_ids;
    }
    // Appends committed tokens to the output; false when generation ends (stop id, budget, callback).
    bool emit(const int32_t *toks, int n) {
        int m = 0;
        while (m < n && st.n_generated < p.max_tokens && !is_stop(toks[m])) out_tokens[st.n_generated++] = toks[m++];
        if (m < n && is_stop(toks[m])) st.stopped_by_eos = 1;
        if (m > 0 && callback && callback(user_data, toks, m) != 0) {
            status = LUCE_ERR_CANCELLED;
            return false;
        }
        return m == n && st.n_generated < p.max_tokens;
    }

    // Prefill in chunks, capturing taps for the drafter context; returns the first token.
    int32_t prefill(const int32_t *prompt, int n_prompt) {
        {
            const PrefillScope scope(be);
            for (int c0 = 0, T = 0; c0 < n_prompt; c0 += T) {
                T = prefill_chunk(s, c0, n_prompt, n_prompt - 1);
                run_target(prompt + c0, T, T - 1);
                append_context(prompt + c0, taps, T);
            }
        }
        return p.max_tokens > 0 ? choose(0) : -1;
    }

    // A plain step's end (one token, features still captured: the policy's plain steps, and the last
    // token of the budget), its row read.
    bool finish_plain(int32_t &anchor, const float *step_taps) {
        const int32_t ran = anchor;
        anchor = choose(0);
        ++st.plain_steps;
        policy.after_plain(now_seconds() - step_t0);
        defer_context(ran, step_taps);  // after the sample: a full buffer's append belongs to drafting
        return emit(&anchor, 1);
    }

    // A plain step's taps wait in `pending` and join the drafter context in one append before the
    // next draft: while plain decoding wins, a context projection per token would make every plain
    // step pay for a drafter that does not run, and one append of many rows reads the drafter's
    // weights once. Output is unchanged: only the drafter's proposals read the context.
    void defer_context(int32_t token, const float *token_taps) {
        const size_t row = size_t(N) * E;
        be.copy(pending + size_t(n_pending) * row, token_taps, row * sizeof(float));
        pending_tokens[n_pending] = token;
        if (++n_pending == PENDING_ROWS) flush_context();
    }
    void flush_context() {
        if (n_pending) append_context(pending_tokens, pending, n_pending);
        n_pending = 0;
    }
    // n committed positions join the drafter's context: the tokens the target ran there and its
    // taps [n][N][E] (backend memory).
    void append_context(const int32_t *toks, const float *rows, int n) {
        if (mtp) mtp_append(*mtp, toks, rows, int64_t(N) * E, n);
        else draft_append_context(d, *ctx, rows, n);
    }

    // The draft_log test hook: q, then the step's proposals tokens[1..q], while they fit.
    void log_drafts(int q) {
        if (!p.draft_log || n_logged + q + 1 > p.draft_log_capacity) return;
        p.draft_log[n_logged++] = q;
        for (int i = 1; i <= q; ++i) p.draft_log[n_logged++] = tokens[size_t(i)];
    }

    // Acceptance of a chain verify (rule in the file header); returns n and sets the bonus.
    int accept(int q, int32_t &bonus) {
        int n = 0;
        bonus = -1;
        if (!sampled) {
            while (n < q && tokens[size_t(n + 1)] == row_ids[size_t(n)]) ++n;
            bonus = row_ids[size_t(n)];
            return n;
        }
        for (; n < q; ++n) {
            const int32_t dt = tokens[size_t(n + 1)];
            const Distribution &qi = q_dists[size_t(n)];
            target_row_probs(n);
            if (rng.uniform() * qi.at(dt) < p_dist.at(dt)) continue;  // u < p/q
            if (subtract(p_dist, qi) <= 0.0) target_row_probs(n);  // no residual mass: p itself
            bonus = draw(p_dist, rng);
            return n;
        }
        bonus = choose(q);
        return n;
    }

    // Draft a chain of q proposals into tokens[1..q]; returns q, fewer where DSpark's confidence
    // gate cuts the chain.
    int propose(int32_t anchor, int q) {
        const int row0 = d.hp.sample_from_anchor ? 0 : 1;
        if (mtp)
            mtp_draft(*mtp, anchor, q, tokens.data() + 1, sampled ? &chain_sampling : nullptr);
        else
            draft_chain(d, *heads, hidden + size_t(row0) * E, q, anchor, tokens.data() + 1, conf.data(),
                        sampled ? &chain_sampling : nullptr);
        for (int i = 1; i <= q; ++i) {  // test hook: proposals from a known continuation
            const int g = st.n_generated - 1 + i;  // generated index of draft i (the anchor is g - i)
            if (g < p.n_oracle_tokens) tokens[size_t(i)] = p.oracle_tokens[g];
        }
        if (p.dspark_confidence_threshold > 0.f && d.hp.confidence_dim > 0)
            for (int i = 0; i < q; ++i)
                if (conf[size_t(i)] < p.dspark_confidence_threshold) {
                    q = i;
                    break;
                }
        log_drafts(q);
        step_t_drafted = now_seconds();
        return q;
    }

    // After the target verified [anchor, d_1..d_q] (rows read): accept, roll back, commit.
    bool finish_chain(int32_t &anchor, int q, const float *step_taps) {
        const double t_verified = now_seconds();
        int32_t bonus;
        const int n = accept(q, bonus);
        // Commit n+1 positions; the recurrent state cannot be trimmed, so it is restored from the
        // verify's per-row checkpoints (attention only needs n_past lowered).
        if (n + 1 < q + 1) ckpt.restore(step_start, chain_rows.data(), n + 1);
        const double t_rolled = now_seconds();
        append_context(tokens.data(), step_taps, n + 1);
        record_spec_step(st, q, n, q, step_t0, step_t_drafted, t_verified, t_rolled);
        policy.after_spec(q, n, now_seconds() - step_t0);
        tokens[size_t(n + 1)] = bonus;
        anchor = bonus;
        return emit(tokens.data() + 1, n + 1);
    }

    // Tree: build, verify all nodes at once (ancestor-only attention, DeltaNet from each node's
    // parent), follow the target's argmax down the tree, commit that path.
    bool tree_step(int32_t &anchor, int q, double t0) {
        const int start = s.n_past, row0 = d.hp.sample_from_anchor ? 0 : 1;
        draft_unary_logits(d, hidden + size_t(row0) * E, q, row_logits);
        // The tree is built on the host (best-first over candidate lists), from a copy of U.
        be.download(tree_U.data(), row_logits, size_t(q) * V * sizeof(float));
        // Nodes occupy cache slots start .. start+budget: stay inside the session's context.
        const int room = std::min(budget, s.n_ctx - start - 1);
        std::vector<TreeNode> nodes = build_tree(d, *heads, tree_U.data(), hidden + size_t(row0) * E, q, anchor, room);
        const int T = int(nodes.size());
        // Test hook: the oracle continuation goes on the tree's first-child chain.
        for (int cur = 0, depth = 1; depth <= q; ++depth) {
            int child = -1;
            for (int c = cur + 1; c < T && child < 0; ++c)
                if (nodes[size_t(c)].parent == cur) child = c;
            const int g = st.n_generated - 1 + depth;
            if (child < 0 || g >= p.n_oracle_tokens) break;
            nodes[size_t(child)].token = p.oracle_tokens[g];
            cur = child;
        }
        std::fill(tree_mask.begin(), tree_mask.begin() + size_t(T) * s.n_ctx, 0);
        for (int t = 0; t < T; ++t) {
            tokens[size_t(t)] = nodes[size_t(t)].token;
            tree_pos[size_t(t)] = start + nodes[size_t(t)].depth;
            tree_slot[size_t(t)] = start + t;
            tree_parent[size_t(t)] = nodes[size_t(t)].parent;
            uint8_t *m = tree_mask.data() + size_t(t) * s.n_ctx;
            std::fill(m, m + start, 1);
            for (int a = t; a >= 0; a = nodes[size_t(a)].parent) m[start + a] = 1;
        }
        const double t_drafted = now_seconds();
        const TreeStep tree{tree_pos.data(), tree_slot.data(), tree_parent.data(), tree_mask.data()};
        ckpt.attach();
        s.tree = &tree;
        run_target(tokens.data(), T, 0);
        s.tree = nullptr;
        ckpt.detach();
        const double t_verified = now_seconds();
        // From the root down: the target's next token after each node (its argmax, or sampled
        // from its distribution) is followed while a child holds it; the first that none does
        // is the bonus. Every committed token is thus what plain decoding would have drawn at
        // its position, one draw per token, the tree only deciding how many come from one verify.
        path.assign(1, 0);
        int32_t bonus = -1;
        for (int cur = 0; bonus < 0;) {
            const int32_t want = choose(cur);
            int child = -1;
            for (int c = cur + 1; c < T && child < 0; ++c)
                if (nodes[size_t(c)].parent == cur && nodes[size_t(c)].token == want) child = c;
            if (child < 0) bonus = want;
            else path.push_back(cur = child);
        }
        const int n = int(path.size()) - 1;
        compact_kv(s, start, path);
        ckpt.restore(start, path.data(), n + 1);
        const size_t tap_row = size_t(N) * E;
        for (int i = 0; i <= n; ++i)  // the path's taps, in order (path[i] >= i: in place)
            if (path[size_t(i)] != i)
                be.copy(taps + size_t(i) * tap_row, taps + size_t(path[size_t(i)]) * tap_row, tap_row * sizeof(float));
        const double t_rolled = now_seconds();
        for (int i = 1; i <= n; ++i) tokens[size_t(i)] = nodes[size_t(path[size_t(i)])].token;
        append_context(tokens.data(), taps, n + 1);
        record_spec_step(st, T - 1, n, q, t0, t_drafted, t_verified, t_rolled);
        policy.after_spec(q, n, now_seconds() - t0);
        tokens[size_t(n + 1)] = bonus;
        anchor = bonus;
        return emit(tokens.data() + 1, n + 1);
    }

    // The proposals a step at the anchor's position verifies: 0 for a plain step (nothing can be
    // drafted, or the policy says so), else q after the drafter's block forward of the policy's width.
    int plan(int32_t anchor) {
        const int remaining = p.max_tokens - st.n_generated, w = policy.next_width();
        int q = std::min(d.proposals(w), remaining - 1);
        if (cap_from > 0 && s.n_past >= cap_from) q = std::min(q, std::max(VERIFY_CAP_MIN, B / 2) - 1);
        step_t0 = now_seconds();
        step_start = s.n_past;
        if (w == 0 || q <= 0) return 0;
        // Charged to this step: plain decoding alone would never append the deferred rows, so
        // catching up is part of what speculating costs (a probe after many plain steps pays most).
        flush_context();
        if (!mtp) {  // the block drafters' one forward; the MTP drafts row by row in propose
            block[0] = anchor;
            draft_forward(d, *ctx, block.data(), w, hidden);
        }
        return q;
    }

    // A plain or chain step up to its verify: tokens[0..rows) for the target (the anchor, then the
    // chain's proposals). Returns rows; a chain's checkpoints are the caller's to attach.
    int begin_step(int32_t anchor) {
        const int q = plan(anchor);
        tokens[0] = anchor;
        step_spec = q > 0;
        step_q = step_spec ? propose(anchor, q) : 0;
        return step_q + 1;
    }

    // The rest of a begin_step's step, once the target has run its rows in this session's state
    // (n_past advanced past them): logit rows [rows][V] and their taps [rows][N][E], backend memory;
    // greedy_ids, when not null, the rows' argmax ids already on the host.
    bool end_step(int32_t &anchor, const float *rows, const float *step_taps, const int32_t *greedy_ids = nullptr) {
        ckpt.detach();
        if (greedy_ids && !sampled) std::copy(greedy_ids, greedy_ids + step_q + 1, row_ids.begin());
        else read_rows(rows, step_q + 1);
        return step_spec ? finish_chain(anchor, step_q, step_taps) : finish_plain(anchor, step_taps);
    }

    // One step at the anchor's position: plain, or a block verified as a chain or a tree.
    bool step(int32_t &anchor) {
        if (p.ddtree) {
            const int q = plan(anchor);
            if (q > 0) return tree_step(anchor, q, step_t0);
            step_spec = false;
            step_q = 0;
            tokens[0] = anchor;
        } else {
            begin_step(anchor);
            if (step_spec) ckpt.attach();
        }
        const float *rows = forward_step_rows(s, tokens.data(), step_q + 1, 0, &capture);
        return end_step(anchor, rows, taps);
    }

    // The run's summary stats, at its end.
    void close_stats(double decode_seconds) {
        st.decode_seconds = decode_seconds;
        st.tau = st.spec_steps ? double(st.n_accepted + st.spec_steps) / st.spec_steps : 0.0;
        st.acceptance = st.n_drafted ? double(st.n_accepted) / st.n_drafted : 0.0;
        record_policy(st, policy);
    }
};

void check_speculative_request(const Session &s, const Drafter &d, const luce_generate_params &p) {
    if (d.target != s.model) fail(LUCE_ERR_INVALID_ARGUMENT, "the drafter is bound to another target model");
    if (p.ddtree && d.hp.kind == DRAFT_MTP)
        fail(LUCE_ERR_UNSUPPORTED, "DDTree needs a block drafter's proposal rows; MTP drafting is a chain (drop --ddtree)");
    if (p.ddtree && !s.model->backend->tree_mode())
        fail(LUCE_ERR_UNSUPPORTED, "DDTree tree verification needs tree-mode DeltaNet, which the %s backend does not "
             "have yet; use chain drafting (no --ddtree) or --device cpu", s.model->backend->name());
    if (p.ddtree && (p.ddtree_budget < 0 || p.ddtree_budget > MAX_STEP - 1))
        fail(LUCE_ERR_INVALID_ARGUMENT, "--ddtree-budget must be in 1..%d; got %d", MAX_STEP - 1, p.ddtree_budget);
    if (!(p.dspark_confidence_threshold >= 0.f && p.dspark_confidence_threshold < 1.f))
        fail(LUCE_ERR_INVALID_ARGUMENT, "the DSpark confidence threshold must be in [0, 1)");
    if (p.n_oracle_tokens < 0 || (p.n_oracle_tokens > 0 && (!p.oracle_tokens || p.temperature > 0.f)))
        fail(LUCE_ERR_INVALID_ARGUMENT, "oracle tokens need a token list and greedy decoding");
    for (int i = 0; i < p.n_oracle_tokens; ++i)
        if (p.oracle_tokens[i] < 0 || p.oracle_tokens[i] >= s.model->hp.n_vocab)
            fail(LUCE_ERR_INVALID_ARGUMENT, "oracle token %d is out of range", p.oracle_tokens[i]);
    block_rows(d, p);  // the block size's range is the drafter's
}

luce_status generate_speculative(Session &s, Drafter &d, const int32_t *prompt, int n_prompt,
                                 const luce_generate_params &p, luce_token_callback callback, void *user_data,
                                 int32_t *out_tokens, int out_capacity, luce_generate_stats *stats) {
    check_generate_request(s, prompt, n_prompt, p, out_tokens, out_capacity);
    // The drafter's context must hold the features of every committed position, so the whole
    // sequence has to go through this loop.
    if (s.n_past != 0)
        fail(LUCE_ERR_INVALID_ARGUMENT, "speculative decoding needs an empty session (%d positions are used)", s.n_past);
    check_speculative_request(s, d, p);

    SpecLoop run(s, d, n_prompt, p, callback, user_data, out_tokens);
    const double t0 = now_seconds();
    int32_t anchor = run.prefill(prompt, n_prompt);
    const double t1 = now_seconds();
    run.st.prefill_seconds = t1 - t0;
    bool going = p.max_tokens > 0 && run.emit(&anchor, 1);
    while (going) going = run.step(anchor);
    run.close_stats(now_seconds() - t1);
    if (stats) *stats = run.st;
    if (run.status == LUCE_ERR_CANCELLED) set_last_error("generation stopped by the token callback");
    return run.status;
}

SpecSequence::SpecSequence(Session &s, Drafter &d, int n_prompt, const luce_generate_params &p, int32_t *out_tokens,
                           float *batch_taps)
    : loop_(std::make_unique<SpecLoop>(s, d, n_prompt, p, nullptr, nullptr, out_tokens, batch_taps)) {}

SpecSequence::~SpecSequence() = default;

bool SpecSequence::start(const int32_t *prompt, int n_prompt) {
    SpecLoop &run = *loop_;
    const double t0 = now_seconds();
    anchor_ = run.prefill(prompt, n_prompt);
    decode_start_ = now_seconds();
    run.st.prefill_seconds = decode_start_ - t0;
    return run.p.max_tokens > 0 && run.emit(&anchor_, 1);
}

int SpecSequence::begin_step() { return loop_->begin_step(anchor_); }

const int32_t *SpecSequence::step_tokens() const { return loop_->tokens.data(); }

void SpecSequence::attach_checkpoints(const CheckpointRows &shared, int row0) {
    if (!loop_->step_spec) return;  // a plain step keeps no history
    loop_->ckpt.lend(shared, row0);
    loop_->ckpt.attach();
}

bool SpecSequence::end_step(const float *rows, const float *taps, const int32_t *greedy_ids) {
    return loop_->end_step(anchor_, rows, taps, greedy_ids);
}

bool SpecSequence::greedy() const { return !loop_->sampled; }

const luce_generate_stats &SpecSequence::finish() {
    loop_->close_stats(now_seconds() - decode_start_);
    return loop_->st;
}

}  // namespace luce
