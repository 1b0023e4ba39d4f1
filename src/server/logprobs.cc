#include "server/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace specinfer {

TokenLogprob LogprobsFromLogits(std::span<const float> logits, int32_t token, int32_t top_n) {
  // log_softmax in double: logsumexp around the maximum.
  double max = -std::numeric_limits<double>::infinity();
  for (float x : logits) max = std::max<double>(max, x);
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
  const double lse = max + std::log(sum);
  auto lp = [&](int32_t id) { return static_cast<float>(logits[id] - lse); };

  TokenLogprob out;
  out.token = token;
  out.logprob = token >= 0 && token < static_cast<int32_t>(logits.size())
                    ? lp(token)
                    : -std::numeric_limits<float>::infinity();
  const int32_t n = std::clamp<int32_t>(top_n, 0, static_cast<int32_t>(logits.size()));
  if (n > 0) {
    std::vector<int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    out.top.reserve(n);
    for (int32_t i = 0; i < n; ++i) out.top.emplace_back(ids[i], lp(ids[i]));
  }
  return out;
}

}  // namespace specinfer
