#include "server/text_output.h"

#include <algorithm>

namespace specinfer {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopStringMatcher::Push(std::string_view text) {
  if (stopped_) return "";
  held_.append(text);
  if (stops_.empty()) return std::exchange(held_, std::string());

  // Earliest occurrence of any stop string. held_ never contains a whole stop string from an
  // earlier call, so one search over it finds the first one in the whole text.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string. Such a suffix
  // starts with the first byte of a stop string (a UTF-8 lead byte), so the cut falls on a
  // character boundary.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, held_.size());
    for (size_t len = max_len; len > keep; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringMatcher::Flush() {
  if (stopped_) return "";
  return std::exchange(held_, std::string());
}

CompletionText::CompletionText(const Tokenizer& tokenizer, int32_t prev_token,
                               std::span<const int32_t> stop_tokens,
                               std::vector<std::string> stop_strings)
    : tokenizer_(tokenizer),
      prev_(prev_token),
      stop_tokens_(stop_tokens.begin(), stop_tokens.end()),
      matcher_(std::move(stop_strings)) {}

std::string CompletionText::Push(int32_t token) {
  const bool is_stop =
      std::find(stop_tokens_.begin(), stop_tokens_.end(), token) != stop_tokens_.end();
  std::string bytes = is_stop ? std::string() : tokenizer_.TokenBytes(prev_, token);
  prev_ = token;
  return matcher_.Push(decoder_.Push(bytes));
}

std::string CompletionText::Finish() {
  std::string out = matcher_.Push(decoder_.Flush());
  return out + matcher_.Flush();
}

std::string SanitizeUtf8(std::string_view bytes) {
  Utf8StreamDecoder d;
  std::string out = d.Push(bytes);
  return out + d.Flush();
}

size_t CountCodePoints(std::string_view text) {
  size_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace specinfer
