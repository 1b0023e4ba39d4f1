#include "engine/executor.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "engine/generation.h"
#include "engine/guarded.h"

namespace specinfer {

Status Executor::PrepareKv(const ForwardBatch& batch) {
  if (kv_.has_pending_copies()) {
    SI_RETURN_IF_ERROR(kv_.ApplyPendingCopies(
        [&](SeqId helper, std::span<const int32_t> src, std::span<const int32_t> dst) {
          return runner_.MoveKv(kv_, helper, src, dst);
        }));
  }
  if (!kv_.prefix_caching()) return Status::Ok();
  // Shared and cached blocks are read-only: a write there would change other sequences' KV.
  for (const BatchSequence& s : batch.seqs) {
    if (s.kv_prefix + s.masked_kv < kv_.WritableFrom(s.seq))
      return InternalError("a pass would write KV position " +
                           std::to_string(s.kv_prefix + s.masked_kv) + " of sequence " +
                           std::to_string(s.seq) + " inside a shared prefix-cache block");
  }
  return Status::Ok();
}

PassOutput Executor::Run(const ForwardBatch& batch, std::span<const LogitsRows> members) {
  using Clock = std::chrono::steady_clock;
  PassOutput out;
  const int32_t vocab = runner_.model().config().vocab_size;
  const auto t0 = Clock::now();
  out.status = Guarded("KV copy-on-write", [&] { return PrepareKv(batch); });
  if (out.status.ok()) out.status = Guarded("forward pass", [&] {
    logits_.resize(batch.logit_rows.size() * static_cast<size_t>(vocab));
    if (batch.argmax_rows.empty() && batch.dist_rows.empty())
      return runner_.Forward(batch, kv_, logits_);
    argmax_.resize(batch.argmax_rows.size());
    return runner_.ForwardArgmax(batch, kv_, logits_, argmax_, &dists_);
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
    PassRows r;
    if (m.kind == LogitsRows::Kind::kArgmax) {
      r.argmax = std::span<const int32_t>(argmax_).subspan(static_cast<size_t>(m.first),
                                                           static_cast<size_t>(m.count));
    } else if (m.kind == LogitsRows::Kind::kDists) {
      r.dists = &dists_;
      r.dist_first = m.first;
    } else {
      r.logits =
          all.subspan(static_cast<size_t>(m.first) * vocab, static_cast<size_t>(m.count) * vocab);
    }
    out.rows.push_back(r);
  }
  return out;
}

}  // namespace specinfer
