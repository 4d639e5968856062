// quants_dispatch.cpp — picks the SIMD matmul kernels at run time (compiled for the baseline
// ISA; the kernels live in per-ISA files with their own compile flags, see CMakeLists.txt).
#include "quants_kernels.h"

namespace luce {

bool matmul_rows_simd(int32_t type, const void *w, int64_t n_cols, int64_t row_begin,
                      int64_t row_end, const float *x, int64_t n_tok, float *y, int64_t ldy) {
    return false;
}

}  // namespace luce
