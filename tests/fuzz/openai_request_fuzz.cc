// Fuzz target: an OpenAI request body (server/openai_api.h) parsed for both endpoints
// (/v1/completions and /v1/chat/completions), then the speculation settings it carries validated
// and any error rendered as the server would answer it.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/openai_api.h"
#include "server/speculation.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specinfer;
  std::string_view body(reinterpret_cast<const char*>(data), size);
  for (OpenAiEndpoint endpoint : {OpenAiEndpoint::kCompletions, OpenAiEndpoint::kChat}) {
    CompletionRequest request;
    ApiError error = ParseOpenAiRequest(endpoint, body, &request);
    if (error.ok()) {
      (void)ValidateSpeculation(request.speculation, 8);
    } else {
      (void)OpenAiErrorBody(error);
    }
  }
  return 0;
}
