#include "engine/generator.h"

#include <optional>

#include "engine/batch_generator.h"

namespace specinfer {

StatusOr<GenerateResult> Generator::Generate(const GenerateRequest& req,
                                             const TokenCallback& on_token) {
  // One sequence on the batch loop: its passes are prefill chunks of req.prefill_chunk tokens
  // (BLAS allowed: there is nothing else in the batch), then one token tree per step.
  BatchOptions options;
  options.max_sequences = 1;
  options.max_batch_tokens = req.prefill_chunk > 0 ? req.prefill_chunk : 1;
  options.blas_prefill = true;
  BatchGenerator batch(runner_, kv_, options);
  std::optional<StatusOr<GenerateResult>> outcome;
  SI_ASSIGN_OR_RETURN(
      BatchGenerator::Admission admission,
      batch.Add(req, on_token, [&](StatusOr<GenerateResult> r) { outcome = std::move(r); }));
  if (admission != BatchGenerator::Admission::kAdmitted)
    return ResourceExhaustedError("no KV room for the sequence");
  while (!outcome) batch.Step();
  return std::move(*outcome);
}

}  // namespace specinfer
