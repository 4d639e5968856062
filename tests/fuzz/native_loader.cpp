// native_loader.cpp — libFuzzer target: fuzzed bytes -> luce_model_load and luce_drafter_load.
//
// Each input is put in a memory file (memfd) and loaded through the C ABI exactly as a user's file
// is: first as a target (and, if accepted, two greedy tokens are generated from it), then as a
// drafter bound to the tiny target named by LUCE_FUZZ_TARGET (and, if accepted, four tokens are
// generated speculatively with it). A refusal must be a status with a one-line reason; anything
// else (a sanitizer report, an abort, a hang) is a finding.
//
// Built two ways (native/CMakeLists.txt): with clang's libFuzzer for `make fuzz`, and with
// gcc's ASan/UBSan beside replay_main.cpp, which runs the committed corpus in `make test`.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "luce.h"

namespace {

int g_fd = -1;
bool g_verbose = false;  // LUCE_FUZZ_VERBOSE=1: one stderr line per load (the replay tests read it)
std::string g_path;
luce_model *g_target = nullptr;

luce_model_params params() {
    luce_model_params p;
    std::memset(&p, 0, sizeof p);
    p.device = LUCE_DEVICE_CPU;
    p.n_threads = 1;
    return p;
}

// A failed call must leave one non-empty line as its reason.
void check_refusal(luce_status st, const char *what) {
    if (g_verbose) std::fprintf(stderr, "  %s: %s%s\n", what, st == LUCE_OK ? "ok" : "refused: ",
                                st == LUCE_OK ? "" : luce_last_error());
    if (st == LUCE_OK) return;
    const char *e = luce_last_error();
    if (!e || !*e || std::strchr(e, '\n')) {
        std::fprintf(stderr, "%s: status %d without a one-line reason: '%s'\n", what, int(st), e ? e : "(null)");
        std::abort();
    }
    if (st == LUCE_ERR_INTERNAL) {
        std::fprintf(stderr, "%s: internal error on a crafted file: %s\n", what, e);
        std::abort();
    }
}

void generate(luce_model *model, luce_drafter *drafter, int32_t n_tokens) {
    luce_session *s = nullptr;
    luce_status st = luce_session_create(model, 64, 0, &s);
    check_refusal(st, "luce_session_create");
    if (st != LUCE_OK) return;
    const int32_t prompt[] = {1, 2, 3};
    luce_generate_params gp;
    std::memset(&gp, 0, sizeof gp);
    gp.max_tokens = n_tokens;
    gp.top_p = 1.0f;
    gp.ignore_eos = 1;
    gp.no_adaptive = 1;
    luce_generate_stats stats;
    int32_t out[8];
    check_refusal(luce_generate(s, drafter, prompt, 3, &gp, nullptr, nullptr, out, 8, &stats), "luce_generate");
    luce_session_free(s);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    g_fd = memfd_create("luce-fuzz", 0);
    if (g_fd < 0) { std::perror("memfd_create"); std::exit(1); }
    g_path = "/proc/self/fd/" + std::to_string(g_fd);
    g_verbose = std::getenv("LUCE_FUZZ_VERBOSE") != nullptr;
    const char *target = std::getenv("LUCE_FUZZ_TARGET");
    if (!target) { std::fprintf(stderr, "set LUCE_FUZZ_TARGET to the tiny target GGUF\n"); std::exit(1); }
    luce_model_params p = params();
    if (luce_model_load(target, &p, &g_target) != LUCE_OK) {
        std::fprintf(stderr, "cannot load %s: %s\n", target, luce_last_error());
        std::exit(1);
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (ftruncate(g_fd, 0) != 0 || (size && pwrite(g_fd, data, size, 0) != ssize_t(size))) {
        std::perror("memfd write");
        std::abort();
    }
    luce_model_params p = params();
    luce_model *m = nullptr;
    luce_status st = luce_model_load(g_path.c_str(), &p, &m);
    check_refusal(st, "luce_model_load");
    if (st == LUCE_OK) generate(m, nullptr, 2);
    luce_model_free(m);

    luce_drafter *d = nullptr;
    st = luce_drafter_load(g_path.c_str(), g_target, &d);
    check_refusal(st, "luce_drafter_load");
    if (st == LUCE_OK) generate(g_target, d, 4);
    luce_drafter_free(d);
    return 0;
}
