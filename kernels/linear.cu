#include "device_types.cuh"
#include "launch.cuh"
#include "linear.cuh"

namespace specinfer::kernels {
namespace {

constexpr int kWarps = 4;

// acc[t] += sum over the 8 columns [c, c + 8) of w[i] * x[t, c + i], in order.
template <int kTok>
__device__ __forceinline__ void Fma8(const float (&w)[8], const float* __restrict__ x, int64_t cols,
                                     int nt, int64_t c, float (&acc)[kTok]) {
#pragma unroll
  for (int t = 0; t < kTok; ++t) {
    if (t < nt) {
      const float4 a = *reinterpret_cast<const float4*>(x + t * cols + c);
      const float4 b = *reinterpret_cast<const float4*>(x + t * cols + c + 4);
      float s = acc[t];
      s = __fmaf_rn(w[0], a.x, s);
      s = __fmaf_rn(w[1], a.y, s);
      s = __fmaf_rn(w[2], a.z, s);
      s = __fmaf_rn(w[3], a.w, s);
      s = __fmaf_rn(w[4], b.x, s);
      s = __fmaf_rn(w[5], b.y, s);
      s = __fmaf_rn(w[6], b.z, s);
      s = __fmaf_rn(w[7], b.w, s);
      acc[t] = s;
    }
  }
}

template <ElemType W, int kTok>
__global__ void __launch_bounds__(kWarps * 32)
    LinearKernel(const uint8_t* __restrict__ w, int64_t rows, int64_t cols,
                 const float* __restrict__ x, int32_t n, float* y, float beta) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (r >= rows) return;
  const uint8_t* wrow = w + r * ElemRowBytes(W, cols);
  // The warp walks every tile of tokens over the same weight row, which stays in L1/L2: the
  // weights are read from memory about once however many tokens there are.
  for (int t0 = 0; t0 < n; t0 += kTok) {
    const int nt = min(kTok, n - t0);
    const float* xt = x + static_cast<int64_t>(t0) * cols;
    float acc[kTok];
#pragma unroll
    for (int t = 0; t < kTok; ++t) acc[t] = 0.0f;

    if constexpr (W == ElemType::kF16 || W == ElemType::kBF16) {
      // 8 elements (16 bytes) per lane per step when rows are 16-byte aligned.
      const int64_t vec_end = cols % 8 == 0 ? cols : 0;
#pragma unroll 2
      for (int64_t c = lane * 8; c < vec_end; c += 256) {
        const uint4 raw = *reinterpret_cast<const uint4*>(wrow + c * 2);
        const uint16_t* h = reinterpret_cast<const uint16_t*>(&raw);
        float wf[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if constexpr (W == ElemType::kF16) {
            wf[i] = __half2float(__ushort_as_half(h[i]));
          } else {
            wf[i] = __uint_as_float(static_cast<uint32_t>(h[i]) << 16);
          }
        }
        Fma8<kTok>(wf, xt, cols, nt, c, acc);
      }
      for (int64_t c = vec_end + lane; c < cols; c += 32) {
        const float wv = LoadElement(W, wrow, c);
        for (int t = 0; t < nt; ++t) acc[t] = __fmaf_rn(wv, xt[t * cols + c], acc[t]);
      }
    } else if constexpr (W == ElemType::kF32) {
      const int64_t vec_end = cols % 8 == 0 ? cols : 0;
      const float* wr = reinterpret_cast<const float*>(wrow);
#pragma unroll 2
      for (int64_t c = lane * 8; c < vec_end; c += 256) {
        const float4 a = *reinterpret_cast<const float4*>(wr + c);
        const float4 b = *reinterpret_cast<const float4*>(wr + c + 4);
        const float wf[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        Fma8<kTok>(wf, xt, cols, nt, c, acc);
      }
      for (int64_t c = vec_end + lane; c < cols; c += 32) {
        const float wv = wr[c];
        for (int t = 0; t < nt; ++t) acc[t] = __fmaf_rn(wv, xt[t * cols + c], acc[t]);
      }
    } else {
      // One 32-element block per lane per step: sum_j q_j x_j, scaled once per block.
      const int64_t nb = cols / kQuantBlock;
      for (int64_t b = lane; b < nb; b += 32) {
        const int64_t c = b * kQuantBlock;
        float q[32];
        float d, m = 0.0f;
        if constexpr (W == ElemType::kQ8_0) {
          const BlockQ8_0* blk = reinterpret_cast<const BlockQ8_0*>(wrow) + b;
          d = HalfBitsToFloat(blk->d);
          const uint16_t* p = reinterpret_cast<const uint16_t*>(blk->qs);
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            const uint16_t v = p[i];
            q[2 * i] = static_cast<float>(static_cast<int8_t>(v & 0xff));
            q[2 * i + 1] = static_cast<float>(static_cast<int8_t>(v >> 8));
          }
        } else {
          const uint16_t* p;
          if constexpr (W == ElemType::kQ4_0) {
            const BlockQ4_0* blk = reinterpret_cast<const BlockQ4_0*>(wrow) + b;
            d = HalfBitsToFloat(blk->d);
            p = reinterpret_cast<const uint16_t*>(blk->qs);
          } else {
            const BlockQ4_1* blk = reinterpret_cast<const BlockQ4_1*>(wrow) + b;
            d = HalfBitsToFloat(blk->d);
            m = HalfBitsToFloat(blk->m);
            p = reinterpret_cast<const uint16_t*>(blk->qs);
          }
          const float off = W == ElemType::kQ4_0 ? 8.0f : 0.0f;
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const uint16_t v = p[i];
            // v = qs[2i] | qs[2i + 1] << 8: low nibbles are elements 2i, 2i + 1, high nibbles
            // elements 2i + 16, 2i + 17.
            q[2 * i] = static_cast<float>(v & 15) - off;
            q[2 * i + 1] = static_cast<float>((v >> 8) & 15) - off;
            q[2 * i + 16] = static_cast<float>((v >> 4) & 15) - off;
            q[2 * i + 17] = static_cast<float>(v >> 12) - off;
          }
        }
#pragma unroll
        for (int t = 0; t < kTok; ++t) {
          if (t < nt) {
            const float4* xv = reinterpret_cast<const float4*>(xt + t * cols + c);
            float s = 0.0f, sx = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              const float4 a = xv[i];
              s = __fmaf_rn(q[4 * i], a.x, s);
              s = __fmaf_rn(q[4 * i + 1], a.y, s);
              s = __fmaf_rn(q[4 * i + 2], a.z, s);
              s = __fmaf_rn(q[4 * i + 3], a.w, s);
              if constexpr (W == ElemType::kQ4_1)
                sx = __fadd_rn(sx, __fadd_rn(__fadd_rn(a.x, a.y), __fadd_rn(a.z, a.w)));
            }
            acc[t] = __fmaf_rn(d, s, acc[t]);
            if constexpr (W == ElemType::kQ4_1) acc[t] = __fmaf_rn(m, sx, acc[t]);
          }
        }
      }
    }

#pragma unroll
    for (int t = 0; t < kTok; ++t) acc[t] = WarpSum(acc[t]);
    if (lane == 0) {
      for (int t = 0; t < nt; ++t) {
        float* out = y + static_cast<int64_t>(t0 + t) * rows + r;
        *out = beta == 0.0f ? acc[t] : __fmaf_rn(beta, *out, acc[t]);
      }
    }
  }  // token tiles
}

template <ElemType W>
cudaError_t LaunchTyped(const void* w, int64_t rows, int64_t cols, const float* x, int32_t n,
                        float* y, float beta, cudaStream_t stream) {
  const dim3 block(kWarps * 32);
  const unsigned gx = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  if (n == 1) {
    SPECINFER_LAUNCH(dim3(gx, 1), block, 0, stream, LinearKernel<W, 1>)
    (wb, rows, cols, x, n, y, beta);
  } else if (n == 2) {
    SPECINFER_LAUNCH(dim3(gx, 1), block, 0, stream, LinearKernel<W, 2>)
    (wb, rows, cols, x, n, y, beta);
  } else if (n <= 4) {
    SPECINFER_LAUNCH(dim3(gx, 1), block, 0, stream, LinearKernel<W, 4>)
    (wb, rows, cols, x, n, y, beta);
  } else {
    SPECINFER_LAUNCH(dim3(gx, 1), block, 0, stream, LinearKernel<W, 8>)
    (wb, rows, cols, x, n, y, beta);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchLinear(ElemType type, const void* w, int64_t rows, int64_t cols, const float* x,
                         int32_t n, float* y, float beta, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || n <= 0 || (rows + kWarps - 1) / kWarps > 0x7fffffff)
    return cudaErrorInvalidValue;
  switch (type) {
    case ElemType::kF32:
      return LaunchTyped<ElemType::kF32>(w, rows, cols, x, n, y, beta, stream);
    case ElemType::kF16:
      return LaunchTyped<ElemType::kF16>(w, rows, cols, x, n, y, beta, stream);
    case ElemType::kBF16:
      return LaunchTyped<ElemType::kBF16>(w, rows, cols, x, n, y, beta, stream);
    case ElemType::kQ8_0:
    case ElemType::kQ4_0:
    case ElemType::kQ4_1:
      if (cols % kQuantBlock != 0) return cudaErrorInvalidValue;
      if (type == ElemType::kQ8_0)
        return LaunchTyped<ElemType::kQ8_0>(w, rows, cols, x, n, y, beta, stream);
      if (type == ElemType::kQ4_0)
        return LaunchTyped<ElemType::kQ4_0>(w, rows, cols, x, n, y, beta, stream);
      return LaunchTyped<ElemType::kQ4_1>(w, rows, cols, x, n, y, beta, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace specinfer::kernels
