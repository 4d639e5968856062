// backend_gpu.cu — GpuBackend: device memory, the stream, and one call per Backend op into the
// launchers of kernels.h. The math lives in the .cu file of each op family.
#include "backend_gpu.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "bulk_copy.cuh"
#include "kernels.h"
#include "quant_blocks.cuh"

namespace luce {

namespace {

constexpr double MIB = 1024.0 * 1024.0;
constexpr double GIB = MIB * 1024.0;
// Kept free beyond the weights at load: session buffers, KV cache of a modest context, the
// runtime's own workspace. A session that does not fit still fails cleanly when it allocates.
constexpr int64_t LOAD_RESERVE_BYTES = int64_t(512) << 20;
// Pinned staging ring for per-step uploads; larger uploads (weights at load) go direct.
constexpr size_t STAGING_BYTES = size_t(1) << 20;
constexpr size_t STAGED_MAX = 64 << 10;
// Widths from which the quantized matmuls run on the tensor cores (CUDA sm_80+). From the kernel
// bench (H200, 2026-12-04; cold weights), dp4a against the better tensor-core kernel: at 4 tokens
// IQ4_XS 17408x5120 53 us against 35 (fragment), Q8_0 17408x5120 86 against 69 (staged), Q5_K
// 32768x5120 95 against 93, Q6_K 5120x6144 37 against 36; at 2 tokens dp4a wins (IQ4_XS 33
// against 35, Q5_K 71 against 92). Past 4 dp4a's cost grows with T (Q5_K at 7 tokens: the lm
// head a DFlash 2 draft projects, 1151 us against 660 staged at 8).
constexpr int MMA_MIN_TOKENS = 4;
constexpr int GEMM_MIN_TOKENS = 16;  // prefill chunks of fewer tokens keep the contract kernels
// Norm rows at least this wide quantize their output for the next matmul (hidden states).
constexpr int FUSED_NORM_MIN_DIM = 1024;

// Starts every op but the matmul: any op may write the memory the quantized activations were
// made from, so they are forgotten; then brackets the rest of the op for LUCE_GPU_PROFILE.
#define LUCE_OP(key)   \
    forget_acts();     \
    LUCE_TIMED(key)
#define LUCE_TIMED(key) gpu::ProfileScope luce_op_scope_(profile_.get(), stream_, key)

bool env_is(const char *name, const char *value) {
    const char *v = std::getenv(name);
    return v && std::strcmp(v, value) == 0;
}

const char *type_name(int32_t type) {
    switch (type) {
        case GGML_F32: return "F32";
        case GGML_F16: return "F16";
        case GGML_BF16: return "BF16";
        case GGML_Q8_0: return "Q8_0";
        case GGML_Q4_K: return "Q4_K";
        case GGML_Q5_K: return "Q5_K";
        case GGML_Q6_K: return "Q6_K";
        case GGML_IQ4_XS: return "IQ4_XS";
        case GGML_Q4_0: return "Q4_0";
        case GGML_Q4_1: return "Q4_1";
        case GGML_Q5_0: return "Q5_0";
        case GGML_Q5_1: return "Q5_1";
        case GGML_IQ4_NL: return "IQ4_NL";
        case GGML_Q2_K: return "Q2_K";
        case GGML_Q3_K: return "Q3_K";
        case GGML_IQ2_XXS: return "IQ2_XXS";
        case GGML_IQ2_XS: return "IQ2_XS";
        case GGML_IQ2_S: return "IQ2_S";
        case GGML_IQ3_XXS: return "IQ3_XXS";
        case GGML_IQ3_S: return "IQ3_S";
        case GGML_IQ1_S: return "IQ1_S";
        case GGML_IQ1_M: return "IQ1_M";
        default: return "?";
    }
}

}  // namespace

GpuBackend::GpuBackend(int device_index) : device_(device_index) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();  // clear the "no device" error
        fail(LUCE_ERR_DEVICE, "no GPU device found (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    if (device_index < 0 || device_index >= n)
        fail(LUCE_ERR_DEVICE, "GPU index %d is out of range (%d device%s present)", device_index, n, n == 1 ? "" : "s");
    LUCE_GPU_CHECK(cudaSetDevice(device_index));
    cudaDeviceProp prop;
    LUCE_GPU_CHECK(cudaGetDeviceProperties(&prop, device_index));
    warp_ = prop.warpSize;
    n_sm_ = prop.multiProcessorCount;
    l2_bytes_ = size_t(std::max(0, prop.l2CacheSize));
#if defined(LUCE_HIP)
    name_ = std::string("hip:") + prop.name;
#else
    name_ = std::string("cuda:") + prop.name;
#endif
    LUCE_GPU_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    read_switches(prop);
    argmax_result_ = static_cast<int32_t *>(alloc(sizeof(int32_t)));
    // No pinned memory (locked-memory limits): uploads stay pageable, which is only slower.
    void *pinned = nullptr;
    if (cudaHostAlloc(&pinned, STAGING_BYTES, cudaHostAllocDefault) == cudaSuccess) staging_ = static_cast<char *>(pinned);
    else (void)cudaGetLastError();
}

// Switches, read once per backend (docs/gpu.md lists them).
void GpuBackend::read_switches(const cudaDeviceProp &prop) {
    exact_kernels_ = env_is("LUCE_GPU_KERNELS", "exact");
    choose_matmul_kernels(prop);
    attn_split_ = !env_is("LUCE_GPU_ATTN_SPLIT", "0");
    fused_attn_ = !env_is("LUCE_GPU_FUSED_ATTN", "0");
    gpu::grouped_attention = !env_is("LUCE_GPU_ATTN_GROUPED", "0");
    // Programmatic dependent launch (gpu_compat.h): Hopper and later, unless LUCE_GPU_PDL=0.
#if !defined(LUCE_HIP)
    gpu::dependent_launch = prop.major >= 9 && !env_is("LUCE_GPU_PDL", "0");
    gpu::frag_bulk_copies = gpu::bulk::bulk_copies_supported(prop.major) && !env_is("LUCE_GPU_BULK", "0");
    gpu::frag_bulk_tensor = !env_is("LUCE_GPU_BULK", "rows");
#endif
    delta_kernel_ = env_is("LUCE_GPU_DELTANET_REG", "0")     ? gpu::DeltaKernel::memory
                    : env_is("LUCE_GPU_DELTANET_EARLY", "0") ? gpu::DeltaKernel::registers
                                                             : gpu::DeltaKernel::registers_early;
    if (const char *prof = std::getenv("LUCE_GPU_PROFILE"); prof && *prof)
        profile_ = std::make_unique<gpu::OpProfile>(prof);
    // Step graphs unless LUCE_GPU_GRAPHS=0, and never under the profiler, whose per-op events
    // need the ops launched one by one.
    graphs_ = !env_is("LUCE_GPU_GRAPHS", "0") && !profile_;
}

void GpuBackend::choose_matmul_kernels(const cudaDeviceProp &prop) {
    // The dp4a and tensor-core int8 kernels give the same bits, so the width (and the weights)
    // pick one: tensor cores from MMA_MIN_TOKENS up where the device has them, fragments staged
    // per warp where gpu::mma_frag_serves says that measured faster, column groups staged per
    // block otherwise. LUCE_GPU_MATMUL=dp4a|mma forces dp4a or the tensor cores for every
    // width; =frag|staged also forces one tensor-core kernel (checks and measurements).
    const bool mma = gpu::mma_matmul_supported(prop.major);
    tensor_cores_ = mma;
    const char *choice = std::getenv("LUCE_GPU_MATMUL");
    const std::string forced = choice ? choice : "";
    // Prefill steps (set_prefill) use the prefill GEMM from GEMM_MIN_TOKENS up unless
    // LUCE_GPU_PREFILL_GEMM=0; LUCE_GPU_MATMUL=gemm forces it for every width it serves, prefill
    // or not (checks and measurements).
    if (mma) mma_min_tokens_ = MMA_MIN_TOKENS;
    // LUCE_GPU_MMA_MIN_TOKENS=2 or 3: A/B runs only (docs/gpu.md). At 2 tokens the fragment
    // kernel with tensor-map copies measured faster than dp4a on most of the 27B's matrices
    // (IQ4_XS 34816x5120 42.8 against 51.9 us, Q5_K 32768x5120 52.8 against 70.9, Q6_K
    // 1024x5120 10.9 against 17.9) but not all (IQ4_XS 16480x5120 24.7 against 21.6, Q8_0
    // 17408x5120 52.4 against 50.0), and a whole verify step of 2 only by the run's spread
    // (10.39 -> 10.12 ms; H200, 2026-12-04).
    if (mma && env_is("LUCE_GPU_MMA_MIN_TOKENS", "2")) mma_min_tokens_ = 2;
    if (mma && env_is("LUCE_GPU_MMA_MIN_TOKENS", "3")) mma_min_tokens_ = 3;
    if (mma && !env_is("LUCE_GPU_PREFILL_GEMM", "0")) gemm_min_tokens_ = GEMM_MIN_TOKENS;
    // LUCE_GPU_GEMM_SPLITS=1..8: the prefill GEMM's row splits forced (A/B runs only).
    if (const char *v = std::getenv("LUCE_GPU_GEMM_SPLITS")) gemm_splits_ = std::atoi(v);
    if (forced == "dp4a") {
        mma_min_tokens_ = gemm_min_tokens_ = NO_MMA;
    } else if (mma && (forced == "mma" || forced == "frag" || forced == "staged")) {
        mma_min_tokens_ = 1;
        gemm_min_tokens_ = NO_MMA;
    } else if (mma && forced == "gemm") {
        gemm_min_tokens_ = 1;
    }
    mma_kernel_ = forced == "frag" ? MmaKernel::frag : forced == "staged" ? MmaKernel::staged
                : forced == "gemm" ? MmaKernel::gemm : MmaKernel::by_shape;
}

GpuBackend::~GpuBackend() {
    if (stream_) (void)cudaStreamSynchronize(stream_);
    if (profile_) {
        profile_->write(name_.c_str());
        profile_.reset();
    }
    graph_clear();
    for (auto &[base, bytes] : allocations_) (void)cudaFree(reinterpret_cast<void *>(base));
    if (stream_) (void)cudaStreamDestroy(stream_);
    if (staging_) (void)cudaFreeHost(staging_);
}

bool GpuBackend::device_memory(int64_t &free, int64_t &total) const {
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    free = int64_t(f), total = int64_t(t);
    return true;
}

void *GpuBackend::alloc(size_t n_bytes) {
    forget_acts();  // the zeroing below may land where a freed activation buffer was
    const size_t bytes = std::max<size_t>(n_bytes, 64);
    void *p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        int64_t free = 0, total = 0;
        if (!device_memory(free, total)) fail(LUCE_ERR_DEVICE, "GPU memory exhausted: allocating %.1f MiB failed",
                                              double(bytes) / MIB);
        fail(LUCE_ERR_DEVICE, "GPU memory exhausted: allocating %.1f MiB failed (%.1f MiB free)",
             double(bytes) / MIB, double(free) / MIB);
    }
    allocations_[reinterpret_cast<uintptr_t>(p)] = bytes;
    count_alloc(bytes);
    LUCE_GPU_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));  // the contract: zero-initialised
    return p;
}

// Called from destructors (Session), so it never throws: at process exit the runtime may already
// be unloading, and a failed free leaks nothing the process still owns.
void GpuBackend::release(void *p) {
    if (!p) return;
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(p));
    if (it == allocations_.end()) return;
    (void)cudaStreamSynchronize(stream_);  // work still queued may read it
    (void)cudaFree(p);
    count_release(it->second);
    allocations_.erase(it);
}

// Scratch buffers grow to the largest request seen and are never shrunk (a step asks for the
// same shapes every time); growing frees the old buffer first, and with it every recorded step
// graph (they hold its address; each re-records after one eager run). Never called inside a
// graph capture: a step runs eagerly before it is recorded, which grows everything it needs.
void GpuBackend::grow(void *&buf, size_t &bytes, size_t need) {
    if (need <= bytes) return;
    if (buf) graph_clear();
    release(buf);
    buf = nullptr;
    bytes = 0;
    buf = alloc(need);
    bytes = need;
}

bool GpuBackend::owns(const void *p) const {
    const auto addr = reinterpret_cast<uintptr_t>(p);
    auto it = allocations_.upper_bound(addr);
    if (it == allocations_.begin()) return false;
    --it;
    return addr < it->first + it->second;
}

// Pageable host source: the copy has been staged when the call returns, so src may be reused.
// Small uploads are copied into the pinned ring first (the caller may reuse src at once either
// way); a slot is reused only after the stream has drained past it, checked once per lap.
void GpuBackend::upload(void *dst, const void *src, size_t n) {
    if (n == 0) return;
    LUCE_OP("upload");
    if (!staging_ || n > STAGED_MAX) {
        LUCE_GPU_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_));
        return;
    }
    const size_t slot = (n + 63) & ~size_t(63);
    if (staging_used_ + slot > STAGING_BYTES) {
        LUCE_GPU_CHECK(cudaStreamSynchronize(stream_));
        staging_used_ = 0;
    }
    char *p = staging_ + staging_used_;
    staging_used_ += slot;
    std::memcpy(p, src, n);
    LUCE_GPU_CHECK(cudaMemcpyAsync(dst, p, n, cudaMemcpyHostToDevice, stream_));
}

void GpuBackend::download(void *dst, const void *src, size_t n) {
    if (n == 0) return;
    {
        LUCE_OP("download");
        LUCE_GPU_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_));
    }
    LUCE_GPU_CHECK(cudaStreamSynchronize(stream_));
    if (profile_) profile_->collect();
}

void GpuBackend::copy(void *dst, const void *src, size_t n) {
    if (n == 0) return;
    LUCE_OP("copy");
    LUCE_GPU_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream_));
}

// The table goes up through the pinned ring (asynchronous; a step's ~150 copies are 3.6 KB). It
// starts at room for 1024 copies: each growth frees the old table, and with it the step graphs.
void GpuBackend::copy_batch(const CopyOp *ops, int n) {
    if (n < 1) return;
    LUCE_OP("copy_batch");
    size_t most = 0;
    for (int i = 0; i < n; ++i) most = std::max(most, ops[i].n_bytes);
    grow(copy_ops_, copy_ops_bytes_, sizeof(CopyOp) * size_t(std::max(n, 1024)));
    upload(copy_ops_, ops, sizeof(CopyOp) * size_t(n));
    gpu::copy_batch(stream_, static_cast<const CopyOp *>(copy_ops_), n, most);
}

void *GpuBackend::upload_weight(const Weight &w, size_t n_bytes) {
    // 16 zero bytes past the end: a bulk copy reads the 16-byte-aligned window around its rows.
    void *dst = alloc(n_bytes + 16);
    upload(dst, w.data, n_bytes);
    gpu::repack_weights(stream_, w.type, dst, int64_t(n_bytes));
    return dst;
}

// Quantized weights take int8 activations (the CPU fast path's contract: matmul_int8.cu's dp4a
// kernel, or from mma_min_tokens_ up a tensor-core one (matmul_mma_frag.cu where it serves,
// matmul_mma.cu otherwise); all sum in one order, so
// verify rows stay bit-identical to decode whichever runs) unless
// LUCE_GPU_KERNELS=exact asked for the fp32-activation kernels, the GPU twin of
// LUCE_CPU_KERNELS=exact. The activation scratch grows to the largest T x n_in seen. It must
// never grow while a CUDA graph is being captured (a capture may not allocate): a step is run
// eagerly before it is captured, which sizes the scratch for that step.
void GpuBackend::matmul(const Weight &w, const float *x, int T, float *y, int64_t ldy) {
    const MatmulOut out{&w, y, ldy};
    matmuls(x, T, &out, 1);
}

// Consecutive outputs of one quantized type and input width share one launch (RowSegments).
void GpuBackend::matmuls(const float *x, int T, const MatmulOut *out, int n) {
    for (int i = 0; i < n;) {
        const Weight &w0 = *out[i].w;
        if (w0.n_out < 1) {  // nothing to compute
            ++i;
            continue;
        }
        const bool int8 = !exact_kernels_ && gpu::act_block_of(w0.type) != 0;
        int j = i + 1;
        while (int8 && j < n && j - i < gpu::RowSegments::MAX && out[j].w->type == w0.type &&
               out[j].w->n_in == w0.n_in && out[j].w->n_out >= 1)
            ++j;
        matmul_launch(x, T, out + i, j - i);
        i = j;
    }
}

bool GpuBackend::frag_acts(int64_t T) const { return T >= mma_min_tokens_ && T <= gpu::MMA_FRAG_MAX_TOKENS; }

void GpuBackend::matmul_launch(const float *x, int T, const MatmulOut *out, int n) {
    const Weight &w0 = *out[0].w;
    if (T < 1) return;
    std::string key;
    if (profile_) {
        key = std::string("matmul ") + type_name(w0.type) + " ";
        for (int i = 0; i < n; ++i) key += (i ? "+" : "") + std::to_string(out[i].w->n_out);
        key += "x" + std::to_string(w0.n_in) + " T=" + std::to_string(T);
    }
    LUCE_TIMED(std::move(key));
    const int block = gpu::act_block_of(w0.type);
    if (exact_kernels_ || block == 0) {
        gpu::matmul(stream_, warp_, w0, x, T, out[0].y, out[0].ldy);  // n == 1 (matmuls groups int8 only)
    } else {
        // Matmuls that share their input quantize it once: the scratch still holds x's
        // quantization if only matmuls and ops that quantized their own output (x) ran since, none
        // of which wrote into x afterwards (checked below).
        const bool frag_copy = frag_acts(T);
        const bool have = acts_.x == x && acts_.n == T * w0.n_in && acts_.block == block &&
                          (!frag_copy || acts_.frag_n_in == w0.n_in);
        if (!have) grow(act_scratch_, act_scratch_bytes_, size_t(gpu::act_scratch_bytes(w0.n_in, T, frag_copy)));
        const gpu::ActScratch a = gpu::act_scratch_at(act_scratch_, w0.n_in, T, frag_copy);
        if (!have) gpu::quantize_acts(stream_, warp_, x, int(w0.n_in), T, block, a);
        gpu::RowSegments rows;
        for (int i = 0; i < n; ++i) {
            rows.w[i] = static_cast<const uint8_t *>(out[i].w->data);
            rows.y[i] = out[i].y;
            rows.ldy[i] = out[i].ldy;
            rows.end[i] = rows.start(i) + out[i].w->n_out;
            rows.n = i + 1;
        }
        const bool frag = T <= gpu::MMA_FRAG_MAX_TOKENS &&
                          (mma_kernel_ == MmaKernel::frag ||
                           (mma_kernel_ == MmaKernel::by_shape && gpu::mma_frag_serves(w0.type, w0.n_in, T)));
        const bool gemm = (prefill_ || mma_kernel_ == MmaKernel::gemm) && T >= gemm_min_tokens_ &&
                          gpu::gemm_serves(w0.type, w0.n_in);
        if (gemm) {
            const int splits = gpu::gemm_splits(rows.n_out(), w0.n_in, T, n_sm_, gemm_splits_);
            if (splits > 1) grow(gemm_scratch_, gemm_scratch_bytes_, sizeof(float) * size_t(splits * T * rows.n_out()));
            gpu::matmul_gemm(stream_, w0.type, w0.n_in, rows, T, a, splits, static_cast<float *>(gemm_scratch_));
        }
        else if (T < mma_min_tokens_) gpu::matmul_int8(stream_, w0.type, w0.n_in, rows, T, a);
        else if (frag) gpu::matmul_mma_frag(stream_, w0.type, w0.n_in, rows, T, a);
        else gpu::matmul_mma(stream_, w0.type, w0.n_in, rows, T, a);
        acts_ = {x, T * w0.n_in, block, frag_copy ? w0.n_in : 0};
        fused_block_ = block;
    }
    for (int i = 0; i < n && acts_.x; ++i) {  // an output overlapping the quantized source voids it
        const float *src_end = acts_.x + acts_.n, *y = out[i].y;
        const float *y_end = y + int64_t(T - 1) * out[i].ldy + out[i].w->n_out;
        if (y < src_end && acts_.x < y_end) forget_acts();
    }
}

void GpuBackend::get_rows(const Weight &w, const int32_t *ids, int T, float *out) {
    LUCE_OP("get_rows");
    gpu::get_rows(stream_, w, ids, T, out);
}

// The ops whose output is a matmul's input quantize it in the same launch (act_quant.cuh), in
// blocks of the last int8 matmul's type, and the scratch records it as its content (y, n values),
// so the matmul then finds its input quantized. Off under LUCE_GPU_KERNELS=exact, before any int8
// matmul ran (float-weight models), and where a row of the output (`row` values: one token's) is
// not a whole number of blocks. Like the matmul's, the scratch never grows inside a graph capture:
// the step ran eagerly first.
// The fragment-order copy is laid out for n / row rows of `row` values; a matmul of another shape
// (frag_n_in) quantizes its input again.
gpu::FusedQuant GpuBackend::quantize_output(const float *y, int64_t n, int64_t row) {
    if (exact_kernels_ || fused_block_ == 0 || row % fused_block_ != 0) return {};
    const int64_t T = n / row;
    const bool frag_copy = frag_acts(T);
    grow(act_scratch_, act_scratch_bytes_, size_t(gpu::act_scratch_bytes(row, int(T), frag_copy)));
    acts_ = {y, n, fused_block_, frag_copy ? row : 0};
    return gpu::fused_quant(gpu::act_scratch_at(act_scratch_, row, int(T), frag_copy), fused_block_);
}

void GpuBackend::rmsnorm(const float *x, int64_t x_stride, const float *w, int n_rows, int dim,
                         float eps, float *y, int64_t y_stride) {
    LUCE_OP("rmsnorm");
    // Hidden-state rows only: the per-head q/k norms (dim 256 on a 27B) feed attention.
    const int64_t n = int64_t(n_rows) * dim;
    const gpu::FusedQuant fq =
        y_stride == dim && dim >= FUSED_NORM_MIN_DIM ? quantize_output(y, n, dim) : gpu::FusedQuant{};
    gpu::rmsnorm(stream_, x, x_stride, w, n_rows, dim, eps, y, y_stride, fq);
}

void GpuBackend::rmsnorm_gated(float *o, const float *w, const float *z, int T, int n_heads, int dim, float eps) {
    LUCE_OP("rmsnorm_gated");
    const int64_t row = int64_t(n_heads) * dim;  // one token's values: the next matmul's input row
    const bool blocks = gpu::rmsnorm_gated_by_blocks(warp_, n_heads, dim);
    gpu::rmsnorm_gated(stream_, warp_, o, w, z, T, n_heads, dim, eps,
                       blocks ? quantize_output(o, T * row, row) : gpu::FusedQuant{});
}

void GpuBackend::mul_sigmoid(float *o, const float *g, int64_t g_stride, int n_rows, int dim) {
    LUCE_OP("mul_sigmoid");
    const int64_t n = int64_t(n_rows) * dim;
    gpu::mul_sigmoid(stream_, warp_, o, g, g_stride, n_rows, dim, quantize_output(o, n, dim));
}

void GpuBackend::swiglu(float *gate, const float *up, int n_rows, int64_t dim) {
    LUCE_OP("swiglu");
    const int64_t n = n_rows * dim;
    gpu::swiglu(stream_, warp_, gate, up, n, quantize_output(gate, n, dim));
}

void GpuBackend::add(float *x, const float *y, int64_t n) {
    LUCE_OP("add");
    gpu::add(stream_, x, y, n);
}

void GpuBackend::add_rmsnorm(float *x, const float *y, const float *w, int n_rows, int dim, float eps, float *out) {
    LUCE_OP("add_rmsnorm");
    gpu::add_rmsnorm(stream_, warp_, x, y, w, n_rows, dim, eps, out, quantize_output(out, int64_t(n_rows) * dim, dim));
}

void GpuBackend::rope_neox(float *x, const int32_t *pos, int T, int n_head, int head_dim, int n_rot,
                           float theta) {
    LUCE_OP("rope_neox");
    gpu::rope_neox(stream_, x, pos, T, n_head, head_dim, n_rot, theta);
}

void GpuBackend::hadamard_rows(float *x, int n_rows, int dim) {
    LUCE_OP("hadamard_rows");
    gpu::hadamard_rows(stream_, x, n_rows, dim);
}

void GpuBackend::kv_store(KvLayer &kv, const float *k, const float *v, const int32_t *pos, int T,
                          int n_head_kv, int head_dim) {
    LUCE_OP("kv_store");
    gpu::kv_store(stream_, kv, k, v, pos, T, n_head_kv, head_dim);
}

void GpuBackend::qk_norm_rope_store(const float *qg, const float *q_norm, float *q, float *k, const float *k_norm,
                                    const float *v, KvLayer &kv, const int32_t *pos, const int32_t *slot, int T,
                                    int n_head, int n_head_kv, int head_dim, int n_rot, float theta, float eps) {
    if (!fused_attn_)
        return Backend::qk_norm_rope_store(qg, q_norm, q, k, k_norm, v, kv, pos, slot, T, n_head, n_head_kv,
                                           head_dim, n_rot, theta, eps);
    LUCE_OP("qk_norm_rope_store");
    gpu::qk_norm_rope_store(stream_, qg, q_norm, q, k, k_norm, v, kv, pos, slot, T, n_head, n_head_kv, head_dim,
                            n_rot, theta, eps);
}

void GpuBackend::attention(const float *q, const KvLayer &kv, const int32_t *pos, const uint8_t *mask,
                           int T, int n_head, int n_head_kv, int head_dim, float *out) {
    LUCE_OP("attention");
    const size_t need = attn_split_ ? size_t(gpu::attention_scratch_bytes(T, n_head, head_dim, kv.n_ctx)) : 0;
    grow(attn_scratch_, attn_scratch_bytes_, need);
    gpu::attention(stream_, warp_, q, kv, pos, mask, T, n_head, n_head_kv, head_dim, out,
                   need ? attn_scratch_ : nullptr, int64_t(attn_scratch_bytes_));
}

void GpuBackend::attention_sequences(const float *qg, const float *q_norm, float *q, float *k, const float *k_norm,
                                     const float *v, const int32_t *pos, const AttentionRows *seqs, int n,
                                     int n_head, int n_head_kv, int head_dim, int n_rot, float theta, float eps,
                                     float *out) {
    if (!fused_attn_ || !gpu::attention_sequences_batch(seqs, n, pos)) {  // one sequence at a time
        Backend::attention_sequences(qg, q_norm, q, k, k_norm, v, pos, seqs, n, n_head, n_head_kv, head_dim, n_rot,
                                     theta, eps, out);
        return;
    }
    LUCE_OP("attention_sequences");
    int T = 0;
    for (int i = 0; i < n; ++i) T += seqs[i].T;
    const size_t need = attn_split_ ? size_t(gpu::attention_scratch_bytes(T, n_head, head_dim, seqs[0].kv->n_ctx)) : 0;
    grow(attn_scratch_, attn_scratch_bytes_, need);
    gpu::attention_sequences(stream_, warp_, qg, q_norm, q, k, k_norm, v, pos, seqs, n, n_head, n_head_kv, head_dim,
                             n_rot, theta, eps, out, need ? attn_scratch_ : nullptr, int64_t(attn_scratch_bytes_));
}

void GpuBackend::conv_silu(const float *x, float *state, const float *w, int T, int C, int Kc, float *out,
                           const int32_t *parent) {
    LUCE_OP("conv_silu");
    gpu::conv_silu(stream_, x, state, w, T, C, Kc, out, parent);
}

void GpuBackend::gated_delta_net(const float *conv, const float *b, const float *a, const float *ssm_a,
                                 const float *dt_bias, const DeltaNetDims &dims, int T, float *state,
                                 float *out, float *state_history, const int32_t *parent) {
    LUCE_OP("gated_delta_net");
    gpu::gated_delta_net(stream_, warp_, conv, b, a, ssm_a, dt_bias, dims, T, state, out, state_history,
                         delta_kernel_, parent);
}

void GpuBackend::deltanet_sequences(const float *qkv, const float *conv_w, int C, int Kc, float *conv_out,
                                    const float *b, const float *a, const float *ssm_a, const float *dt_bias,
                                    const DeltaNetDims &dims, const RecurrentRows *seqs, int n, float *out) {
    if (!gpu::deltanet_sequences_batch(Kc, dims, seqs, n, delta_kernel_)) {  // one sequence at a time
        Backend::deltanet_sequences(qkv, conv_w, C, Kc, conv_out, b, a, ssm_a, dt_bias, dims, seqs, n, out);
        return;
    }
    LUCE_OP("deltanet_sequences");
    gpu::deltanet_sequences(stream_, warp_, qkv, conv_w, C, Kc, conv_out, b, a, ssm_a, dt_bias, dims, seqs, n, out,
                            delta_kernel_);
}

// The generate loop hands argmax the host copy of the logits it downloaded for sampling; device
// rows (the speculative verify path) are reduced on the device and only the index comes back.
int32_t GpuBackend::argmax(const float *x, int64_t n) {
    if (n < 1) return 0;
    if (!owns(x)) {
        int64_t best = 0;
        for (int64_t i = 1; i < n; ++i)
            if (x[i] > x[best]) best = i;
        return int32_t(best);
    }
    argmax_rows(x, 1, n, argmax_result_);
    int32_t r = 0;
    download(&r, argmax_result_, sizeof r);
    return r;
}

// ---- Step graphs ---------------------------------------------------------------------------------
// A failure anywhere in recording turns graphs off for this backend (one eager path remains), so a
// runtime that cannot capture something degrades to eager launches instead of failing the step.

bool GpuBackend::graph_replay(uint64_t key) {
    if (!graphs_ || capturing_) return false;
    auto it = graph_execs_.find(key);
    if (it == graph_execs_.end()) return false;
    forget_acts();  // the replay rewrites the activation scratch behind the host's record of it
    LUCE_GPU_CHECK(cudaGraphLaunch(it->second, stream_));
    return true;
}

bool GpuBackend::graph_begin(uint64_t key) {
    if (!graphs_ || capturing_ || graph_execs_.count(key)) return false;
    if (graph_seen_[key]++ == 0) return false;  // first time: eager, scratch grows to this shape
    if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        (void)cudaGetLastError();
        graphs_ = false;
        return false;
    }
    capturing_ = true;
    return true;
}

bool GpuBackend::graph_end(uint64_t key) {
    if (!capturing_) return false;
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    cudaGraphExec_t exec = nullptr;
    if (e == cudaSuccess && graph) e = cudaGraphInstantiateWithFlags(&exec, graph, 0);
    if (graph) (void)cudaGraphDestroy(graph);
    if (e != cudaSuccess || !exec) {
        (void)cudaGetLastError();
        graphs_ = false;
        return false;
    }
    graph_execs_[key] = exec;
    LUCE_GPU_CHECK(cudaGraphLaunch(exec, stream_));
    return true;
}

void GpuBackend::graph_abort() {
    if (!capturing_) return;
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    (void)cudaStreamEndCapture(stream_, &graph);
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    graphs_ = false;
}

void GpuBackend::graph_clear() {
    for (auto &[key, exec] : graph_execs_) (void)cudaGraphExecDestroy(exec);
    graph_execs_.clear();
    graph_seen_.clear();
}

// ---- Drafter ops (backend.h's last block; kernels in drafter.cu) -----------------------------------

void GpuBackend::rope_table(float *x, const int32_t *pos, int T, int n_head, int head_dim, const float *inv_freq,
                            float mscale) {
    LUCE_OP("rope_table");
    gpu::rope_table(stream_, x, pos, T, n_head, head_dim, inv_freq, mscale);
}

void GpuBackend::drafter_masks(uint8_t *masks, int rows, int cap, const int32_t *pos, int B, int window,
                               unsigned variants) {
    LUCE_OP("drafter_masks");
    gpu::drafter_masks(stream_, masks, rows, cap, pos, B, window, variants);
}

void GpuBackend::dyn_conv(const float *base, const float *dyn, int64_t dyn_stride, const float *in, int B, int E,
                          int K, int group, float *out) {
    LUCE_OP("dyn_conv");
    gpu::dyn_conv(stream_, base, dyn, dyn_stride, in, B, E, K, group, out);
}

void GpuBackend::softcap(float *x, int64_t n, float mult, float cap) {
    LUCE_OP("softcap");
    gpu::softcap(stream_, x, n, mult, cap);
}

void GpuBackend::argmax_rows(const float *x, int n_rows, int64_t n, int32_t *out) {
    LUCE_OP("argmax_rows");
    grow(topk_scratch_, topk_scratch_bytes_, size_t(gpu::topk_scratch_bytes(n_rows, n, 1)));
    gpu::argmax_rows(stream_, x, n_rows, n, out, topk_scratch_);
}

void GpuBackend::topk_rows(const float *x, int n_rows, int64_t n, int k, int32_t *ids, float *vals) {
    LUCE_OP("topk_rows");
    const size_t need = size_t(gpu::topk_scratch_bytes(n_rows, n, k));
    grow(topk_scratch_, topk_scratch_bytes_, need);
    gpu::topk_rows(stream_, x, n_rows, n, k, ids, vals, topk_scratch_);
}

void GpuBackend::selector_pairs(const float *hproj, const float *pred, const float *succ, int n_rows, int k, int R,
                                float *out) {
    LUCE_OP("selector_pairs");
    gpu::selector_pairs(stream_, hproj, pred, succ, n_rows, k, R, out);
}

void GpuBackend::confidence(const float *h, const float *e, const float *w, float b, int E, int R, float *out) {
    LUCE_OP("confidence");
    gpu::confidence(stream_, h, e, w, b, E, R, out);
}

void GpuBackend::copy_rows(void *dst, int64_t dst_stride, const void *src, int64_t src_stride, int64_t width,
                           int n_rows) {
    LUCE_OP("copy_rows");
    gpu::copy_rows(stream_, dst, dst_stride, src, src_stride, width, n_rows);
}

}  // namespace luce

extern "C" luce_status luce_gpu_open(int32_t device_index, int64_t bytes_needed, luce::Backend **out,
                                     char *err, size_t err_len) {
    auto report = [&](const char *msg) {
        if (err && err_len) std::snprintf(err, err_len, "%s", msg);
    };
    try {
        auto be = std::make_unique<luce::GpuBackend>(device_index);
        int64_t free = 0, total = 0;
        if (!be->device_memory(free, total))
            luce::fail(LUCE_ERR_DEVICE, "cannot read the free memory of %s", be->name());
        const int64_t need = bytes_needed + luce::LOAD_RESERVE_BYTES;
        if (free < need) {
            char msg[512];
            std::snprintf(msg, sizeof msg,
                          "not enough GPU memory on %s: the model needs %.2f GiB (weights + %.1f GiB reserve), "
                          "%.2f GiB are free",
                          be->name(), double(need) / luce::GIB, double(luce::LOAD_RESERVE_BYTES) / luce::GIB,
                          double(free) / luce::GIB);
            report(msg);
            return LUCE_ERR_DEVICE;
        }
        *out = be.release();
        return LUCE_OK;
    } catch (const luce::Error &e) {
        report(e.what());
        return e.status;
    } catch (const std::exception &e) {
        report(e.what());
        return LUCE_ERR_INTERNAL;
    }
}

// Test hook for tools/gpu_check.py: the device's name as the backend reports it ("cuda:...",
// "hip:...") and whether its int8 matmuls have tensor-core kernels, so the checks skip forcing
// kernels a device does not have (they would run the dp4a kernel again).
extern "C" luce_status luce_gpu_device_info(int32_t device_index, char *name, size_t name_len,
                                            int32_t *tensor_core_matmuls, char *err, size_t err_len) {
    try {
        luce::GpuBackend be(device_index);
        if (name && name_len) std::snprintf(name, name_len, "%s", be.name());
        if (tensor_core_matmuls) *tensor_core_matmuls = be.tensor_core_matmuls() ? 1 : 0;
        return LUCE_OK;
    } catch (const luce::Error &e) {
        if (err && err_len) std::snprintf(err, err_len, "%s", e.what());
        return e.status;
    }
}

namespace {
// Microseconds a call of call(i), i = 0 .. reps - 1, queued back to back on stream.
template <class Call>
float time_calls(cudaStream_t stream, int reps, Call call) {
    cudaEvent_t start, stop;
    LUCE_GPU_CHECK(cudaEventCreate(&start));
    LUCE_GPU_CHECK(cudaEventCreate(&stop));
    LUCE_GPU_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < reps; ++i) call(i);
    LUCE_GPU_CHECK(cudaEventRecord(stop, stream));
    LUCE_GPU_CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    LUCE_GPU_CHECK(cudaEventElapsedTime(&ms, start, stop));
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    return 1000.f * ms / float(reps);
}
}  // namespace

// Each call reads its own copy of the weights, the copies together at least four times the L2
// (H200: 50 MB, which holds most of a 47 MB FFN matrix): timed back to back on one copy, a
// matmul reads its weights from the L2 and looks faster than in a model step, where every matrix
// is read once (H200, 2026-12-04, the same kernel: Q6_K 1024x5120 11.1 us on one copy, 15.7 on
// copies).
float luce::GpuBackend::time_matmul(const luce::Weight &w, size_t w_bytes, const float *x, int T, float *y, int reps) {
    const size_t n_copies = std::min<size_t>(64, std::max<size_t>(1, (4 * l2_bytes_ + w_bytes - 1) / w_bytes));
    std::vector<Weight> copies(n_copies, w);
    for (size_t i = 1; i < n_copies; ++i) {
        void *p = alloc(w_bytes);
        LUCE_GPU_CHECK(cudaMemcpyAsync(p, w.data, w_bytes, cudaMemcpyDeviceToDevice, stream_));
        copies[i].data = p;
    }
    matmul(copies[n_copies - 1], x, T, y, w.n_out);  // warm-up: quantizes x, loads the kernel
    return time_calls(stream_, reps, [&](int i) { matmul(copies[size_t(i) % n_copies], x, T, y, w.n_out); });
}

// Test hook for tools/gpu_check.py: one matmul on the device, y[t][r] = sum_c W[r][c] x[t][c]
// (host in, host out; the CPU twin is luce_matmul in luce.h), so each weight type can be checked
// against gguf.quants' dequantization by itself, apart from the model. timing_reps > 0 then times
// that many more calls into *us_per_call (microseconds each; the activations stay quantized from
// the first call, so this is the matmul kernel alone, its weights read from DRAM: time_matmul).
extern "C" luce_status luce_gpu_matmul(int32_t device_index, int32_t type, const void *weights, size_t nbytes,
                                       int64_t n_rows, int64_t n_cols, const float *x, int64_t n_tok, float *y,
                                       int32_t timing_reps, float *us_per_call, char *err, size_t err_len) {
    try {
        if (n_tok < 1 || n_tok > 4096 || n_rows < 1 || n_cols < 1 || luce::gpu::block_bytes(type) == 0 ||
            n_cols % luce::gpu::block_elems(type) != 0 ||
            size_t(n_cols / luce::gpu::block_elems(type) * luce::gpu::block_bytes(type) * n_rows) != nbytes)
            luce::fail(LUCE_ERR_INVALID_ARGUMENT, "luce_gpu_matmul: bad shape or size");
        luce::GpuBackend be(device_index);
        luce::Weight wt;
        wt.type = type;
        wt.n_in = n_cols;
        wt.n_out = n_rows;
        wt.data = weights;                       // the host bytes upload_weight reads,
        wt.data = be.upload_weight(wt, nbytes);  // then as a model's weights (the GPU layout)
        auto *xd = static_cast<float *>(be.alloc(sizeof(float) * size_t(n_tok * n_cols)));
        auto *yd = static_cast<float *>(be.alloc(sizeof(float) * size_t(n_tok * n_rows)));
        be.upload(xd, x, sizeof(float) * size_t(n_tok * n_cols));
        be.matmul(wt, xd, int(n_tok), yd, n_rows);
        be.download(y, yd, sizeof(float) * size_t(n_tok * n_rows));
        if (timing_reps > 0 && us_per_call) *us_per_call = be.time_matmul(wt, nbytes, xd, int(n_tok), yd, timing_reps);
        return LUCE_OK;
    } catch (const luce::Error &e) {
        if (err && err_len) std::snprintf(err, err_len, "%s", e.what());
        return e.status;
    }
}

// Test hook for tools/gpu_check.py: one attention call on the device, host buffers in and out:
// q [T][H][D], k and v [Hkv][n_ctx][D] f32, stored as cache rows of types k_type and v_type (f32
// rows as given; the others through the cache store kernel), pos [T], mask [T][n_ctx] or null,
// out [T][H][D]. split != 0 takes the split-KV path where the shape has one, 0 the one-pass kernel,
// so both can be checked against an independent reference (float64 numpy) on random inputs.
extern "C" luce_status luce_gpu_attention(int32_t device_index, const float *q, const float *k, const float *v,
                                          const int32_t *pos, const uint8_t *mask, int32_t T, int32_t n_head,
                                          int32_t n_head_kv, int32_t head_dim, int32_t n_ctx, int32_t split,
                                          int32_t k_type, int32_t v_type, int32_t timing_reps, float *us_per_call,
                                          float *out, char *err, size_t err_len) {
    try {
        const auto known = [](int32_t t) { return t >= int32_t(luce::KvType::F32) && t <= int32_t(luce::KvType::Q4_0); };
        if (T < 1 || T > 4096 || n_head < 1 || n_head_kv < 1 || n_head % n_head_kv != 0 || head_dim < 1 ||
            head_dim > 1024 || n_ctx < 1 || n_ctx > (1 << 20) || !q || !k || !v || !pos || !out || !known(k_type) ||
            !known(v_type) || timing_reps < 0 || (timing_reps > 0 && !us_per_call))
            luce::fail(LUCE_ERR_INVALID_ARGUMENT, "luce_gpu_attention: bad shape");
        const luce::KvType tk = luce::KvType(k_type), tv = luce::KvType(v_type);
        if ((luce::kv_quantized(tk) || luce::kv_quantized(tv)) && head_dim % luce::KV_BLOCK != 0)
            luce::fail(LUCE_ERR_INVALID_ARGUMENT, "luce_gpu_attention: bad shape");
        for (int t = 0; t < T; ++t)
            if (pos[t] < 0 || pos[t] >= n_ctx) luce::fail(LUCE_ERR_INVALID_ARGUMENT, "luce_gpu_attention: bad pos");
        luce::GpuBackend be(device_index);
        const size_t qn = size_t(T) * n_head * head_dim, kvn = size_t(n_head_kv) * n_ctx * head_dim;
        auto *qd = static_cast<float *>(be.alloc(qn * sizeof(float)));
        auto *od = static_cast<float *>(be.alloc(qn * sizeof(float)));
        luce::KvLayer kv;
        kv.format.k = tk, kv.format.v = tv;
        kv.k = be.alloc(size_t(n_head_kv) * n_ctx * luce::kv_row_bytes(tk, head_dim));
        kv.v = be.alloc(size_t(n_head_kv) * n_ctx * luce::kv_row_bytes(tv, head_dim));
        kv.n_ctx = n_ctx;
        if (tk == luce::KvType::F32 && tv == luce::KvType::F32) {  // as given: NaN rows stay NaN
            be.upload(kv.k, k, kvn * sizeof(float));
            be.upload(kv.v, v, kvn * sizeof(float));
        } else {  // the store kernel takes rows [position][Hkv][D]
            std::vector<float> kt(kvn), vt(kvn);
            std::vector<int32_t> all(static_cast<size_t>(n_ctx));
            for (int j = 0; j < n_ctx; ++j) {
                all[size_t(j)] = j;
                for (int h = 0; h < n_head_kv; ++h) {
                    const size_t src = (size_t(h) * n_ctx + j) * head_dim, dst = (size_t(j) * n_head_kv + h) * head_dim;
                    std::copy(k + src, k + src + head_dim, kt.begin() + std::ptrdiff_t(dst));
                    std::copy(v + src, v + src + head_dim, vt.begin() + std::ptrdiff_t(dst));
                }
            }
            auto *kf = static_cast<float *>(be.alloc(kvn * sizeof(float)));
            auto *vf = static_cast<float *>(be.alloc(kvn * sizeof(float)));
            auto *pa = static_cast<int32_t *>(be.alloc(size_t(n_ctx) * sizeof(int32_t)));
            be.upload(kf, kt.data(), kvn * sizeof(float));
            be.upload(vf, vt.data(), kvn * sizeof(float));
            be.upload(pa, all.data(), size_t(n_ctx) * sizeof(int32_t));
            luce::gpu::kv_store(be.stream(), kv, kf, vf, pa, n_ctx, n_head_kv, head_dim);
        }
        auto *pd = static_cast<int32_t *>(be.alloc(size_t(T) * sizeof(int32_t)));
        uint8_t *md = mask ? static_cast<uint8_t *>(be.alloc(size_t(T) * n_ctx)) : nullptr;
        be.upload(qd, q, qn * sizeof(float));
        be.upload(pd, pos, size_t(T) * sizeof(int32_t));
        if (md) be.upload(md, mask, size_t(T) * n_ctx);
        const int64_t scratch_bytes = split ? luce::gpu::attention_scratch_bytes(T, n_head, head_dim, n_ctx) : 0;
        void *scratch = scratch_bytes ? be.alloc(size_t(scratch_bytes)) : nullptr;
        const auto call = [&](int) {
            luce::gpu::attention(be.stream(), be.warp_size(), qd, kv, pd, md, T, n_head, n_head_kv, head_dim, od,
                                 scratch, scratch_bytes);
        };
        call(0);
        be.download(out, od, qn * sizeof(float));
        if (timing_reps > 0) *us_per_call = time_calls(be.stream(), timing_reps, call);
        return LUCE_OK;
    } catch (const luce::Error &e) {
        if (err && err_len) std::snprintf(err, err_len, "%s", e.what());
        return e.status;
    }
}

// Test hook for tools/gpu_check.py: the drafter's selections on the device, host buffers in and
// out: k == 0 is argmax_rows (ids [n_rows]), k >= 1 topk_rows (ids and vals [n_rows][k]), so both
// are checked against numpy's stable orderings on rows with ties across chunks.
extern "C" luce_status luce_gpu_select(int32_t device_index, const float *x, int32_t n_rows, int64_t n, int32_t k,
                                       int32_t *ids, float *vals, char *err, size_t err_len) {
    try {
        if (n_rows < 1 || n < 1 || n > INT32_MAX || k < 0 || k > 256 || k > n || !x || !ids || (k > 0 && !vals))
            luce::fail(LUCE_ERR_INVALID_ARGUMENT, "luce_gpu_select: bad shape");
        luce::GpuBackend be(device_index);
        const size_t xn = size_t(n_rows) * size_t(n), kn = size_t(n_rows) * size_t(k > 0 ? k : 1);
        auto *xd = static_cast<float *>(be.alloc(xn * sizeof(float)));
        auto *id = static_cast<int32_t *>(be.alloc(kn * sizeof(int32_t)));
        auto *vd = static_cast<float *>(be.alloc(kn * sizeof(float)));
        be.upload(xd, x, xn * sizeof(float));
        if (k == 0) {
            be.argmax_rows(xd, n_rows, n, id);
        } else {
            be.topk_rows(xd, n_rows, n, k, id, vd);
            be.download(vals, vd, kn * sizeof(float));
        }
        be.download(ids, id, kn * sizeof(int32_t));
        return LUCE_OK;
    } catch (const luce::Error &e) {
        if (err && err_len) std::snprintf(err, err_len, "%s", e.what());
        return e.status;
    }
}

// Test hook for tools/gpu_check.py: one gated_delta_net call on the device over T tokens, host
// buffers in and out (state [HV][DK][DV] is read and advanced; history [T][HV][DK][DV] may be
// null). registers: 0 the device-memory kernel, 1 the register-resident one where DK has one, 2
// that one with its state loaded early (gpu::DeltaKernel), so each is checked against float64
// numpy. parent (may be null; needs history): tree
// mode, token t starting from token parent[t]'s state (< 0: the initial state), which is left as is.
extern "C" luce_status luce_gpu_deltanet(int32_t device_index, const float *conv, const float *b, const float *a,
                                         const float *ssm_a, const float *dt_bias, int32_t hk, int32_t hv, int32_t dk,
                                         int32_t dv, float eps, int32_t T, float *state, float *out, float *history,
                                         int32_t registers, const int32_t *parent, char *err, size_t err_len) {
    try {
        if (T < 1 || T > 4096 || hk < 1 || hv < 1 || hv % hk != 0 || dk < 1 || dk > 1024 || dv < 1 || dv > 4096 ||
            registers < 0 || registers > 2 || !conv || !b || !a || !ssm_a || !dt_bias || !state || !out ||
            (parent && !history))
            luce::fail(LUCE_ERR_INVALID_ARGUMENT, "luce_gpu_deltanet: bad shape");
        for (int32_t t = 0; parent && t < T; ++t)
            if (parent[t] >= t) luce::fail(LUCE_ERR_INVALID_ARGUMENT, "luce_gpu_deltanet: parent[%d] = %d", t, parent[t]);
        luce::GpuBackend be(device_index);
        const size_t cd = size_t(2 * hk * dk + hv * dv), ss = size_t(hv) * dk * dv;
        auto dev = [&](const float *src, size_t n) {
            auto *p = static_cast<float *>(be.alloc(n * sizeof(float)));
            if (src) be.upload(p, src, n * sizeof(float));
            return p;
        };
        float *cd_d = dev(conv, size_t(T) * cd), *b_d = dev(b, size_t(T) * hv), *a_d = dev(a, size_t(T) * hv);
        float *sa_d = dev(ssm_a, size_t(hv)), *dt_d = dev(dt_bias, size_t(hv)), *st_d = dev(state, ss);
        float *out_d = dev(nullptr, size_t(T) * hv * dv), *hist_d = history ? dev(nullptr, size_t(T) * ss) : nullptr;
        int32_t *parent_d = nullptr;
        if (parent) {
            parent_d = static_cast<int32_t *>(be.alloc(size_t(T) * sizeof(int32_t)));
            be.upload(parent_d, parent, size_t(T) * sizeof(int32_t));
        }
        const luce::DeltaNetDims dims{hk, hv, dk, dv, eps};
        luce::gpu::gated_delta_net(be.stream(), be.warp_size(), cd_d, b_d, a_d, sa_d, dt_d, dims, T, st_d, out_d, hist_d,
                                   luce::gpu::DeltaKernel(registers), parent_d);
        be.download(out, out_d, size_t(T) * hv * dv * sizeof(float));
        be.download(state, st_d, ss * sizeof(float));
        if (history) be.download(history, hist_d, size_t(T) * ss * sizeof(float));
        return LUCE_OK;
    } catch (const luce::Error &e) {
        if (err && err_len) std::snprintf(err, err_len, "%s", e.what());
        return e.status;
    }
}
