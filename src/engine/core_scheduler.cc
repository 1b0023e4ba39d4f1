#include "engine/core_scheduler.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>

#include <spdlog/spdlog.h>

#include "engine/guarded.h"

namespace specinfer {

CoreScheduler::CoreScheduler(ModelRunner& runner, KvCacheManager& kv, BatchOptions options)
    : runner_(runner),
      kv_(kv),
      options_(options),
      cache_epoch_(runner.kv_epoch()),
      controller_(options_.controller ? options_.controller
                                       : std::make_shared<SpecController>()) {
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
  step.start = std::chrono::steady_clock::now();
  Reap();
  if (running_.empty()) return step;

  // How deep each decoding sequence's tree goes this step (spec_controller.h): candidates are
  // the sequences that may speculate; the others' roots and the prefill chunks likely to join
  // are the pass's other tokens.
  std::vector<SpecController::Candidate> candidates;
  std::vector<Sequence*> spec_seqs;
  int32_t num_decoding = 0, prefill = 0;
  for (auto& e : running_) {
    Sequence& q = *e.seq;
    if (q.phase() == Sequence::Phase::kPrefill) {
      prefill += std::min(q.prefill_remaining(), q.request().prefill_chunk);
      continue;
    }
    if (q.phase() != Sequence::Phase::kDecode) continue;
    ++num_decoding;
    if (q.max_spec_depth() <= 0) continue;
    SpecController::Candidate c;
    c.key = &q.speculation().key();
    c.own = &q.speculation().acceptance();
    c.shape_nodes = q.speculation().shape_nodes();
    c.max_depth = q.max_spec_depth();
    c.own_budget = &q.speculation().budget_acceptance();
    c.max_nodes = static_cast<int32_t>(TreeShape::kMaxNodes);
    c.id = reinterpret_cast<uintptr_t>(&q) / alignof(Sequence);
    candidates.push_back(c);
    spec_seqs.push_back(&q);
  }
  step.decoding = num_decoding;
  const bool adaptive = options_.spec_budget != SpecBudgetMode::kStatic;
  const bool dynamic = options_.spec_budget == SpecBudgetMode::kDynamic;
  if (!candidates.empty() && adaptive && !controller_->calibrated()) {
    Calibrate();
    // The calibration passes are no part of this step's time (they made the first step's
    // overhead, which the controller adds to every option, hundreds of ms).
    step.start = std::chrono::steady_clock::now();
  }
  // Per speculating sequence: its depth cap and, for dynamic trees, its node budget.
  std::map<const Sequence*, std::pair<int32_t, int32_t>> cap;
  if (!candidates.empty()) {
    const int32_t others = num_decoding - static_cast<int32_t>(candidates.size()) +
                           std::min(prefill, std::max(options_.max_batch_tokens - num_decoding, 0));
    if (dynamic) {
      step.choice = controller_->ChooseBudgets(candidates, static_cast<int32_t>(candidates.size()),
                                               others, options_.max_batch_tokens);
    } else if (adaptive) {
      step.choice = controller_->Choose(candidates, static_cast<int32_t>(candidates.size()), others,
                                       options_.max_batch_tokens);
    } else {
      SpecController::Choice full;
      for (const auto& c : candidates) {
        full.depth.push_back(c.max_depth);
        int64_t nodes = 0;
        for (int32_t d = 0; d < c.max_depth && d < static_cast<int32_t>(c.shape_nodes.size()); ++d)
          nodes += c.shape_nodes[static_cast<size_t>(d)];
        full.budget_tokens += std::min<int64_t>(nodes, TreeShape::kMaxNodes);
      }
      full.plain_seconds = controller_->cost().Predict(num_decoding + others);
      step.choice = std::move(full);
    }
    for (size_t i = 0; i < spec_seqs.size(); ++i) {
      cap[spec_seqs[i]] = {step.choice->depth[i],
                           dynamic ? step.choice->nodes[i] : Sequence::kStaticTree};
    }
    spdlog::debug("spec controller: {} decoding, {} other tokens; budget {} tokens, first depth "
                  "{}; predicted {:.2f} tokens in {:.2f} ms, plain {:.2f} ms, gain {:.2f}",
                  num_decoding, others, step.choice->budget_tokens, step.choice->depth[0],
                  step.choice->predicted_tokens, step.choice->predicted_seconds * 1e3,
                  step.choice->plain_seconds * 1e3, step.choice->predicted_gain);
  }
  auto cap_of = [&](const Sequence* q) {
    auto it = cap.find(q);
    return it == cap.end() ? std::pair<int32_t, int32_t>{0, Sequence::kStaticTree} : it->second;
  };

  // Speculators that work in the background (remote SSM workers) start every sequence's
  // proposal at once, so the step's drafts overlap across sequences and replicas.
  // With batched drafting, one BeginBatch per speculator: remote SSM workers get one call per
  // worker with every sequence's item.
  if (options_.batch_drafts) {
    std::vector<Sequence*> decoding;
    std::vector<Sequence::DraftCap> caps;
    for (auto& e : running_) {
      if (e.seq->phase() != Sequence::Phase::kDecode) continue;
      decoding.push_back(e.seq.get());
      caps.push_back(cap_of(e.seq.get()));
    }
    Sequence::BeginTogether(decoding, caps);
  } else {
    for (auto& e : running_)
      if (e.seq->phase() == Sequence::Phase::kDecode) {
        const auto [depth, nodes] = cap_of(e.seq.get());
        e.seq->BeginDraft(depth, nodes);
      }
  }

  // Sequences sharing a model draft draft together: one draft pass per tree level for all.
  if (options_.batch_drafts) {
    std::vector<Sequence*> drafting;
    std::vector<Sequence::DraftCap> caps;
    for (auto& e : running_) {
      const Sequence::DraftCap c = cap_of(e.seq.get());
      if (e.seq->phase() != Sequence::Phase::kDecode || c.first <= 0 || c.second == 0) continue;
      drafting.push_back(e.seq.get());
      caps.push_back(c);
    }
    if (drafting.size() >= 2) Sequence::DraftTogether(drafting, caps);
  }

  // Every decoding sequence's tree, then prefill chunks in admission order.
  ForwardBatch& batch = step.batch;
  RowRequest runner_rows;
  runner_rows.draws = runner_.draws_tokens();
  runner_rows.dists = runner_.returns_distributions();
  int32_t tokens = 0;
  for (auto it = running_.begin(); it != running_.end();) {
    auto next = std::next(it);
    if (it->seq->phase() == Sequence::Phase::kDecode) {
      // The sequence's rows are argmax rows (tokens), distribution rows or logits rows:
      // whichever it added to.
      const auto first_argmax = static_cast<int32_t>(batch.argmax_rows.size());
      const auto first_dist = static_cast<int32_t>(batch.dist_rows.size());
      const auto first_logits = static_cast<int32_t>(batch.logit_rows.size());
      const std::pair<int32_t, int32_t> c = cap_of(it->seq.get());
      auto size = Guarded(
          "drafting", [&] { return it->seq->PlanDecode(batch, c.first, c.second, runner_rows); });
      LogitsRows rows{first_logits, 0, LogitsRows::Kind::kLogits};
      if (static_cast<int32_t>(batch.argmax_rows.size()) > first_argmax)
        rows = LogitsRows{first_argmax, 0, LogitsRows::Kind::kArgmax};
      else if (static_cast<int32_t>(batch.dist_rows.size()) > first_dist)
        rows = LogitsRows{first_dist, 0, LogitsRows::Kind::kDists};
      if (!size.ok()) {
        Complete(it, size.status().WithContext("drafting"));
      } else {
        tokens += *size;
        step.draft_seconds += it->seq->speculation().last_draft_seconds();
        step.members.push_back(it);
        rows.count = *size;
        step.rows.push_back(rows);
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

void CoreScheduler::Calibrate() {
  controller_->set_calibrated();
  // Passes of a scratch sequence, a chain of T tokens with every row's logits (as a tree pass
  // has), after one warm-up pass; each timed pass of a size after the runner's warm-up passes of
  // that shape (ModelRunner::warmup_passes: a CUDA runner's first replay of the shape's graph,
  // as serving runs it, not its capture). Only within the KV blocks nobody may claim.
  const int32_t vocab = runner_.model().config().vocab_size;
  const int32_t free = kv_.num_blocks() - static_cast<int32_t>(reserved_blocks_);
  const int32_t untimed = std::max(runner_.warmup_passes(), 0);
  std::vector<float> logits;
  const SeqId seq = kv_.AddSequence();
  // The seconds of one pass of t tokens.
  auto pass = [&](int32_t t) -> StatusOr<double> {
    ForwardBatch batch;
    std::vector<int32_t> toks(static_cast<size_t>(t), 0), pos(static_cast<size_t>(t));
    for (int32_t i = 0; i < t; ++i) pos[static_cast<size_t>(i)] = i;
    SI_RETURN_IF_ERROR(kv_.Reserve(seq, t));
    batch.AddSequence(seq, toks, pos, 0, nullptr);
    for (int32_t i = 0; i < t; ++i) batch.logit_rows.push_back(i);
    logits.resize(static_cast<size_t>(t) * vocab);
    const auto t0 = std::chrono::steady_clock::now();
    Status s = Guarded("calibration pass", [&] { return runner_.Forward(batch, kv_, logits); });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    kv_.Truncate(seq, 0);
    if (!s.ok()) return s;
    return seconds;
  };
  bool warm = false;
  for (int32_t t : {1, 2, 3, 5, 9, 17, 33, 65}) {
    if (t > options_.max_batch_tokens || (t + kv_.block_size() - 1) / kv_.block_size() > free)
      break;
    StatusOr<double> seconds = 0.0;
    for (int32_t i = warm ? 0 : -1; i <= untimed && seconds.ok(); ++i) seconds = pass(t);
    warm = true;
    if (!seconds.ok()) {
      spdlog::warn("speculation cost calibration stopped: {}", seconds.status().ToString());
      break;
    }
    controller_->ObserveCalibration(t, *seconds);
    spdlog::debug("speculation cost calibration: {} tokens in {:.2f} ms", t, *seconds * 1e3);
  }
  kv_.RemoveSequence(seq);
}

void CoreScheduler::Update(ScheduledStep& step, const PassOutput& pass) {
  if (!pass.status.ok()) {
    for (auto it : step.members) Complete(it, pass.status);
    return;
  }
  for (auto it : step.members) it->seq->AddPassSeconds(pass.seconds);
  step.generated_before.clear();
  for (auto it : step.members) step.generated_before.push_back(it->seq->generated());

  // Verify and commit each tree; report those that ended. The controller learns the step's
  // time by its tokens and each tree's acceptance.
  int64_t emitted = 0;
  for (size_t i = 0; i < step.members.size(); ++i) {
    auto it = step.members[i];
    if (step.rows[i].count == 0) {  // a prefill chunk
      it->seq->CacheCommittedKv();
      continue;
    }
    Status s = Guarded("commit", [&] { return it->seq->Commit(pass.rows[i], runner_); });
    if (s.ok()) {
      const Sequence& q = *it->seq;
      emitted += q.generated() - step.generated_before[i];
      const SpeculativeStep::TreeReport& t = q.speculation().last_tree();
      const double draft_seconds = t.draft_steady ? t.draft_seconds : -1;
      if (t.dynamic) {
        controller_->ObserveBudgetTree(q.speculation().key(), t.budget, t.probs, t.accepted,
                                       draft_seconds);
      } else if (t.cap > 0) {
        controller_->ObserveTree(q.speculation().key(), t.cap, t.nodes_at_depth, t.accepted,
                                 draft_seconds);
      }
    }
    if (!s.ok()) {
      Complete(it, s);
      continue;
    }
    it->seq->CacheCommittedKv();
    if (it->seq->phase() == Sequence::Phase::kDone) Complete(it, std::move(it->seq->result()));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - step.start).count() -
      step.draft_seconds;
  controller_->ObserveStep(step.choice ? &*step.choice : nullptr, step.batch.size(),
                           pass.seconds, seconds, step.draft_seconds, emitted, step.decoding);
}

}  // namespace specinfer
