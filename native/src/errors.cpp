// errors.cpp — thread-local last-error string behind luce_last_error().
#include "errors.h"

#include <vector>

namespace luce {

static thread_local std::string g_last_error;

void set_last_error(const std::string &msg) { g_last_error = msg; }
void clear_last_error() { g_last_error.clear(); }

void fail(luce_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int n = std::vsnprintf(nullptr, 0, fmt, ap);
    va_end(ap);
    std::vector<char> buf(n > 0 ? size_t(n) + 1 : 1, '\0');
    std::vsnprintf(buf.data(), buf.size(), fmt, ap2);
    va_end(ap2);
    throw Error(status, std::string(buf.data()));
}

}  // namespace luce

extern "C" __attribute__((visibility("default"))) const char *luce_last_error(void) {
    return luce::g_last_error.c_str();
}

extern "C" __attribute__((visibility("default"))) const char *luce_version(void) { return "0.1.0"; }
