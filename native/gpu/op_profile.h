// op_profile.h — per-op device time of the GPU backend, for finding where a step goes.
//
// LUCE_GPU_PROFILE=FILE: every Backend op is bracketed by two CUDA events on the stream; at each
// synchronisation (download) the finished pairs are read and summed per key (op name, plus type,
// shape and width for matmuls), and when the backend is destroyed the table is appended to FILE.
// Off (the default) it costs one pointer test per op. Events serialise nothing, but the
// per-op host work (formatting a key) is real, so profiled runs are not benchmark runs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gpu_compat.h"

namespace luce::gpu {

class OpProfile {
public:
    explicit OpProfile(std::string path) : path_(std::move(path)) {}
    ~OpProfile();
    OpProfile(const OpProfile &) = delete;
    OpProfile &operator=(const OpProfile &) = delete;

    void begin(cudaStream_t s, std::string key);
    void end(cudaStream_t s);
    void collect();  // the stream has been synchronised: read and recycle the finished pairs
    void write(const char *device_name);

private:
    struct Pending {
        std::string key;
        cudaEvent_t start, stop;
    };
    struct Total {
        int64_t calls = 0;
        double ms = 0;
    };
    cudaEvent_t take_event();

    std::string path_;
    std::vector<Pending> pending_;
    std::vector<cudaEvent_t> free_;
    std::map<std::string, Total> totals_;
    bool written_ = false;
};

// RAII bracket: ops enqueue their kernels between construction and destruction.
class ProfileScope {
public:
    ProfileScope(OpProfile *p, cudaStream_t s, const char *name) : p_(p), s_(s) {
        if (p_) p_->begin(s_, name);
    }
    ProfileScope(OpProfile *p, cudaStream_t s, std::string key) : p_(p), s_(s) {
        if (p_) p_->begin(s_, std::move(key));
    }
    ~ProfileScope() {
        if (p_) p_->end(s_);
    }

private:
    OpProfile *p_;
    cudaStream_t s_;
};

}  // namespace luce::gpu
