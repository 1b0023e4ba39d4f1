// The protocol-neutral half of serving a generation request, shared by the OpenAI gateway and the
// gRPC service: checks a parsed CompletionRequest against the served model and the limits,
// tokenizes its prompts (chat template applied), resolves seeds, and submits the resulting
// SequenceJobs to the RequestQueue.
//
// Checks (each an ApiError naming the field, 400 unless noted):
//   model other than the served one (404, "model_not_found"); temperature outside [0, 2]; top_p
//   outside (0, 1]; top_k < -1 (-1 and 0 both mean "off", as in vLLM); n outside 1..16 or more
//   than 16 sequences in all; logprobs outside 0..20; more than 16 stop strings, an empty or
//   over-long one; bad speculation settings, and speculation.enabled while the build cannot
//   speculate; token ids outside the vocabulary; a prompt longer than the context, or prompt +
//   max_tokens beyond it ("context_length_exceeded"); max_tokens < 0.
// Fields a request leaves out take ServiceOptions::defaults (a default max_tokens is cut to what
// the context holds after the prompt instead of refused).
//
// Thread safety: const methods may be called from any thread (they use only the Engine's
// immutable parts).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/generation_defaults.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/request_queue.h"

namespace specinfer {

struct ServiceOptions {
  std::string served_model_name;
  std::string chat_template;  // default chat template override ("" = the model's own)
  // Whether requests may enable speculation: InferenceServer turns it on (its request queue hands
  // SequenceJob::speculation to the engine's speculators); a service whose engine should not
  // speculate leaves it off and refuses such requests.
  bool speculation_available = false;
  // "model:PATH" drafts loaded at start: the only model drafts a request may name.
  std::vector<std::string> model_drafts;
  // Sampling and max_tokens for requests that leave them out; Validate()d by the caller.
  GenerationDefaults defaults;
};

struct PreparedRequest {
  std::vector<SequenceJob> jobs;  // job i is choice i: prompt i / n, sample i % n
  int32_t prompt_tokens = 0;      // usage: every prompt counted once
  int32_t choices_per_prompt = 1;  // the request's n: jobs [p * n, (p + 1) * n) share prompt p
};

class CompletionService {
 public:
  CompletionService(RequestQueue& queue, ServerMetrics& metrics, ServiceOptions options);

  // Validates and tokenizes `request` into `out`.
  ApiError Prepare(const CompletionRequest& request, PreparedRequest* out) const;

  // Prepare, then submit: on success *stream receives the request's events. Unavailable (503)
  // when the queue is full.
  ApiError Start(const CompletionRequest& request, PreparedRequest* prepared,
                 std::shared_ptr<ResponseStream>* stream);

  void Cancel(const std::shared_ptr<ResponseStream>& stream) { queue_.Cancel(stream); }

  const std::string& model_name() const { return options_.served_model_name; }
  const Engine& engine() const { return queue_.engine(); }
  RequestQueue& queue() { return queue_; }
  ServerMetrics& metrics() { return metrics_; }

 private:
  ApiError CheckParameters(const CompletionRequest& r) const;

  RequestQueue& queue_;
  ServerMetrics& metrics_;
  const ServiceOptions options_;
};

}  // namespace specinfer
