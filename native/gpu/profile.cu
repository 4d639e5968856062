// profile.cu — LUCE_GPU_PROFILE=1: where the device time of a step goes, per Backend op.
//
// luce_gpu_open wraps the GpuBackend in a ProfiledBackend, which forwards every op unchanged and
// brackets it with two events on the backend's stream. Nothing synchronises for the profile: the
// pending event pairs are read back at the next point where the stream is drained anyway
// (download, argmax, release). Totals live in one process-wide table, so a test harness reads
// them through the exported luce_gpu_profile_* hooks (tools/gpu_check.py) without an API change.
// Eager mode only: the events time each launch as enqueued.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend_gpu.h"
#include "profile.h"

namespace luce {

namespace {

struct OpTotal {
    int64_t calls = 0;
    double ms = 0.0;
};

std::mutex g_mutex;
std::map<std::string, OpTotal> g_totals;  // op name -> device time over all profiled backends

class ProfiledBackend final : public Backend {
public:
    explicit ProfiledBackend(GpuBackend *inner) : be_(inner), stream_(inner->stream()) {}
    ~ProfiledBackend() override {
        try {
            drain();
        } catch (...) {
        }
        for (auto &p : free_) destroy(p);
        for (auto &p : pending_) destroy(p.ev);
        delete be_;
    }
    const char *name() const override { return be_->name(); }

    void *alloc(size_t n) override { return be_->alloc(n); }
    void release(void *p) override {
        drain();
        be_->release(p);
    }
    void upload(void *dst, const void *src, size_t n) override {
        Timed t(this, "upload");
        be_->upload(dst, src, n);
    }
    void download(void *dst, const void *src, size_t n) override {
        {
            Timed t(this, "download");
            be_->download(dst, src, n);
        }
        drain();
    }
    void copy(void *dst, const void *src, size_t n) override {
        Timed t(this, "copy");
        be_->copy(dst, src, n);
    }
    void matmul(const Weight &w, const float *x, int T, float *y, int64_t ldy) override {
        Timed t(this, "matmul");
        be_->matmul(w, x, T, y, ldy);
    }
    void get_rows(const Weight &w, const int32_t *ids, int T, float *out) override {
        Timed t(this, "get_rows");
        be_->get_rows(w, ids, T, out);
    }
    void rmsnorm(const float *x, int64_t xs, const float *w, int n_rows, int dim, float eps, float *y,
                 int64_t ys) override {
        Timed t(this, "rmsnorm");
        be_->rmsnorm(x, xs, w, n_rows, dim, eps, y, ys);
    }
    void rmsnorm_gated(float *o, const float *w, const float *z, int n_rows, int dim, float eps) override {
        Timed t(this, "rmsnorm_gated");
        be_->rmsnorm_gated(o, w, z, n_rows, dim, eps);
    }
    void mul_sigmoid(float *o, const float *g, int64_t gs, int n_rows, int dim) override {
        Timed t(this, "mul_sigmoid");
        be_->mul_sigmoid(o, g, gs, n_rows, dim);
    }
    void swiglu(float *gate, const float *up, int64_t n) override {
        Timed t(this, "swiglu");
        be_->swiglu(gate, up, n);
    }
    void add(float *x, const float *y, int64_t n) override {
        Timed t(this, "add");
        be_->add(x, y, n);
    }
    void rope_neox(float *x, const int32_t *pos, int T, int n_head, int head_dim, int n_rot,
                   float theta) override {
        Timed t(this, "rope_neox");
        be_->rope_neox(x, pos, T, n_head, head_dim, n_rot, theta);
    }
    void kv_store(KvLayer &kv, const float *k, const float *v, const int32_t *pos, int T, int n_head_kv,
                  int head_dim) override {
        Timed t(this, "kv_store");
        be_->kv_store(kv, k, v, pos, T, n_head_kv, head_dim);
    }
    void attention(const float *q, const KvLayer &kv, const int32_t *pos, const uint8_t *mask, int T, int n_head,
                   int n_head_kv, int head_dim, float *out) override {
        Timed t(this, "attention");
        be_->attention(q, kv, pos, mask, T, n_head, n_head_kv, head_dim, out);
    }
    void conv_silu(const float *x, float *state, const float *w, int T, int C, int Kc, float *out,
                   const int32_t *parent) override {
        Timed t(this, "conv_silu");
        be_->conv_silu(x, state, w, T, C, Kc, out, parent);
    }
    void gated_delta_net(const float *conv, const float *b, const float *a, const float *ssm_a,
                         const float *dt_bias, const DeltaNetDims &dims, int T, float *state, float *out,
                         float *state_history, const int32_t *parent) override {
        Timed t(this, "gated_delta_net");
        be_->gated_delta_net(conv, b, a, ssm_a, dt_bias, dims, T, state, out, state_history, parent);
    }
    int32_t argmax(const float *x, int64_t n) override {
        int32_t r;
        {
            Timed t(this, "argmax");
            r = be_->argmax(x, n);
        }
        drain();
        return r;
    }
    void rope_table(float *x, const int32_t *pos, int T, int n_head, int head_dim, const float *inv_freq,
                    float mscale) override {
        Timed t(this, "rope_table");
        be_->rope_table(x, pos, T, n_head, head_dim, inv_freq, mscale);
    }
    void dyn_conv(const float *base, const float *dyn, int64_t dyn_stride, const float *in, int B, int E, int K,
                  int group, float *out) override {
        Timed t(this, "dyn_conv");
        be_->dyn_conv(base, dyn, dyn_stride, in, B, E, K, group, out);
    }
    void softcap(float *x, int64_t n, float mult, float cap) override {
        Timed t(this, "softcap");
        be_->softcap(x, n, mult, cap);
    }
    void argmax_rows(const float *x, int n_rows, int64_t n, int32_t *out) override {
        Timed t(this, "argmax_rows");
        be_->argmax_rows(x, n_rows, n, out);
    }
    void topk_rows(const float *x, int n_rows, int64_t n, int k, int32_t *ids, float *vals) override {
        Timed t(this, "topk_rows");
        be_->topk_rows(x, n_rows, n, k, ids, vals);
    }
    void selector_pairs(const float *hproj, const float *pred, const float *succ, int n_rows, int k, int R,
                        float *out) override {
        Timed t(this, "selector_pairs");
        be_->selector_pairs(hproj, pred, succ, n_rows, k, R, out);
    }
    void confidence(const float *h, const float *e, const float *w, float b, int E, int R, float *out) override {
        Timed t(this, "confidence");
        be_->confidence(h, e, w, b, E, R, out);
    }
    void copy_rows(void *dst, int64_t ds, const void *src, int64_t ss, int64_t width, int n_rows) override {
        Timed t(this, "copy_rows");
        be_->copy_rows(dst, ds, src, ss, width, n_rows);
    }
    bool tree_mode() const override { return be_->tree_mode(); }

private:
    struct EventPair {
        cudaEvent_t start = nullptr, stop = nullptr;
    };
    struct Pending {
        const char *op;
        EventPair ev;
    };

    // Records the start event on construction and the stop event on destruction (also when the op
    // throws, so the pair is never left half-recorded).
    class Timed {
    public:
        Timed(ProfiledBackend *p, const char *op) : p_(p), op_(op), ev_(p->take()) {
            LUCE_GPU_CHECK(cudaEventRecord(ev_.start, p_->stream_));
        }
        ~Timed() {
            if (cudaEventRecord(ev_.stop, p_->stream_) == cudaSuccess) p_->pending_.push_back({op_, ev_});
            else p_->free_.push_back(ev_);
        }

    private:
        ProfiledBackend *p_;
        const char *op_;
        EventPair ev_;
    };

    EventPair take() {
        if (!free_.empty()) {
            EventPair e = free_.back();
            free_.pop_back();
            return e;
        }
        EventPair e;
        LUCE_GPU_CHECK(cudaEventCreate(&e.start));
        LUCE_GPU_CHECK(cudaEventCreate(&e.stop));
        return e;
    }
    static void destroy(EventPair &e) {
        if (e.start) (void)cudaEventDestroy(e.start);
        if (e.stop) (void)cudaEventDestroy(e.stop);
    }
    // Adds the elapsed time of every recorded pair to the totals and recycles the events.
    void drain() {
        if (pending_.empty()) return;
        LUCE_GPU_CHECK(cudaEventSynchronize(pending_.back().ev.stop));
        std::lock_guard<std::mutex> lock(g_mutex);
        for (auto &p : pending_) {
            float ms = 0.f;
            LUCE_GPU_CHECK(cudaEventElapsedTime(&ms, p.ev.start, p.ev.stop));
            OpTotal &t = g_totals[p.op];
            t.calls += 1;
            t.ms += ms;
            free_.push_back(p.ev);
        }
        pending_.clear();
    }

    GpuBackend *be_;
    cudaStream_t stream_;
    std::vector<Pending> pending_;
    std::vector<EventPair> free_;
};

}  // namespace

bool gpu_profile_enabled() {
    const char *v = std::getenv("LUCE_GPU_PROFILE");
    return v && *v && std::strcmp(v, "0") != 0;
}

Backend *gpu_profile_wrap(GpuBackend *be) { return new ProfiledBackend(be); }

}  // namespace luce

extern "C" void luce_gpu_profile_reset(void) {
    std::lock_guard<std::mutex> lock(luce::g_mutex);
    luce::g_totals.clear();
}

// One line per op, "name calls total_ms", slowest first; returns the length the full table needs
// (so a caller can retry with a larger buffer), writing at most len - 1 bytes plus the NUL.
extern "C" int64_t luce_gpu_profile_table(char *buf, size_t len) {
    std::vector<std::pair<std::string, luce::OpTotal>> rows;
    {
        std::lock_guard<std::mutex> lock(luce::g_mutex);
        rows.assign(luce::g_totals.begin(), luce::g_totals.end());
    }
    std::sort(rows.begin(), rows.end(), [](const auto &a, const auto &b) { return a.second.ms > b.second.ms; });
    std::string text;
    char line[160];
    for (auto &[name, t] : rows) {
        std::snprintf(line, sizeof line, "%s %lld %.6f\n", name.c_str(), (long long)t.calls, t.ms);
        text += line;
    }
    if (buf && len) std::snprintf(buf, len, "%s", text.c_str());
    return int64_t(text.size());
}
