// Host program for tests/test_gpu_layouts.py: GGUF blocks of one quantized type on stdin -> their
// values through the GPU's weight layout, float32 on stdout. It runs the functions the device
// runs (native/gpu/quant_blocks.cuh): the upload's conversion to the GPU layout
// (iq4_xs_codes_to_gpu for IQ4_XS and IQ4_NL, q6_k_block_to_gpu, as repack_weights applies them) and the dequantizer
// that reads that layout (load_unit), so the test can hold them to gguf's own dequantization
// on a machine without a GPU. Usage: gpu_layouts iq4_xs|iq4_nl|q6_k < blocks > values
//
// Also the bulk copies' windows (native/gpu/bulk_copy.cuh): gpu_layouts windows SPAN prints, for
// a run of SPAN bytes at each offset 0..63, "a end first bytes max" with the window the device
// copies and the buffer size it relies on; gpu_layouts boxes SPAN prints, for each lead 0..15,
// "lead box" with the tensor-map box width bulk::box_bytes gives.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "bulk_copy.cuh"
#include "quant_blocks.cuh"

using namespace luce;
using namespace luce::gpu;

namespace {

// The tensor's bytes as repack_weights leaves them on the device.
std::vector<uint8_t> to_gpu_layout(int type, const std::vector<uint8_t> &gguf) {
    const int block = block_bytes(type);
    std::vector<uint8_t> gpu(gguf);  // operator new: 16-aligned, as a cudaMalloc'd tensor is 256-aligned
    for (size_t b = 0; b < gguf.size() / block; ++b) {
        const uint8_t *in = gguf.data() + b * block;
        uint8_t *out = gpu.data() + b * block;
        if (type == GGML_Q6_K) {
            q6_k_block_to_gpu(in, out, b % 2 != 0);
        } else if (type == GGML_IQ4_NL) {
            iq4_xs_codes_to_gpu(in + 2, out + 2);  // f16 d; qs[16]
        } else {
            for (int ib = 0; ib < 8; ++ib) iq4_xs_codes_to_gpu(in + 8 + 16 * ib, out + 8 + 16 * ib);
        }
    }
    return gpu;
}

template <int TYPE>
std::vector<float> values(const std::vector<uint8_t> &gpu) {
    const int64_t n_units = int64_t(gpu.size() / block_bytes(TYPE)) * (block_elems(TYPE) / 32);
    std::vector<float> y(size_t(n_units) * 32);
    for (int64_t u = 0; u < n_units; ++u) load_unit<TYPE>(gpu.data(), u, 32, y.data() + 32 * u);
    return y;
}

}  // namespace

int print_windows(const char *span_arg) {
    const int span = std::atoi(span_arg);
    if (span < 1 || span > 1 << 20) {
        std::fprintf(stderr, "gpu_layouts: bad span %s\n", span_arg);
        return 2;
    }
    for (uintptr_t a = 4096; a < 4096 + 64; ++a) {
        uint32_t bytes = 0;
        const uintptr_t first = bulk::aligned_window(a, a + uintptr_t(span), bytes);
        std::printf("%ju %ju %ju %u %d\n", uintmax_t(a), uintmax_t(a + span), uintmax_t(first), bytes,
                    bulk::max_window_bytes(span));
    }
    return 0;
}

int print_boxes(const char *span_arg) {
    const int span = std::atoi(span_arg);
    if (span < 1 || span > 1 << 20) {
        std::fprintf(stderr, "gpu_layouts: bad span %s\n", span_arg);
        return 2;
    }
    for (int lead = 0; lead < 16; ++lead) std::printf("%d %d\n", lead, bulk::box_bytes(span, lead));
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && std::string(argv[1]) == "windows") return print_windows(argv[2]);
    if (argc == 3 && std::string(argv[1]) == "boxes") return print_boxes(argv[2]);
    const std::string name = argc == 2 ? argv[1] : "";
    const int type = name == "iq4_xs" ? GGML_IQ4_XS : name == "iq4_nl" ? GGML_IQ4_NL : name == "q6_k" ? GGML_Q6_K : -1;
    if (type < 0) {
        std::fprintf(stderr, "usage: gpu_layouts iq4_xs|iq4_nl|q6_k < blocks > values, or gpu_layouts windows SPAN\n");
        return 2;
    }
    const std::vector<uint8_t> gguf{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
    if (gguf.empty() || gguf.size() % block_bytes(type) != 0) {
        std::fprintf(stderr, "gpu_layouts: %zu bytes is not a whole number of blocks\n", gguf.size());
        return 2;
    }
    const std::vector<uint8_t> gpu = to_gpu_layout(type, gguf);
    const std::vector<float> y = type == GGML_Q6_K    ? values<GGML_Q6_K>(gpu)
                                 : type == GGML_IQ4_NL ? values<GGML_IQ4_NL>(gpu)
                                                       : values<GGML_IQ4_XS>(gpu);
    std::fwrite(y.data(), sizeof(float), y.size(), stdout);
    return 0;
}
