// errors.h — how native code reports failure across the C ABI.
//
// Internally, code throws luce::Error(status, message). Every exported function body runs inside
// guard(), which turns the exception into a luce_status and stores the message in a thread-local
// string that luce_last_error() returns. Nothing else may escape into C callers.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>

#include "luce.h"

namespace luce {

struct Error : std::runtime_error {
    luce_status status;
    Error(luce_status s, const std::string &msg) : std::runtime_error(msg), status(s) {}
};

// Whether s is well-formed UTF-8 (the GGUF reader's rule for keys and tensor names, as the
// Python reader's).
bool is_utf8(std::string_view s);

void set_last_error(const std::string &msg);
void clear_last_error();

// printf-style throw: fail(LUCE_ERR_FORMAT, "tensor %s: offset %llu past end of file", ...)
[[noreturn]] void fail(luce_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

template <class F>
luce_status guard(F &&body) {
    clear_last_error();
    try {
        body();
        return LUCE_OK;
    } catch (const Error &e) {
        set_last_error(e.what());
        return e.status;
    } catch (const std::bad_alloc &) {
        set_last_error("out of host memory");
        return LUCE_ERR_OUT_OF_MEMORY;
    } catch (const std::exception &e) {
        set_last_error(std::string("internal error: ") + e.what());
        return LUCE_ERR_INTERNAL;
    } catch (...) {
        set_last_error("internal error: unknown exception");
        return LUCE_ERR_INTERNAL;
    }
}

}  // namespace luce
