// bench_ggml.cpp — the peer for native/dev/bench_quants.py: single-thread speed of ggml's own
// CPU mul_mat (llama.cpp's CPU matmul: activations quantized to the type's vec_dot format, then
// vec_dot per row) on the same shapes and the same kind of random blocks. Not part of the build.
//
//   git clone https://github.com/ggml-org/ggml /tmp/ggml-src && cd /tmp/ggml-src
//   cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX2=ON \
//     -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON \
//     -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
//     -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF && ninja -C build ggml
//   g++ -O2 -std=c++17 native/dev/bench_ggml.cpp -I/tmp/ggml-src/include \
//     /tmp/ggml-src/build/src/libggml.a /tmp/ggml-src/build/src/libggml-cpu.a \
//     /tmp/ggml-src/build/src/libggml-base.a -lpthread -o /tmp/bench_ggml
//   /tmp/bench_ggml 4096 4096 1,4,32           # every type, ggml's vec_dot path
//   /tmp/bench_ggml 4096 4096 1,4,32 repack    # Q4_K in llama.cpp's CPU_REPACK buffer
//
// Plain ggml contexts use ggml's vec_dot path. llama.cpp by default also places some weights in
// the CPU "repack" buffer (interleaved 8-row layouts with their own gemv/gemm); on x86 that
// covers Q4_0, Q4_K, Q2_K, IQ4_NL and MXFP4 among luce's peers only Q4_K, measured by `repack`.
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

static double thread_seconds() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Offsets of the f16 scales per block, as in bench_quants.py (0.01 there too).
static std::vector<int> f16_fields(ggml_type t) {
    switch (t) {
        case GGML_TYPE_Q8_0: case GGML_TYPE_IQ4_XS: return {0};
        case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: return {0, 2};
        case GGML_TYPE_Q6_K: return {208};
        default: return {};
    }
}

static void fill_blocks(uint8_t *wd, size_t wbytes, ggml_type type, int64_t n, uint64_t &seed) {
    for (size_t i = 0; i < wbytes; ++i) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        wd[i] = uint8_t(seed >> 56);
    }
    const int64_t bs = ggml_blck_size(type), ts = ggml_type_size(type);
    const ggml_fp16_t scale = ggml_fp32_to_fp16(0.01f);
    for (int64_t b = 0; b < n / bs; ++b)
        for (int off : f16_fields(type)) memcpy(wd + b * ts + off, &scale, 2);
}

// Q4_K through the CPU backend with the weight in the CPU_REPACK buffer type.
static int bench_repack(int64_t rows, int64_t cols, const std::vector<int> &toks) {
    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, 1);
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts");
    ggml_backend_buffer_type_t repack = nullptr;
    for (ggml_backend_buffer_type_t *b = get_extra ? get_extra(dev) : nullptr; b && *b; ++b)
        if (strstr(ggml_backend_buft_name(*b), "REPACK")) repack = *b;
    if (!repack) { fprintf(stderr, "no CPU_REPACK buffer type in this build\n"); return 1; }
    const ggml_type type = GGML_TYPE_Q4_K;
    ggml_init_params wp = {ggml_tensor_overhead() * 4, nullptr, true};
    ggml_context *wctx = ggml_init(wp);
    ggml_tensor *w = ggml_new_tensor_2d(wctx, type, cols, rows);
    ggml_backend_alloc_ctx_tensors_from_buft(wctx, repack);
    const size_t wbytes = ggml_row_size(type, cols) * rows;
    std::vector<uint8_t> host(wbytes);
    uint64_t seed = 1;
    fill_blocks(host.data(), wbytes, type, rows * cols, seed);
    ggml_backend_tensor_set(w, host.data(), 0, wbytes);  // repacks
    printf("%-8s %5s %9s %7s %8s   (%s)\n", "type", "n_tok", "ms", "GB/s", "GFLOP/s", ggml_backend_buft_name(repack));
    for (int n_tok : toks) {
        ggml_init_params ip = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
        ggml_context *ctx = ggml_init(ip);
        ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols, n_tok);
        ggml_tensor *y = ggml_mul_mat(ctx, w, x);
        ggml_cgraph *gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, y);
        ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(be));
        ggml_gallocr_alloc_graph(galloc, gf);
        std::vector<float> xs(size_t(cols) * n_tok);
        for (size_t i = 0; i < xs.size(); ++i) xs[i] = float(i % 17) / 17.0f - 0.5f;
        ggml_backend_tensor_set(x, xs.data(), 0, xs.size() * 4);
        ggml_backend_graph_compute(be, gf);  // warm-up
        double best = 1e30;
        for (int rep = 0; rep < 15; ++rep) {
            const double t0 = thread_seconds();
            ggml_backend_graph_compute(be, gf);
            const double dt = thread_seconds() - t0;
            best = dt < best ? dt : best;
        }
        printf("%-8s %5d %9.3f %7.2f %8.1f\n", "q4_K", n_tok, best * 1e3, wbytes / best / 1e9,
               2.0 * rows * cols * n_tok / best / 1e9);
        ggml_gallocr_free(galloc);
        ggml_free(ctx);
    }
    return 0;
}

int main(int argc, char **argv) {
    const int64_t rows = argc > 1 ? atoll(argv[1]) : 4096, cols = argc > 2 ? atoll(argv[2]) : 4096;
    std::vector<int> toks;
    for (char *p = strtok(argc > 3 ? argv[3] : (char *)"1,4,32", ","); p; p = strtok(nullptr, ",")) toks.push_back(atoi(p));
    const ggml_type types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0,
                               GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS};
    ggml_cpu_init();
    if (argc > 4 && strcmp(argv[4], "repack") == 0) return bench_repack(rows, cols, toks);
    printf("%-8s %5s %9s %7s %8s\n", "type", "n_tok", "ms", "GB/s", "GFLOP/s");
    uint64_t seed = 1;
    for (ggml_type type : types) {
        for (int n_tok : toks) {
            const size_t wbytes = ggml_row_size(type, cols) * rows;
            ggml_init_params ip = {wbytes + size_t(cols + rows) * n_tok * 4 * 2 + (size_t(64) << 20), nullptr, false};
            ggml_context *ctx = ggml_init(ip);
            ggml_tensor *w = ggml_new_tensor_2d(ctx, type, cols, rows);
            ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols, n_tok);
            uint8_t *wd = (uint8_t *)w->data;
            for (size_t i = 0; i < wbytes; ++i) {
                seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
                wd[i] = uint8_t(seed >> 56);
            }
            const int64_t bs = ggml_blck_size(type), ts = ggml_type_size(type);
            if (type == GGML_TYPE_F16 || type == GGML_TYPE_BF16 || type == GGML_TYPE_F32) {
                for (int64_t i = 0; i < rows * cols; ++i) {
                    const float v = float((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
                    if (type == GGML_TYPE_F32) ((float *)wd)[i] = v;
                    else if (type == GGML_TYPE_F16) ((ggml_fp16_t *)wd)[i] = ggml_fp32_to_fp16(v);
                    else ((ggml_bf16_t *)wd)[i] = ggml_fp32_to_bf16(v);
                }
            } else {
                const ggml_fp16_t scale = ggml_fp32_to_fp16(0.01f);
                for (int64_t b = 0; b < rows * cols / bs; ++b)
                    for (int off : f16_fields(type)) memcpy(wd + b * ts + off, &scale, 2);
            }
            for (int64_t i = 0; i < cols * n_tok; ++i) ((float *)x->data)[i] = float(i % 17) / 17.0f - 0.5f;
            ggml_tensor *y = ggml_mul_mat(ctx, w, x);
            ggml_cgraph *gf = ggml_new_graph(ctx);
            ggml_build_forward_expand(gf, y);
            ggml_cplan plan = ggml_graph_plan(gf, 1, nullptr);
            std::vector<uint8_t> work(plan.work_size + 1);
            plan.work_data = work.data();
            ggml_graph_compute(gf, &plan);  // warm-up
            double best = 1e30;
            for (int rep = 0; rep < 15; ++rep) {
                const double t0 = thread_seconds();
                ggml_graph_compute(gf, &plan);
                const double dt = thread_seconds() - t0;
                best = dt < best ? dt : best;
            }
            printf("%-8s %5d %9.3f %7.2f %8.1f\n", ggml_type_name(type), n_tok, best * 1e3, wbytes / best / 1e9,
                   2.0 * rows * cols * n_tok / best / 1e9);
            ggml_free(ctx);
        }
    }
    return 0;
}
