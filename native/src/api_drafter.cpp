// api_drafter.cpp — the drafter part of the C ABI (luce_drafter_*). Bodies arrive with the
// drafter runtime; until then they report LUCE_ERR_UNSUPPORTED.
#include "api_handles.h"
#include "errors.h"
#include "luce.h"

#define LUCE_API extern "C" __attribute__((visibility("default")))

struct luce_drafter {};

LUCE_API luce_status luce_drafter_load(const char *path, luce_model *target, luce_drafter **out) {
    return luce::guard([&] {
        if (out) *out = nullptr;
        luce::fail(LUCE_ERR_UNSUPPORTED, "drafters are not built yet");
    });
}

LUCE_API void luce_drafter_free(luce_drafter *drafter) { delete drafter; }

LUCE_API luce_status luce_drafter_get_info(const luce_drafter *, luce_drafter_info *) {
    return luce::guard([&] { luce::fail(LUCE_ERR_UNSUPPORTED, "drafters are not built yet"); });
}

LUCE_API luce_status luce_drafter_forward(luce_drafter *, const float *, int32_t, const int32_t *, int32_t,
                                          float *) {
    return luce::guard([&] { luce::fail(LUCE_ERR_UNSUPPORTED, "drafters are not built yet"); });
}

LUCE_API luce_status luce_drafter_chain(luce_drafter *, const float *, int32_t, int32_t, int32_t *, float *) {
    return luce::guard([&] { luce::fail(LUCE_ERR_UNSUPPORTED, "drafters are not built yet"); });
}
