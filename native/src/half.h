// half.h — IEEE binary32 -> binary16 on the host (the KV cache's f16 rows and scales, and the GPU
// emulator's __float2half_rn: one conversion, so both round alike).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace luce {

// IEEE binary32 -> binary16, round to nearest even (overflow -> inf, NaN kept quiet).
inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t abs = x & 0x7FFFFFFFu;
    if (abs > 0x7F800000u) return uint16_t(sign | 0x7E00u);          // NaN
    if (abs >= 0x477FF000u) return uint16_t(sign | 0x7C00u);         // rounds to >= 65520: inf
    if (abs < 0x38800000u) {                                         // subnormal half (or 0)
        // value = abs_float; half subnormal unit = 2^-24: round(value * 2^24) to nearest even.
        float a;
        std::memcpy(&a, &abs, 4);
        return uint16_t(sign | uint32_t(std::nearbyint(a * 16777216.0f)));
    }
    // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
    uint32_t h = (abs - 0x38000000u) >> 13;
    const uint32_t rest = abs & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;        // carry may bump the exponent
    return uint16_t(sign | h);
}

}  // namespace luce
