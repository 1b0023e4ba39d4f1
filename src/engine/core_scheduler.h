// The engine core's scheduler: iteration-level scheduling (Orca) of many sequences. It keeps the
// running set, admits sequences against the KV cache, and decides each step's batch: every
// decoding sequence's token tree, then prefill chunks of newcomers within the token budget. After
// the executor's pass (engine/executor.h), which slices out each member's logits rows, it has each
// decoding sequence verify and commit its rows, and reports those that ended. Sequences join
// between steps (Add) and leave as soon as they finish; nobody waits for the longest.
//
//   Add(request) ──> running set (admission order)
//   Schedule()    [ end the cancelled ones and those whose KV was lost     ]
//                 [ each decoding sequence drafts and lays out its tree    ] ──> ScheduledStep
//                 [ prefill chunks fill the rest of the token budget       ]     (batch, rows)
//   Update(pass)  [ a failed pass fails its members; otherwise each tree   ] <── PassOutput
//                 [ is verified, its KV committed, its tokens emitted      ]     (executor)
//                 [ those that ended are reported (DoneCallback)           ] ──> done
//
// Admission is against the KV cache: a sequence is admitted only if the blocks it may need at
// its largest (Sequence::max_kv_blocks) fit beside those the running sequences may still claim,
// so a running sequence never runs out of KV memory and nothing needs preempting.
//
// Prefix caching (BatchOptions::prefix_cache, on by default): the scheduler turns it on in the
// KV cache, offers every member's committed KV entries to it after each successful pass, and
// forgets the cache whenever the runner's kv_epoch() changes (the KV it held is gone). Exact
// because the entries are those the same tokens would get from the batch-invariant kernels. With
// `blas_prefill` (Generator: one sequence at a time) it stays off: prompt entries would carry
// BLAS rounding that depends on the chunk they were computed in.
//
// Exactness: a pass that holds any decoding tree is planned with the batch-invariant kernels for
// every token, and so is prefill unless `blas_prefill` is set; each sequence's logits are then
// bit-identical to running it alone, and greedy output is the same token for token whatever it
// was batched with. With `blas_prefill`, a pass of prompt tokens only may use BLAS (faster
// prefill for float32 weights; quantized weights never take that path), whose rounding depends
// on the batch.
//
// Failure isolation: an error while drafting or committing fails that sequence alone; an error
// (or exception) in the pass itself fails the sequences in it, and the scheduler goes on.
//
// Thread safety: one thread at a time (the owner of the runner and the KV cache).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "engine/executor.h"
#include "engine/sequence.h"
#include "engine/spec_controller.h"
#include "kv/kv_cache.h"

namespace specinfer {

struct BatchOptions {
  int32_t max_sequences = 8;       // running at once
  int32_t max_batch_tokens = 512;  // tokens per pass: trees first, prefill chunks fill the rest
  bool blas_prefill = false;       // see the file comment
  // Automatic prefix caching (kv/kv_cache.h): newcomers attach the KV of the longest prompt
  // prefix that earlier sequences committed, and prefill only the rest. Off with blas_prefill.
  bool prefix_cache = true;
  // How deep each step's trees go: kAuto lets the SpecController (engine/spec_controller.h)
  // choose per step and sequence, kStatic always expands the request's full tree shape.
  SpecBudgetMode spec_budget = SpecBudgetMode::kAuto;
  // Batched drafting: when several decoding sequences share a model draft in a step, it runs one
  // pass per tree level for all of them (SpeculativeStep::DraftTogether) instead of one pass per
  // level per sequence. Same trees either way; off only to compare.
  bool batch_drafts = true;
  // The controller to use (e.g. one an Engine keeps across its Generate calls, so its cost
  // model is calibrated once); null: the scheduler's own.
  std::shared_ptr<SpecController> controller;
};

class CoreScheduler {
 private:
  struct Entry;

 public:
  // Called once per sequence when it ends: its result, or the error that ended it.
  using DoneCallback = std::function<void(StatusOr<GenerateResult>)>;
  // Polled before every step; true ends the sequence as kCancelled (e.g. a client went away
  // while its prompt was still being prefilled, with no token callback to answer).
  using CancelPoll = std::function<bool()>;
  enum class Admission { kAdmitted, kNoRoom };

  // One step's plan: the pass's batch, and its member sequences in batch order (decoding trees
  // first, then prefill chunks) with each one's logits rows.
  struct ScheduledStep {
    ForwardBatch batch;
    std::vector<std::list<Entry>::iterator> members;
    std::vector<LogitsRows> rows;  // per member
    // For the controller: the choice made (if any sequence could speculate), when planning
    // began, the drafts' seconds, and the decoding members' tokens before the step.
    std::optional<SpecController::Choice> choice;
    std::chrono::steady_clock::time_point start;
    double draft_seconds = 0;
    int32_t decoding = 0;
    std::vector<int32_t> generated_before;  // per member
  };

  // `runner` (its model's configuration and kv_epoch(); MoveKv when committing) and `kv` must
  // outlive the scheduler.
  CoreScheduler(ModelRunner& runner, KvCacheManager& kv, BatchOptions options);
  ~CoreScheduler();  // ends the running sequences as kCancelled

  // Starts a sequence if it fits now (kNoRoom: try again after some finish). Errors: the
  // request is invalid (Sequence::Start), or it could never fit (ResourceExhausted: it needs
  // more KV blocks than the whole cache has). On an error `on_done` is not called.
  StatusOr<Admission> Add(GenerateRequest request, TokenCallback on_token, DoneCallback on_done,
                          CancelPoll cancelled = nullptr);

  // Ends the sequences cancelled or lost since the last step (reporting each), then plans the
  // next pass. An empty batch means there is nothing to run.
  ScheduledStep Schedule();
  // Applies the pass's output to `step`'s members: a failed pass fails them all; otherwise each
  // decoding member verifies and commits its rows. Sequences that end are reported here.
  void Update(ScheduledStep& step, const PassOutput& pass);

  // Ends every running sequence as kCancelled (Shutdown), reporting each.
  void CancelAll();

  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  bool idle() const { return running_.empty(); }
  // KV blocks the running sequences may claim at their largest.
  int64_t reserved_kv_blocks() const { return reserved_blocks_; }
  const BatchOptions& options() const { return options_; }
  const SpecController& spec_controller() const { return *controller_; }

 private:
  struct Entry {
    std::unique_ptr<Sequence> seq;
    DoneCallback on_done;
    CancelPoll cancelled;
  };
  void Complete(std::list<Entry>::iterator it, StatusOr<GenerateResult> outcome);
  // Ends those that ended outside a step (cancelled by their owner, or asked for no tokens) and
  // those whose KV the runner lost (a remote LLM worker restarted).
  void Reap();
  // Forgets the prefix cache if the runner's KV was lost since the last call.
  void SyncPrefixCache();
  // Seeds the controller's pass-cost model with a few timed passes of 1..65 tokens (once, before
  // the first step that may speculate under SpecBudgetMode::kAuto).
  void Calibrate();

  ModelRunner& runner_;
  KvCacheManager& kv_;
  const BatchOptions options_;
  std::list<Entry> running_;  // in admission order (prefill is first come, first served)
  int64_t reserved_blocks_ = 0;
  uint64_t cache_epoch_ = 0;  // the runner's kv_epoch() the prefix cache holds entries of
  std::shared_ptr<SpecController> controller_;  // never null
};

}  // namespace specinfer
