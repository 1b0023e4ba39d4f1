#include "engine/generator.h"

#include <optional>

#include "engine/engine_core.h"

namespace specinfer {

StatusOr<GenerateResult> Generator::Generate(const GenerateRequest& req,
                                             const TokenCallback& on_token) {
  // One sequence on the engine core: its passes are prefill chunks of req.prefill_chunk tokens
  // (BLAS allowed: there is nothing else in the batch), then one token tree per step.
  BatchOptions options;
  options.max_sequences = 1;
  options.max_batch_tokens = req.prefill_chunk > 0 ? req.prefill_chunk : 1;
  options.blas_prefill = true;
  options.spec_budget = spec_budget_;
  options.controller = controller_;
  EngineCore core(runner_, kv_, options);
  std::optional<StatusOr<GenerateResult>> outcome;
  SI_ASSIGN_OR_RETURN(
      EngineCore::Admission admission,
      core.Add(req, on_token, [&](StatusOr<GenerateResult> r) { outcome = std::move(r); }));
  if (admission != EngineCore::Admission::kAdmitted)
    return ResourceExhaustedError("no KV room for the sequence");
  while (!outcome) core.Step();
  return std::move(*outcome);
}

}  // namespace specinfer
