// quants_dispatch.cpp — picks the SIMD matmul kernels at run time. This file is compiled for
// the baseline ISA; each kernel file has its own ISA flags (CMakeLists.txt) and is only entered
// after the CPU said it has that ISA, so one library runs on every x86-64 (scalar otherwise).
//
// LUCE_CPU_KERNELS=scalar forces the portable path (for tests and for comparing numbers).
#include <cstdlib>
#include <cstring>

#include "quants_kernels.h"

namespace luce {

#if defined(__x86_64__)
namespace avx2 {
bool matmul_rows(int32_t type, const void *w, int64_t n_cols, int64_t row_begin, int64_t row_end,
                 const float *x, int64_t n_tok, float *y, int64_t ldy);
}

static bool use_avx2() {
    static const bool yes = [] {
        const char *force = std::getenv("LUCE_CPU_KERNELS");
        if (force != nullptr && std::strcmp(force, "scalar") == 0) return false;
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    }();
    return yes;
}
#endif

bool matmul_rows_simd(int32_t type, const void *w, int64_t n_cols, int64_t row_begin,
                      int64_t row_end, const float *x, int64_t n_tok, float *y, int64_t ldy) {
#if defined(__x86_64__)
    if (use_avx2()) return avx2::matmul_rows(type, w, n_cols, row_begin, row_end, x, n_tok, y, ldy);
#endif
    return false;
}

}  // namespace luce
