// kv_cache.cpp — KV cache formats: the API's kv_type, and the CPU row codecs (kv_cache.h).
#include "kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "errors.h"
#include "luce.h"
#include "half.h"
#include "quants_kernels.h"  // f16_to_f32

namespace luce {

namespace {

KvType checked_type(int32_t t, const char *which) {
    if (t < LUCE_KV_F32 || t > LUCE_KV_Q4_0) fail(LUCE_ERR_INVALID_ARGUMENT, "unknown %s cache type %d", which, t);
    return KvType(t);
}

bool power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

// The block's scale as stored (an IEEE half), and as the quants are computed against: ggml
// rounds the scale to half after dividing by it, and so does this.
struct BlockScale {
    uint16_t stored;
    float inverse;
};

BlockScale q8_0_scale(const float *x) {
    float amax = 0.f;
    for (int i = 0; i < KV_BLOCK; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.f;
    return {f32_to_f16(d), d != 0.f ? 1.f / d : 0.f};
}

BlockScale q4_0_scale(const float *x) {
    float amax = 0.f, max = 0.f;  // the value of largest magnitude, with its sign
    for (int i = 0; i < KV_BLOCK; ++i)
        if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
    const float d = max / -8.f;
    return {f32_to_f16(d), d != 0.f ? 1.f / d : 0.f};
}

}  // namespace

void KvFormat::check(int head_dim) const {
    for (KvType t : {k, v})
        if (kv_quantized(t) && head_dim % KV_BLOCK != 0)
            fail(LUCE_ERR_UNSUPPORTED, "a %s KV cache needs a head dim that is a multiple of %d (this model's is %d)",
                 kv_type_name(t), KV_BLOCK, head_dim);
    if (rotate && !power_of_two(head_dim))
        fail(LUCE_ERR_UNSUPPORTED, "KV rotation needs a power-of-two head dim (this model's is %d)", head_dim);
}

KvFormat kv_format_from_api(int32_t kv_type) {
    const int32_t flags = LUCE_KV_V_GIVEN | LUCE_KV_ROTATE, type_bits = 0xff | (0xff << LUCE_KV_V_SHIFT);
    if (kv_type < 0 || (kv_type & ~(flags | type_bits)) != 0)
        fail(LUCE_ERR_INVALID_ARGUMENT, "unknown KV cache type %d", kv_type);
    KvFormat f;
    f.k = checked_type(kv_type & 0xff, "K");
    const int32_t v = (kv_type >> LUCE_KV_V_SHIFT) & 0xff;
    if (!(kv_type & LUCE_KV_V_GIVEN) && v != 0) fail(LUCE_ERR_INVALID_ARGUMENT, "unknown KV cache type %d", kv_type);
    f.v = kv_type & LUCE_KV_V_GIVEN ? checked_type(v, "V") : f.k;
    f.rotate = (kv_type & LUCE_KV_ROTATE) != 0;
    return f;
}

void kv_encode_row(KvType t, const float *x, int dim, void *dst) {
    switch (t) {
        case KvType::F32:
            std::memcpy(dst, x, sizeof(float) * size_t(dim));
            return;
        case KvType::F16: {
            auto *h = static_cast<uint16_t *>(dst);
            for (int i = 0; i < dim; ++i) h[i] = f32_to_f16(x[i]);
            return;
        }
        case KvType::Q8_0: {
            auto *q = static_cast<int8_t *>(dst);
            auto *scales = reinterpret_cast<uint16_t *>(static_cast<uint8_t *>(dst) + dim);
            for (int b = 0; b < dim / KV_BLOCK; ++b) {
                const float *xb = x + b * KV_BLOCK;
                const BlockScale s = q8_0_scale(xb);
                for (int i = 0; i < KV_BLOCK; ++i) q[b * KV_BLOCK + i] = int8_t(std::lround(xb[i] * s.inverse));
                std::memcpy(scales + b, &s.stored, 2);
            }
            return;
        }
        case KvType::Q4_0: {
            auto *q = static_cast<uint8_t *>(dst);
            auto *scales = reinterpret_cast<uint16_t *>(q + dim / 2);
            for (int b = 0; b < dim / KV_BLOCK; ++b) {
                const float *xb = x + b * KV_BLOCK;
                const BlockScale s = q4_0_scale(xb);
                for (int i = 0; i < KV_BLOCK; i += 2) {
                    const int lo = std::min(15, int(xb[i] * s.inverse + 8.5f));
                    const int hi = std::min(15, int(xb[i + 1] * s.inverse + 8.5f));
                    q[(b * KV_BLOCK + i) / 2] = uint8_t(lo | (hi << 4));
                }
                std::memcpy(scales + b, &s.stored, 2);
            }
            return;
        }
    }
}

const float *kv_decode_row(KvType t, const void *base, int64_t index, int dim, float *scratch) {
    const auto *row = static_cast<const uint8_t *>(base) + index * int64_t(kv_row_bytes(t, dim));
    switch (t) {
        case KvType::F32:
            return reinterpret_cast<const float *>(row);
        case KvType::F16: {
            const auto *h = reinterpret_cast<const uint16_t *>(row);
            for (int i = 0; i < dim; ++i) scratch[i] = f16_to_f32(h[i]);
            return scratch;
        }
        case KvType::Q8_0: {
            const auto *q = reinterpret_cast<const int8_t *>(row);
            for (int b = 0; b < dim / KV_BLOCK; ++b) {
                uint16_t h;
                std::memcpy(&h, row + dim + 2 * b, 2);
                const float d = f16_to_f32(h);
                for (int i = 0; i < KV_BLOCK; ++i) scratch[b * KV_BLOCK + i] = d * float(q[b * KV_BLOCK + i]);
            }
            return scratch;
        }
        case KvType::Q4_0: {
            for (int b = 0; b < dim / KV_BLOCK; ++b) {
                uint16_t h;
                std::memcpy(&h, row + dim / 2 + 2 * b, 2);
                const float d = f16_to_f32(h);
                for (int i = 0; i < KV_BLOCK; i += 2) {
                    const uint8_t byte = row[(b * KV_BLOCK + i) / 2];
                    scratch[b * KV_BLOCK + i] = d * float(int(byte & 0xf) - 8);
                    scratch[b * KV_BLOCK + i + 1] = d * float(int(byte >> 4) - 8);
                }
            }
            return scratch;
        }
    }
    return scratch;
}

void fwht(float *x, int dim) {
    for (int len = 1; len < dim; len *= 2)
        for (int i = 0; i < dim; i += 2 * len)
            for (int j = i; j < i + len; ++j) {
                const float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
    const float scale = 1.f / std::sqrt(float(dim));
    for (int i = 0; i < dim; ++i) x[i] *= scale;
}

}  // namespace luce
