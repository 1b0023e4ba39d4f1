#include <climits>

#include "launch.cuh"
#include "sampling.cuh"

namespace specinfer::kernels {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarpsPerBlock = kThreads / 32;

// Block-wide reductions (every thread gets the result). `scratch` holds kWarpsPerBlock values.
template <typename V, typename Op>
__device__ V BlockReduce(V v, Op op, V* scratch) {
  for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  __syncthreads();  // scratch may still be read by a previous reduction
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  V r = scratch[0];
  for (int i = 1; i < kWarpsPerBlock; ++i) r = op(r, scratch[i]);
  return r;
}

struct SumD {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct SumI {
  __device__ int operator()(int a, int b) const { return a + b; }
};
struct MaxF {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Lowest index of the maximum: packs nothing, reduces value then index. `max_out`, if given,
// receives the maximum.
__device__ int32_t BlockArgmax(const float* row, int32_t vocab, float* fscratch, int* iscratch,
                               float* max_out = nullptr) {
  float best = -INFINITY;
  int best_i = INT_MAX;
  for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x)
    if (row[i] > best || (row[i] == best && i < best_i)) best = row[i], best_i = i;
  const float mx = BlockReduce(best, MaxF(), fscratch);
  int cand = best == mx ? best_i : INT_MAX;
  struct MinI {
    __device__ int operator()(int a, int b) const { return a < b ? a : b; }
  };
  const int idx = BlockReduce(cand, MinI(), iscratch);
  if (max_out) *max_out = mx;
  return idx == INT_MAX ? 0 : idx;
}

__global__ void __launch_bounds__(kThreads)
    ArgmaxKernel(const float* __restrict__ logits, int32_t vocab, int32_t* out, float* values) {
  __shared__ float fs[kWarpsPerBlock];
  __shared__ int is[kWarpsPerBlock];
  float mx;
  const int32_t a =
      BlockArgmax(logits + static_cast<int64_t>(blockIdx.x) * vocab, vocab, fs, is, &mx);
  if (threadIdx.x == 0) {
    out[blockIdx.x] = a;
    if (values) values[blockIdx.x] = mx;
  }
}

// One row's sampling distribution (SamplingProbs) by the whole block. `out` may be `row`: each
// thread reads an element of `row` before it writes that element of `out`, and the greedy
// one-hot is written after the argmax's reductions.
__device__ void RowProbs(const float* row, int32_t vocab, SamplingConfig cfg, float* out) {
  __shared__ float fs[kWarpsPerBlock];
  __shared__ int is[kWarpsPerBlock];
  __shared__ double ds[kWarpsPerBlock];
  __shared__ int tie_cut_shared;

  if (cfg.temperature <= 0.0f || cfg.top_k == 1) {
    const int32_t a = BlockArgmax(row, vocab, fs, is);
    for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) out[i] = i == a ? 1.0f : 0.0f;
    return;
  }
  float mx = -INFINITY;
  for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) mx = fmaxf(mx, row[i]);
  mx = BlockReduce(mx, MaxF(), fs);
  const float inv_t = 1.0f / cfg.temperature;
  double sum = 0.0;
  for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float e = expf(__fmul_rn(__fsub_rn(row[i], mx), inv_t));
    out[i] = e;
    sum += e;
  }
  sum = BlockReduce(sum, SumD(), ds);
  const bool use_k = cfg.top_k > 0 && cfg.top_k < vocab;
  const bool use_p = cfg.top_p < 1.0f;
  if (!use_k && !use_p) {
    const float inv = static_cast<float>(1.0 / sum);
    for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) out[i] *= inv;
    return;
  }
  // Every thread reads back only the elements it wrote: no barrier needed for `out`.

  // Top-k: tau = the k-th largest value; keep e > tau, and ties at tau up to index tie_k.
  uint32_t tau_k = 0;
  int32_t tie_k = vocab;
  if (use_k) {
    uint32_t lo = 0, hi = 0x7f800001u;  // count(e >= lo) >= k; count(e >= hi) < k
    while (hi - lo > 1) {
      const uint32_t mid = lo + (hi - lo) / 2;
      const float t = __uint_as_float(mid);
      int c = 0;
      for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) c += out[i] >= t;
      c = BlockReduce(c, SumI(), is);
      if (c >= cfg.top_k)
        lo = mid;
      else
        hi = mid;
    }
    tau_k = lo;
    const float tau = __uint_as_float(lo);
    int gt = 0, eq = 0;
    for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      gt += out[i] > tau;
      eq += out[i] == tau;
    }
    gt = BlockReduce(gt, SumI(), is);
    eq = BlockReduce(eq, SumI(), is);
    const int need = cfg.top_k - gt;
    if (need < eq) {
      __syncthreads();  // every thread's writes to out are visible to thread 0
      if (threadIdx.x == 0) {
        int seen = 0, cut = -1;
        for (int32_t i = 0; i < vocab && seen < need; ++i)
          if (out[i] == tau) ++seen, cut = i;
        tie_cut_shared = cut;
      }
      __syncthreads();
      tie_k = tie_cut_shared;
    }
  }
  const float tau_kf = __uint_as_float(tau_k);
  auto kept_k = [&](int32_t i, float e) {
    return !use_k || e > tau_kf || (e == tau_kf && i <= tie_k);
  };

  // Top-p over what top-k kept: v = the largest value whose kept mass at or above it reaches
  // the target; keep e > v, and ties at v in index order until the target is reached.
  float tau_p = 0.0f;
  int32_t tie_p = vocab;
  bool p_active = false;
  if (use_p) {
    double kept_mass = 0.0;
    for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x)
      if (kept_k(i, out[i])) kept_mass += out[i];
    kept_mass = BlockReduce(kept_mass, SumD(), ds);
    const double target = static_cast<double>(cfg.top_p) * kept_mass;
    uint32_t lo = 0, hi = 0x7f800001u;  // mass(e >= lo) >= target; mass(e >= hi) < target
    while (hi - lo > 1) {
      const uint32_t mid = lo + (hi - lo) / 2;
      const float t = __uint_as_float(mid);
      double s = 0.0;
      for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x)
        if (out[i] >= t && kept_k(i, out[i])) s += out[i];
      s = BlockReduce(s, SumD(), ds);
      if (s >= target)
        lo = mid;
      else
        hi = mid;
    }
    tau_p = __uint_as_float(lo);
    p_active = true;
    double gt_mass = 0.0;
    int eq = 0;
    for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      if (!kept_k(i, out[i])) continue;
      if (out[i] > tau_p) gt_mass += out[i];
      if (out[i] == tau_p) ++eq;
    }
    gt_mass = BlockReduce(gt_mass, SumD(), ds);
    eq = BlockReduce(eq, SumI(), is);
    if (eq > 1) {
      __syncthreads();
      if (threadIdx.x == 0) {
        double acc = gt_mass;
        int cut = -1;
        for (int32_t i = 0; i < vocab; ++i) {
          if (out[i] == tau_p && kept_k(i, out[i])) {
            acc += out[i];
            cut = i;
            if (acc >= target) break;
          }
        }
        tie_cut_shared = cut;
      }
      __syncthreads();
      tie_p = tie_cut_shared;
    }
  }
  auto kept = [&](int32_t i, float e) {
    return kept_k(i, e) && (!p_active || e > tau_p || (e == tau_p && i <= tie_p));
  };
  double kept_total = 0.0;
  for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x)
    if (kept(i, out[i])) kept_total += out[i];
  kept_total = BlockReduce(kept_total, SumD(), ds);
  const double inv = 1.0 / kept_total;
  __syncthreads();  // thread 0's tie scans read `out` above; now it is overwritten
  for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float e = out[i];
    out[i] = kept(i, e) ? static_cast<float>(e * inv) : 0.0f;
  }
}

__global__ void __launch_bounds__(kThreads)
    SamplingProbsKernel(const float* __restrict__ logits, int32_t vocab, SamplingConfig cfg,
                        float* __restrict__ probs) {
  RowProbs(logits + static_cast<int64_t>(blockIdx.x) * vocab, vocab, cfg,
           probs + static_cast<int64_t>(blockIdx.x) * vocab);
}

// The token at uniform u of a distribution over `vocab` ids (SampleFromProbs): the first id whose
// cumulative probability, summed in id order, exceeds u; the last nonzero one if rounding leaves u
// at or beyond the total. Each thread sums a contiguous chunk; thread 0 finds the chunk where the
// running sum passes u and walks it.
__device__ int32_t BlockDraw(const float* probs, int32_t vocab, double u) {
  __shared__ double chunk_sum[kThreads];
  __shared__ int32_t chunk_last[kThreads];  // the chunk's last nonzero id, or -1
  __shared__ int32_t drawn;
  const int32_t per = (vocab + static_cast<int32_t>(blockDim.x) - 1) / blockDim.x;
  const int32_t begin = min(vocab, static_cast<int32_t>(threadIdx.x) * per);
  const int32_t end = min(vocab, begin + per);
  double sum = 0.0;
  int32_t last = -1;
  for (int32_t i = begin; i < end; ++i) {
    if (probs[i] > 0.0f) {
      sum += probs[i];
      last = i;
    }
  }
  chunk_sum[threadIdx.x] = sum;
  chunk_last[threadIdx.x] = last;
  __syncthreads();
  if (threadIdx.x == 0) {
    double acc = 0.0;
    int32_t found = -1, last_nonzero = 0;
    for (int32_t t = 0; t < static_cast<int32_t>(blockDim.x) && found < 0; ++t) {
      if (chunk_last[t] >= 0) last_nonzero = chunk_last[t];
      if (!(u < acc + chunk_sum[t])) {
        acc += chunk_sum[t];
        continue;
      }
      for (int32_t i = t * per, e = min(vocab, i + per); i < e; ++i) {
        if (probs[i] <= 0.0f) continue;
        acc += probs[i];
        if (u < acc) {
          found = i;
          break;
        }
      }
    }
    drawn = found >= 0 ? found : last_nonzero;
  }
  __syncthreads();
  return drawn;
}

__global__ void __launch_bounds__(kThreads)
    DrawTokensKernel(float* __restrict__ logits, int32_t vocab,
                     const TokenDraw* __restrict__ draws, int32_t* out, float* values) {
  __shared__ float fs[kWarpsPerBlock];
  __shared__ int is[kWarpsPerBlock];
  float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const TokenDraw d = draws[blockIdx.x];
  if (d.temperature <= 0.0f || d.top_k == 1) {
    float mx;
    const int32_t a = BlockArgmax(row, vocab, fs, is, &mx);
    if (threadIdx.x == 0) {
      out[blockIdx.x] = a;
      if (values) values[blockIdx.x] = mx;
    }
    return;
  }
  RowProbs(row, vocab, SamplingConfig{d.temperature, d.top_k, d.top_p}, row);
  __syncthreads();  // every thread's probabilities are visible to BlockDraw's chunks
  const int32_t token = BlockDraw(row, vocab, d.u);
  if (threadIdx.x == 0) {
    out[blockIdx.x] = token;
    if (values) values[blockIdx.x] = row[token];
  }
}

// Each row's distribution in place, and its count of nonzero probabilities.
__global__ void __launch_bounds__(kThreads)
    DistProbsKernel(float* __restrict__ logits, int32_t vocab,
                    const TokenDraw* __restrict__ settings, int32_t* __restrict__ counts) {
  __shared__ int is[kWarpsPerBlock];
  float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const TokenDraw d = settings[blockIdx.x];
  RowProbs(row, vocab, SamplingConfig{d.temperature, d.top_k, d.top_p}, row);
  __syncthreads();
  int c = 0;
  for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) c += row[i] != 0.0f;
  c = BlockReduce(c, SumI(), is);
  if (threadIdx.x == 0) counts[blockIdx.x] = c;
}

// Row r packed at the words the rows before it take (each block sums them itself: a chunk has at
// most a few hundred rows). Sparse rows are compacted in id order: each thread takes a contiguous
// run of ids, and its run's nonzeros go after those of the threads before it.
__global__ void __launch_bounds__(kThreads)
    DistPackKernel(const float* __restrict__ probs, int32_t vocab,
                   const int32_t* __restrict__ counts, uint32_t* __restrict__ packed) {
  __shared__ int32_t run_count[kThreads];
  __shared__ int64_t row_offset;
  const int32_t r = blockIdx.x;
  if (threadIdx.x == 0) {
    int64_t off = 0;
    for (int32_t i = 0; i < r; ++i) off += DistRowWords(counts[i], vocab);
    row_offset = off;
  }
  __syncthreads();
  const float* row = probs + static_cast<int64_t>(r) * vocab;
  uint32_t* out = packed + row_offset;
  const int32_t kept = counts[r];
  if (!DistRowSparse(kept, vocab)) {
    for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) out[i] = __float_as_uint(row[i]);
    return;
  }
  const int32_t per = (vocab + static_cast<int32_t>(blockDim.x) - 1) / blockDim.x;
  const int32_t begin = min(vocab, static_cast<int32_t>(threadIdx.x) * per);
  const int32_t end = min(vocab, begin + per);
  int32_t mine = 0;
  for (int32_t i = begin; i < end; ++i) mine += row[i] != 0.0f;
  run_count[threadIdx.x] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {  // exclusive prefix over the runs
    int32_t acc = 0;
    for (int32_t t = 0; t < static_cast<int32_t>(blockDim.x); ++t) {
      const int32_t n = run_count[t];
      run_count[t] = acc;
      acc += n;
    }
  }
  __syncthreads();
  int32_t at = run_count[threadIdx.x];
  for (int32_t i = begin; i < end; ++i) {
    if (row[i] == 0.0f) continue;
    out[at] = __float_as_uint(row[i]);
    out[kept + at] = static_cast<uint32_t>(i);
    ++at;
  }
}

}  // namespace

cudaError_t LaunchDistRows(float* logits, int32_t rows, int32_t vocab, const TokenDraw* settings,
                           int32_t* counts, uint32_t* packed, cudaStream_t stream) {
  if (rows <= 0 || vocab <= 0) return cudaErrorInvalidValue;
  SPECINFER_LAUNCH(rows, kThreads, 0, stream, DistProbsKernel)(logits, vocab, settings, counts);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  SPECINFER_LAUNCH(rows, kThreads, 0, stream, DistPackKernel)(logits, vocab, counts, packed);
  return cudaGetLastError();
}

cudaError_t LaunchArgmax(const float* logits, int32_t rows, int32_t vocab, int32_t* out,
                         cudaStream_t stream, float* values) {
  if (rows <= 0 || vocab <= 0) return cudaErrorInvalidValue;
  SPECINFER_LAUNCH(rows, kThreads, 0, stream, ArgmaxKernel)(logits, vocab, out, values);
  return cudaGetLastError();
}

cudaError_t LaunchSamplingProbs(const float* logits, int32_t rows, int32_t vocab,
                                SamplingConfig config, float* probs, cudaStream_t stream) {
  if (rows <= 0 || vocab <= 0 || !(config.top_p > 0.0f && config.top_p <= 1.0f) || config.top_k < 0)
    return cudaErrorInvalidValue;
  SPECINFER_LAUNCH(rows, kThreads, 0, stream, SamplingProbsKernel)(logits, vocab, config, probs);
  return cudaGetLastError();
}

cudaError_t LaunchDrawTokens(float* logits, int32_t rows, int32_t vocab, const TokenDraw* draws,
                             int32_t* out, cudaStream_t stream, float* values) {
  if (rows <= 0 || vocab <= 0) return cudaErrorInvalidValue;
  SPECINFER_LAUNCH(rows, kThreads, 0, stream, DrawTokensKernel)(logits, vocab, draws, out, values);
  return cudaGetLastError();
}

}  // namespace specinfer::kernels
