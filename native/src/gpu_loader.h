// gpu_loader.h — finds, loads and opens the GPU backend library (libluce_gpu.so) at run time.
//
// libluce never links a GPU runtime: the GPU backend is a separate library installed beside it
// and dlopen'ed here only when a model is loaded with device = LUCE_DEVICE_GPU. Every way this
// can fail (library not built, its runtime or driver missing, no device, too little memory) is
// one LUCE_ERR_DEVICE line, raised before any weight is uploaded.
#pragma once

#include <cstdint>
#include <memory>

#include "backend.h"

namespace luce {

// Environment variable naming the GPU library to load instead of the one beside libluce.so.
constexpr const char *GPU_LIBRARY_ENV = "LUCE_GPU_LIBRARY";
constexpr const char *GPU_LIBRARY_NAME = "libluce_gpu.so";

// Whether the GPU library file is there (a CPU-only build has none); loads nothing.
bool gpu_backend_installed();

// Opens GPU `gpu_index`, checking that `bytes_needed` of weights fit its free memory.
std::unique_ptr<Backend> open_gpu_backend(int gpu_index, int64_t bytes_needed);

}  // namespace luce
