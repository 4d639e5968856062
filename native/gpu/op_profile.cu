// op_profile.cu — see op_profile.h.
#include "op_profile.h"

#include <algorithm>
#include <cstdio>

namespace luce::gpu {

cudaEvent_t OpProfile::take_event() {
    if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
    }
    cudaEvent_t e;
    LUCE_GPU_CHECK(cudaEventCreate(&e));
    return e;
}

void OpProfile::begin(cudaStream_t s, std::string key) {
    Pending p{std::move(key), take_event(), take_event()};
    LUCE_GPU_CHECK(cudaEventRecord(p.start, s));
    pending_.push_back(std::move(p));
}

void OpProfile::end(cudaStream_t s) {
    if (!pending_.empty()) LUCE_GPU_CHECK(cudaEventRecord(pending_.back().stop, s));
}

void OpProfile::collect() {
    for (Pending &p : pending_) {
        float ms = 0;
        if (cudaEventSynchronize(p.stop) == cudaSuccess && cudaEventElapsedTime(&ms, p.start, p.stop) == cudaSuccess) {
            Total &t = totals_[p.key];
            t.calls += 1;
            t.ms += ms;
        }
        (void)cudaGetLastError();
        free_.push_back(p.start);
        free_.push_back(p.stop);
    }
    pending_.clear();
}

void OpProfile::write(const char *device_name) {
    if (written_) return;
    written_ = true;
    collect();
    std::FILE *f = std::fopen(path_.c_str(), "a");
    if (!f) return;
    std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
    std::sort(rows.begin(), rows.end(), [](const auto &a, const auto &b) { return a.second.ms > b.second.ms; });
    double all = 0;
    for (const auto &r : rows) all += r.second.ms;
    std::fprintf(f, "# luce GPU op profile (%s): %.3f ms in %zu keys\n", device_name, all, rows.size());
    std::fprintf(f, "%10s %10s %10s %6s  %s\n", "total_ms", "calls", "us/call", "share", "op");
    for (const auto &[key, t] : rows)
        std::fprintf(f, "%10.3f %10lld %10.2f %5.1f%%  %s\n", t.ms, (long long)t.calls, 1e3 * t.ms / double(t.calls),
                     all > 0 ? 100.0 * t.ms / all : 0.0, key.c_str());
    std::fclose(f);
}

OpProfile::~OpProfile() {
    for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);
    for (Pending &p : pending_) {
        (void)cudaEventDestroy(p.start);
        (void)cudaEventDestroy(p.stop);
    }
}

}  // namespace luce::gpu
