// drafter_heads.cpp — from final-normed drafter rows to a candidate chain (spec drafters.md
// §1.6, §2.2, §3.2-§3.3; engine.md §4.4). U_t = target_head(h_t) [V] are the unary logits;
// for DFlash 2 transformed first: U_t = tanh(target_head(h_t)*m / cap)*cap (or *m without a cap).
//   DFlash:   token_t = argmax U_t.
//   DFlash 2: C_t = top-k of U_t (value desc, id asc); walk from prev = anchor:
//             S_t(b) = U_t(b) + < pred_cb[prev] * hproj(h_t), succ_cb[b] >,  b in C_t;
//             token_t = argmax S_t (ties -> smaller id); prev = token_t.
//   DSpark:   logits_t = U_t + W2 W1[prev];  token_t = argmax;  prev = token_t;
//             confidence c_t = sigmoid(w . [h_t ; W1[prev_t]] + b)  (or w . h_t + b when C = E),
//             computed with prev_t (before token_t is known).
// Sampled chains (temperature T > 0) draw token_t ~ q_t = the target sampler's distribution over
// the same candidate scores (softmax(scores_t / T) within its top-k and nucleus; DFlash 2: among
// the selector's k candidates, zero elsewhere) and report q_t for verification.
//
// Where the host takes part (everything else is Backend ops on backend memory, DraftHeads):
//   DFlash greedy: argmax_rows on the device, n ids come back. DSpark greedy: each row's argmax
//   is written to device memory and gathered as the next row's W1[prev], so the chain runs without
//   a host round trip; the n ids and confidences come back at the end. DFlash 2: the device
//   computes every row's top-k candidates and the pair terms <pred[a] * hproj_t, succ[b]> for all
//   a in C_{t-1} (the possible predecessors; the anchor for t = 0) and b in C_t; the walk itself,
//   a choice among k values per row, runs on the host over those n x k x k floats.
//   Sampled chains (T > 0) bring each row's candidates to the host, where q_t is needed for
//   rejection sampling anyway: DFlash and DSpark rows are ranked on the backend and only their k
//   best come back (ChainSampling::top_k; the speculative loop's proposal_top_k), DFlash 2's are
//   the selector's candidates already.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "drafter.h"
#include "errors.h"
#include "generate.h"
#include "sampling.h"

namespace luce {

namespace {

// A sampled proposal: q = the target sampler's distribution over candidate scores; one id drawn
// from it. From a whole host row of scores:
int32_t propose(const float *scores, int V, const ChainSampling &smp, Distribution &q) {
    thread_local Ranking ranking;
    target_probs(scores, V, smp.params, ranking, q);
    return draw(q, *smp.rng);
}

// From k candidates already ranked (best first, ties to the lower id) with their scores.
int32_t propose_ranked(const int32_t *ids, const float *scores, int k, const ChainSampling &smp, Distribution &q) {
    target_probs_ranked(ids, scores, k, smp.params, q);
    return draw(q, *smp.rng);
}

// Sampled proposals for n rows of backend scores U [n][V] into tokens[n], their q into
// smp.q_out[q_row0 ..]: all n ranked on the backend in one call where smp.top_k asks for it, else
// each row downloaded whole.
void propose_rows(DraftHeads &hd, const float *U, int n, int q_row0, const ChainSampling &smp, int32_t *tokens) {
    const int V = hd.V;
    TopKRows *top = smp.top_k && smp.top_k->k() ? smp.top_k : nullptr;
    if (top) top->fetch(U, n, V);
    for (int t = 0; t < n; ++t) {
        Distribution &q = smp.q_out[q_row0 + t];
        if (top) {
            tokens[t] = propose_ranked(top->ids(t), top->values(t), top->k(), smp, q);
            continue;
        }
        hd.be.download(hd.h_row.data(), U + int64_t(t) * V, sizeof(float) * size_t(V));
        tokens[t] = propose(hd.h_row.data(), V, smp, q);
    }
}

void dflash_chain(DraftHeads &hd, int n_rows, int32_t *tokens, const ChainSampling *smp) {
    if (smp) return propose_rows(hd, hd.U, n_rows, 0, *smp, tokens);
    hd.be.argmax_rows(hd.U, n_rows, hd.V, hd.tok);
    hd.be.download(tokens, hd.tok, sizeof(int32_t) * size_t(n_rows));
}

// Indices 0..k-1 of candidates (ids, scores) in rank order: score descending, ties to the lower id.
void rank_candidates(const int32_t *ids, const float *scores, int k, std::vector<int32_t> &order) {
    order.resize(size_t(k));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return scores[a] > scores[b] || (scores[a] == scores[b] && ids[a] < ids[b]);
    });
}

void selector_chain(const Drafter &d, DraftHeads &hd, const float *hidden, int n_rows, int32_t anchor,
                    int32_t *tokens, const ChainSampling *smp) {
    Backend &be = hd.be;
    const int V = hd.V, R = hd.R, k = hd.k;
    const int64_t nk = int64_t(n_rows) * k;
    int32_t *cand = hd.ids, *prev_ids = hd.ids + int64_t(hd.rows) * k;
    be.topk_rows(hd.U, n_rows, V, k, cand, hd.vals);
    be.matmul(d.sel_hproj, hidden, n_rows, hd.hproj, R);
    be.get_rows(d.sel_succ, cand, int(nk), hd.succ);
    // Predecessor candidates of row t: the anchor for t = 0 (k copies; only the first is read),
    // C_{t-1} after.
    std::fill(hd.h_ids.begin(), hd.h_ids.begin() + k, anchor);
    be.upload(prev_ids, hd.h_ids.data(), sizeof(int32_t) * size_t(k));
    be.copy(prev_ids + k, cand, sizeof(int32_t) * size_t(nk - k));
    be.get_rows(d.sel_pred, prev_ids, int(nk), hd.pred);
    be.selector_pairs(hd.hproj, hd.pred, hd.succ, n_rows, k, R, hd.pairs);
    be.download(hd.h_ids.data(), cand, sizeof(int32_t) * size_t(nk));
    be.download(hd.h_vals.data(), hd.vals, sizeof(float) * size_t(nk));
    be.download(hd.h_pairs.data(), hd.pairs, sizeof(float) * size_t(nk) * size_t(k));
    std::vector<float> &scores = hd.h_row;  // [k]
    thread_local std::vector<int32_t> order, ranked_ids;
    thread_local std::vector<float> ranked_scores;
    ranked_ids.resize(size_t(k));
    ranked_scores.resize(size_t(k));
    int a = 0;  // index of the predecessor in its candidate row
    for (int t = 0; t < n_rows; ++t) {
        const int32_t *ids = hd.h_ids.data() + int64_t(t) * k;
        const float *U = hd.h_vals.data() + int64_t(t) * k, *pair = hd.h_pairs.data() + (int64_t(t) * k + a) * k;
        for (int b = 0; b < k; ++b) scores[size_t(b)] = U[b] + pair[b];
        int best = 0;
        if (smp) {
            rank_candidates(ids, scores.data(), k, order);
            for (int i = 0; i < k; ++i) {
                ranked_ids[size_t(i)] = ids[order[size_t(i)]];
                ranked_scores[size_t(i)] = scores[size_t(order[size_t(i)])];
            }
            const int32_t id = propose_ranked(ranked_ids.data(), ranked_scores.data(), k, *smp, smp->q_out[t]);
            while (ids[best] != id) ++best;
        } else {
            for (int b = 1; b < k; ++b)  // ties -> smaller id
                if (scores[size_t(b)] > scores[size_t(best)] ||
                    (scores[size_t(b)] == scores[size_t(best)] && ids[b] < ids[best]))
                    best = b;
        }
        tokens[t] = ids[best];
        a = best;
    }
}

void markov_chain(const Drafter &d, DraftHeads &hd, const float *hidden, int n_rows, int32_t anchor, int32_t *tokens,
                  float *confidence, const ChainSampling *smp) {
    Backend &be = hd.be;
    const int V = hd.V, R = hd.R, E = d.hp.n_embd;
    const bool gate = confidence && d.hp.confidence_dim > 0;
    be.upload(hd.tok, &anchor, sizeof anchor);
    for (int t = 0; t < n_rows; ++t) {
        float *U = hd.U + int64_t(t) * V;
        be.get_rows(d.markov_w1, hd.tok + t, 1, hd.e);  // e = W1[prev_t]
        if (gate)
            be.confidence(hidden + int64_t(t) * E, hd.e, d.conf_w.data(), d.conf_b, E,
                          d.hp.confidence_dim > E ? R : 0, hd.conf + t);
        be.matmul(d.markov_w2, hd.e, 1, hd.bias, V);
        be.add(U, hd.bias, V);
        if (!smp) {
            be.argmax_rows(U, 1, V, hd.tok + t + 1);
            continue;
        }
        int32_t id;
        propose_rows(hd, U, 1, t, *smp, &id);
        be.upload(hd.tok + t + 1, &id, sizeof id);
    }
    be.download(tokens, hd.tok + 1, sizeof(int32_t) * size_t(n_rows));
    if (gate) be.download(confidence, hd.conf, sizeof(float) * size_t(n_rows));
    else if (confidence) std::fill(confidence, confidence + n_rows, 1.0f);  // no confidence head: never gates
}

}  // namespace

void *DraftHeads::take(size_t n_bytes) {
    owned_.push_back(be.alloc(n_bytes + 64));  // + 64: no zero-sized requests
    return owned_.back();
}

DraftHeads::DraftHeads(const Drafter &d, int rows_) : be(*d.target->backend), rows(rows_) {
    V = d.target->hp.n_vocab;
    k = d.hp.selector_top_k;
    R = d.hp.selector_rank ? d.hp.selector_rank : d.hp.markov_rank;
    const size_t n = size_t(rows), F = sizeof(float), I = sizeof(int32_t), K = size_t(k);
    try {
        U = static_cast<float *>(take(n * size_t(V) * F));
        ids = static_cast<int32_t *>(take(2 * n * K * I));
        vals = static_cast<float *>(take(n * K * F));
        pred = static_cast<float *>(take(n * K * size_t(R) * F));
        succ = static_cast<float *>(take(n * K * size_t(R) * F));
        hproj = static_cast<float *>(take(n * size_t(R) * F));
        pairs = static_cast<float *>(take(n * K * K * F));
        tok = static_cast<int32_t *>(take((n + 1) * I));
        conf = static_cast<float *>(take(n * F));
        e = static_cast<float *>(take(size_t(R) * F));
        bias = static_cast<float *>(take(size_t(V) * F));
    } catch (...) {
        for (void *p : owned_) be.release(p);
        throw;
    }
    h_ids.resize(n * K + K);
    h_vals.resize(n * K);
    h_pairs.resize(n * K * K);
    h_row.resize(size_t(std::max(V, k)));
}

DraftHeads::~DraftHeads() {
    for (void *p : owned_) be.release(p);
}

void draft_unary_logits(const Drafter &d, const float *hidden, int n_rows, float *logits) {
    const Model &tm = *d.target;
    tm.backend->matmul(tm.output, hidden, n_rows, logits, tm.hp.n_vocab);
    if (d.hp.kind != DRAFT_DFLASH2) return;
    tm.backend->softcap(logits, int64_t(n_rows) * tm.hp.n_vocab, d.hp.output_multiplier,
                        d.hp.final_logit_softcapping);
}

void draft_chain(const Drafter &d, DraftHeads &hd, const float *hidden, int n_rows, int32_t anchor, int32_t *tokens,
                 float *confidence, const ChainSampling *smp) {
    const int V = hd.V;
    if (n_rows < 0 || n_rows > hd.rows)
        fail(LUCE_ERR_INVALID_ARGUMENT, "n_rows = %d must be in 0..%d", n_rows, hd.rows);
    if (anchor < 0 || anchor >= V)
        fail(LUCE_ERR_INVALID_ARGUMENT, "anchor token %d is out of range (vocabulary has %d tokens)", anchor, V);
    if (smp && !(smp->params.temperature > 0.f)) smp = nullptr;  // greedy: the heads take argmaxes
    if (smp && !(smp->rng && smp->q_out)) fail(LUCE_ERR_INVALID_ARGUMENT, "a sampled chain needs an RNG and q_out");
    if (n_rows == 0) return;
    draft_unary_logits(d, hidden, n_rows, hd.U);
    if (d.hp.kind == DRAFT_DSPARK) {
        markov_chain(d, hd, hidden, n_rows, anchor, tokens, confidence, smp);
        return;
    }
    if (confidence) std::fill(confidence, confidence + n_rows, 1.0f);
    if (d.hp.selector_rank) selector_chain(d, hd, hidden, n_rows, anchor, tokens, smp);
    else dflash_chain(hd, n_rows, tokens, smp);
}

namespace {

// The k best of scores[0..n) (ids: indices), best first, ties to the lower index (sampling.h's
// Ranking: a selection, not a sort of the vocabulary).
void best_k(const float *scores, int n, int k, std::vector<int32_t> &ids) {
    thread_local Ranking ranking;
    ranking.reset(scores, n);
    const int32_t *best = ranking.best(k);
    ids.assign(best, best + k);
}

// The log-softmax normaliser of candidate scores (every other token's score is -inf), summed in
// the order `by_token` (candidate positions by increasing token id): the -inf entries add exact
// zeros, so these are the same terms in the same order as a pass over the whole vocabulary.
float log_normaliser(const float *scores, const std::vector<int32_t> &by_token, float top) {
    double sum = 0.0;
    for (int32_t i : by_token) sum += std::exp(double(scores[i] - top));
    return top + float(std::log(sum));
}

// DFlash 2: the selector's top kk of U (cached per row), rescored with prev:
// sum_r pred[prev][r] hproj[r] succ[c][r]; every other token scores -inf.
int selector_candidates(const Drafter &d, DraftHeads &hd, const float *U_row, const float *hidden_row, int32_t prev,
                        int k, int32_t *ids, float *logp, RowCandidates &row) {
    Backend &be = hd.be;
    const int V = d.target->hp.n_vocab, R = d.hp.selector_rank, kk = d.hp.selector_top_k;
    if (!row.ready) {
        best_k(U_row, V, kk, row.ids);
        row.ready = true;
    }
    thread_local std::vector<int32_t> picked, order, ascending;
    thread_local std::vector<float> tmp, scores;
    picked.assign(1, prev);
    picked.insert(picked.end(), row.ids.begin(), row.ids.end());
    be.upload(hd.ids, picked.data(), size_t(kk + 1) * sizeof(int32_t));
    be.get_rows(d.sel_pred, hd.ids, 1, hd.pred);
    be.get_rows(d.sel_succ, hd.ids + 1, kk, hd.succ);
    be.matmul(d.sel_hproj, hidden_row, 1, hd.hproj, R);
    tmp.resize(size_t(R) * size_t(kk + 2));  // hproj | pred | succ rows
    be.download(tmp.data(), hd.hproj, size_t(R) * sizeof(float));
    be.download(tmp.data() + R, hd.pred, size_t(R) * sizeof(float));
    be.download(tmp.data() + 2 * R, hd.succ, size_t(kk) * size_t(R) * sizeof(float));
    scores.resize(size_t(kk));  // scores of the candidates, in row.ids order
    for (int i = 0; i < kk; ++i) {
        const float *e = tmp.data() + size_t(2 + i) * R;
        float dot = 0.f;
        for (int r = 0; r < R; ++r) dot += tmp[size_t(R + r)] * tmp[size_t(r)] * e[r];
        scores[size_t(i)] = U_row[row.ids[size_t(i)]] + dot;
    }
    // Best k by (score, lower token id), as over the whole vocabulary.
    k = std::min(k, kk);
    order.resize(size_t(kk));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        const int32_t ta = row.ids[size_t(a)], tb = row.ids[size_t(b)];
        return scores[size_t(a)] > scores[size_t(b)] || (scores[size_t(a)] == scores[size_t(b)] && ta < tb);
    });
    ascending.resize(size_t(kk));
    std::iota(ascending.begin(), ascending.end(), 0);
    std::sort(ascending.begin(), ascending.end(),
              [&](int32_t a, int32_t b) { return row.ids[size_t(a)] < row.ids[size_t(b)]; });
    const float lse = log_normaliser(scores.data(), ascending, scores[size_t(order[0])]);
    for (int i = 0; i < k; ++i) {
        ids[i] = row.ids[size_t(order[size_t(i)])];
        logp[i] = scores[size_t(order[size_t(i)])] - lse;
    }
    return k;
}

// log-softmax over the whole vocabulary of scores [V]: the k best, best first.
int vocab_candidates(const float *scores, int V, int k, int32_t *ids, float *logp) {
    thread_local std::vector<int32_t> order;
    k = std::min(k, V);
    best_k(scores, V, k, order);
    const float top = scores[order[0]];
    double sum = 0.0;
    for (int i = 0; i < V; ++i) sum += std::exp(double(scores[i] - top));
    const float lse = top + float(std::log(sum));
    for (int i = 0; i < k; ++i) {
        ids[i] = order[size_t(i)];
        logp[i] = scores[order[size_t(i)]] - lse;
    }
    return k;
}

}  // namespace

int draft_candidates(const Drafter &d, DraftHeads &hd, const float *U_row, const float *hidden_row, int32_t prev,
                     int k, int32_t *ids, float *logp, RowCandidates &row) {
    Backend &be = hd.be;
    const int V = d.target->hp.n_vocab;
    if (d.hp.kind == DRAFT_DSPARK) {  // U + W2 W1[prev], the bias formed in backend memory
        thread_local std::vector<float> scores;
        scores.resize(size_t(V));
        be.upload(hd.tok, &prev, sizeof prev);
        be.get_rows(d.markov_w1, hd.tok, 1, hd.e);
        be.matmul(d.markov_w2, hd.e, 1, hd.bias, V);
        be.download(scores.data(), hd.bias, size_t(V) * sizeof(float));
        for (int i = 0; i < V; ++i) scores[size_t(i)] += U_row[i];
        return vocab_candidates(scores.data(), V, k, ids, logp);
    }
    if (d.hp.selector_rank) return selector_candidates(d, hd, U_row, hidden_row, prev, k, ids, logp, row);
    // DFlash: prev does not enter, every node of the row gets the same candidates.
    if (!row.ready || int(row.ids.size()) < std::min(k, V)) {
        row.ids.resize(size_t(std::min(k, V)));
        row.logp.resize(row.ids.size());
        vocab_candidates(U_row, V, k, row.ids.data(), row.logp.data());
        row.ready = true;
    }
    k = std::min(k, int(row.ids.size()));
    std::copy(row.ids.begin(), row.ids.begin() + k, ids);
    std::copy(row.logp.begin(), row.logp.begin() + k, logp);
    return k;
}

}  // namespace luce
