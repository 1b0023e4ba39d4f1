// Single-sequence generation on a ModelRunner, with or without speculation (SpecInfer §3-4): one
// sequence on the engine core (engine/engine_core.h), the steps being those of Sequence
// (engine/sequence.h) and SpeculativeStep (engine/speculative_step.h), as in serving.
//
// The prompt but its last token is prefilled; from then on every step is one LLM pass over a
// token tree whose root is the last chosen token: the speculators propose trees (merged into
// one), the tree is laid out depth-first after the sequence's committed KV entries, the LLM runs
// it with the topology-aware mask, the verifier (spec/verifier.h) picks the accepted path and the
// LLM's next token, and the accepted path's KV entries are compacted into place while the rest
// are dropped. With no speculators the tree is the root alone: that is incremental decoding,
// the baseline, on the very same path.
//
// Thread safety: a Generator is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/generation.h"
#include "engine/spec_controller.h"
#include "kv/kv_cache.h"

namespace specinfer {

class Generator {
 public:
  // `spec_budget` and `controller` as BatchOptions' (engine/core_scheduler.h).
  Generator(ModelRunner& runner, KvCacheManager& kv,
            SpecBudgetMode spec_budget = SpecBudgetMode::kAuto,
            std::shared_ptr<SpecController> controller = nullptr)
      : runner_(runner), kv_(kv), spec_budget_(spec_budget), controller_(std::move(controller)) {}

  // InvalidArgument for an empty prompt, out-of-vocabulary ids, bad sampling params or tree
  // shape;
  // OutOfRange if the prompt does not fit the model's context (the number of new tokens is
  // clamped to the context that remains). The sequence's KV blocks are freed on return.
  StatusOr<GenerateResult> Generate(const GenerateRequest& request,
                                    const TokenCallback& on_token = nullptr);

 private:
  ModelRunner& runner_;
  KvCacheManager& kv_;
  SpecBudgetMode spec_budget_;
  std::shared_ptr<SpecController> controller_;
};

}  // namespace specinfer
