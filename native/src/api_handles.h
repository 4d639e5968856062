// api_handles.h — what the opaque C handles of luce.h wrap. Shared by the api*.cpp files.
#pragma once
#include <memory>

#include "drafter.h"
#include "model.h"
#include "session.h"

struct luce_model {
    std::unique_ptr<luce::Model> m;
};

struct luce_session {
    std::unique_ptr<luce::Session> s;
};

struct luce_drafter {
    std::unique_ptr<luce::Drafter> d;
};
