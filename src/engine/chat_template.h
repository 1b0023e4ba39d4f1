// Chat templates: turning a list of chat messages into the prompt text a chat model was trained on.
//
// Models ship their template as Jinja source (GGUF metadata `tokenizer.chat_template`). specinfer
// has no Jinja interpreter; like llama.cpp's llama_chat_apply_template, ChatTemplate *recognises*
// a template by characteristic markers and maps it to a built-in formatter that reproduces the
// template's output byte for byte for the supported families:
//
//   chatml  "<|im_start|>"                 <|im_start|>role\ncontent<|im_end|>\n ...
//           generation prompt "<|im_start|>assistant\n". A default system message that the
//           template injects when the conversation does not start with one (SmolLM2, Qwen) is
//           extracted from the template text and reproduced.
//   llama2  "[INST]" and "<<SYS>>"          <s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST]
//           assistant </s><s>[INST] ... ; contents stripped; roles must alternate user/assistant
//           after the optional system message; no generation prompt (the text already ends in
//           "[/INST]").
//   llama3  "<|start_header_id|>"           <|begin_of_text|><|start_header_id|>role
//           <|end_header_id|>\n\ncontent<|eot_id|> ... ; contents trimmed when the template trims;
//           generation prompt "<|start_header_id|>assistant<|end_header_id|>\n\n".
//   gemma   "<start_of_turn>"               <bos><start_of_turn>user\ncontent<end_of_turn>\n
//           <start_of_turn>model\ncontent<end_of_turn>\n ... ; the assistant's role is "model",
//           contents trimmed, roles must alternate user/assistant after the optional system
//           message; generation prompt "<start_of_turn>model\n". Gemma has no system turn: Gemma
//           3's template writes the system message at the start of the first user turn followed
//           by a separator ('\n\n', read from the template), while Gemma 1/2's templates reject
//           one (raise_exception('System role not supported')), and so does the formatter for
//           them. `Named("gemma")` is Gemma 3's format.
//
// Conformance with the real Jinja templates is checked against renderings made by jinja2
// (tests/reference/make_chat_template_vectors.py -> tests/data/chat/templates.json).
// Known approximations: templates that add content beyond the family's pattern (e.g. Llama 3.1's
// "Cutting Knowledge Date" system header, tool definitions) are rendered as the plain family.
//
// Thread safety: a ChatTemplate is immutable after construction; Apply is const and may be called
// concurrently.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specinfer/status.h"

namespace specinfer {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  enum class Family { kChatMl, kLlama2, kLlama3, kGemma };

  // Largest template source FromModelTemplate accepts (real ones are a few KiB; the source comes
  // from a model file, which may be hostile). Recognition is linear in the source's length.
  static constexpr size_t kMaxChatTemplateBytes = size_t{1} << 20;

  // Recognises the model's Jinja template `jinja_source` and returns the matching formatter.
  // `bos_token` / `eos_token` are the texts of the vocabulary's BOS / EOS tokens (Jinja's
  // bos_token / eos_token variables); they may be empty. Unimplemented for a template of an
  // unsupported family (the message suggests --chat-template chatml|llama2|llama3|gemma);
  // InvalidArgument for an empty source or one over kMaxChatTemplateBytes.
  static StatusOr<ChatTemplate> FromModelTemplate(std::string_view jinja_source,
                                                  std::string bos_token, std::string eos_token);

  // A built-in formatter chosen by name ("chatml", "llama2", "llama3", "gemma"), e.g. as a user
  // override. Empty `bos_token` / `eos_token` select the family's usual texts (llama2 "<s>" /
  // "</s>", llama3 "<|begin_of_text|>" / "<|eot_id|>", chatml none / "<|im_end|>", gemma "<bos>" /
  // "<eos>"). InvalidArgument for an unknown name.
  static StatusOr<ChatTemplate> Named(std::string_view name, std::string bos_token = "",
                                      std::string eos_token = "");

  // Renders `messages` as the template would. Roles must be "system", "user" or "assistant", and
  // "system" may appear only first; the llama2 and gemma families also require user/assistant
  // alternation (as their templates' raise_exception does), and Gemma 1/2 templates reject a system
  // message. InvalidArgument for an empty list or a violation. With `add_generation_prompt` the
  // text ends with the header that opens the assistant's turn (llama2 has none: its user turn
  // already ends the prompt).
  StatusOr<std::string> Apply(std::span<const ChatMessage> messages,
                              bool add_generation_prompt) const;

  // Texts of the tokens that end an assistant turn: the family's end-of-turn marker ("<|im_end|>",
  // "<|eot_id|>", "<end_of_turn>") and the EOS text, without duplicates or empty strings. Map them
  // to ids with the tokenizer (a text that encodes, with parse_special, to exactly one special
  // token).
  std::vector<std::string> stop_token_texts() const;

  Family family() const { return family_; }
  std::string_view name() const;  // "chatml", "llama2", "llama3" or "gemma"
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  // The system message injected when the conversation does not open with one (empty: none).
  const std::string& default_system_message() const { return default_system_; }

 private:
  ChatTemplate(Family family, std::string bos, std::string eos)
      : family_(family), bos_token_(std::move(bos)), eos_token_(std::move(eos)) {}

  std::string ApplyChatMl(std::span<const ChatMessage> messages, bool add_generation_prompt) const;
  StatusOr<std::string> ApplyLlama2(std::span<const ChatMessage> messages) const;
  std::string ApplyLlama3(std::span<const ChatMessage> messages, bool add_generation_prompt) const;
  StatusOr<std::string> ApplyGemma(std::span<const ChatMessage> messages,
                                   bool add_generation_prompt) const;

  Family family_;
  std::string bos_token_;
  std::string eos_token_;
  std::string default_system_;  // chatml only
  bool has_default_system_ = false;
  bool emit_bos_ = true;        // llama2/llama3/gemma: the template writes bos_token
  bool trim_content_ = true;    // llama2/llama3/gemma: the template strips message contents
  bool reject_system_ = false;  // gemma 1/2: a system message is an error
  std::string system_separator_ = "\n\n";  // gemma 3: between the system text and the first turn
};

// Python's str.strip() (what Jinja's `trim` filter and `.strip()` do): removes leading and trailing
// Unicode whitespace from UTF-8 text. Invalid UTF-8 is left in place.
std::string StripUnicodeWhitespace(std::string_view text);

}  // namespace specinfer
