// session.cpp — allocation of a session's state and step buffers (once, static shapes).
#include "session.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "errors.h"

namespace luce {

namespace {

template <class T>
T *take(Session &s, int64_t n) {
    void *p = s.model->backend->alloc(size_t(std::max<int64_t>(n, 1)) * sizeof(T));
    s.allocations.push_back(p);
    return static_cast<T *>(p);
}

}  // namespace

int prefill_step_setting() {
    const char *env = std::getenv("LUCE_PREFILL_STEP");
    if (!env || !*env) return PREFILL_STEP;
    char *end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || v < MAX_STEP || v > MAX_PREFILL_STEP)
        fail(LUCE_ERR_INVALID_ARGUMENT, "LUCE_PREFILL_STEP=%s: not an integer in %d..%d", env, MAX_STEP,
             MAX_PREFILL_STEP);
    return int(v);
}

Session::Session(Model *m, int n_ctx_, KvFormat kv_format_, bool own_state)
    : model(m), n_ctx(n_ctx_), kv_format(kv_format_) {
    kv_format.check(m->hp.head_dim);
    graph_id = new_graph_owner();
    const Hparams &hp = m->hp;
    // Longer than the model's is a context that does not fit (callers such as bench, which size
    // it from the work asked for, tell it from their other mistakes by status).
    if (n_ctx < 1 || n_ctx > hp.n_ctx_train)
        fail(n_ctx < 1 ? LUCE_ERR_INVALID_ARGUMENT : LUCE_ERR_CONTEXT_FULL,
             "context size %d is not in 1..%d (the model's context length)", n_ctx, hp.n_ctx_train);
    try {
        prefill_step = prefill_step_setting();
        const int64_t T = prefill_step, E = hp.n_embd, CD = hp.conv_channels();
        const int64_t inner = int64_t(hp.ssm_hv) * hp.ssm_dv;
        kv.resize(size_t(hp.n_layer));
        recurrent.resize(size_t(hp.n_layer));
        for (int i = 0; own_state && i < hp.n_layer; ++i) {
            if (hp.recurrent[size_t(i)]) {
                recurrent[size_t(i)].conv = take<float>(*this, int64_t(hp.ssm_conv - 1) * CD);
                recurrent[size_t(i)].ssm = take<float>(*this, inner * hp.ssm_dk);
            } else {
                const int64_t rows = int64_t(hp.n_head_kv[size_t(i)]) * n_ctx;
                kv[size_t(i)] = KvLayer{take<uint8_t>(*this, rows * int64_t(kv_row_bytes(kv_format.k, hp.head_dim))),
                                        take<uint8_t>(*this, rows * int64_t(kv_row_bytes(kv_format.v, hp.head_dim))),
                                        n_ctx, kv_format};
            }
        }
        buf.tokens = take<int32_t>(*this, T);
        buf.pos = take<int32_t>(*this, T);
        buf.tree_slot = take<int32_t>(*this, MAX_STEP);
        buf.tree_parent = take<int32_t>(*this, MAX_STEP);
        buf.x = take<float>(*this, T * E);
        buf.cur = take<float>(*this, T * E);
        buf.mix = take<float>(*this, T * E);
        buf.qg = take<float>(*this, T * 2 * hp.max_q_width());
        buf.q = take<float>(*this, T * hp.max_q_width());
        buf.k = take<float>(*this, T * hp.max_kv_width());
        buf.v = take<float>(*this, T * hp.max_kv_width());
        buf.attn = take<float>(*this, T * std::max<int64_t>(hp.max_q_width(), inner));
        buf.qkv = take<float>(*this, T * CD);
        buf.conv = take<float>(*this, T * CD);
        buf.z = take<float>(*this, T * inner);
        buf.b = take<float>(*this, T * hp.ssm_hv);
        buf.a = take<float>(*this, T * hp.ssm_hv);
        buf.ff_gate = take<float>(*this, T * hp.max_n_ff());
        buf.ff_up = take<float>(*this, T * hp.max_n_ff());
        buf.logits = take<float>(*this, int64_t(MAX_STEP) * hp.n_vocab);  // a vocabulary row is ~1 MB
    } catch (...) {
        for (void *p : allocations) model->backend->release(p);
        throw;
    }
}

Session::~Session() {
    model->backend->graph_clear();  // recorded steps point into the buffers released here
    for (void *p : allocations) model->backend->release(p);
}

void clear_recurrent_state(const Model &m, std::vector<RecurrentState> &recurrent) {
    const Hparams &hp = m.hp;
    const int64_t CD = hp.conv_channels(), inner = int64_t(hp.ssm_hv) * hp.ssm_dv;
    std::vector<float> zeros;
    for (int i = 0; i < hp.n_layer; ++i) {
        if (!hp.recurrent[size_t(i)]) continue;
        const size_t n_conv = size_t(hp.ssm_conv - 1) * size_t(CD), n_ssm = size_t(inner * hp.ssm_dk);
        zeros.assign(std::max(n_conv, n_ssm), 0.f);
        m.backend->upload(recurrent[size_t(i)].conv, zeros.data(), n_conv * sizeof(float));
        m.backend->upload(recurrent[size_t(i)].ssm, zeros.data(), n_ssm * sizeof(float));
    }
}

void Session::set_fa_window(int n_window) {
    if (n_window != 0 && n_window < MAX_STEP)
        fail(LUCE_ERR_INVALID_ARGUMENT, "fa-window %d: 0 (off) or at least %d positions", n_window, MAX_STEP);
    for (int i = 0; i < model->hp.n_layer; ++i)
        if (!model->hp.recurrent[size_t(i)]) kv[size_t(i)].window = n_window;
}

void Session::reset() {
    // Attention keys past n_past are never visible, so only the recurrent state needs zeroing.
    clear_recurrent_state(*model, recurrent);
    n_past = 0;
}

void state_sizes(const Hparams &hp, size_t &n_conv, size_t &n_ssm) {
    n_conv = size_t(hp.ssm_conv - 1) * size_t(hp.conv_channels());
    n_ssm = size_t(hp.ssm_hv) * size_t(hp.ssm_dv) * size_t(hp.ssm_dk);
}

void Session::snapshot(Snapshot &out) const {
    const Hparams &hp = model->hp;
    size_t n_conv, n_ssm;
    state_sizes(hp, n_conv, n_ssm);
    out.owner = this;
    out.n_past = n_past;
    out.state.clear();
    for (int i = 0; i < hp.n_layer; ++i) {
        if (!hp.recurrent[size_t(i)]) continue;
        const size_t at = out.state.size();
        out.state.resize(at + n_conv + n_ssm);
        model->backend->download(out.state.data() + at, recurrent[size_t(i)].conv, n_conv * sizeof(float));
        model->backend->download(out.state.data() + at + n_conv, recurrent[size_t(i)].ssm, n_ssm * sizeof(float));
    }
}

void Session::restore(const Snapshot &in) {
    if (in.owner != this) fail(LUCE_ERR_INVALID_ARGUMENT, "snapshot belongs to another session");
    const Hparams &hp = model->hp;
    size_t n_conv, n_ssm;
    state_sizes(hp, n_conv, n_ssm);
    size_t at = 0;
    for (int i = 0; i < hp.n_layer; ++i) {
        if (!hp.recurrent[size_t(i)]) continue;
        model->backend->upload(recurrent[size_t(i)].conv, in.state.data() + at, n_conv * sizeof(float));
        model->backend->upload(recurrent[size_t(i)].ssm, in.state.data() + at + n_conv, n_ssm * sizeof(float));
        at += n_conv + n_ssm;
    }
    n_past = in.n_past;
}

}  // namespace luce
