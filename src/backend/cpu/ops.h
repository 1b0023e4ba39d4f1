// Element-wise and normalisation kernels of the Llama layer on the CPU (float32).
// These are the reference semantics every other backend is checked against.
#pragma once

#include <cstdint>

#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/model_config.h"

namespace specinfer::cpu {

// out[i] = x[i] * w[i] / sqrt(mean(x^2) + eps), for i < n. out may alias x.
void RmsNorm(const float* x, const float* w, float* out, int64_t n, float eps);

// Precomputed rotary cos/sin for positions [0, max_pos): [max_pos, head_dim / 2] each, from the
// head_dim / 2 inverse frequencies (RopeInvFrequencies(config): scaling already applied).
// angle(pos, i) = float(pos) * inv_freq[i].
class RopeTable {
 public:
  RopeTable() = default;
  RopeTable(std::vector<float> inv_freq, int32_t max_pos);
  // Rotates `num_heads` heads of `vec` ([num_heads, head_dim]) to position `pos`.
  // Positions beyond the table are computed on the fly.
  void Apply(float* vec, int32_t num_heads, int32_t pos, RopeStyle style) const;

 private:
  void Angle(int32_t pos, int32_t i, float* c, float* s) const;
  int32_t head_dim_ = 0;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  int32_t max_pos_ = 0;
  std::vector<float> cos_, sin_;  // [max_pos, head_dim / 2]
};

// In place: x[i] = exp(x[i] - max) / sum, for i < n. With AVX2, exp is a polynomial within 2 ulp
// of expf (inputs below -87.3 give 2^-126, not 0) and the sum runs in 8 lanes.
void Softmax(float* x, int64_t n);

// gate[i] = silu(gate[i]) * up[i], for i < n; with AVX2 through the same exp as Softmax. Each
// element's value depends on its inputs only (not on n or i).
void SwiGlu(float* gate, const float* up, int64_t n);

// gate[i] = gelu_tanh(gate[i]) * up[i], for i < n (GeGLU; GELU's tanh approximation, as
// PyTorch's gelu(approximate="tanh") and ggml_gelu).
void GeGluTanh(float* gate, const float* up, int64_t n);

// In place: x[i] = cap * tanh(x[i] / cap), for i < n; nothing when cap is 0 (Gemma 2).
void SoftCap(float* x, int64_t n, float cap);

// Attention's inner loops: sum_i a[i] * b[i], and y[i] += alpha * x[i], for i < n. AVX2 (8 lanes,
// fused multiply-add) where the CPU has it, scalar otherwise. The summation order depends only on
// n, never on the batch, so a token's attention is the same in every batch.
float Dot(const float* a, const float* b, int64_t n);
void Axpy(float alpha, const float* x, float* y, int64_t n);

// Attention of new token `i` of sequence `s` for the `group` query heads that share one KV head:
// over the committed prefix, then what s.mask lets it see of the masked window and the new tokens
// (causal when s.mask is null), in position order. Position p lives in cache slot slots[p] (for
// every p < s.kv_end(); the caller resolves the block table once per pass for all tokens, heads
// and layers); its key and value are at keys + slot * slot_stride and values + slot *
// slot_stride ([head_dim] each).
//   q: [group, head_dim], out: [group, head_dim].
// With sliding_window > 0, only keys at positions p with qpos - p < sliding_window are seen
// (qpos: the token's rotary position); scores are soft-capped by `softcap` when it is not 0.
// `visible` and `scores` are scratch. Used by every CPU runner (whole model and TP shards), so
// a token's attention is bit-identical whichever computes it.
void AttendKvHead(const BatchSequence& s, int32_t i, const int32_t* slots, const float* keys,
                  const float* values, int64_t slot_stride, const float* q, int32_t group,
                  int32_t head_dim, float scale, std::vector<int32_t>& visible,
                  std::vector<float>& scores, float* out, int32_t qpos = 0,
                  int32_t sliding_window = 0, float softcap = 0.0f);

}  // namespace specinfer::cpu
