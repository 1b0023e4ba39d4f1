// Logits post-processing on the GPU: greedy argmax and the sampling distribution.
//
// Argmax: out[r] = index of the largest logits[r, :] (the lowest index among equals), as
//   specinfer::Argmax (NaNs are not supported); values[r], if values is not null, that logit.
// SamplingProbs: probs[r, :] = the distribution specinfer::ComputeProbs (sampling/sampler.h)
//   samples from: softmax of logits / temperature, then the top_k most likely tokens (ties by
//   lower index), then the smallest prefix by descending probability whose mass reaches top_p of
//   what top-k kept (ties at the cut by lower index), renormalised; 0 elsewhere; one-hot on the
//   argmax when greedy (temperature <= 0 or top_k == 1). The kept set is found without sorting:
//   the top-k and top-p thresholds are found by bisection over the float bit patterns of the
//   probabilities (31 counting/summing passes each), then ties at a threshold are resolved in
//   index order. Tolerance: probabilities within 1e-6 + 1e-5 relative of the CPU's (expf vs
//   std::exp); the kept set is the CPU's except where a cumulative mass ties the top_p target to
//   within double rounding.
// DrawTokens: a token per row by draws[r] (a device array): the argmax for greedy settings
//   (temperature <= 0 or top_k == 1; values[r] its logit), else the token drawn at uniform u
//   from the row's SamplingProbs distribution: the first id whose cumulative probability (in id
//   order, summed in double) exceeds u, the last nonzero one if rounding leaves u beyond the
//   total, as specinfer::SampleFromProbs(probs, u) (values[r] its probability). A drawn row of
//   `logits` is overwritten with its distribution. Cumulative sums are taken per chunk of ids,
//   so a u within double rounding of a boundary may pick the neighbouring token.
// DistRows: each row of `logits` becomes its SamplingProbs distribution under settings[r] (its u
//   unused), in place; counts[r] = its nonzero probabilities; and the rows are packed one after
//   another into `packed` (4-byte words; at most rows * vocab), row r taking
//   DistRowWords(counts[r], vocab) words: a sparse row (DistRowSparse: the rule of
//   specinfer::DistRows) its counts[r] probabilities then their ids, ascending; a dense row all
//   vocab probabilities. What crosses to the host for multi-step speculative sampling.
// Layout: logits, probs [rows, vocab] float32 row-major; out [rows].
// Launch: one block of 1024 threads per row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "elem_type.cuh"  // SPECINFER_HOST_DEVICE

namespace specinfer::kernels {

struct SamplingConfig {
  float temperature = 1.0f;
  int32_t top_k = 0;   // 0: no limit
  float top_p = 1.0f;  // 1: no limit
};

// ForwardBatch's TokenDraw as the device reads it.
struct TokenDraw {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  int32_t unused = 0;
  double u = 0.0;
};

// Whether a distribution row with `kept` nonzero probabilities is packed sparse, and the words
// it takes (specinfer::DistRows::Sparse's rule, kept equal to it by a test).
SPECINFER_HOST_DEVICE inline bool DistRowSparse(int64_t kept, int32_t vocab) {
  return kept * 8 <= vocab;
}
SPECINFER_HOST_DEVICE inline int64_t DistRowWords(int64_t kept, int32_t vocab) {
  return DistRowSparse(kept, vocab) ? 2 * kept : vocab;
}

cudaError_t LaunchArgmax(const float* logits, int32_t rows, int32_t vocab, int32_t* out,
                         cudaStream_t stream, float* values = nullptr);
cudaError_t LaunchSamplingProbs(const float* logits, int32_t rows, int32_t vocab,
                                SamplingConfig config, float* probs, cudaStream_t stream);
cudaError_t LaunchDistRows(float* logits, int32_t rows, int32_t vocab, const TokenDraw* settings,
                           int32_t* counts, uint32_t* packed, cudaStream_t stream);
cudaError_t LaunchDrawTokens(float* logits, int32_t rows, int32_t vocab, const TokenDraw* draws,
                             int32_t* out, cudaStream_t stream, float* values = nullptr);

}  // namespace specinfer::kernels
