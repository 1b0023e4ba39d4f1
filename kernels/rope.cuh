// Rotary position embedding on the GPU, in place, for the query and key heads of a batch.
//
// For token t at position p = positions[t], every head h and pair i < head_dim / 2 rotates
// (a, b) -> (a cos - b sin, a sin + b cos) by angle p * inv_freq[i], where the pair is
// (2i, 2i + 1) (interleaved: llama2.c, GGUF llama) or (i, i + head_dim / 2) (half: Hugging Face).
// cos/sin come from host-precomputed tables [max_pos, head_dim / 2] (the CPU's RopeTable values,
// so results are bit-identical to cpu::RopeTable::Apply); positions >= max_pos use cosf/sinf of
// float(p) * inv_freq[i] (a few ulp from the CPU's std::cos). Scaled frequencies (linear, llama3,
// freq factors) are applied on the host when the tables are built.
// Layout: q [n, q_heads, head_dim], k [n, k_heads, head_dim] float32 (k may be null);
// positions [n]; cos_table, sin_table [max_pos, head_dim / 2]; inv_freq [head_dim / 2].
// Launch: grid (tokens, up to 32) of 128 threads; a token's (head, pair) elements spread over its
// blocks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace specinfer::kernels {

enum class RopeMode : int32_t { kInterleaved = 0, kHalf = 1 };

cudaError_t LaunchRope(float* q, int32_t q_heads, float* k, int32_t k_heads, int32_t head_dim,
                       const int32_t* positions, int32_t n, const float* cos_table,
                       const float* sin_table, int32_t max_pos, const float* inv_freq,
                       RopeMode mode, cudaStream_t stream);

}  // namespace specinfer::kernels
