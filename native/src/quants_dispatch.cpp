// quants_dispatch.cpp — picks the SIMD matmul kernels at run time. This file is compiled for
// the baseline ISA; each kernel file has its own ISA flags (CMakeLists.txt) and is only entered
// after the CPU said it has that ISA, so one library runs on every x86-64 (scalar otherwise).
//
// LUCE_CPU_KERNELS=scalar|avx2|avx512 caps the level (read per call, so tests can switch it);
// unset = the best the CPU has. All levels compute the same numbers up to fp32 summation order.
#include <cstdlib>
#include <cstring>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "quants_kernels.h"

namespace luce {

#if defined(__x86_64__)
namespace avx2 {
bool matmul_rows(int32_t type, const void *w, int64_t n_cols, int64_t row_begin, int64_t row_end,
                 const float *x, int64_t n_tok, float *y, int64_t ldy, bool prefill);
}
namespace avx512 {
bool matmul_rows(int32_t type, const void *w, int64_t n_cols, int64_t row_begin, int64_t row_end,
                 const float *x, int64_t n_tok, float *y, int64_t ldy);
}

// F16C through CPUID leaf 1 (ECX bit 29): clang before 16 has no "f16c" in __builtin_cpu_supports,
// and the fuzzing build (tests/fuzz, make fuzz) uses clang 14.
static bool cpu_has_f16c() {
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
}

enum KernelLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

static KernelLevel cpu_level() {
    static const KernelLevel level = [] {
        __builtin_cpu_init();
        if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c()))
            return kScalar;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("bmi2"))
            return kAvx512;
        return kAvx2;
    }();
    return level;
}

static KernelLevel kernel_level() {
    KernelLevel cap = kAvx512;
    if (const char *want = std::getenv("LUCE_CPU_KERNELS")) {
        if (std::strcmp(want, "scalar") == 0) cap = kScalar;
        else if (std::strcmp(want, "avx2") == 0) cap = kAvx2;
    }
    return cpu_level() < cap ? cpu_level() : cap;
}
#endif

bool matmul_rows_simd(int32_t type, const void *w, int64_t n_cols, int64_t row_begin,
                      int64_t row_end, const float *x, int64_t n_tok, float *y, int64_t ldy, bool prefill) {
#if defined(__x86_64__)
    switch (kernel_level()) {
        case kAvx512:
            if (avx512::matmul_rows(type, w, n_cols, row_begin, row_end, x, n_tok, y, ldy)) return true;
            [[fallthrough]];  // a type with no AVX-512 kernel (the 1-3-bit ones) runs the AVX2 one
        case kAvx2: return avx2::matmul_rows(type, w, n_cols, row_begin, row_end, x, n_tok, y, ldy, prefill);
        case kScalar: break;
    }
#endif
    return false;
}

}  // namespace luce
