// api_handles.h — what the opaque C handles of luce.h wrap, and the few helpers every api*.cpp
// file needs (export macro, argument checks).
#pragma once
#include <memory>

#include "drafter.h"
#include "errors.h"
#include "model.h"
#include "session.h"

#define LUCE_API extern "C" __attribute__((visibility("default")))

namespace luce {

// A NULL pointer argument is the caller's mistake, reported like every other one.
template <class T>
void require(const T *p, const char *what) {
    if (!p) fail(LUCE_ERR_INVALID_ARGUMENT, "%s is NULL", what);
}

// luce.h's KV cache type (LUCE_KV_F32 / LUCE_KV_F16) as "store half floats", refusing others.
inline bool kv_type_is_f16(int32_t kv_type) {
    if (kv_type != LUCE_KV_F32 && kv_type != LUCE_KV_F16)
        fail(LUCE_ERR_INVALID_ARGUMENT, "unknown KV cache type %d", kv_type);
    return kv_type == LUCE_KV_F16;
}

}  // namespace luce

struct luce_model {
    std::unique_ptr<luce::Model> m;
};

struct luce_session {
    std::unique_ptr<luce::Session> s;
};

struct luce_drafter {
    std::unique_ptr<luce::Drafter> d;
};
