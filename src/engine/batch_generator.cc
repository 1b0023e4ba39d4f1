#include "engine/batch_generator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <exception>

namespace specinfer {

namespace {
// Runs `f` (returning Status or StatusOr), turning an exception into an Internal error that
// fails one sequence instead of the process.
template <typename F>
auto Guarded(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& ex) {
    return InternalError(std::string(what) + " failed: " + ex.what());
  }
}
}  // namespace

BatchGenerator::BatchGenerator(ModelRunner& runner, KvCacheManager& kv, BatchOptions options)
    : runner_(runner), kv_(kv), options_(options) {}

BatchGenerator::~BatchGenerator() { CancelAll(); }

StatusOr<BatchGenerator::Admission> BatchGenerator::Add(GenerateRequest request,
                                                        TokenCallback on_token,
                                                        DoneCallback on_done,
                                                        CancelPoll cancelled) {
  const ModelConfig& c = runner_.model().config();
  const int32_t need = SequenceRun::MaxKvBlocks(request, c, kv_.block_size());
  if (need > kv_.num_blocks()) {
    return ResourceExhaustedError(
        "the request may need " + std::to_string(need * kv_.block_size()) +
        " KV positions but the cache holds " + std::to_string(kv_.num_blocks() * kv_.block_size()) +
        "; ask for fewer tokens");
  }
  if (num_running() >= options_.max_sequences || reserved_blocks_ + need > kv_.num_blocks())
    return Admission::kNoRoom;
  SI_ASSIGN_OR_RETURN(auto run,
                      SequenceRun::Start(std::move(request), std::move(on_token), c, kv_,
                                         runner_.kv_epoch()));
  reserved_blocks_ += run->max_kv_blocks();
  running_.push_back(Entry{std::move(run), std::move(on_done), std::move(cancelled)});
  return Admission::kAdmitted;
}

void BatchGenerator::Complete(std::list<Entry>::iterator it, StatusOr<GenerateResult> outcome) {
  DoneCallback on_done = std::move(it->on_done);
  reserved_blocks_ -= it->run->max_kv_blocks();
  running_.erase(it);  // frees the KV blocks before anyone hears of it
  if (on_done) on_done(std::move(outcome));
}

void BatchGenerator::CancelAll() {
  while (!running_.empty()) {
    auto it = running_.begin();
    it->run->Finish(FinishReason::kCancelled);
    Complete(it, std::move(it->run->result()));
  }
}

void BatchGenerator::Step() {
  using Clock = std::chrono::steady_clock;
  // Those that ended outside a step: cancelled by their owner, or asked for no tokens; and
  // those whose KV the runner lost (a remote LLM worker restarted).
  const uint64_t kv_epoch = runner_.kv_epoch();
  for (auto it = running_.begin(); it != running_.end();) {
    auto next = std::next(it);
    if (it->run->phase() != SequenceRun::Phase::kDone && it->cancelled && it->cancelled())
      it->run->Finish(FinishReason::kCancelled);
    if (it->run->phase() == SequenceRun::Phase::kDone) {
      Complete(it, std::move(it->run->result()));
    } else if (Status lost = it->run->CheckKvEpoch(kv_epoch); !lost.ok()) {
      Complete(it, lost);
    }
    it = next;
  }
  if (running_.empty()) return;

  // Speculators that work in the background (remote SSM workers) start every sequence's
  // proposal at once, so the step's drafts overlap across sequences and replicas.
  for (auto& e : running_)
    if (e.run->phase() == SequenceRun::Phase::kDecode) e.run->BeginDraft();

  // Plan: every decoding sequence's tree, then prefill chunks in admission order.
  ForwardBatch batch;
  std::vector<std::list<Entry>::iterator> members, decoding;
  int32_t tokens = 0;
  for (auto it = running_.begin(); it != running_.end();) {
    auto next = std::next(it);
    if (it->run->phase() == SequenceRun::Phase::kDecode) {
      auto size = Guarded("drafting", [&] { return it->run->PlanDecode(batch); });
      if (!size.ok()) {
        Complete(it, size.status().WithContext("drafting"));
      } else {
        tokens += *size;
        members.push_back(it);
        decoding.push_back(it);
      }
    }
    it = next;
  }
  int32_t budget = std::max(options_.max_batch_tokens - tokens, 0);
  if (decoding.empty()) budget = std::max(budget, 1);  // prefill always makes progress
  for (auto it = running_.begin(); it != running_.end() && budget > 0;) {
    auto next = std::next(it);
    if (it->run->phase() == SequenceRun::Phase::kPrefill) {
      const int32_t before = batch.size();
      Status s = Guarded("prefill", [&] { return it->run->PlanPrefill(batch, budget); });
      if (!s.ok()) {
        Complete(it, s.WithContext("prefill"));
      } else {
        budget -= batch.size() - before;
        members.push_back(it);
      }
    }
    it = next;
  }
  if (batch.size() == 0) return;

  // One pass for all of them.
  batch.batch_invariant = !(options_.blas_prefill && decoding.empty());
  const int32_t vocab = runner_.model().config().vocab_size;
  const auto t0 = Clock::now();
  Status pass = Guarded("forward pass", [&] {
    logits_.resize(batch.logit_rows.size() * static_cast<size_t>(vocab));
    return runner_.Forward(batch, kv_, logits_);
  });
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!pass.ok()) {
    spdlog::error("forward pass of {} sequences ({} tokens) failed: {}", members.size(),
                  batch.size(), pass.ToString());
    for (auto it : members) Complete(it, pass);
    return;
  }
  for (auto it : members) it->run->AddPassSeconds(seconds);

  // Verify and commit each tree; report those that ended.
  for (auto it : decoding) {
    Status s = Guarded("commit", [&] { return it->run->Commit(logits_, runner_); });
    if (!s.ok()) {
      Complete(it, s);
    } else if (it->run->phase() == SequenceRun::Phase::kDone) {
      Complete(it, std::move(it->run->result()));
    }
  }
}

}  // namespace specinfer
