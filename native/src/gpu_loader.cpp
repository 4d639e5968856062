// gpu_loader.cpp — dlopen of libluce_gpu.so (see gpu_loader.h).
#include "gpu_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <sys/stat.h>

#include "errors.h"

namespace luce {

namespace {

// The exported entry point of libluce_gpu (native/gpu/backend_gpu.h).
using GpuOpenFn = luce_status (*)(int32_t, int64_t, Backend **, char *, size_t);
constexpr const char *GPU_OPEN_SYMBOL = "luce_gpu_open";

// The directory this library (libluce.so) was loaded from: the GPU library is installed beside it.
std::string own_directory() {
    Dl_info info{};
    if (!dladdr(reinterpret_cast<void *>(&open_gpu_backend), &info) || !info.dli_fname) return ".";
    std::string path = info.dli_fname;
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string gpu_library_path() {
    const char *env = std::getenv(GPU_LIBRARY_ENV);
    if (env && *env) return env;
    return own_directory() + "/" + GPU_LIBRARY_NAME;
}

bool file_exists(const std::string &path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0;
}

// Loaded once and never closed: backends created from it live as long as their models.
GpuOpenFn load_open_function() {
    static GpuOpenFn open_fn = nullptr;
    if (open_fn) return open_fn;
    const std::string path = gpu_library_path();
    if (!file_exists(path))
        fail(LUCE_ERR_DEVICE,
             "GPU backend not built: %s is missing (install luce where nvcc or hipcc is present; see docs/gpu.md)",
             path.c_str());
    void *handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) fail(LUCE_ERR_DEVICE, "cannot load the GPU backend: %s", dlerror());
    auto fn = reinterpret_cast<GpuOpenFn>(dlsym(handle, GPU_OPEN_SYMBOL));
    if (!fn) fail(LUCE_ERR_DEVICE, "%s does not export %s", path.c_str(), GPU_OPEN_SYMBOL);
    open_fn = fn;
    return fn;
}

}  // namespace

bool gpu_backend_installed() { return file_exists(gpu_library_path()); }

std::unique_ptr<Backend> open_gpu_backend(int gpu_index, int64_t bytes_needed) {
    GpuOpenFn open_fn = load_open_function();
    Backend *be = nullptr;
    char err[512] = {0};
    const luce_status st = open_fn(gpu_index, bytes_needed, &be, err, sizeof err);
    if (st != LUCE_OK || !be) fail(st != LUCE_OK ? st : LUCE_ERR_DEVICE, "%s", err[0] ? err : "GPU backend failed to open");
    return std::unique_ptr<Backend>(be);
}

}  // namespace luce
