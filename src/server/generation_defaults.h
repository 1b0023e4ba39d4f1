// What a request gets for a field it leaves out, set per server: `serve --temperature 0.2`, a
// cluster config's manager.request_defaults (as llama.cpp's --temp/--top-p/--top-k/--n-predict
// and vLLM's generation config do). The defaults are OpenAI's; a request's own value always wins.
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <string>

#include "specinfer/status.h"

namespace specinfer {

struct GenerationDefaults {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;  // off
  // New tokens when a request gives no max_tokens (still at most what the context holds); -1:
  // the endpoint's own default (completions 16, chat and gRPC as many as the context holds).
  int64_t max_tokens = -1;

  // InvalidArgument naming the field for a value no request could carry (temperature outside
  // [0, 2], top_p outside (0, 1], top_k < -1, max_tokens < 1 other than -1).
  Status Validate() const;
  // "temperature 0.2, top_p 0.9, top_k off, max_tokens endpoint default": for the start-up log.
  std::string ToString() const;
  bool operator==(const GenerationDefaults&) const = default;
};

}  // namespace specinfer
