// Turning logits into the next token: greedy, temperature, top-k and top-p (nucleus) sampling.
//
// The distribution actually sampled from is computed by ComputeProbs, in this order (as vLLM and
// Hugging Face do): divide the logits by the temperature, softmax, keep the top_k most likely
// tokens, keep the smallest prefix (by descending probability) whose mass reaches top_p,
// renormalise. Every other token gets probability exactly 0. Speculative verification applies
// the very same function to the LLM's logits (p) and to a draft model's logits (q), which is what
// keeps multi-step speculative sampling exact under temperature, top-k and top-p.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "specinfer/status.h"

namespace specinfer {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy (argmax)
  int32_t top_k = 0;         // 0: no limit
  float top_p = 1.0f;        // 1: no limit
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0.0f || top_k == 1; }
  // InvalidArgument for temperature < 0 or > 100, top_k < 0, top_p outside (0, 1], NaN.
  Status Validate() const;
};

// Per-request random stream: a seeded 64-bit Mersenne twister, so a run is repeatable.
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  // Uniform in [0, 1), 53 random bits.
  double Uniform() { return static_cast<double>(gen_() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  std::mt19937_64 gen_;
};

// Index of the largest logit (the lowest index among equals; NaNs never win, unless at index 0).
// Vectorised where the CPU allows (backend/cpu/simd.h).
int32_t Argmax(std::span<const float> logits);
// The kernels behind it, for tests: the portable loop, and the AVX2 one (callable only where
// cpu::GetCpuFeatures().use_avx2_kernels).
int32_t ArgmaxPortable(std::span<const float> logits);
int32_t ArgmaxAvx2(std::span<const float> logits);

// Fills `probs` (resized to logits.size()) with the distribution sampled from under `params`
// (see the file comment). For greedy params it is one-hot on the argmax.
void ComputeProbs(std::span<const float> logits, const SamplingParams& params,
                  std::vector<float>& probs);

// Draws an index from a distribution over its entries (which must sum to ~1; the last nonzero
// entry absorbs rounding).
int32_t SampleFromProbs(std::span<const float> probs, Rng& rng);
// The same draw at a given uniform u in [0, 1): the first index whose cumulative probability (in
// index order, summed in double) exceeds u. SampleFromProbs(probs, rng) is this at rng.Uniform().
int32_t SampleFromProbs(std::span<const float> probs, double u);

// The next token under `params`: argmax for greedy, else a draw from ComputeProbs.
int32_t SampleToken(std::span<const float> logits, const SamplingParams& params, Rng& rng,
                    std::vector<float>& scratch);

}  // namespace specinfer
