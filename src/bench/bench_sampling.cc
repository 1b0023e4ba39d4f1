// Micro-benchmark of ComputeProbs (sampling/sampler.h), the distribution every sampled token and
// every speculative verification step draws from, on one thread: median microseconds per row for
// each setting against the implementation it replaced, which sorted the whole vocabulary for top_p
// (the baseline, measured in the same run), with the kept set's size and the bytes its row takes
// as a distribution row (sampling/dist_rows.h: what a GPU runner sends back for a sampled token
// tree's node) beside the row's logits (4 * vocab bytes).
//
//   bench_sampling [--vocab 49152] [--runs 15] [--rows 20]
//
// Logits are Gaussian (scale s: the larger, the more peaked the softmax and the smaller the
// nucleus) plus one outlier: s 1.5 leaves thousands of tokens in a top_p 0.9 nucleus, s 4 tens,
// s 8 a handful, as a confident LLM step does. 49152 is SmolLM2's vocabulary.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "bench/bench_util.h"
#include "sampling/dist_rows.h"
#include "sampling/sampler.h"

namespace specinfer {
namespace {

using Clock = std::chrono::steady_clock;

// ComputeProbs as it was before it sorted only the prefix the cut needs (the baseline): softmax;
// top-k by partial_sort; top-p alone by sorting the whole vocabulary.
void FullSortProbs(std::span<const float> logits, const SamplingParams& params,
                   std::vector<float>& probs) {
  const size_t n = logits.size();
  probs.assign(n, 0.0f);
  const float inv_t = 1.0f / params.temperature;
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    probs[i] = std::exp((logits[i] - max) * inv_t);
    sum += probs[i];
  }
  const bool use_k = params.top_k > 0 && static_cast<size_t>(params.top_k) < n;
  const bool use_p = params.top_p < 1.0f;
  if (!use_k && !use_p) {
    const float inv = static_cast<float>(1.0 / sum);
    for (float& p : probs) p *= inv;
    return;
  }
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  auto by_prob = [&](int32_t a, int32_t b) {
    return probs[a] != probs[b] ? probs[a] > probs[b] : a < b;
  };
  size_t keep = use_k ? static_cast<size_t>(params.top_k) : n;
  if (use_k) {
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), by_prob);
  } else {
    std::sort(order.begin(), order.end(), by_prob);
  }
  if (use_p) {
    double mass = 0.0;
    for (size_t i = 0; i < keep; ++i) mass += probs[order[i]];
    double acc = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      acc += probs[order[i]];
      if (acc >= params.top_p * mass) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += probs[order[i]];
  std::vector<float> out(n, 0.0f);
  for (size_t i = 0; i < keep; ++i) out[order[i]] = static_cast<float>(probs[order[i]] / kept);
  probs.swap(out);
}

// Median over `runs` of the mean microseconds per row of `fn` over `rows`.
template <typename Fn>
double MedianMicros(const std::vector<std::vector<float>>& rows, int runs, Fn&& fn) {
  std::vector<double> us;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = Clock::now();
    for (const auto& row : rows) fn(row);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                 static_cast<double>(rows.size()));
  }
  return bench::Median(us);
}

}  // namespace
}  // namespace specinfer

int main(int argc, char** argv) {
  using namespace specinfer;
  CLI::App app{"ComputeProbs: microseconds per row against the full-sort version it replaced"};
  int vocab = 49152, runs = 15, rows = 20;
  app.add_option("--vocab", vocab, "vocabulary size")->check(CLI::Range(2, 1 << 22));
  app.add_option("--runs", runs, "timed runs (the median is reported)")->check(CLI::Range(1, 1000));
  app.add_option("--rows", rows, "logits rows per run")->check(CLI::Range(1, 10000));
  CLI11_PARSE(app, argc, argv);

  struct Setting {
    const char* name;
    int32_t top_k;
    float top_p;
  };
  const Setting settings[] = {{"T=1", 0, 1.0f},
                              {"top_p=0.9", 0, 0.9f},
                              {"top_p=0.95", 0, 0.95f},
                              {"top_k=50", 50, 1.0f},
                              {"top_k=50,top_p=0.9", 50, 0.9f}};
  std::printf("vocab %d, %d rows per run, median of %d runs, one thread\n\n", vocab, rows, runs);
  std::printf("%-7s %-20s %8s %14s %14s %8s %10s %10s\n", "scale", "setting", "kept", "before us",
              "ComputeProbs us", "speedup", "row KB", "logits KB");
  std::mt19937 gen(1);
  int mismatches = 0;
  for (float scale : {1.5f, 4.0f, 8.0f}) {
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<std::vector<float>> logits(rows, std::vector<float>(vocab));
    for (auto& row : logits) {
      for (float& v : row) v = normal(gen);
      row[gen() % vocab] += 3.0f * scale;  // the model's favourite
    }
    for (const Setting& s : settings) {
      SamplingParams params;
      params.top_k = s.top_k;
      params.top_p = s.top_p;
      std::vector<float> probs, base;
      const double base_us =
          MedianMicros(logits, runs, [&](const auto& row) { FullSortProbs(row, params, base); });
      const double us =
          MedianMicros(logits, runs, [&](const auto& row) { ComputeProbs(row, params, probs); });
      // The kept set of the last row, and a check that both computed the same distribution.
      const auto kept = std::count_if(probs.begin(), probs.end(), [](float p) { return p > 0; });
      for (size_t i = 0; i < probs.size(); ++i)
        if ((probs[i] > 0) != (base[i] > 0) || std::abs(probs[i] - base[i]) > 1e-6f) ++mismatches;
      DistRows as_row;
      as_row.Reset(vocab);
      as_row.AddDense(probs);
      std::printf("%-7.1f %-20s %8ld %14.1f %14.1f %7.1fx %10.2f %10.1f\n", scale, s.name,
                  static_cast<long>(kept), base_us, us, base_us / us,
                  static_cast<double>(as_row.stored_values()) * 4 / 1024, vocab * 4.0 / 1024);
    }
  }
  if (mismatches > 0) {
    std::fprintf(stderr, "bench_sampling: %d probabilities differ from the baseline's\n",
                 mismatches);
    return 1;
  }
  return 0;
}
