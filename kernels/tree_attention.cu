#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "device_types.cuh"
#include "launch.cuh"
#include "tree_attention.cuh"

namespace specinfer::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = kTreeAttnRowsPerBlock / kWarps;  // 4
constexpr int kTile = kTreeAttnTileKv;                        // 32: one key per lane
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kTile == 32, "a lane owns one key of a tile");

// Window entries row i sees: the set bits of its mask row (causal: i + 1).
__device__ __forceinline__ int32_t VisibleWindow(const TreeAttentionRequest& rq,
                                                 const uint64_t* __restrict__ mask_words,
                                                 int32_t i) {
  if (rq.mask_begin < 0) return i + 1;
  const uint64_t* row =
      mask_words + rq.mask_begin + static_cast<int64_t>(i) * rq.mask_words_per_row;
  int32_t n = 0;
  for (int32_t w = 0; w < rq.mask_words_per_row; ++w) n += __popcll(row[w]);
  return n;
}

// Window index of the n-th (from 0) window entry row i sees.
__device__ __forceinline__ int32_t WindowEntry(const TreeAttentionRequest& rq,
                                               const uint64_t* __restrict__ mask_words, int32_t i,
                                               int32_t n) {
  if (rq.mask_begin < 0) return n;
  const uint64_t* row =
      mask_words + rq.mask_begin + static_cast<int64_t>(i) * rq.mask_words_per_row;
  for (int32_t w = 0; w < rq.mask_words_per_row; ++w) {
    uint64_t word = row[w];
    const int32_t pc = __popcll(word);
    if (n >= pc) {
      n -= pc;
      continue;
    }
    for (; n > 0; --n) word &= word - 1;  // drop the n lowest set bits
    return w * 64 + __ffsll(static_cast<long long>(word)) - 1;
  }
  return 0;  // unreachable for n < VisibleWindow(rq, mask_words, i)
}

template <int kDMax>
constexpr int SharedFloats() {
  return kTreeAttnRowsPerBlock * kDMax + kTile * (kDMax + 1) + kTile * kDMax;
}

template <typename T, typename OutT, int kDMax>
__global__ void __launch_bounds__(kWarps * 32) TreeAttentionKernel(const TreeAttentionParams p) {
  constexpr int kDPerLane = kDMax / 32;
  SPECINFER_DYNAMIC_SHARED(float, smem);
  float* q_s = smem;                                 // [16][kDMax]
  float* k_s = q_s + kTreeAttnRowsPerBlock * kDMax;  // [32][kDMax + 1] (padded: no conflicts)
  float* v_s = k_s + kTile * (kDMax + 1);            // [32][kDMax]

  const TreeAttentionWorkItem wi = p.work[blockIdx.x];
  const TreeAttentionRequest rq = p.requests[wi.request];
  const int32_t kvh = blockIdx.y;
  const int32_t group = p.qo_heads / p.kv_heads;
  const int32_t hd = p.head_dim;
  const int32_t total_rows = rq.token_count * group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* q = static_cast<const T*>(p.q);
  const T* kc = static_cast<const T*>(p.k_cache);
  const T* vc = static_cast<const T*>(p.v_cache);
  const float qscale = p.scale * kLog2e;

  // Queries of the block's 16 rows, scaled, as float32.
  for (int idx = threadIdx.x; idx < kTreeAttnRowsPerBlock * kDMax; idx += blockDim.x) {
    const int rr = idx / kDMax, d = idx % kDMax;
    const int32_t row = wi.row_begin + rr;
    float val = 0.0f;
    if (row < total_rows && d < hd) {
      const int64_t t = rq.token_begin + row / group;
      const int32_t h = kvh * group + row % group;
      val = ToFloat(q[(t * p.qo_heads + h) * hd + d]) * qscale;
    }
    q_s[idx] = val;
  }

  // This warp's rows.
  int32_t tok[kRowsPerWarp];  // token index within the request, -1: no row
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kDPerLane];
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    const int32_t row = wi.row_begin + warp * kRowsPerWarp + j;
    tok[j] = row < total_rows ? row / group : -1;
    m[j] = -INFINITY;
    l[j] = 0.0f;
#pragma unroll
    for (int e = 0; e < kDPerLane; ++e) acc[j][e] = 0.0f;
  }

  // A row's keys, in order, are its "virtual" sequence: positions 0..kv_prefix-1, then the
  // window entries its mask shows, compacted. Tiles and chunks are cut in that sequence and every
  // key updates the running max, sum and output on its own, in order, so a row's result depends
  // only on the keys it sees: a tree node gives bit for bit what decoding its path one token at
  // a time gives, and a request what it gives in any batch.
  int32_t vlen[kRowsPerWarp];
  int32_t warp_max = 0;
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    vlen[j] = 0;
    if (tok[j] >= 0) vlen[j] = rq.kv_prefix + VisibleWindow(rq, p.mask_words, tok[j]);
    warp_max = max(warp_max, vlen[j]);
  }
  __shared__ int32_t block_max[kWarps];
  if (lane == 0) block_max[warp] = warp_max;
  __syncthreads();
  int32_t max_vlen = 0;
  for (int w = 0; w < kWarps; ++w) max_vlen = max(max_vlen, block_max[w]);

  const int32_t c0 = wi.chunk * p.kv_chunk;
  const int32_t c1 = min(max_vlen, c0 + p.kv_chunk);
  const int32_t* table = p.block_tables + rq.block_table_begin;
  // 16-byte K/V loads when every head row is a whole number of them (and so 16-byte aligned:
  // the caches' base addresses are).
  constexpr int kVec = 16 / sizeof(T);
  const bool vec_loads =
      hd % kVec == 0 &&
      (reinterpret_cast<uintptr_t>(kc) | reinterpret_cast<uintptr_t>(vc)) % 16 == 0;
  auto slot_of = [&](int32_t pos) {
    return static_cast<int64_t>(table[pos / p.block_size]) * p.block_size + pos % p.block_size;
  };
  const float* qw = q_s + warp * kRowsPerWarp * kDMax;

  for (int32_t k0 = c0; k0 < c1; k0 += kTile) {
    // Tiles wholly inside the committed prefix are the same keys for every row: staged in shared
    // memory once; so are a causal request's (its rows' keys are positions 0, 1, ... too).
    // Other tiles reach into a tree's window and are read per row from global memory.
    const bool shared_tile = rq.mask_begin < 0 || k0 + kTile <= rq.kv_prefix;
    const int32_t tile_len = min(kTile, c1 - k0);
    if (shared_tile) {
      __syncthreads();  // the previous shared tile is no longer being read
      if (vec_loads) {
        // 16-byte loads: kVec consecutive elements of one key's head per thread.
        const int vec_per_row = hd / kVec;
        for (int idx = threadIdx.x; idx < kTile * vec_per_row; idx += blockDim.x) {
          const int kk = idx / vec_per_row, d0 = (idx % vec_per_row) * kVec;
          uint4 kraw = make_uint4(0, 0, 0, 0), vraw = make_uint4(0, 0, 0, 0);
          if (kk < tile_len) {
            const int64_t off = (slot_of(k0 + kk) * p.kv_heads + kvh) * hd + d0;
            kraw = *reinterpret_cast<const uint4*>(kc + off);
            vraw = *reinterpret_cast<const uint4*>(vc + off);
          }
          const T* ke = reinterpret_cast<const T*>(&kraw);
          const T* ve = reinterpret_cast<const T*>(&vraw);
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            k_s[kk * (kDMax + 1) + d0 + e] = ToFloat(ke[e]);
            v_s[kk * kDMax + d0 + e] = ToFloat(ve[e]);
          }
        }
      } else {
        for (int idx = threadIdx.x; idx < kTile * hd; idx += blockDim.x) {
          const int kk = idx / hd, d = idx % hd;
          float kv = 0.0f, vv = 0.0f;
          if (kk < tile_len) {
            const int64_t off = (slot_of(k0 + kk) * p.kv_heads + kvh) * hd + d;
            kv = ToFloat(kc[off]);
            vv = ToFloat(vc[off]);
          }
          k_s[kk * (kDMax + 1) + d] = kv;
          v_s[kk * kDMax + d] = vv;
        }
      }
      __syncthreads();
    }

    // Lane l owns key k0 + l of each of the warp's rows: its slot and its score.
    const int32_t v = k0 + lane;
    int64_t slot[kRowsPerWarp];
    float s[kRowsPerWarp];
    unsigned vis[kRowsPerWarp];
    bool any = false;
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j) {
      const bool mine = lane < tile_len && v < vlen[j];
      slot[j] = 0;
      s[j] = 0.0f;
      if (mine && !shared_tile) {
        const int32_t pos = v < rq.kv_prefix ? v
                                             : rq.kv_prefix + WindowEntry(rq, p.mask_words, tok[j],
                                                                          v - rq.kv_prefix);
        slot[j] = slot_of(pos);
      }
      vis[j] = __ballot_sync(0xffffffffu, mine);
      any |= vis[j] != 0;
    }
    if (!any) continue;  // warp-uniform

    if (shared_tile) {
      const float* krow = k_s + lane * (kDMax + 1);
      for (int d = 0; d < hd; ++d) {
        const float kd = krow[d];
#pragma unroll
        for (int j = 0; j < kRowsPerWarp; ++j) s[j] = fmaf(qw[j * kDMax + d], kd, s[j]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kRowsPerWarp; ++j) {
        if (!((vis[j] >> lane) & 1u)) continue;
        const T* krow = kc + (slot[j] * p.kv_heads + kvh) * hd;
        float acc_s = 0.0f;
        for (int d = 0; d < hd; ++d) acc_s = fmaf(qw[j * kDMax + d], ToFloat(krow[d]), acc_s);
        s[j] = acc_s;
      }
    }

    // Keys in order: running max m, sum l and output acc (rescaled when the max grows).
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j) {
      for (unsigned bits = vis[j]; bits != 0; bits &= bits - 1) {
        const int kk = __ffs(bits) - 1;
        const float sk = __shfl_sync(0xffffffffu, s[j], kk);
        if (sk > m[j]) {
          const float corr = m[j] == -INFINITY ? 0.0f : exp2f(m[j] - sk);
          m[j] = sk;
          l[j] *= corr;
#pragma unroll
          for (int e = 0; e < kDPerLane; ++e) acc[j][e] *= corr;
        }
        const float pk = exp2f(sk - m[j]);
        l[j] += pk;
        if (shared_tile) {
#pragma unroll
          for (int e = 0; e < kDPerLane; ++e) {
            const int d = lane + 32 * e;
            if (d < hd) acc[j][e] = fmaf(pk, v_s[kk * kDMax + d], acc[j][e]);
          }
        } else {
          const int64_t sl = __shfl_sync(0xffffffffu, slot[j], kk);
          const T* vrow = vc + (sl * p.kv_heads + kvh) * hd;
#pragma unroll
          for (int e = 0; e < kDPerLane; ++e) {
            const int d = lane + 32 * e;
            if (d < hd) acc[j][e] = fmaf(pk, ToFloat(vrow[d]), acc[j][e]);
          }
        }
      }
    }
  }

  // Results: final rows, or partial rows for the merge.
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    if (tok[j] < 0) continue;
    const int32_t row = wi.row_begin + warp * kRowsPerWarp + j;
    const int32_t h = kvh * group + row % group;
    if (rq.num_chunks == 1) {
      const int64_t t = rq.token_begin + tok[j];
      OutT* o = static_cast<OutT*>(p.out) + (t * p.qo_heads + h) * hd;
      const float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f;
#pragma unroll
      for (int e = 0; e < kDPerLane; ++e) {
        const int d = lane + 32 * e;
        if (d < hd) o[d] = FromFloat<OutT>(acc[j][e] * inv);
      }
    } else {
      const int64_t prow = rq.partial_begin +
                           (static_cast<int64_t>(wi.chunk) * rq.token_count + tok[j]) * p.qo_heads +
                           h;
      float* o = p.partial_out + prow * hd;
#pragma unroll
      for (int e = 0; e < kDPerLane; ++e) {
        const int d = lane + 32 * e;
        if (d < hd) o[d] = acc[j][e];
      }
      if (lane == 0) {
        p.partial_ml[prow * 2] = m[j];
        p.partial_ml[prow * 2 + 1] = l[j];
      }
    }
  }
}

// Combines the chunks of split requests: grid (num_tokens, qo_heads), 128 threads over head_dim.
template <typename OutT>
__global__ void TreeAttentionMergeKernel(const TreeAttentionParams p) {
  const int32_t t = blockIdx.x, h = blockIdx.y;
  const TreeAttentionRequest rq = p.requests[p.token_request[t]];
  if (rq.num_chunks == 1) return;
  const int32_t i = t - rq.token_begin;
  const int32_t hd = p.head_dim;
  auto prow = [&](int32_t c) {
    return rq.partial_begin + (static_cast<int64_t>(c) * rq.token_count + i) * p.qo_heads + h;
  };
  float mx = -INFINITY;
  for (int32_t c = 0; c < rq.num_chunks; ++c) mx = fmaxf(mx, p.partial_ml[prow(c) * 2]);
  float total = 0.0f;
  if (mx != -INFINITY) {
    for (int32_t c = 0; c < rq.num_chunks; ++c) {
      const float mc = p.partial_ml[prow(c) * 2];
      if (mc != -INFINITY) total += p.partial_ml[prow(c) * 2 + 1] * exp2f(mc - mx);
    }
  }
  OutT* o = static_cast<OutT*>(p.out) + (static_cast<int64_t>(t) * p.qo_heads + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float v = 0.0f;
    if (total > 0.0f) {
      for (int32_t c = 0; c < rq.num_chunks; ++c) {
        const float mc = p.partial_ml[prow(c) * 2];
        if (mc != -INFINITY) v += p.partial_out[prow(c) * hd + d] * exp2f(mc - mx);
      }
      v *= 1.0f / total;  // as the unsplit path: acc * (1 / l)
    }
    o[d] = FromFloat<OutT>(v);
  }
}

template <typename T, typename OutT, int kDMax>
cudaError_t LaunchTyped(const TreeAttentionParams& p, cudaStream_t stream) {
  constexpr size_t smem = SharedFloats<kDMax>() * sizeof(float);
  // Above 48 KiB a kernel must opt in (once per instantiation).
  static const cudaError_t attr =
      cudaFuncSetAttribute(reinterpret_cast<const void*>(&TreeAttentionKernel<T, OutT, kDMax>),
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr != cudaSuccess) return attr;
  if (p.num_work > 0) {
    SPECINFER_LAUNCH(dim3(p.num_work, p.kv_heads), kWarps * 32, smem, stream,
                     TreeAttentionKernel<T, OutT, kDMax>)
    (p);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (p.any_split) {
    SPECINFER_LAUNCH(dim3(p.num_tokens, p.qo_heads), 128, 0, stream, TreeAttentionMergeKernel<OutT>)
    (p);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

template <typename T, typename OutT>
cudaError_t LaunchForHeadDim(const TreeAttentionParams& p, cudaStream_t stream) {
  if (p.head_dim <= 32) return LaunchTyped<T, OutT, 32>(p, stream);
  if (p.head_dim <= 64) return LaunchTyped<T, OutT, 64>(p, stream);
  if (p.head_dim <= 128) return LaunchTyped<T, OutT, 128>(p, stream);
  return LaunchTyped<T, OutT, 256>(p, stream);
}

}  // namespace

cudaError_t LaunchTreeAttention(const TreeAttentionParams& p, AttnType in_type, bool out_float,
                                cudaStream_t stream) {
  if (p.head_dim <= 0 || p.head_dim > kTreeAttnMaxHeadDim || p.kv_heads <= 0 ||
      p.qo_heads % p.kv_heads != 0 || p.block_size <= 0 || p.kv_chunk <= 0 ||
      p.kv_chunk % kTile != 0 || p.num_tokens <= 0 || p.kv_heads > 65535 || p.qo_heads > 65535 ||
      (p.any_split &&
       (p.partial_out == nullptr || p.partial_ml == nullptr || p.token_request == nullptr)))
    return cudaErrorInvalidValue;
  switch (in_type) {
    case AttnType::kF32:
      return LaunchForHeadDim<float, float>(p, stream);
    case AttnType::kF16:
      return out_float ? LaunchForHeadDim<__half, float>(p, stream)
                       : LaunchForHeadDim<__half, __half>(p, stream);
    case AttnType::kBF16:
      return out_float ? LaunchForHeadDim<__nv_bfloat16, float>(p, stream)
                       : LaunchForHeadDim<__nv_bfloat16, __nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace specinfer::kernels
