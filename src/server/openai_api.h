// The OpenAI wire format of POST /v1/completions and POST /v1/chat/completions: request bodies
// parsed into CompletionRequest, and responses, stream chunks and errors rendered as JSON text.
// No transport here (server/http_server.cc serves it), so all of it is testable directly.
//
// Parsing follows OpenAI's behaviour: a field the endpoint does not know is an error (400,
// "Unrecognized request argument supplied: NAME"), null means "absent", and a known field of the
// wrong type is an error (400, with `param` naming it). Known features this server
// does not implement are refused rather than silently ignored when a request actually uses them:
// echo, suffix, best_of other than n, logit_bias, non-zero presence/frequency penalties, tools,
// function calls, non-text content parts, response_format other than text.
//
// Fields: model, prompt (string, [string], [int], [[int]]) or messages; max_tokens (chat also
// max_completion_tokens, which wins), temperature, top_p, top_k (extension), n, seed, stop
// (string or [string]), stream, stream_options.include_usage, logprobs (completions: int;
// chat: bool with top_logprobs int), ignore_eos (vLLM's extension: generate to max_tokens or a
// stop string, past EOS and end-of-turn tokens), and the extension object
//   "speculation": {"enabled": bool, "draft": [string], "tree": [int]}
// (server/speculation.h), whose own unknown keys are refused (typos must not silently change
// what runs).
//
// Logprobs are the model's raw distribution (see server/logprobs.h). Token strings are the
// token's bytes as text (invalid UTF-8 as U+FFFD; chat also gives the raw "bytes"); special
// tokens show their vocabulary piece. Completions' text_offset counts code points.
//
// Thread safety: free functions are pure; an OpenAiResponseWriter belongs to one request.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"
#include "server/completion_service.h"
#include "server/request.h"
#include "tokenizer/tokenizer.h"

namespace specinfer {

enum class OpenAiEndpoint { kCompletions, kChat };

// The deepest JSON nesting a request body may have (the parser recurses).
inline constexpr int kMaxJsonDepth = 64;

// Parses a request body: UTF-8, JSON syntax and depth, and field types. Value ranges and
// everything that needs the model are CompletionService::Prepare's.
ApiError ParseOpenAiRequest(OpenAiEndpoint endpoint, std::string_view body, CompletionRequest* out);

// {"error": {"message", "type", "param", "code"}} for `error`. type: "invalid_request_error" for
// 4xx, "server_error" for 5xx.
std::string OpenAiErrorBody(const ApiError& error);

// The GET /v1/models list (one model) and a single model object.
std::string OpenAiModelList(const std::string& model_name, int64_t created, int32_t context);
std::string OpenAiModel(const std::string& model_name, int64_t created, int32_t context);

// One generated token as the logprobs fields show it.
struct RenderedToken {
  std::string text;   // the token as text (U+FFFD for partial characters)
  std::string bytes;  // its raw bytes
  float logprob = 0;
  int64_t text_offset = 0;         // completions: code points before it
  std::vector<RenderedToken> top;  // alternatives (their own `top` empty)
};

// Renders one request's StreamEvents as OpenAI responses.
class OpenAiResponseWriter {
 public:
  // `id` e.g. "cmpl-..." / "chatcmpl-..."; `created` in Unix seconds.
  OpenAiResponseWriter(OpenAiEndpoint endpoint, const Tokenizer& tokenizer,
                       const PreparedRequest& prepared, std::string model, int32_t logprobs,
                       std::string id, int64_t created);

  // Streaming. Chunks to send before any event (chat: one role chunk per choice).
  std::vector<std::string> StreamStart() const;
  // Chunks for one event (none for a delta with nothing to show). A kError event yields no chunk
  // (send OpenAiErrorBody instead).
  std::vector<std::string> StreamChunks(const StreamEvent& event);
  // The final chunk with usage (stream_options.include_usage), after every choice finished.
  // Usage everywhere: prompt_tokens, completion_tokens, total_tokens and
  // prompt_tokens_details.cached_tokens (prompt tokens served from the prefix cache).
  std::string UsageChunk() const;

  // Non-streaming: collect every event, then render the whole response.
  void Add(const StreamEvent& event);
  std::string Response() const;

 private:
  struct Choice {
    int32_t prev_token = -1;              // for TokenBytes of the next token
    int64_t text_offset = 0;              // completions: code points of token texts so far
    std::string text;                     // non-streaming: accumulated text
    std::vector<RenderedToken> logprobs;  // non-streaming: accumulated
    std::string finish_reason;            // "" until finished
    int32_t completion_tokens = 0;
    int32_t cached_prompt_tokens = 0;  // of its prompt, tokens whose KV came from the prefix cache
  };

  // usage.prompt_tokens_details.cached_tokens: per prompt (counted once, as prompt_tokens), the
  // tokens cached for every one of its n choices. (With n > 1 the later samples of a prompt
  // usually find the first one's KV; the prompt was still computed once for this request.)
  int32_t CachedPromptTokens() const;

  // Renders `event`'s tokens for `choice` (advancing its token state); empty without logprobs.
  std::vector<RenderedToken> Render(Choice& choice, const StreamEvent& event) const;
  RenderedToken RenderOne(int32_t prev, int32_t token, float logprob) const;
  const OpenAiEndpoint endpoint_;
  const Tokenizer& tokenizer_;
  const std::string model_;
  const int32_t logprobs_;
  const std::string id_;
  const int64_t created_;
  const int32_t prompt_tokens_;
  const int32_t choices_per_prompt_;
  std::vector<Choice> choices_;
};

// SSE framing (text/event-stream): "data: <line>\n" per line of `data`, then a blank line.
std::string SseData(std::string_view data);
// The stream terminator OpenAI clients wait for: "data: [DONE]\n\n".
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";
// A comment line, ignored by clients; sent to detect disconnected clients while waiting.
inline constexpr std::string_view kSseKeepAlive = ": keep-alive\n\n";

}  // namespace specinfer
