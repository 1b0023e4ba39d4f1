// The paged KV cache on the GPU: appending new entries and moving entries between slots.
//
// Storage (per K and per V): [layers][num_slots][kv_dim] elements of T (float32, fp16 or bf16),
// slot = block * block_size + offset, the block tables being KvCacheManager's (kv/kv_cache.h).
//
// KvAppend: cache[slot[t] * kv_dim + i] = T(src[t * kv_dim + i]) for t < n, i < kv_dim, for the
//   K and V of one layer (k_cache, v_cache point at that layer). src float32 [n, kv_dim].
//   Exact for float32 caches; rounded to nearest even otherwise.
// KvMove: for each move m < count, copies the K and V entries of slot src[m] to slot dst[m] in
//   every layer (layer_stride elements between layers). The moves run in parallel, so the
//   caller must order them itself where one move reads what another writes (the host glue
//   launches one move at a time in that case); exact.
// Launch: KvAppend grid (tokens, up to 32) of 128 threads, a token's row spread over its blocks;
// KvMove grid (count, layers).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace specinfer::kernels {

template <typename T>
cudaError_t LaunchKvAppend(const float* k, const float* v, const int64_t* slots, int32_t n,
                           int32_t kv_dim, T* k_cache, T* v_cache, cudaStream_t stream);

// elem_bytes: sizeof(T) of the cache (2 or 4).
cudaError_t LaunchKvMove(void* k_cache, void* v_cache, int32_t elem_bytes, int32_t layers,
                         int64_t layer_stride, int32_t kv_dim, const int64_t* src,
                         const int64_t* dst, int32_t count, cudaStream_t stream);

}  // namespace specinfer::kernels
