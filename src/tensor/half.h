// Scalar conversions between float32 and the 16-bit float formats stored in model files:
// IEEE binary16 ("fp16", ggml_half) and bfloat16.
//
// Portable bit manipulation: no F16C or other ISA extension is needed, so these are the
// reference the vectorised kernels are tested against. Float32 -> 16-bit conversions round to
// nearest, ties to even (the rounding of F16C's _mm_cvtps_ph with _MM_FROUND_TO_NEAREST_INT and
// of numpy's astype(float16)), overflow to infinity, keep NaNs NaN (quiet) and produce
// subnormals where the value calls for one. 16-bit -> float32 is exact.
#pragma once

#include <bit>
#include <cstdint>

namespace specinfer {

inline float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0) {
    // Zero or subnormal: man * 2^-24, exact in float32.
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000u | (man << 13));  // inf / NaN
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t Fp32ToFp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) {  // NaN: quiet, keep the top payload bits
    return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
  }
  if (ax >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to infinity (or is inf)
  if (ax < 0x38800000u) {                        // below 2^-14: half subnormal or zero
    if (ax <= 0x33000000u) return sign;          // <= 2^-25 rounds to zero (2^-25 is a tie)
    const uint32_t e = ax >> 23;                 // 102..112
    const uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - e;  // value = m * 2^(e-150) = (m >> shift) * 2^-24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into the smallest normal
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t h = (ax - 0x38000000u) >> 13;  // rebias exponent 127 -> 15, keep 10 mantissa bits
  const uint32_t rem = ax & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry bumps the exponent
  return static_cast<uint16_t>(sign | h);
}

inline float Bf16ToFp32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

inline uint16_t Fp32ToBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: force quiet
    return static_cast<uint16_t>((x >> 16) | 0x40u);
  }
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace specinfer
