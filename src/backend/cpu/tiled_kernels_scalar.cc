// The scalar tile kernels: the reference every vectorised set is checked against bit for bit.
// Plain loops over the tile layout of tiled_matrix.h, in its summation orders.
#include <cmath>
#include <cstring>

#include "backend/cpu/tiled_kernels.h"
#include "tensor/half.h"

namespace specinfer::cpu::tiled_scalar {

namespace {

float H(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return Fp16ToFp32(h);
}

// One block's exact integer sum for row j of a tile block (quants starting at `q`) with
// activation block `a`, for the three quantised layouts.
// The 5-bit layouts' high bits: word j at q - 64 (before the nibbles), bit 8e + 2k + half the
// fifth bit of the quant in chunk k, byte e, low (half 0) or high (half 1) nibble.
enum class Layout { kNibbles, kNibblesOffset8, kBytesOffset128, kFive, kFiveOffset16 };

template <Layout L>
int32_t BlockSum(const uint8_t* q, int j, const TileAct& a) {
  int32_t sum = 0;
  if constexpr (L == Layout::kFive || L == Layout::kFiveOffset16) {
    uint32_t h;
    std::memcpy(&h, q - 64 + 4 * j, 4);
    const int off = L == Layout::kFiveOffset16 ? 16 : 0;
    for (int k = 0; k < 4; ++k) {
      for (int e = 0; e < 4; ++e) {
        const uint8_t b = q[64 * k + 4 * j + e];
        const int lo = (b & 0x0F) | static_cast<int>(((h >> (8 * e + 2 * k)) & 1u) << 4);
        const int hi = (b >> 4) | static_cast<int>(((h >> (8 * e + 2 * k + 1)) & 1u) << 4);
        sum += (lo - off) * a.qs[4 * k + e] + (hi - off) * a.qs[16 + 4 * k + e];
      }
    }
  } else if constexpr (L == Layout::kBytesOffset128) {
    for (int k = 0; k < 8; ++k)
      for (int e = 0; e < 4; ++e) sum += (q[64 * k + 4 * j + e] - 128) * a.qs[4 * k + e];
  } else {
    const int off = L == Layout::kNibblesOffset8 ? 8 : 0;
    for (int k = 0; k < 4; ++k) {
      for (int e = 0; e < 4; ++e) {
        const uint8_t b = q[64 * k + 4 * j + e];
        sum += ((b & 0x0F) - off) * a.qs[4 * k + e] + ((b >> 4) - off) * a.qs[16 + 4 * k + e];
      }
    }
  }
  return sum;
}

template <Layout L, bool kMin, size_t kBlockBytes>
void DotTile(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y,
             int64_t y_stride) {
  const int64_t nb = n / kQK;
  constexpr bool kFive = L == Layout::kFive || L == Layout::kFiveOffset16;
  // After d[16] (and m[16]) (and the high bits' 16 words).
  const size_t q_offset = (kMin ? 64 : 32) + (kFive ? 64 : 0);
  for (int t = 0; t < count; ++t) {
    const TileAct* a = static_cast<const TileAct*>(x) + t * x_stride;
    for (int j = 0; j < kTileRows; ++j) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + b * kBlockBytes;
        const float dw = H(blk + 2 * j);
        const int32_t sum = BlockSum<L>(blk + q_offset, j, a[b]);
        acc = std::fma(static_cast<float>(sum), dw * a[b].d, acc);
        if constexpr (kMin) acc = acc + H(blk + 32 + 2 * j) * a[b].s;
      }
      y[t * y_stride + j] = acc;
    }
  }
}

// Float tiles: column c holds the 16 rows' values; per (row, token) one FMA chain over the even
// columns and one over the odd columns, in order, then their sum. Widen(p) reads one value.
template <float (*Widen)(const uint8_t*), size_t kBytes>
void FloatTile(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y,
               int64_t y_stride) {
  for (int t = 0; t < count; ++t) {
    const float* a = static_cast<const float*>(x) + t * x_stride;
    for (int j = 0; j < kTileRows; ++j) {
      float acc[2] = {0.0f, 0.0f};
      for (int64_t c = 0; c < n; ++c)
        acc[c % 2] = std::fma(Widen(w + (c * kTileRows + j) * kBytes), a[c], acc[c % 2]);
      y[t * y_stride + j] = acc[0] + acc[1];
    }
  }
}

float F32At(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}
float Bf16At(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return Bf16ToFp32(h);
}

}  // namespace

void DotQ5_1(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y,
             int64_t y_stride) {
  DotTile<Layout::kFive, true, kTileQ5_1Bytes>(n, w, x, x_stride, count, y, y_stride);
}

void DotQ5_0(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y,
             int64_t y_stride) {
  DotTile<Layout::kFiveOffset16, false, kTileQ5_0Bytes>(n, w, x, x_stride, count, y, y_stride);
}

void DotF32(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y,
            int64_t y_stride) {
  FloatTile<F32At, 4>(n, w, x, x_stride, count, y, y_stride);
}

void DotF16(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y,
            int64_t y_stride) {
  FloatTile<H, 2>(n, w, x, x_stride, count, y, y_stride);
}

void DotBF16(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y,
             int64_t y_stride) {
  FloatTile<Bf16At, 2>(n, w, x, x_stride, count, y, y_stride);
}

void DotQ4_1(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y,
             int64_t y_stride) {
  DotTile<Layout::kNibbles, true, kTileQ4_1Bytes>(n, w, x, x_stride, count, y, y_stride);
}

void DotQ4_0(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y,
             int64_t y_stride) {
  DotTile<Layout::kNibblesOffset8, false, kTileQ4_0Bytes>(n, w, x, x_stride, count, y, y_stride);
}

void DotQ8_0(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y,
             int64_t y_stride) {
  DotTile<Layout::kBytesOffset128, false, kTileQ8_0Bytes>(n, w, x, x_stride, count, y, y_stride);
}

}  // namespace specinfer::cpu::tiled_scalar
