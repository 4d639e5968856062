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
