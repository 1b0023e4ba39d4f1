// Protocol-neutral request and response types shared by the frontends (OpenAI HTTP gateway, gRPC)
// and the request queue:
//
//   frontend parses its wire format  ->  CompletionRequest   (what the client asked for)
//   CompletionService::Prepare       ->  SequenceJob x n     (tokenized, checked, seeds resolved)
//   RequestQueue runs each job       ->  StreamEvent stream  (text deltas, tokens, finish, usage)
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/chat_template.h"
#include "engine/generator.h"
#include "server/logprobs.h"
#include "server/speculation.h"
#include "specinfer/status.h"

namespace specinfer {

// Limits every frontend applies before anything reaches the engine.
struct RequestLimits {
  static constexpr int32_t kMaxSequences = 16;  // prompts x n per request
  static constexpr int32_t kMaxStopStrings = 16;
  static constexpr int32_t kMaxStopStringBytes = 256;
  static constexpr int32_t kMaxLogprobs = 20;     // alternatives per token (vLLM's default cap)
  static constexpr float kMaxTemperature = 2.0f;  // OpenAI's range is [0, 2]
};

// One prompt: text (tokenized with the model's conventions, BOS first where the model wants one)
// or token ids used as they are.
struct PromptInput {
  bool is_tokens = false;
  std::string text;
  std::vector<int32_t> tokens;
};

struct CompletionRequest {
  std::string model;  // empty: the served model
  bool chat = false;
  std::vector<PromptInput> prompts;   // !chat: one or more prompts
  std::vector<ChatMessage> messages;  // chat: the conversation
  std::string chat_template;          // chat: "" = the model's own; chatml, llama2, llama3, gemma

  // New tokens per sequence; absent: the server's GenerationDefaults::max_tokens if set, else
  // default_max_tokens, at most what the context holds after the prompt.
  std::optional<int64_t> max_tokens;
  int64_t default_max_tokens = -1;  // the endpoint's (completions: 16); -1: to the context
  // Sampling; absent: the server's GenerationDefaults (OpenAI's 1, 1 and off unless configured).
  std::optional<float> temperature;  // 0: greedy
  std::optional<float> top_p;
  std::optional<int32_t> top_k;  // -1 and 0: off
  std::optional<int64_t> seed;   // absent: random per sequence
  std::vector<std::string> stop;
  bool ignore_eos = false;  // vLLM's extension: no stop tokens (EOS, end of turn) at all
  int32_t n = 1;            // sequences per prompt (seeds seed, seed + 1, ...)
  int32_t logprobs = -1;    // -1: none; k >= 0: the chosen token's logprob and k alternatives
  bool stream = false;
  bool include_usage = false;  // stream: a final chunk with usage
  SpeculationRequest speculation;
};

// One sequence the engine generates: choice `index` of its request.
struct SequenceJob {
  int32_t index = 0;
  GenerateRequest generate;  // prompt ids, max new tokens, sampling with its seed, stop ids
  std::vector<std::string> stop_strings;
  int32_t top_logprobs = -1;       // -1: no logprobs
  SpeculationRequest speculation;  // validated (serving limits); the request queue applies defaults
};

// What the output processor reports about a request's sequences, in order per sequence: zero or
// more kDelta events, then exactly one kFinished or kError.
struct StreamEvent {
  enum class Type { kDelta, kFinished, kError };
  Type type = Type::kDelta;
  int32_t index = 0;            // the sequence (choice index)
  std::string text;             // newly released text: complete UTF-8 characters, stop strings cut
  std::vector<int32_t> tokens;  // kDelta: generated ids reported by this event
  std::vector<TokenLogprob> logprobs;  // kDelta with logprobs requested: one per token
  // kFinished:
  FinishReason finish_reason = FinishReason::kLength;
  int32_t prompt_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // of prompt_tokens, those whose KV came from the prefix cache
  int32_t completion_tokens = 0;
  Status error;  // kError
};

}  // namespace specinfer
