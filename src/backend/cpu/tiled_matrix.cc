// Tiling of weight matrices, the activation conversion, the reference dot product and the choice
// of kernel set for the tile kernels (tiled_matrix.h).
#include "backend/cpu/tiled_matrix.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cpu/simd.h"
#include "backend/cpu/tiled_kernels.h"
#include "tensor/half.h"

namespace specinfer::cpu {

namespace {

float H(uint16_t h) { return Fp16ToFp32(h); }

// Bytes of one tile block: 32 columns of a quantised type, one column of a float type.
size_t BlockBytes(DType t) {
  switch (t) {
    case DType::kQ4_1: return kTileQ4_1Bytes;
    case DType::kQ4_0: return kTileQ4_0Bytes;
    case DType::kQ8_0: return kTileQ8_0Bytes;
    case DType::kQ5_1: return kTileQ5_1Bytes;
    case DType::kQ5_0: return kTileQ5_0Bytes;
    case DType::kF32: return kTileF32ColumnBytes;
    case DType::kF16:
    case DType::kBF16: return kTileF16ColumnBytes;
    default: return 0;
  }
}

bool IsFloatTile(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// Float tiles: column c of each row r of the group at (c * kTileRows + j) * element bytes, the
// stored bits copied (padding rows zero).
void TileFloats(const WeightMatrix& w, int64_t groups, size_t group_bytes, uint8_t* data) {
  const size_t es = GetDTypeTraits(w.type).block_bytes;
  std::memset(data, 0, group_bytes * groups);
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* src = static_cast<const uint8_t*>(w.row(r));
    uint8_t* dst = data + (r / kTileRows) * group_bytes + (r % kTileRows) * es;
    for (int64_t c = 0; c < w.cols; ++c) std::memcpy(dst + c * kTileRows * es, src + c * es, es);
  }
}

// Row j of tile block `dst` from GGUF block `src` (src null: a padding row, all zero values).
void PutQ4_1(const BlockQ4_1* src, int j, uint8_t* dst) {
  BlockQ4_1 z{};
  if (src == nullptr) src = &z;
  std::memcpy(dst + 2 * j, &src->d, 2);
  std::memcpy(dst + 32 + 2 * j, &src->m, 2);
  for (int k = 0; k < 4; ++k) std::memcpy(dst + 64 + 64 * k + 4 * j, src->qs + 4 * k, 4);
}

void PutQ4_0(const BlockQ4_0* src, int j, uint8_t* dst) {
  BlockQ4_0 z{};
  for (uint8_t& q : z.qs) q = 0x88;  // quants 8: value 0
  if (src == nullptr) src = &z;
  std::memcpy(dst + 2 * j, &src->d, 2);
  for (int k = 0; k < 4; ++k) std::memcpy(dst + 32 + 64 * k + 4 * j, src->qs + 4 * k, 4);
}

void PutQ8_0(const BlockQ8_0* src, int j, uint8_t* dst) {
  BlockQ8_0 z{};
  if (src == nullptr) src = &z;
  std::memcpy(dst + 2 * j, &src->d, 2);
  for (int k = 0; k < 8; ++k)
    for (int e = 0; e < 4; ++e)
      dst[32 + 64 * k + 4 * j + e] = static_cast<uint8_t>(src->qs[4 * k + e] + 128);
}

// The 5-bit types' high bits of one row in the tile's order: bit 8e + 2k + half holds bit
// 16 * half + 4k + e of the GGUF block's qh (the quant whose nibble is byte e of chunk k).
uint32_t TileHighBits(const uint8_t qh[4]) {
  uint32_t in;
  std::memcpy(&in, qh, 4);
  uint32_t out = 0;
  for (int k = 0; k < 4; ++k)
    for (int e = 0; e < 4; ++e)
      for (int half = 0; half < 2; ++half)
        out |= ((in >> (16 * half + 4 * k + e)) & 1u) << (8 * e + 2 * k + half);
  return out;
}

void PutQ5_1(const BlockQ5_1* src, int j, uint8_t* dst) {
  BlockQ5_1 z{};
  if (src == nullptr) src = &z;
  std::memcpy(dst + 2 * j, &src->d, 2);
  std::memcpy(dst + 32 + 2 * j, &src->m, 2);
  const uint32_t h = TileHighBits(src->qh);
  std::memcpy(dst + 64 + 4 * j, &h, 4);
  for (int k = 0; k < 4; ++k) std::memcpy(dst + 128 + 64 * k + 4 * j, src->qs + 4 * k, 4);
}

void PutQ5_0(const BlockQ5_0* src, int j, uint8_t* dst) {
  BlockQ5_0 z{};
  for (uint8_t& b : z.qh) b = 0xFF;  // quants 16: value 0
  if (src == nullptr) src = &z;
  std::memcpy(dst + 2 * j, &src->d, 2);
  const uint32_t h = TileHighBits(src->qh);
  std::memcpy(dst + 32 + 4 * j, &h, 4);
  for (int k = 0; k < 4; ++k) std::memcpy(dst + 96 + 64 * k + 4 * j, src->qs + 4 * k, 4);
}

template <typename Block>
void TileBlocks(const WeightMatrix& w, int64_t groups, size_t group_bytes, uint8_t* data,
                void (*put)(const Block*, int, uint8_t*)) {
  const int64_t nb = w.cols / kQK;
  const size_t bb = BlockBytes(w.type);
  for (int64_t g = 0; g < groups; ++g) {
    for (int j = 0; j < kTileRows; ++j) {
      const int64_t r = g * kTileRows + j;
      const Block* row = r < w.rows ? reinterpret_cast<const Block*>(w.row(r)) : nullptr;
      for (int64_t b = 0; b < nb; ++b)
        put(row ? row + b : nullptr, j, data + g * group_bytes + b * bb);
    }
  }
}

// Activations for the tile kernels: Q8_1 quantisation by the kernel set's own FromFloatQ8_1
// (bit-identical across sets), widened, with the offset term of weights stored plus kOffset.
template <void (*FromFloat)(const float*, void*, int64_t), int kOffset>
void Prep(const float* x, int64_t n, TileAct* out) {
  BlockQ8_1 b;
  for (int64_t i = 0; i < n / kQK; ++i) {
    FromFloat(x + i * kQK, &b, kQK);
    int32_t sum = 0;
    for (int j = 0; j < kQK; ++j) sum += b.qs[j];
    out[i].d = Fp16ToFp32(b.d);
    out[i].s = Fp16ToFp32(b.s);
    out[i].bias = -kOffset * sum;
    std::memcpy(out[i].qs, b.qs, kQK);
  }
}

struct Tables {
  TileOps q4_1, q4_0, q8_0, q5_1, q5_0, f32, f16, bf16;
  const TileOps* Get(DType t) const {
    switch (t) {
      case DType::kQ5_1: return &q5_1;
      case DType::kQ5_0: return &q5_0;
      case DType::kQ4_1: return &q4_1;
      case DType::kQ4_0: return &q4_0;
      case DType::kQ8_0: return &q8_0;
      case DType::kF32: return &f32;
      case DType::kF16: return &f16;
      case DType::kBF16: return &bf16;
      default: return nullptr;
    }
  }
};

// The quantised types' preps of each kernel set, by offset: the scalar and AVX2 sets quantise
// with their FromFloatQ8_1 (Prep above), the AVX-512 set with its own PrepQ8 (16 blocks' scalar
// steps at once); all write the same bytes.
template <int kOffset>
void PrepScalar(const float* x, int64_t n, TileAct* out) {
  Prep<scalar::FromFloatQ8_1, kOffset>(x, n, out);
}
#if defined(SPECINFER_HAVE_X86_KERNELS)
template <int kOffset>
void PrepAvx2(const float* x, int64_t n, TileAct* out) {
  Prep<avx2::FromFloatQ8_1, kOffset>(x, n, out);
}
#endif

#define SPECINFER_TILE_TABLE(kernels, prep)                            \
  Tables {                                                             \
    .q4_1 = {prep<0>, kernels::DotQ4_1},                               \
    .q4_0 = {prep<8>, kernels::DotQ4_0},                               \
    .q8_0 = {prep<128>, kernels::DotQ8_0},                             \
    .q5_1 = {prep<0>, kernels::DotQ5_1},                               \
    .q5_0 = {prep<16>, kernels::DotQ5_0},                              \
    .f32 = {nullptr, kernels::DotF32},                                 \
    .f16 = {nullptr, kernels::DotF16},                                 \
    .bf16 = {nullptr, kernels::DotBF16},                               \
  }

const Tables kScalarTables = SPECINFER_TILE_TABLE(tiled_scalar, PrepScalar);
#if defined(SPECINFER_HAVE_X86_KERNELS)
const Tables kAvx2Tables = SPECINFER_TILE_TABLE(tiled_avx2, PrepAvx2);
const Tables kAvx512Tables = SPECINFER_TILE_TABLE(tiled_avx512, tiled_avx512::PrepQ8);
#endif

#undef SPECINFER_TILE_TABLE

}  // namespace

void TiledMatrix::Free::operator()(uint8_t* p) const { std::free(p); }

bool TiledMatrix::Supports(DType t) { return BlockBytes(t) != 0; }

StatusOr<TiledMatrix> TiledMatrix::Tile(const WeightMatrix& w) {
  if (!Supports(w.type))
    return UnimplementedError("no tile layout for " + std::string(DTypeName(w.type)) + " weights");
  if ((!IsFloatTile(w.type) && w.cols % kQK != 0) || w.rows <= 0 || w.cols <= 0)
    return InvalidArgumentError("tiled weights need a positive row count and columns in blocks");
  TiledMatrix m;
  m.type_ = w.type;
  m.rows_ = w.rows;
  m.cols_ = w.cols;
  m.group_bytes_ = static_cast<size_t>(IsFloatTile(w.type) ? w.cols : w.cols / kQK) *
                   BlockBytes(w.type);
  const size_t bytes = ((m.group_bytes_ * m.groups() + 63) / 64) * 64;
  m.data_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, bytes)));
  if (m.data_ == nullptr)
    return ResourceExhaustedError("cannot allocate " + std::to_string(bytes >> 20) +
                                  " MiB of tiled weights");
  uint8_t* data = m.data_.get();
  switch (w.type) {
    case DType::kQ4_1: TileBlocks<BlockQ4_1>(w, m.groups(), m.group_bytes_, data, PutQ4_1); break;
    case DType::kQ4_0: TileBlocks<BlockQ4_0>(w, m.groups(), m.group_bytes_, data, PutQ4_0); break;
    case DType::kQ8_0: TileBlocks<BlockQ8_0>(w, m.groups(), m.group_bytes_, data, PutQ8_0); break;
    case DType::kQ5_1: TileBlocks<BlockQ5_1>(w, m.groups(), m.group_bytes_, data, PutQ5_1); break;
    case DType::kQ5_0: TileBlocks<BlockQ5_0>(w, m.groups(), m.group_bytes_, data, PutQ5_0); break;
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16: TileFloats(w, m.groups(), m.group_bytes_, data); break;
    default: break;
  }
  return m;
}

const TileOps* TileOpsForIsa(DType t, KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kScalar:
      return kScalarTables.Get(t);
    case KernelIsa::kAvx2:
#if defined(SPECINFER_HAVE_X86_KERNELS)
      if (GetCpuFeatures().use_avx2_kernels) return kAvx2Tables.Get(t);
#endif
      return nullptr;
    case KernelIsa::kAvx512:
#if defined(SPECINFER_HAVE_X86_KERNELS)
      if (GetCpuFeatures().use_avx512_kernels) return kAvx512Tables.Get(t);
#endif
      return nullptr;
  }
  return nullptr;
}

const TileOps* TileOpsFor(DType t) {
  static const KernelIsa isa = GetCpuFeatures().use_avx512_kernels ? KernelIsa::kAvx512
                               : GetCpuFeatures().use_avx2_kernels  ? KernelIsa::kAvx2
                                                                    : KernelIsa::kScalar;
  return TileOpsForIsa(t, isa);
}

PeakMacs MeasurePeakInt8Macs(KernelIsa isa, double seconds) {
  PeakMacs p;
#if defined(SPECINFER_HAVE_X86_KERNELS)
  int64_t (*loop)(int64_t) = nullptr;
  if (isa == KernelIsa::kAvx512 && GetCpuFeatures().use_avx512_kernels) {
    loop = tiled_avx512::PeakLoop;
    p.instruction = "vpdpbusd zmm";
  } else if (isa == KernelIsa::kAvx2 && GetCpuFeatures().use_avx2_kernels) {
    loop = tiled_avx2::PeakLoop;
    p.instruction = "vpmaddubsw ymm";
  }
  if (loop == nullptr) return p;
  // Fastest of short runs: the least disturbed by other work on the machine.
  using Clock = std::chrono::steady_clock;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  volatile int64_t sink = 0;
  do {
    const auto t0 = Clock::now();
    const int64_t macs = loop(int64_t{1} << 16);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    sink = sink + macs;
    p.per_second = std::max(p.per_second, static_cast<double>(macs) / s);
  } while (Clock::now() < end);
#endif
  return p;
}

float ReferenceDot(DType t, int64_t n, const void* w_row, const void* x) {
  float acc = 0.0f;
  if (IsFloatTile(t)) {
    const float* a = static_cast<const float*>(x);
    const uint16_t* h = static_cast<const uint16_t*>(w_row);
    float even = 0.0f, odd = 0.0f;
    for (int64_t c = 0; c < n; ++c) {
      const float wc = t == DType::kF32   ? static_cast<const float*>(w_row)[c]
                       : t == DType::kF16 ? Fp16ToFp32(h[c])
                                          : Bf16ToFp32(h[c]);
      if (c % 2 == 0)
        even = std::fma(wc, a[c], even);
      else
        odd = std::fma(wc, a[c], odd);
    }
    return even + odd;
  }
  for (int64_t b = 0; b < n / kQK; ++b) {
    int32_t sum = 0;
    switch (t) {
      case DType::kQ4_1: {
        const BlockQ4_1& a = static_cast<const BlockQ4_1*>(w_row)[b];
        const BlockQ8_1& v = static_cast<const BlockQ8_1*>(x)[b];
        for (int j = 0; j < kQK / 2; ++j)
          sum += (a.qs[j] & 0x0F) * v.qs[j] + (a.qs[j] >> 4) * v.qs[j + kQK / 2];
        acc = std::fma(static_cast<float>(sum), H(a.d) * H(v.d), acc);
        acc = acc + H(a.m) * H(v.s);
        break;
      }
      case DType::kQ4_0: {
        const BlockQ4_0& a = static_cast<const BlockQ4_0*>(w_row)[b];
        const BlockQ8_0& v = static_cast<const BlockQ8_0*>(x)[b];
        for (int j = 0; j < kQK / 2; ++j)
          sum += ((a.qs[j] & 0x0F) - 8) * v.qs[j] + ((a.qs[j] >> 4) - 8) * v.qs[j + kQK / 2];
        acc = std::fma(static_cast<float>(sum), H(a.d) * H(v.d), acc);
        break;
      }
      case DType::kQ5_1: {
        const BlockQ5_1& a = static_cast<const BlockQ5_1*>(w_row)[b];
        const BlockQ8_1& v = static_cast<const BlockQ8_1*>(x)[b];
        uint32_t qh;
        std::memcpy(&qh, a.qh, 4);
        for (int j = 0; j < kQK / 2; ++j)
          sum += ((a.qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4)) * v.qs[j] +
                 ((a.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4)) *
                     v.qs[j + kQK / 2];
        acc = std::fma(static_cast<float>(sum), H(a.d) * H(v.d), acc);
        acc = acc + H(a.m) * H(v.s);
        break;
      }
      case DType::kQ5_0: {
        const BlockQ5_0& a = static_cast<const BlockQ5_0*>(w_row)[b];
        const BlockQ8_0& v = static_cast<const BlockQ8_0*>(x)[b];
        uint32_t qh;
        std::memcpy(&qh, a.qh, 4);
        for (int j = 0; j < kQK / 2; ++j)
          sum += (((a.qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4)) - 16) * v.qs[j] +
                 (((a.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4)) - 16) *
                     v.qs[j + kQK / 2];
        acc = std::fma(static_cast<float>(sum), H(a.d) * H(v.d), acc);
        break;
      }
      case DType::kQ8_0: {
        const BlockQ8_0& a = static_cast<const BlockQ8_0*>(w_row)[b];
        const BlockQ8_0& v = static_cast<const BlockQ8_0*>(x)[b];
        for (int j = 0; j < kQK; ++j) sum += a.qs[j] * v.qs[j];
        acc = std::fma(static_cast<float>(sum), H(a.d) * H(v.d), acc);
        break;
      }
      default:
        return std::nanf("");
    }
  }
  return acc;
}

}  // namespace specinfer::cpu
