// Turning a sequence's generated token ids into the text a client sees, incrementally:
//
//   token ids --Tokenizer::TokenBytes--> bytes --Utf8StreamDecoder--> complete UTF-8 characters
//             --StopStringMatcher--> text safe to send
//
// Stop strings are matched on the decoded text (as OpenAI and vLLM do, so a stop string may span
// tokens) and removed from the output together with everything after them. Text that could still
// turn out to be the start of a stop string is held back until the next token decides, so a
// streamed response never sends text that the finished response would not contain: the
// concatenation of everything Push() and Finish() return is exactly the final text.
//
// Thread safety: one object per sequence, used by one thread at a time.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace specinfer {

class StopStringMatcher {
 public:
  // Empty strings in `stops` are ignored (the request parsers reject them).
  explicit StopStringMatcher(std::vector<std::string> stops);

  // Appends `text`; returns the prefix of all text so far that can no longer be affected by a
  // stop string and has not been returned yet. Once a stop string has appeared, returns the text
  // before it (if not yet returned), sets stopped(), and returns "" for every later call.
  std::string Push(std::string_view text);
  // End of generation: returns whatever is still held back ("" once stopped).
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // text not yet returned; always shorter than the longest stop string
  bool stopped_ = false;
};

class CompletionText {
 public:
  // `prev_token` is the last prompt token (SentencePiece vocabularies drop the space after BOS).
  // Tokens in `stop_tokens` (EOS, end-of-turn) contribute no text.
  CompletionText(const Tokenizer& tokenizer, int32_t prev_token,
                 std::span<const int32_t> stop_tokens, std::vector<std::string> stop_strings);

  // Adds a generated token; returns the text that may be sent now (possibly empty).
  std::string Push(int32_t token);
  // True once a stop string has appeared: generation should end (finish reason "stop").
  bool stopped() const { return matcher_.stopped(); }
  // End of generation: the text still held back (an incomplete UTF-8 tail becomes U+FFFD).
  std::string Finish();

 private:
  const Tokenizer& tokenizer_;
  int32_t prev_;
  std::vector<int32_t> stop_tokens_;
  Utf8StreamDecoder decoder_;
  StopStringMatcher matcher_;
};

// `bytes` with every invalid or incomplete UTF-8 sequence replaced by U+FFFD (for showing single
// tokens, e.g. in logprobs, which may be parts of characters).
std::string SanitizeUtf8(std::string_view bytes);

// Number of Unicode code points in valid UTF-8 `text` (Python's len(str)).
size_t CountCodePoints(std::string_view text);

}  // namespace specinfer
