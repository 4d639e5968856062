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
// Sampled chains (temperature T > 0) draw token_t ~ q_t = softmax(scores_t / T) over the same
// candidate set (DFlash 2: the k candidates, zero elsewhere) and report q_t for verification.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "drafter.h"
#include "errors.h"

namespace luce {

namespace {

int32_t argmax_row(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return best;
}

// q = softmax(scores / T) over ids (n of them), scattered into a zeroed q_row [V]; draws one id.
int32_t sample_softmax(const float *scores, const int32_t *ids, int n, float T, Rng &rng, float *q_row, int V) {
    float top = *std::max_element(scores, scores + n);
    thread_local std::vector<double> p;  // scratch that only grows: no allocation per step
    p.resize(size_t(n));
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += (p[size_t(i)] = std::exp(double(scores[i] - top) / T));
    if (q_row) {
        std::fill(q_row, q_row + V, 0.f);
        for (int i = 0; i < n; ++i) q_row[ids ? ids[i] : i] = float(p[size_t(i)] / sum);
    }
    double u = rng.uniform() * sum;
    for (int i = 0; i < n; ++i) {
        u -= p[size_t(i)];
        if (u < 0.0) return ids ? ids[i] : i;
    }
    return ids ? ids[n - 1] : n - 1;
}

void selector_chain(const Drafter &d, const float *hidden, const float *logits, int n_rows, int32_t anchor,
                    int32_t *tokens, const ChainSampling *smp) {
    Backend &be = *d.target->backend;
    const int V = d.target->hp.n_vocab, R = d.hp.selector_rank, k = d.hp.selector_top_k;
    thread_local std::vector<float> hproj, pred, succ, scores;  // scratch that only grows
    thread_local std::vector<int32_t> ids;
    hproj.resize(size_t(n_rows) * R);
    pred.resize(size_t(R));
    succ.resize(size_t(R));
    scores.resize(size_t(k));
    ids.resize(size_t(V));
    be.matmul(d.sel_hproj, hidden, n_rows, hproj.data(), R);
    int32_t prev = anchor;
    for (int t = 0; t < n_rows; ++t) {
        const float *U = logits + int64_t(t) * V;
        std::iota(ids.begin(), ids.end(), 0);
        std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                          [&](int32_t a, int32_t b) { return U[a] > U[b] || (U[a] == U[b] && a < b); });
        be.get_rows(d.sel_pred, &prev, 1, pred.data());
        for (int r = 0; r < R; ++r) pred[size_t(r)] *= hproj[size_t(t) * R + r];
        for (int i = 0; i < k; ++i) {
            be.get_rows(d.sel_succ, &ids[size_t(i)], 1, succ.data());
            float dot = 0.f;
            for (int r = 0; r < R; ++r) dot += pred[size_t(r)] * succ[size_t(r)];
            scores[size_t(i)] = U[ids[size_t(i)]] + dot;
        }
        if (smp && smp->temperature > 0.f) {
            float *q = smp->q_out ? smp->q_out + int64_t(t) * V : nullptr;
            prev = sample_softmax(scores.data(), ids.data(), k, smp->temperature, *smp->rng, q, V);
        } else {
            int best = 0;  // candidates are in id-ascending order among equal U; ties -> smaller id
            for (int i = 1; i < k; ++i)
                if (scores[size_t(i)] > scores[size_t(best)] ||
                    (scores[size_t(i)] == scores[size_t(best)] && ids[size_t(i)] < ids[size_t(best)]))
                    best = i;
            prev = ids[size_t(best)];
        }
        tokens[t] = prev;
    }
}

void markov_chain(const Drafter &d, const float *hidden, float *logits, int n_rows, int32_t anchor, int32_t *tokens,
                  float *confidence, const ChainSampling *smp) {
    Backend &be = *d.target->backend;
    const int V = d.target->hp.n_vocab, R = d.hp.markov_rank, E = d.hp.n_embd;
    thread_local std::vector<float> e, bias;  // scratch that only grows
    e.resize(size_t(R));
    bias.resize(size_t(V));
    int32_t prev = anchor;
    for (int t = 0; t < n_rows; ++t) {
        float *U = logits + int64_t(t) * V;
        be.get_rows(d.markov_w1, &prev, 1, e.data());
        if (confidence && d.hp.confidence_dim == 0) {
            confidence[t] = 1.0f;  // no confidence head: never gates
        } else if (confidence) {
            const float *h = hidden + int64_t(t) * E;
            float z = d.conf_b;
            for (int i = 0; i < E; ++i) z += d.conf_w[size_t(i)] * h[i];
            if (d.hp.confidence_dim > E)
                for (int r = 0; r < R; ++r) z += d.conf_w[size_t(E + r)] * e[size_t(r)];
            confidence[t] = 1.0f / (1.0f + std::exp(-z));
        }
        be.matmul(d.markov_w2, e.data(), 1, bias.data(), V);
        for (int i = 0; i < V; ++i) U[i] += bias[size_t(i)];
        if (smp && smp->temperature > 0.f) {
            float *q = smp->q_out ? smp->q_out + int64_t(t) * V : nullptr;
            prev = sample_softmax(U, nullptr, V, smp->temperature, *smp->rng, q, V);
        } else {
            prev = argmax_row(U, V);
        }
        tokens[t] = prev;
    }
}

}  // namespace

void draft_unary_logits(const Drafter &d, const float *hidden, int n_rows, float *logits) {
    const Model &tm = *d.target;
    const int64_t n = int64_t(n_rows) * tm.hp.n_vocab;
    tm.backend->matmul(tm.output, hidden, n_rows, logits, tm.hp.n_vocab);
    if (d.hp.kind != DRAFT_DFLASH2) return;
    // The order of fp32 operations of z-lab's compute_logits: scale, then divide, tanh, multiply.
    const float m = d.hp.output_multiplier, cap = d.hp.final_logit_softcapping;
    if (m != 1.f)
        for (int64_t i = 0; i < n; ++i) logits[i] *= m;
    if (cap > 0.f)
        for (int64_t i = 0; i < n; ++i) logits[i] = std::tanh(logits[i] / cap) * cap;
}

void draft_chain(const Drafter &d, const float *hidden, int n_rows, int32_t anchor, int32_t *tokens,
                 float *confidence, const ChainSampling *smp) {
    const Model &tm = *d.target;
    const int V = tm.hp.n_vocab;
    if (n_rows < 0) fail(LUCE_ERR_INVALID_ARGUMENT, "n_rows must be >= 0");
    if (anchor < 0 || anchor >= V)
        fail(LUCE_ERR_INVALID_ARGUMENT, "anchor token %d is out of range (vocabulary has %d tokens)", anchor, V);
    if (n_rows == 0) return;
    thread_local std::vector<float> logits;  // [n_rows][V] scratch that only grows
    logits.resize(size_t(n_rows) * size_t(V));
    draft_unary_logits(d, hidden, n_rows, logits.data());
    if (d.hp.kind == DRAFT_DSPARK) {
        markov_chain(d, hidden, logits.data(), n_rows, anchor, tokens, confidence, smp);
        return;
    }
    if (confidence) std::fill(confidence, confidence + n_rows, 1.0f);
    if (d.hp.selector_rank) {
        selector_chain(d, hidden, logits.data(), n_rows, anchor, tokens, smp);
        return;
    }
    for (int t = 0; t < n_rows; ++t) {
        const float *U = logits.data() + int64_t(t) * V;
        if (smp && smp->temperature > 0.f) {
            float *q = smp->q_out ? smp->q_out + int64_t(t) * V : nullptr;
            tokens[t] = sample_softmax(U, nullptr, V, smp->temperature, *smp->rng, q, V);
        } else {
            tokens[t] = argmax_row(U, V);
        }
    }
}

int draft_candidates(const Drafter &d, const float *U_row, const float *hidden_row, int32_t prev, int k,
                     int32_t *ids, float *logp) {
    Backend &be = *d.target->backend;
    const int V = d.target->hp.n_vocab;
    thread_local std::vector<float> scores, tmp, e;
    thread_local std::vector<int32_t> order;
    order.resize(size_t(V));
    std::iota(order.begin(), order.end(), 0);
    int n = V;
    if (d.hp.kind == DRAFT_DSPARK) {
        e.resize(size_t(d.hp.markov_rank));
        scores.resize(size_t(V));
        be.get_rows(d.markov_w1, &prev, 1, e.data());
        be.matmul(d.markov_w2, e.data(), 1, scores.data(), V);
        for (int i = 0; i < V; ++i) scores[size_t(i)] += U_row[i];
    } else if (d.hp.selector_rank) {
        const int R = d.hp.selector_rank, kk = d.hp.selector_top_k;
        std::partial_sort(order.begin(), order.begin() + kk, order.end(), [&](int32_t a, int32_t b) {
            return U_row[a] > U_row[b] || (U_row[a] == U_row[b] && a < b);
        });
        tmp.resize(size_t(2 * R));
        be.matmul(d.sel_hproj, hidden_row, 1, tmp.data(), R);
        be.get_rows(d.sel_pred, &prev, 1, tmp.data() + R);
        scores.assign(size_t(V), -INFINITY);
        e.resize(size_t(R));
        for (int i = 0; i < kk; ++i) {
            be.get_rows(d.sel_succ, &order[size_t(i)], 1, e.data());
            float dot = 0.f;
            for (int r = 0; r < R; ++r) dot += tmp[size_t(R + r)] * tmp[size_t(r)] * e[size_t(r)];
            scores[size_t(order[size_t(i)])] = U_row[order[size_t(i)]] + dot;
        }
        n = kk;
        std::iota(order.begin(), order.end(), 0);
    } else {
        scores.assign(U_row, U_row + V);
    }
    k = std::min(k, n);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return scores[size_t(a)] > scores[size_t(b)] || (scores[size_t(a)] == scores[size_t(b)] && a < b);
    });
    // log-softmax normaliser over the candidate set (-inf entries contribute nothing)
    const float top = scores[size_t(order[0])];
    double sum = 0.0;
    for (int i = 0; i < V; ++i) sum += std::exp(double(scores[size_t(i)] - top));
    const float lse = top + float(std::log(sum));
    for (int i = 0; i < k; ++i) {
        ids[i] = order[size_t(i)];
        logp[i] = scores[size_t(order[size_t(i)])] - lse;
    }
    return k;
}

}  // namespace luce
