// api.cpp — the C ABI of luce.h over the C++ runtime. Every body runs inside guard(), so no
// exception crosses the boundary; every pointer argument is checked before use.
#include <memory>

#include "errors.h"
#include "generate.h"
#include "gpu_loader.h"
#include "luce.h"
#include "model.h"
#include "session.h"
#include "speculative.h"

#include "api_handles.h"


struct luce_snapshot {
    luce::Session::Snapshot snap;
};

using luce::fail;
using luce::guard;

using luce::require;

LUCE_API int32_t luce_gpu_backend_installed(void) { return luce::gpu_backend_installed() ? 1 : 0; }

LUCE_API luce_status luce_model_load(const char *path, const luce_model_params *params, luce_model **out) {
    return guard([&] {
        require(path, "path");
        require(out, "out");
        *out = nullptr;
        luce_model_params p{LUCE_DEVICE_CPU, 0, 0, nullptr, nullptr};
        if (params) p = *params;
        if (p.device != LUCE_DEVICE_CPU && p.device != LUCE_DEVICE_GPU)
            fail(LUCE_ERR_INVALID_ARGUMENT, "unknown device %d", p.device);
        if (p.gpu_index < 0) fail(LUCE_ERR_INVALID_ARGUMENT, "gpu_index = %d must be >= 0", p.gpu_index);
        if (p.n_threads < 0 || p.n_threads > 1024)
            fail(LUCE_ERR_INVALID_ARGUMENT, "n_threads = %d must be in 0..1024", p.n_threads);
        auto h = std::make_unique<luce_model>();
        luce::LoadProgress progress;
        if (p.progress)
            progress = [&p](int64_t done, int64_t total) { p.progress(p.progress_user_data, done, total); };
        h->m = luce::load_model(path, p.n_threads, p.device, p.gpu_index, progress);
        *out = h.release();
    });
}

LUCE_API void luce_model_free(luce_model *model) { delete model; }

LUCE_API luce_status luce_model_get_info(const luce_model *model, luce_model_info *out) {
    return guard([&] {
        require(model, "model");
        require(out, "out");
        const luce::Hparams &hp = model->m->hp;
        luce_model_info info{};
        info.n_vocab = hp.n_vocab;
        info.n_embd = hp.n_embd;
        info.n_layer = hp.n_layer;
        for (int i = 0; i < hp.n_layer; ++i) {
            if (hp.recurrent[size_t(i)]) {
                info.n_recurrent++;
            } else {
                info.n_full_attention++;
                info.n_head = hp.n_head[size_t(i)];
                info.n_head_kv = hp.n_head_kv[size_t(i)];
            }
        }
        info.head_dim = hp.head_dim;
        info.n_ff = hp.max_n_ff();
        info.n_ctx_train = hp.n_ctx_train;
        info.n_params = model->m->n_params;
        info.weight_bytes = model->m->weight_bytes;
        info.eos_token_id = model->m->eos_token_id;
        info.tied_head = hp.tied_head ? 1 : 0;
        info.n_layer_file = hp.n_layer_total;
        *out = info;
    });
}

LUCE_API luce_status luce_model_memory(const luce_model *model, luce_memory_info *out) {
    return guard([&] {
        require(model, "model");
        require(out, "out");
        const luce::Backend &be = *model->m->backend;
        const luce::Backend::MemoryUse use = be.memory_use();
        luce_memory_info info{use.in_use, use.peak, -1, -1};
        int64_t free = 0, total = 0;
        if (be.device_memory(free, total)) info.device_free_bytes = free, info.device_total_bytes = total;
        *out = info;
    });
}

LUCE_API luce_status luce_session_create(luce_model *model, int32_t n_ctx, int32_t kv_type,
                                         luce_session **out) {
    return guard([&] {
        require(model, "model");
        require(out, "out");
        *out = nullptr;
        const luce::KvFormat kv_format = luce::kv_format_from_api(kv_type);
        auto h = std::make_unique<luce_session>();
        h->s = std::make_unique<luce::Session>(model->m.get(), n_ctx, kv_format);
        *out = h.release();
    });
}

LUCE_API void luce_session_free(luce_session *session) { delete session; }

LUCE_API luce_status luce_session_reset(luce_session *session) {
    return guard([&] {
        require(session, "session");
        session->s->reset();
    });
}

LUCE_API luce_status luce_session_set_fa_window(luce_session *session, int32_t n_window) {
    return guard([&] {
        require(session, "session");
        session->s->set_fa_window(n_window);
    });
}

LUCE_API int32_t luce_session_n_past(const luce_session *session) {
    return session ? session->s->n_past : 0;
}

LUCE_API luce_status luce_session_snapshot(const luce_session *session, luce_snapshot **out) {
    return guard([&] {
        require(session, "session");
        require(out, "out");
        *out = nullptr;
        auto h = std::make_unique<luce_snapshot>();
        session->s->snapshot(h->snap);
        *out = h.release();
    });
}

LUCE_API luce_status luce_session_restore(luce_session *session, const luce_snapshot *snapshot) {
    return guard([&] {
        require(session, "session");
        require(snapshot, "snapshot");
        session->s->restore(snapshot->snap);
    });
}

LUCE_API void luce_snapshot_free(luce_snapshot *snapshot) { delete snapshot; }

LUCE_API luce_status luce_session_state_save(const luce_session *session, const char *path, const uint8_t *identity,
                                             int32_t identity_len) {
    return guard([&] {
        require(session, "session");
        require(path, "path");
        luce::save_session_state(*session->s, path, identity, identity_len);
    });
}

LUCE_API luce_status luce_session_state_load(luce_session *session, const char *path, const uint8_t *identity,
                                             int32_t identity_len) {
    return guard([&] {
        require(session, "session");
        require(path, "path");
        luce::load_session_state(*session->s, path, identity, identity_len);
    });
}

LUCE_API luce_status luce_session_state_image(const luce_session *session, const uint8_t *identity,
                                              int32_t identity_len, void *out, uint64_t capacity,
                                              uint64_t *n_bytes) {
    return guard([&] {
        require(session, "session");
        require(n_bytes, "n_bytes");
        *n_bytes = luce::session_state_image(*session->s, identity, identity_len, out, capacity);
    });
}

LUCE_API luce_status luce_session_eval(luce_session *session, const int32_t *tokens, int32_t n_tokens,
                                       float *logits, int32_t n_logit_rows) {
    return guard([&] {
        require(session, "session");
        luce::session_eval(*session->s, tokens, n_tokens, logits, n_logit_rows);
    });
}

LUCE_API luce_status luce_session_eval_hidden(luce_session *session, const int32_t *tokens,
                                              int32_t n_tokens, float *logits, int32_t n_logit_rows,
                                              const int32_t *layer_ids, int32_t n_layers, float *hidden) {
    return guard([&] {
        require(session, "session");
        luce::HiddenCapture capture{layer_ids, n_layers, hidden};
        luce::session_eval(*session->s, tokens, n_tokens, logits, n_logit_rows, &capture);
    });
}

LUCE_API luce_status luce_generate(luce_session *session, luce_drafter *drafter, const int32_t *prompt,
                                   int32_t n_prompt, const luce_generate_params *params,
                                   luce_token_callback callback, void *user_data, int32_t *out_tokens,
                                   int32_t out_capacity, luce_generate_stats *stats) {
    luce_status result = LUCE_OK;
    luce_status st = guard([&] {
        require(session, "session");
        require(params, "params");
        if (drafter)
            result = luce::generate_speculative(*session->s, *drafter->d, prompt, n_prompt, *params, callback,
                                                user_data, out_tokens, out_capacity, stats);
        else
            result = luce::generate(*session->s, prompt, n_prompt, *params, callback, user_data, out_tokens,
                                    out_capacity, stats);
    });
    return st != LUCE_OK ? st : result;
}
