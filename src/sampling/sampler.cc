#include "sampling/sampler.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "backend/cpu/simd.h"

namespace specinfer {

Status SamplingParams::Validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f || temperature > 100.0f)
    return InvalidArgumentError("temperature must be in [0, 100], got " +
                                std::to_string(temperature));
  if (top_k < 0) return InvalidArgumentError("top_k must be >= 0, got " + std::to_string(top_k));
  if (!std::isfinite(top_p) || top_p <= 0.0f || top_p > 1.0f)
    return InvalidArgumentError("top_p must be in (0, 1], got " + std::to_string(top_p));
  return Status::Ok();
}

int32_t ArgmaxPortable(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  return best;
}

// Two passes over the row (a vocabulary of 49k floats stays in L2): the maximum, then the first
// index holding it. A NaN anywhere hands the row to the scalar loop, whose answer with NaNs
// (they never win, unless at index 0) is the one kept. -0 and +0 compare equal in both, so the
// first of them wins in both.
__attribute__((target("avx2"))) int32_t ArgmaxAvx2(std::span<const float> logits) {
  const float* x = logits.data();
  const size_t n = logits.size();
  if (n < 16) return ArgmaxPortable(logits);
  const size_t vec_end = n / 8 * 8;
  __m256 vmax = _mm256_loadu_ps(x);
  __m256 unordered = _mm256_cmp_ps(vmax, vmax, _CMP_UNORD_Q);
  for (size_t i = 8; i < vec_end; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    vmax = _mm256_max_ps(vmax, v);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  if (_mm256_movemask_ps(unordered) != 0) return ArgmaxPortable(logits);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float m = lanes[0];
  for (float v : lanes) m = std::max(m, v);
  for (size_t i = vec_end; i < n; ++i) {
    if (std::isnan(x[i])) return ArgmaxPortable(logits);
    m = std::max(m, x[i]);
  }
  const __m256 target = _mm256_set1_ps(m);
  for (size_t i = 0; i < vec_end; i += 8) {
    const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), target, _CMP_EQ_OQ));
    if (hits != 0) return static_cast<int32_t>(i) + std::countr_zero(static_cast<unsigned>(hits));
  }
  for (size_t i = vec_end; i < n; ++i)
    if (x[i] == m) return static_cast<int32_t>(i);
  return ArgmaxPortable(logits);  // not reached: m is one of the values
}

int32_t Argmax(std::span<const float> logits) {
  // Greedy verification takes one argmax per tree node and sequence, on the engine's thread
  // between passes: the scalar loop was 4% of a 64-sequence serving run (perf).
  if (cpu::GetCpuFeatures().use_avx2_kernels) return ArgmaxAvx2(logits);
  return ArgmaxPortable(logits);
}

namespace {

// Top-p without top-k: `order` receives every index, those that can be in the nucleus of
// `probs` (non-negative, most likely first reaching `target` mass) first; returns their count.
// One pass sums the probabilities into buckets by the top bits of their float bit patterns
// (non-negative floats order as their bits; a bucket spans a factor 2^(1/8)); the buckets from
// the top down whose mass reaches the target, and one more below for the rounding of summing in
// another order, hold the nucleus. Every index outside them is less likely than every candidate,
// so the candidates sorted are the full sort's prefix.
size_t NucleusCandidates(std::span<const float> probs, double target, std::vector<int32_t>& order) {
  constexpr int kShift = 20;  // 8 exponent bits + 3 mantissa bits: 2^11 buckets
  const size_t n = probs.size();
  auto bucket = [&](size_t i) { return std::bit_cast<uint32_t>(probs[i]) >> kShift; };
  thread_local std::vector<double> mass;
  mass.assign(size_t{1} << (31 - kShift), 0.0);
  for (size_t i = 0; i < n; ++i) mass[bucket(i)] += probs[i];
  uint32_t lowest = 0;
  double acc = 0.0;
  for (uint32_t b = static_cast<uint32_t>(mass.size()); b-- > 0;) {
    acc += mass[b];
    if (acc >= target) {
      lowest = b > 0 ? b - 1 : 0;
      break;
    }
  }
  order.resize(n);
  size_t front = 0, back = n;
  for (size_t i = 0; i < n; ++i) {
    if (bucket(i) >= lowest) {
      order[front++] = static_cast<int32_t>(i);
    } else {
      order[--back] = static_cast<int32_t>(i);
    }
  }
  return front;
}

}  // namespace

void ComputeProbs(std::span<const float> logits, const SamplingParams& params,
                  std::vector<float>& probs) {
  const size_t n = logits.size();
  probs.assign(n, 0.0f);
  if (params.greedy()) {
    probs[Argmax(logits)] = 1.0f;
    return;
  }
  // Softmax of logits / T, in double for the normaliser.
  const float inv_t = 1.0f / params.temperature;
  float max = logits[0];
  for (float v : logits) max = std::max(max, v);
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    float e = std::exp((logits[i] - max) * inv_t);
    probs[i] = e;
    sum += e;
  }
  const bool use_k = params.top_k > 0 && static_cast<size_t>(params.top_k) < n;
  const bool use_p = params.top_p < 1.0f;
  if (!use_k && !use_p) {
    const float inv = static_cast<float>(1.0 / sum);
    for (float& p : probs) p *= inv;
    return;
  }
  // Candidates ordered by probability, ties by index (so the kept set is deterministic): only as
  // long a prefix of that order as the cut needs. Top-k sorts its k. Top-p alone sorts only the
  // candidates that can be in the nucleus (sorting a 49k vocabulary took ~6 ms a row; a nucleus
  // is often tens of tokens): see NucleusCandidates. The kept set is the full sort's.
  thread_local std::vector<int32_t> order;
  auto by_prob = [&](int32_t a, int32_t b) {
    return probs[a] != probs[b] ? probs[a] > probs[b] : a < b;
  };
  size_t keep = use_k ? static_cast<size_t>(params.top_k) : n;
  size_t sorted = keep;  // order[0, sorted) is in by_prob order
  if (use_k) {
    order.resize(n);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), by_prob);
  }
  if (use_p) {
    // Mass relative to what top-k kept (without top-k: the whole vocabulary's, `sum`).
    double kept_mass = sum;
    if (use_k) {
      kept_mass = 0.0;
      for (size_t i = 0; i < keep; ++i) kept_mass += probs[order[i]];
    }
    const double target = static_cast<double>(params.top_p) * kept_mass;
    if (!use_k) {
      sorted = NucleusCandidates(probs, target, order);
      std::sort(order.begin(), order.begin() + sorted, by_prob);
    }
    size_t cut = keep;  // if rounding never lets the sum reach the target: all of them
    double acc = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      if (i == sorted) {  // the candidates fell short (rounding): order the rest too
        std::sort(order.begin() + sorted, order.end(), by_prob);
        sorted = n;
      }
      acc += probs[order[i]];
      if (acc >= target) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
  }
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += probs[order[i]];
  const double inv = 1.0 / kept;
  thread_local std::vector<float> kept_probs;
  kept_probs.resize(keep);
  for (size_t i = 0; i < keep; ++i) kept_probs[i] = static_cast<float>(probs[order[i]] * inv);
  std::fill(probs.begin(), probs.end(), 0.0f);
  for (size_t i = 0; i < keep; ++i) probs[order[i]] = kept_probs[i];
}

int32_t SampleFromProbs(std::span<const float> probs, Rng& rng) {
  return SampleFromProbs(probs, rng.Uniform());
}

int32_t SampleFromProbs(std::span<const float> probs, double u) {
  double acc = 0.0;
  int32_t last_nonzero = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    acc += probs[i];
    last_nonzero = static_cast<int32_t>(i);
    if (u < acc) return last_nonzero;
  }
  return last_nonzero;
}

int32_t SampleToken(std::span<const float> logits, const SamplingParams& params, Rng& rng,
                    std::vector<float>& scratch) {
  if (params.greedy()) return Argmax(logits);
  ComputeProbs(logits, params, scratch);
  return SampleFromProbs(scratch, rng);
}

}  // namespace specinfer
