// Iteration-level scheduling (Orca) of many sequences on one ModelRunner: every Step() is one LLM
// pass holding the token trees of all decoding sequences plus prefill chunks of newcomers, after
// which each sequence verifies its own tree, commits and streams its tokens. Sequences join
// between steps (Add) and leave as soon as they finish; nobody waits for the longest.
//
//   Add(seq) ──> running ──Step()──> [ draft each decoding sequence's tree          ]
//                   ^                [ fill the token budget with prefill chunks    ]
//                   │                [ one Forward over the whole batch             ]
//                   └────────────────[ per sequence: verify, commit KV, emit tokens ]──> done
//
// Admission is against the KV cache: a sequence is admitted only if the blocks it may need at
// its largest (SequenceRun::max_kv_blocks) fit beside those the running sequences may still
// claim, so a running sequence never runs out of KV memory and nothing needs preempting.
//
// Exactness: a pass that holds any decoding tree uses the batch-invariant kernels for every
// token, and so does prefill unless `blas_prefill` is set; each sequence's logits are then
// bit-identical to running it alone, and greedy output is the same token for token whatever
// it was batched with. With `blas_prefill`, a pass of prompt tokens only may use BLAS (faster
// prefill for float32 weights; quantized weights never take that path), whose rounding depends
// on the batch.
//
// Failure isolation: an error while drafting or committing fails that sequence alone; an error
// (or exception) in the pass itself fails the sequences in it, and the generator goes on.
//
// Thread safety: one thread at a time (the owner of the runner and the KV cache).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/sequence.h"
#include "kv/kv_cache.h"

namespace specinfer {

struct BatchOptions {
  int32_t max_sequences = 8;       // running at once
  int32_t max_batch_tokens = 512;  // tokens per pass: trees first, prefill chunks fill the rest
  bool blas_prefill = false;       // see the file comment
};

class BatchGenerator {
 public:
  // Called once per sequence when it ends: its result, or the error that ended it.
  using DoneCallback = std::function<void(StatusOr<GenerateResult>)>;
  // Polled before every step; true ends the sequence as kCancelled (e.g. a client went away
  // while its prompt was still being prefilled, with no token callback to answer).
  using CancelPoll = std::function<bool()>;

  BatchGenerator(ModelRunner& runner, KvCacheManager& kv, BatchOptions options);
  ~BatchGenerator();  // ends the running sequences as kCancelled

  enum class Admission { kAdmitted, kNoRoom };
  // Starts a sequence if it fits now (kNoRoom: try again after some finish). Errors: the
  // request is invalid (SequenceRun::Start), or it could never fit (ResourceExhausted: it needs
  // more KV blocks than the whole cache has). On an error `on_done` is not called.
  StatusOr<Admission> Add(GenerateRequest request, TokenCallback on_token, DoneCallback on_done,
                          CancelPoll cancelled = nullptr);

  // One iteration: one LLM pass for every running sequence that has work. Does nothing when
  // none is running. Sequences that end are reported through their DoneCallback, in this call.
  void Step();

  // Ends every running sequence as kCancelled (Shutdown), reporting each.
  void CancelAll();

  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  bool idle() const { return running_.empty(); }
  // KV blocks the running sequences may claim at their largest.
  int64_t reserved_kv_blocks() const { return reserved_blocks_; }
  const BatchOptions& options() const { return options_; }

 private:
  struct Entry {
    std::unique_ptr<SequenceRun> run;
    DoneCallback on_done;
    CancelPoll cancelled;
  };
  void Complete(std::list<Entry>::iterator it, StatusOr<GenerateResult> outcome);

  ModelRunner& runner_;
  KvCacheManager& kv_;
  const BatchOptions options_;
  std::list<Entry> running_;  // in admission order (prefill is first come, first served)
  int64_t reserved_blocks_ = 0;
  std::vector<float> logits_;
};

}  // namespace specinfer
