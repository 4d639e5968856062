// errors.cpp — thread-local last-error string behind luce_last_error().
#include "errors.h"

#include <cstring>
#include <vector>

namespace luce {

static thread_local std::string g_last_error;

void set_last_error(const std::string &msg) { g_last_error = msg; }
void clear_last_error() { g_last_error.clear(); }

// Length of the well-formed UTF-8 sequence at p (0: not one), reading at most `left` bytes.
static int utf8_length(const unsigned char *p, size_t left) {
    const unsigned char c = p[0];
    int len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    if (size_t(len) > left) return 0;
    for (int i = 1; i < len; ++i)
        if ((p[i] & 0xC0) != 0x80) return 0;
    if (len == 3 && ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] > 0x9F))) return 0;  // overlong, surrogate
    if (len == 4 && ((c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] > 0x8F))) return 0;  // overlong, > U+10FFFF
    return len;
}

bool is_utf8(std::string_view s) {
    const auto *p = reinterpret_cast<const unsigned char *>(s.data());
    for (size_t i = 0; i < s.size();) {
        const int len = utf8_length(p + i, s.size() - i);
        if (len == 0) return false;
        i += size_t(len);
    }
    return true;
}

// A reason is one line of text, but it often quotes a name read from an untrusted file (a tensor
// name, a key, an architecture): control characters become \xNN, as do bytes that are not UTF-8.
static std::string one_line(const char *s) {
    std::string out;
    const auto *p = reinterpret_cast<const unsigned char *>(s);
    while (*p) {
        unsigned char c = *p;
        const int len = utf8_length(p, std::strlen(reinterpret_cast<const char *>(p)));
        if (len == 0 || (len == 1 && (c < 0x20 || c == 0x7F))) {
            char esc[5];
            std::snprintf(esc, sizeof esc, "\\x%02x", c);
            out += esc;
            ++p;
            continue;
        }
        out.append(reinterpret_cast<const char *>(p), size_t(len));
        p += len;
    }
    return out;
}

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
    throw Error(status, one_line(buf.data()));
}

}  // namespace luce

extern "C" __attribute__((visibility("default"))) const char *luce_last_error(void) {
    return luce::g_last_error.c_str();
}

extern "C" __attribute__((visibility("default"))) const char *luce_version(void) { return "0.1.0"; }
