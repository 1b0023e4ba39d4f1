// Weight matrices re-laid out in tiles of 16 rows, and the multi-token kernels that read them:
// the CPU backend's matrix products for decode steps, token-tree passes and prompts.
//
// Why: a tree pass dots every weight row with k tokens. Kernels that take one row at a time spend
// their time in per-row horizontal reductions and re-reading activations; with 16 rows
// interleaved, one vector lane per row, the integer dot product of a block needs no reduction at
// all: vpdpbusd (or maddubs + madd on AVX2) with the token's 4 activation bytes broadcast adds
// into lane r the products of row r, and one float FMA per (16 rows, block, token) applies the
// block scales. The unpacked weights of a block stay in registers for up to kMaxTileTokens
// tokens, each token's activations (a few KiB) stay in L1 for all 16 rows.
//
// Types with tiles: Q4_1, Q4_0, Q8_0, Q5_1, Q5_0, F32, F16, BF16 (Supports()); other types keep
// the per-row TypeOps kernels. Float tiles hold the stored values transposed (one column's 16
// rows side by side): one vector FMA per (column, token) serves all 16 rows, the column read once
// for up to kMaxTileTokens tokens (AVX2: slices of 3, re-read from cache).
//
// THE SUMMATION ORDER (bit-identical on every kernel set, scalar included, so a token's logits
// do not depend on the batch, on the tile it falls in, on the tensor-parallel split or on the
// machine's instruction set). For weight row r and token t, over the blocks b in order:
//   acc = 0
//   acc = fma(float(I_b), dw_b * dx_b, acc)   I_b: the exact integer sum of quant products
//   acc = acc + mw_b * sx_b                    Q4_1, Q5_1 (mw, sx fp16: the product is exact, so
//                                              fma and multiply-then-add agree)
// dw, mw: the weight block's fp16 scale and minimum; dx, sx: the activation block's Q8_1 scale
// and fp16(d * sum q) (the same d and quants as Q8_0's). dw * dx is exact in float32 (fp16 x fp16).
// Float weights (F32, F16, BF16; activations float32 as they are, widening to float32 exact):
//   even = 0, odd = 0
//   even = fma(w_c, x_c, even)                 for the even columns c in order
//   odd  = fma(w_c, x_c, odd)                  for the odd columns c in order
//   result = even + odd
// (Two chains, not one: with one, a single token's kernel is bound by the FMA latency, at half
// the speed on cache-resident weights; four were no faster. AVX-512 BF16's vdpbf16ps adds pairs
// of products before accumulating, another order: the BF16 kernels widen by a shift and use FMA.)
// ReferenceDot below is that definition, written plainly. (This order differs from the per-row
// TypeOps::vec_dot kernels', which matrices without tiles still use.)
//
// Layout of a tile (one group of kTileRows rows; the last group padded with zero rows), blocks
// of 32 columns one after another, each block:
//   Q4_1: d[16] fp16, m[16] fp16, then 4 x 64 bytes: chunk k holds, for row j, bytes
//         qs_j[4k..4k+3] of the GGUF block at 4j (low nibbles: elements 4k..4k+3, high nibbles:
//         16+4k..16+4k+3)                                                        320 bytes
//   Q4_0: d[16], then the 4 x 64 nibble chunks as Q4_1                           288 bytes
//   Q8_0: d[16], then 8 x 64 bytes: chunk k holds row j's quants 4k..4k+3 plus 128 as unsigned
//         bytes (vpdpbusd multiplies unsigned by signed; the activation side's -128 * sum(q)
//         is the kernel's starting value, TileAct::bias)                         544 bytes
//   Q5_1: d[16], m[16], h[16] (32-bit words), then the 4 x 64 nibble chunks as Q4_1; bit
//         8e + 2k of h_j is the fifth bit of the quant in byte e of chunk k's low nibble, bit
//         8e + 2k + 1 that of its high nibble (so a shift and a mask put chunk k's fifth bits at
//         bit 4 of each byte, all 16 rows at once)                                384 bytes
//   Q5_0: d[16], h[16], then the nibble chunks (quants stored plus 16, TileAct::bias
//         -16 * sum q as Q4_0's -8)                                               352 bytes
// Float types have blocks of one column (any column count): the 16 rows' stored values, row j
// at element j                                          F32 64 bytes, F16 and BF16 32 bytes
// Tiles are a second copy of the weights (the model's view stays for embedding rows and BLAS).
//
// Thread safety: TiledMatrix is immutable after Tile(); the kernels are pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "backend/cpu/quants.h"
#include "specinfer/status.h"
#include "tensor/weight.h"

namespace specinfer::cpu {

inline constexpr int kTileRows = 16;
inline constexpr int kMaxTileTokens = 8;  // tokens per kernel call

// One 32-element block of one token's activations, as the tile kernels read it (Q8 quantisation
// exactly as FromFloatQ8_1, with the fp16 fields widened and the offset term precomputed).
struct TileAct {
  float d;        // fp16 scale widened to float32
  float s;        // Q8_1's fp16(d * sum q) widened (the m term of Q4_1/Q5_1 weights)
  int32_t bias;   // starting value of the block's integer sum: -offset * sum q for weights
                  // stored with an offset (Q8_0: 128, Q4_0: 8), else 0
  int8_t qs[kQK];
};
static_assert(sizeof(TileAct) == 44);

// A weight matrix in tiles (owns its bytes, 64-byte aligned).
class TiledMatrix {
 public:
  // Whether Tile() takes matrices of this type.
  static bool Supports(DType t);
  // The tiles of `w` (w.type supported, w.cols a multiple of 32 for the quantised types). Rows
  // are independent: tiling a share of a matrix's rows gives that share of the whole matrix's
  // tiles' results.
  static StatusOr<TiledMatrix> Tile(const WeightMatrix& w);

  DType type() const { return type_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t groups() const { return (rows_ + kTileRows - 1) / kTileRows; }
  size_t group_bytes() const { return group_bytes_; }
  const uint8_t* group(int64_t g) const { return data_.get() + g * group_bytes_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  DType type_ = DType::kF32;
  int64_t rows_ = 0, cols_ = 0;
  size_t group_bytes_ = 0;
  std::unique_ptr<uint8_t, Free> data_;
};

// The kernels of one weight type for one kernel set.
struct TileOps {
  // Converts n float activations (n a multiple of 32) to n / 32 TileAct. Null for the float
  // types, whose kernels read the float32 activations themselves.
  void (*prep)(const float* x, int64_t n, TileAct* out) = nullptr;
  // y[t * y_stride + j] = row j of the tile group `w` dotted with token t (t < count <=
  // kMaxTileTokens), for all kTileRows rows j (padding rows included); x points to TileAct
  // (float types: to float), token t's first at x + t * x_stride (in TileAct, or floats).
  // n: columns.
  void (*dot)(int64_t n, const uint8_t* w, const void* x, int64_t x_stride, int count, float* y,
              int64_t y_stride) = nullptr;
};

// The tile kernels for `t` from kernel set `isa`; nullptr if the type has none or the CPU (or
// build) cannot run that set. TileOpsFor(t) picks the best set this CPU allows (as GetTypeOps).
const TileOps* TileOpsForIsa(DType t, KernelIsa isa);
const TileOps* TileOpsFor(DType t);

// The int8 multiply-adds per second one core reaches with kernel set `isa`'s integer dot
// instruction (AVX-512: vpdpbusd zmm, 64 per instruction; AVX2: vpmaddubsw ymm, 32), measured
// with a dependency-free loop for about `seconds`: the peak the kernels are compared with. Zero
// for the scalar set or a set this CPU cannot run.
struct PeakMacs {
  double per_second = 0;
  const char* instruction = "";
};
PeakMacs MeasurePeakInt8Macs(KernelIsa isa, double seconds);

// The summation order above, plainly, for row `w_row` of a matrix of type t in its GGUF layout
// against activations as vec_dot_type of t (Q8_1 for Q4_1/Q5_1, Q8_0 for Q4_0/Q5_0/Q8_0, F32 for
// floats).
float ReferenceDot(DType t, int64_t n, const void* w_row, const void* x);

}  // namespace specinfer::cpu
