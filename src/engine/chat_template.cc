// Chat template recognition and the built-in formatters. Each formatter mirrors its family's
// reference Jinja template statement by statement; the comments quote the Jinja being mirrored.
#include "engine/chat_template.h"

#include <algorithm>

namespace specinfer {
namespace {

constexpr std::string_view kImStart = "<|im_start|>";
constexpr std::string_view kImEnd = "<|im_end|>";
constexpr std::string_view kStartHeader = "<|start_header_id|>";
constexpr std::string_view kEndHeader = "<|end_header_id|>";
constexpr std::string_view kEotId = "<|eot_id|>";
constexpr std::string_view kStartOfTurn = "<start_of_turn>";
constexpr std::string_view kEndOfTurn = "<end_of_turn>";
constexpr std::string_view kSupportedNames = "chatml|llama2|llama3|gemma";

bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

// Decodes one UTF-8 code point at text[pos]; false if the bytes there are not a valid sequence.
bool DecodeUtf8(std::string_view text, size_t pos, char32_t* cp, size_t* len) {
  auto b = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  unsigned char c = b(pos);
  size_t n;
  char32_t v;
  if (c < 0x80) {
    *cp = c;
    *len = 1;
    return true;
  } else if ((c & 0xE0) == 0xC0) {
    n = 2;
    v = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    v = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    v = c & 0x07;
  } else {
    return false;
  }
  if (pos + n > text.size()) return false;
  for (size_t i = 1; i < n; ++i) {
    if ((b(pos + i) & 0xC0) != 0x80) return false;
    v = (v << 6) | (b(pos + i) & 0x3F);
  }
  static constexpr char32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return false;
  *cp = v;
  *len = n;
  return true;
}

// Python's str.isspace().
bool IsUnicodeSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Undoes the escapes of a Jinja (Python-style) string literal: \n \t \r \\ \' \".
std::string UnescapeJinjaLiteral(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      char e = s[++i];
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '\\':
        case '\'':
        case '"':
          out += e;
          break;
        default:
          out += '\\';
          out += e;
          break;
      }
    } else {
      out += s[i];
    }
  }
  return out;
}

// Finds a ChatML default system message written as one string literal in the template, e.g.
// SmolLM2's '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, ...<|im_end|>\n'
// (the newline may be a real newline or the escape "\n"). Occurrences where the system text is an
// expression (`'<|im_start|>system\n' + messages[0]['content']`) are skipped: their span up to
// <|im_end|> contains an unescaped quote.
// Linear in the template's length, whatever it holds: the <|im_end|> found for one occurrence
// serves every later occurrence before it, and a quote that disqualifies one occurrence
// disqualifies every later occurrence before that quote (the escape scan is in step again after
// the marker, which holds no backslash or quote), so the search resumes after the quote. (Found
// writing its fuzz target: rescanning from every occurrence took minutes on a 1 MB template.)
bool FindChatMlDefaultSystem(std::string_view src, std::string* out) {
  static constexpr std::string_view kHead = "<|im_start|>system";
  size_t end = 0;   // the first <|im_end|> after the current body once end >= body
  size_t next = 0;  // where the next occurrence may start
  for (size_t pos = src.find(kHead); pos != std::string_view::npos; pos = src.find(kHead, next)) {
    next = pos + 1;
    size_t body = pos + kHead.size();
    if (src.substr(body, 1) == "\n") {
      body += 1;
    } else if (src.substr(body, 2) == "\\n") {
      body += 2;
    } else {
      continue;
    }
    if (end < body) end = src.find(kImEnd, body);
    if (end == std::string_view::npos) return false;  // none after any later occurrence either
    std::string_view text = src.substr(body, end - body);
    bool literal = true;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\\') {
        ++i;
      } else if (text[i] == '\'' || text[i] == '"') {
        literal = false;
        next = body + i + 1;
        break;
      }
    }
    if (!literal) continue;
    *out = UnescapeJinjaLiteral(text);
    return true;
  }
  return false;
}

// Finds Gemma 3's separator between the system message and the first user turn, written as
// `set first_user_prefix = messages[0]['content'] + '\n\n'` (the literal may use either quote).
// False if the template has no such assignment.
bool FindGemmaSystemSeparator(std::string_view src, std::string* out) {
  static constexpr std::string_view kAssign = "first_user_prefix = messages[0]['content'] + ";
  const size_t pos = src.find(kAssign);
  if (pos == std::string_view::npos) return false;
  size_t i = pos + kAssign.size();
  if (i >= src.size() || (src[i] != '\'' && src[i] != '"')) return false;
  const char quote = src[i++];
  const size_t begin = i;
  for (; i < src.size() && src[i] != quote; ++i) {
    if (src[i] == '\\') ++i;
  }
  if (i >= src.size()) return false;
  *out = UnescapeJinjaLiteral(src.substr(begin, i - begin));
  return true;
}

Status ValidateMessages(std::span<const ChatMessage> messages) {
  if (messages.empty()) return InvalidArgumentError("chat request has no messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role == "system") {
      if (i != 0) {
        return InvalidArgumentError("message " + std::to_string(i) +
                                    ": a system message may only come first");
      }
    } else if (role != "user" && role != "assistant") {
      return InvalidArgumentError("message " + std::to_string(i) + ": unsupported role '" + role +
                                  "' (expected system, user or assistant)");
    }
  }
  return Status::Ok();
}

}  // namespace

std::string StripUnicodeWhitespace(std::string_view text) {
  size_t begin = 0;
  while (begin < text.size()) {
    char32_t cp;
    size_t len;
    if (!DecodeUtf8(text, begin, &cp, &len) || !IsUnicodeSpace(cp)) break;
    begin += len;
  }
  size_t end = text.size();
  while (end > begin) {
    // Step back to the lead byte of the last character (at most 3 continuation bytes).
    size_t start = end - 1;
    while (start > begin && end - start < 4 &&
           (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
      --start;
    }
    char32_t cp;
    size_t len;
    if (!DecodeUtf8(text, start, &cp, &len) || start + len != end || !IsUnicodeSpace(cp)) break;
    end = start;
  }
  return std::string(text.substr(begin, end - begin));
}

StatusOr<ChatTemplate> ChatTemplate::FromModelTemplate(std::string_view src, std::string bos_token,
                                                       std::string eos_token) {
  if (src.empty()) {
    return InvalidArgumentError("the model has no chat template; choose one with --chat-template " +
                                std::string(kSupportedNames));
  }
  if (src.size() > kMaxChatTemplateBytes) {
    return InvalidArgumentError(
        "the model's chat template has " + std::to_string(src.size()) +
        " bytes, more than the limit of " + std::to_string(kMaxChatTemplateBytes) +
        "; choose one with --chat-template " + std::string(kSupportedNames));
  }
  if (Contains(src, kImStart)) {
    ChatTemplate t(Family::kChatMl, std::move(bos_token), std::move(eos_token));
    t.has_default_system_ = FindChatMlDefaultSystem(src, &t.default_system_);
    return t;
  }
  const bool trims = Contains(src, ".strip()") || Contains(src, "trim");
  const bool uses_bos = Contains(src, "bos_token");
  if (Contains(src, kStartOfTurn) && Contains(src, kEndOfTurn)) {
    ChatTemplate t(Family::kGemma, std::move(bos_token), std::move(eos_token));
    t.trim_content_ = trims;
    t.emit_bos_ = uses_bos;
    // Gemma 1/2: {% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not
    // supported') }}; Gemma 3: {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}.
    t.reject_system_ = Contains(src, "System role not supported");
    FindGemmaSystemSeparator(src, &t.system_separator_);
    return t;
  }
  if (Contains(src, kStartHeader) && Contains(src, kEndHeader)) {
    ChatTemplate t(Family::kLlama3, std::move(bos_token), std::move(eos_token));
    t.trim_content_ = trims;
    t.emit_bos_ = uses_bos;
    return t;
  }
  if (Contains(src, "[INST]") && Contains(src, "<<SYS>>")) {
    ChatTemplate t(Family::kLlama2, std::move(bos_token), std::move(eos_token));
    t.trim_content_ = trims;
    t.emit_bos_ = uses_bos;
    return t;
  }
  return UnimplementedError(
      "unrecognised chat template (supported: ChatML, Llama 2, Llama 3, Gemma); choose one with "
      "--chat-template " +
      std::string(kSupportedNames));
}

StatusOr<ChatTemplate> ChatTemplate::Named(std::string_view name, std::string bos_token,
                                           std::string eos_token) {
  if (name == "chatml") {
    if (eos_token.empty()) eos_token = std::string(kImEnd);
    return ChatTemplate(Family::kChatMl, std::move(bos_token), std::move(eos_token));
  }
  if (name == "llama2") {
    if (bos_token.empty()) bos_token = "<s>";
    if (eos_token.empty()) eos_token = "</s>";
    return ChatTemplate(Family::kLlama2, std::move(bos_token), std::move(eos_token));
  }
  if (name == "llama3") {
    if (bos_token.empty()) bos_token = "<|begin_of_text|>";
    if (eos_token.empty()) eos_token = std::string(kEotId);
    return ChatTemplate(Family::kLlama3, std::move(bos_token), std::move(eos_token));
  }
  if (name == "gemma") {
    if (bos_token.empty()) bos_token = "<bos>";
    if (eos_token.empty()) eos_token = "<eos>";
    return ChatTemplate(Family::kGemma, std::move(bos_token), std::move(eos_token));
  }
  return InvalidArgumentError("unknown chat template '" + std::string(name) +
                              "' (expected chatml, llama2, llama3 or gemma)");
}

std::string_view ChatTemplate::name() const {
  switch (family_) {
    case Family::kChatMl:
      return "chatml";
    case Family::kLlama2:
      return "llama2";
    case Family::kLlama3:
      return "llama3";
    case Family::kGemma:
      return "gemma";
  }
  return "";
}

std::vector<std::string> ChatTemplate::stop_token_texts() const {
  std::vector<std::string> out;
  if (family_ == Family::kChatMl) out.emplace_back(kImEnd);
  if (family_ == Family::kLlama3) out.emplace_back(kEotId);
  if (family_ == Family::kGemma) out.emplace_back(kEndOfTurn);
  if (!eos_token_.empty() && std::find(out.begin(), out.end(), eos_token_) == out.end()) {
    out.push_back(eos_token_);
  }
  return out;
}

StatusOr<std::string> ChatTemplate::Apply(std::span<const ChatMessage> messages,
                                          bool add_generation_prompt) const {
  SI_RETURN_IF_ERROR(ValidateMessages(messages));
  switch (family_) {
    case Family::kChatMl:
      return ApplyChatMl(messages, add_generation_prompt);
    case Family::kLlama2:
      return ApplyLlama2(messages);
    case Family::kLlama3:
      return ApplyLlama3(messages, add_generation_prompt);
    case Family::kGemma:
      return ApplyGemma(messages, add_generation_prompt);
  }
  return InternalError("unknown chat template family");
}

std::string ChatTemplate::ApplyChatMl(std::span<const ChatMessage> messages,
                                      bool add_generation_prompt) const {
  std::string out;
  // {% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n...' }}
  if (has_default_system_ && messages[0].role != "system") {
    out.append(kImStart).append("system\n").append(default_system_).append(kImEnd) += '\n';
  }
  // {{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}
  for (const ChatMessage& m : messages) {
    out.append(kImStart).append(m.role) += '\n';
    out.append(m.content).append(kImEnd) += '\n';
  }
  if (add_generation_prompt) out.append(kImStart).append("assistant\n");
  return out;
}

StatusOr<std::string> ChatTemplate::ApplyLlama2(std::span<const ChatMessage> messages) const {
  // {% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}...
  const bool has_system = messages[0].role == "system";
  std::span<const ChatMessage> loop = has_system ? messages.subspan(1) : messages;
  const std::string_view bos = emit_bos_ ? std::string_view(bos_token_) : std::string_view();
  std::string out;
  for (size_t i = 0; i < loop.size(); ++i) {
    const ChatMessage& m = loop[i];
    // {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception(...) }}
    if ((m.role == "user") != (i % 2 == 0)) {
      return InvalidArgumentError(
          "Conversation roles must alternate user/assistant/user/assistant/... (llama2 template)");
    }
    // {% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}
    std::string content;
    if (i == 0 && has_system) {
      content = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n" + m.content;
    } else {
      content = m.content;
    }
    if (trim_content_) content = StripUnicodeWhitespace(content);
    if (m.role == "user") {
      // {{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}
      out.append(bos).append("[INST] ").append(content).append(" [/INST]");
    } else {
      // {{ ' '  + content.strip() + ' ' + eos_token }}
      out.append(" ").append(content).append(" ").append(eos_token_);
    }
  }
  return out;
}

std::string ChatTemplate::ApplyLlama3(std::span<const ChatMessage> messages,
                                      bool add_generation_prompt) const {
  std::string out;
  // {% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}
  if (emit_bos_) out.append(bos_token_);
  for (const ChatMessage& m : messages) {
    // '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] |
    // trim + '<|eot_id|>'
    out.append(kStartHeader).append(m.role).append(kEndHeader).append("\n\n");
    out.append(trim_content_ ? StripUnicodeWhitespace(m.content) : m.content).append(kEotId);
  }
  if (add_generation_prompt) {
    out.append(kStartHeader).append("assistant").append(kEndHeader).append("\n\n");
  }
  return out;
}

StatusOr<std::string> ChatTemplate::ApplyGemma(std::span<const ChatMessage> messages,
                                               bool add_generation_prompt) const {
  const bool has_system = messages[0].role == "system";
  // Gemma 1/2: {% if messages[0]['role'] == 'system' %}{{ raise_exception(...) }}
  if (has_system && reject_system_) {
    return InvalidArgumentError(
        "System role not supported (this Gemma template has no system turn; --chat-template "
        "gemma writes it into the first user turn, as Gemma 3 does)");
  }
  // Gemma 3: {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%} (not trimmed)
  std::string first_user_prefix;
  if (has_system) first_user_prefix = messages[0].content + system_separator_;
  std::span<const ChatMessage> loop = has_system ? messages.subspan(1) : messages;
  std::string out;
  // {{ bos_token }}
  if (emit_bos_) out.append(bos_token_);
  for (size_t i = 0; i < loop.size(); ++i) {
    const ChatMessage& m = loop[i];
    // {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}{{ raise_exception(...) }}
    if ((m.role == "user") != (i % 2 == 0)) {
      return InvalidArgumentError(
          "Conversation roles must alternate user/assistant/user/assistant/... (gemma template)");
    }
    // {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    out.append(kStartOfTurn).append(m.role == "assistant" ? "model" : m.role) += '\n';
    if (i == 0) out.append(first_user_prefix);
    // {{ message['content'] | trim }}{{ '<end_of_turn>\n' }}
    out.append(trim_content_ ? StripUnicodeWhitespace(m.content) : m.content).append(kEndOfTurn);
    out += '\n';
  }
  // {{'<start_of_turn>model\n'}}
  if (add_generation_prompt) out.append(kStartOfTurn).append("model\n");
  return out;
}

}  // namespace specinfer
