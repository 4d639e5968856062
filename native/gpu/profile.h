// profile.h — the per-op device-time profile (LUCE_GPU_PROFILE=1), see profile.cu.
#pragma once

#include <cstddef>
#include <cstdint>

namespace luce {

class Backend;
class GpuBackend;

bool gpu_profile_enabled();
// Takes ownership of be; the returned backend forwards every op to it and times each one.
Backend *gpu_profile_wrap(GpuBackend *be);

}  // namespace luce

// Test hooks (tools/gpu_check.py): clear the process-wide totals / read them as text.
extern "C" __attribute__((visibility("default"))) void luce_gpu_profile_reset(void);
extern "C" __attribute__((visibility("default"))) int64_t luce_gpu_profile_table(char *buf, size_t len);
