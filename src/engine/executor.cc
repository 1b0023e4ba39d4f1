#include "engine/executor.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "engine/generation.h"
#include "engine/guarded.h"

namespace specinfer {

PassOutput Executor::Run(const ForwardBatch& batch, std::span<const LogitsRows> members) {
  using Clock = std::chrono::steady_clock;
  PassOutput out;
  const int32_t vocab = runner_.model().config().vocab_size;
  const auto t0 = Clock::now();
  out.status = Guarded("forward pass", [&] {
    logits_.resize(batch.logit_rows.size() * static_cast<size_t>(vocab));
    return runner_.Forward(batch, kv_, logits_);
  });
  out.seconds = SecondsSince(t0);
  if (!out.status.ok()) {
    spdlog::error("forward pass of {} sequences ({} tokens) failed: {}", members.size(),
                  batch.size(), out.status.ToString());
    return out;
  }
  const std::span<const float> all(logits_);
  out.rows.reserve(members.size());
  for (const LogitsRows& m : members) {
    out.rows.push_back(all.subspan(static_cast<size_t>(m.first) * vocab,
                                   static_cast<size_t>(m.count) * vocab));
  }
  return out;
}

}  // namespace specinfer
