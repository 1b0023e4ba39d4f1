// The tile kernels of each kernel set (internal to the CPU backend; tiled_matrix.h is the
// interface and states the layout and the summation order every one of them follows).
//
// Each `Dot<Type>` has TileOps::dot's signature. The scalar set is the reference (portable C++,
// reads the tile layout element by element); the AVX2 set needs AVX2 + FMA + F16C, the AVX-512
// set F/VL/BW/VNNI as well: callers check GetCpuFeatures() first (TileOpsForIsa does).
#pragma once

#include <cstdint>

#include "backend/cpu/tiled_matrix.h"

namespace specinfer::cpu {

// Bytes of one block (32 columns) of one tile group of each quantised type, and of one column of
// the float types.
inline constexpr size_t kTileQ4_1Bytes = 320;
inline constexpr size_t kTileQ4_0Bytes = 288;
inline constexpr size_t kTileQ8_0Bytes = 544;
inline constexpr size_t kTileQ5_1Bytes = 384;
inline constexpr size_t kTileQ5_0Bytes = 352;
inline constexpr size_t kTileF32ColumnBytes = 4 * kTileRows;
inline constexpr size_t kTileF16ColumnBytes = 2 * kTileRows;  // F16 and BF16

#define SPECINFER_TILE_KERNELS                                                                \
  void DotQ4_1(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y, \
               int64_t y_stride);                                                             \
  void DotQ4_0(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y, \
               int64_t y_stride);                                                             \
  void DotQ8_0(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y, \
               int64_t y_stride);                                                             \
  void DotQ5_1(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y, \
               int64_t y_stride);                                                             \
  void DotQ5_0(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y, \
               int64_t y_stride);                                                             \
  void DotF32(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y,  \
              int64_t y_stride);                                                              \
  void DotF16(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y,  \
              int64_t y_stride);                                                              \
  void DotBF16(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y, \
               int64_t y_stride);

namespace tiled_scalar {
SPECINFER_TILE_KERNELS
}
#if defined(SPECINFER_HAVE_X86_KERNELS)
// PeakLoop(iters): a dependency-free loop of the set's integer dot instruction; returns the
// multiply-adds done (for MeasurePeakInt8Macs).
namespace tiled_avx2 {
SPECINFER_TILE_KERNELS
int64_t PeakLoop(int64_t iters);
}
namespace tiled_avx512 {
SPECINFER_TILE_KERNELS
int64_t PeakLoop(int64_t iters);
// TileOps::prep: Q8_1 quantisation into TileAct, bias = -kOffset * sum q (0, 8, 16 or 128).
template <int kOffset>
void PrepQ8(const float* x, int64_t n, TileAct* out);
}
#endif

#undef SPECINFER_TILE_KERNELS

}  // namespace specinfer::cpu
