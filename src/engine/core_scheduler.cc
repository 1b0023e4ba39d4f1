#include "engine/core_scheduler.h"

#include <algorithm>
#include <utility>

#include "engine/guarded.h"

namespace specinfer {

CoreScheduler::CoreScheduler(ModelRunner& runner, KvCacheManager& kv, BatchOptions options)
    : runner_(runner), kv_(kv), options_(options), cache_epoch_(runner.kv_epoch()) {
  kv_.set_prefix_caching(options_.prefix_cache && !options_.blas_prefill);
}

void CoreScheduler::SyncPrefixCache() {
  const uint64_t epoch = runner_.kv_epoch();
  if (epoch == cache_epoch_) return;
  kv_.ClearPrefixCache();
  cache_epoch_ = epoch;
}

CoreScheduler::~CoreScheduler() { CancelAll(); }

StatusOr<CoreScheduler::Admission> CoreScheduler::Add(GenerateRequest request,
                                                      TokenCallback on_token,
                                                      DoneCallback on_done,
                                                      CancelPoll cancelled) {
  const ModelConfig& c = runner_.model().config();
  const int32_t need = Sequence::MaxKvBlocks(request, c, kv_.block_size());
  if (need > kv_.num_blocks()) {
    return ResourceExhaustedError(
        "the request may need " + std::to_string(need * kv_.block_size()) +
        " KV positions but the cache holds " + std::to_string(kv_.num_blocks() * kv_.block_size()) +
        "; ask for fewer tokens");
  }
  if (num_running() >= options_.max_sequences || reserved_blocks_ + need > kv_.num_blocks())
    return Admission::kNoRoom;
  SyncPrefixCache();
  SI_ASSIGN_OR_RETURN(auto seq, Sequence::Start(std::move(request), std::move(on_token), c, kv_,
                                                runner_.kv_epoch()));
  reserved_blocks_ += seq->max_kv_blocks();
  running_.push_back(Entry{std::move(seq), std::move(on_done), std::move(cancelled)});
  return Admission::kAdmitted;
}

void CoreScheduler::Complete(std::list<Entry>::iterator it, StatusOr<GenerateResult> outcome) {
  DoneCallback on_done = std::move(it->on_done);
  reserved_blocks_ -= it->seq->max_kv_blocks();
  running_.erase(it);  // frees the KV blocks before anyone hears of it
  if (on_done) on_done(std::move(outcome));
}

void CoreScheduler::CancelAll() {
  while (!running_.empty()) {
    auto it = running_.begin();
    it->seq->Finish(FinishReason::kCancelled);
    Complete(it, std::move(it->seq->result()));
  }
}

void CoreScheduler::Reap() {
  SyncPrefixCache();
  const uint64_t kv_epoch = runner_.kv_epoch();
  for (auto it = running_.begin(); it != running_.end();) {
    auto next = std::next(it);
    if (it->seq->phase() != Sequence::Phase::kDone && it->cancelled && it->cancelled())
      it->seq->Finish(FinishReason::kCancelled);
    if (it->seq->phase() == Sequence::Phase::kDone) {
      Complete(it, std::move(it->seq->result()));
    } else if (Status lost = it->seq->CheckKvEpoch(kv_epoch); !lost.ok()) {
      Complete(it, lost);
    }
    it = next;
  }
}

CoreScheduler::ScheduledStep CoreScheduler::Schedule() {
  ScheduledStep step;
  Reap();
  if (running_.empty()) return step;

  // Speculators that work in the background (remote SSM workers) start every sequence's
  // proposal at once, so the step's drafts overlap across sequences and replicas.
  for (auto& e : running_)
    if (e.seq->phase() == Sequence::Phase::kDecode) e.seq->BeginDraft();

  // Every decoding sequence's tree, then prefill chunks in admission order.
  ForwardBatch& batch = step.batch;
  int32_t tokens = 0;
  for (auto it = running_.begin(); it != running_.end();) {
    auto next = std::next(it);
    if (it->seq->phase() == Sequence::Phase::kDecode) {
      const auto first_row = static_cast<int32_t>(batch.logit_rows.size());
      auto size = Guarded("drafting", [&] { return it->seq->PlanDecode(batch); });
      if (!size.ok()) {
        Complete(it, size.status().WithContext("drafting"));
      } else {
        tokens += *size;
        step.members.push_back(it);
        step.rows.push_back(LogitsRows{first_row, *size});
      }
    }
    it = next;
  }
  const bool decoding = !step.members.empty();
  int32_t budget = std::max(options_.max_batch_tokens - tokens, 0);
  if (!decoding) budget = std::max(budget, 1);  // prefill always makes progress
  for (auto it = running_.begin(); it != running_.end() && budget > 0;) {
    auto next = std::next(it);
    if (it->seq->phase() == Sequence::Phase::kPrefill) {
      const int32_t before = batch.size();
      Status s = Guarded("prefill", [&] { return it->seq->PlanPrefill(batch, budget); });
      if (!s.ok()) {
        Complete(it, s.WithContext("prefill"));
      } else {
        budget -= batch.size() - before;
        step.members.push_back(it);
        step.rows.push_back(LogitsRows{});
      }
    }
    it = next;
  }
  batch.batch_invariant = !(options_.blas_prefill && !decoding);
  return step;
}

void CoreScheduler::Update(ScheduledStep& step, const PassOutput& pass) {
  if (!pass.status.ok()) {
    for (auto it : step.members) Complete(it, pass.status);
    return;
  }
  for (auto it : step.members) it->seq->AddPassSeconds(pass.seconds);

  // Verify and commit each tree; report those that ended.
  for (size_t i = 0; i < step.members.size(); ++i) {
    auto it = step.members[i];
    if (step.rows[i].count == 0) {  // a prefill chunk
      it->seq->CacheCommittedKv();
      continue;
    }
    Status s = Guarded("commit", [&] { return it->seq->Commit(pass.rows[i], runner_); });
    if (!s.ok()) {
      Complete(it, s);
      continue;
    }
    it->seq->CacheCommittedKv();
    if (it->seq->phase() == Sequence::Phase::kDone) Complete(it, std::move(it->seq->result()));
  }
}

}  // namespace specinfer
