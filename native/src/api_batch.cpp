// api_batch.cpp — the C ABI of continuous batching (luce.h luce_batch_*).
#include "api_handles.h"
#include "batch.h"

struct luce_batch {
    std::unique_ptr<luce::BatchRunner> b;
};

using luce::fail;
using luce::guard;
using luce::require;

LUCE_API luce_status luce_batch_create(luce_model *model, int32_t n_parallel, int32_t n_ctx, int32_t kv_type,
                                       luce_batch **out) {
    return guard([&] {
        require(model, "model");
        require(out, "out");
        *out = nullptr;
        const luce::KvFormat kv_format = luce::kv_format_from_api(kv_type);
        auto h = std::make_unique<luce_batch>();
        h->b = std::make_unique<luce::BatchRunner>(model->m.get(), n_parallel, n_ctx, kv_format);
        *out = h.release();
    });
}

LUCE_API void luce_batch_free(luce_batch *batch) { delete batch; }

LUCE_API luce_status luce_batch_set_drafter(luce_batch *batch, luce_drafter *drafter) {
    return guard([&] {
        require(batch, "batch");
        batch->b->set_drafter(drafter ? drafter->d.get() : nullptr);
    });
}

LUCE_API luce_status luce_batch_generate(luce_batch *batch, const luce_batch_request *requests, int32_t n_requests,
                                         luce_batch_done_callback done, void *user_data) {
    luce_status result = LUCE_OK;
    const luce_status st = guard([&] {
        require(batch, "batch");
        result = batch->b->run(requests, n_requests, done, user_data);
    });
    return st != LUCE_OK ? st : result;
}
